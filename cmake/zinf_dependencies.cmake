# Every dependency comes from a Debian 12 package (scripts/install-deps.sh), except the CUDA
# toolkit, which is used when present and skipped otherwise.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(LIBURING REQUIRED IMPORTED_TARGET liburing>=2.1)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
find_library(LIBAIO_LIBRARY NAMES aio REQUIRED)
find_path(LIBAIO_INCLUDE_DIR libaio.h REQUIRED)
add_library(zinf_libaio INTERFACE)
target_link_libraries(zinf_libaio INTERFACE ${LIBAIO_LIBRARY})
target_include_directories(zinf_libaio SYSTEM INTERFACE ${LIBAIO_INCLUDE_DIR})

find_package(TBB REQUIRED)
find_package(xsimd REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
if(ZINF_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(ZINF_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()

if(ZINF_WITH_TORCH)
  # A CUDA LibTorch (pip torch's default Linux wheel, pytorch.org's cuXXX builds) ships
  # lib/libtorch_cuda.so beside its CMake config, and that config enables the CUDA language
  # and finds the toolkit itself (nvcc, headers, libraries): without them it fails far from the
  # cause. Find the config find_package(Torch) will read and, for a CUDA build, the toolkit.
  find_path(ZINF_TORCH_CONFIG_DIR TorchConfig.cmake
            HINTS ${Torch_DIR}
            PATH_SUFFIXES Torch share/cmake/Torch lib/cmake/Torch
                          lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch
            NO_CACHE)
  if(ZINF_TORCH_CONFIG_DIR)
    file(REAL_PATH "${ZINF_TORCH_CONFIG_DIR}" ZINF_TORCH_CONFIG_DIR)
  endif()
  get_filename_component(_zinf_torch_lib "${ZINF_TORCH_CONFIG_DIR}/../../../lib" ABSOLUTE)
  if(ZINF_TORCH_CONFIG_DIR AND EXISTS "${_zinf_torch_lib}/libtorch_cuda.so")
    find_package(CUDAToolkit QUIET)
    if(NOT CUDAToolkit_FOUND OR NOT CUDAToolkit_NVCC_EXECUTABLE)
      message(FATAL_ERROR
              "zinf: the LibTorch in ${ZINF_TORCH_CONFIG_DIR} is a CUDA build, and its CMake "
              "config needs the CUDA toolkit with nvcc, of the CUDA version that LibTorch was "
              "built for (torch 2.11.0+cu130: CUDA 13.0), which was not found. Install it (at "
              "/usr/local/cuda, or set CUDAToolkit_ROOT), or build against a CPU LibTorch.")
    endif()
    message(STATUS "zinf: ${ZINF_TORCH_CONFIG_DIR} is a CUDA LibTorch; CUDA toolkit "
                   "${CUDAToolkit_VERSION} (${CUDAToolkit_NVCC_EXECUTABLE})")
    # Torch's config finds nvcc through FindCUDA and enable_language(CUDA): point both at the
    # toolkit found above, nvcc on PATH or not. zinf has no .cu sources, and CMake 3.25 knows
    # no C++20 dialect flag for nvcc, which CMAKE_CUDA_STANDARD would copy from C++.
    if(NOT CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
    endif()
    if(NOT CUDA_TOOLKIT_ROOT_DIR)
      get_filename_component(CUDA_TOOLKIT_ROOT_DIR "${CUDAToolkit_BIN_DIR}" DIRECTORY)
    endif()
    if(NOT CMAKE_CUDA_STANDARD)
      set(CMAKE_CUDA_STANDARD 17)
    endif()
  endif()
  # TorchConfig finds libtorch and libc10 with find_library(... PATHS <its lib>), which looks in
  # the system's folders first: with Debian's LibTorch installed too, a pip torch's config
  # would link Debian's libc10. Its own lib folder goes first while it runs.
  set(_zinf_library_path "${CMAKE_LIBRARY_PATH}")
  if(EXISTS "${_zinf_torch_lib}/libc10.so")
    list(PREPEND CMAKE_LIBRARY_PATH "${_zinf_torch_lib}")
  endif()
  find_package(Torch REQUIRED)
  set(CMAKE_LIBRARY_PATH "${_zinf_library_path}")
  message(STATUS "zinf: LibTorch ${Torch_VERSION} (${Torch_DIR}; ${c10_LIBRARY})")
  # LibTorch's flags carry -D_GLIBCXX_USE_CXX11_ABI; keep them on every torch consumer.
  # libstdc++ is linked ahead of LibTorch: pip torch's libtorch.so and libtorch_cpu.so export
  # std::filesystem functions of their own (pytorch issue 133437), and a program that needs
  # libtorch before libstdc++ binds its calls to those: std::filesystem::remove_all then jumps
  # to address 0 (torch 2.11.0).
  add_library(zinf_torch INTERFACE)
  target_link_libraries(zinf_torch INTERFACE stdc++ ${TORCH_LIBRARIES})
  target_include_directories(zinf_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  separate_arguments(_zinf_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(zinf_torch INTERFACE ${_zinf_torch_flags})
  # A pip torch ships fmt's headers (fmt 12 in torch 2.11) in its include folder, which comes
  # before /usr/include; zinf links Debian's libfmt 9, and spdlog is built on it. A folder
  # holding just a link to the fmt headers zinf links goes before LibTorch's folders.
  get_target_property(_zinf_fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  find_path(ZINF_FMT_INCLUDE_DIR fmt/format.h HINTS ${_zinf_fmt_include} NO_CACHE REQUIRED)
  file(REAL_PATH "${ZINF_FMT_INCLUDE_DIR}" ZINF_FMT_INCLUDE_DIR)
  file(REAL_PATH "${TORCH_INSTALL_PREFIX}/include" _zinf_torch_include)
  if(EXISTS "${_zinf_torch_include}/fmt" AND NOT _zinf_torch_include STREQUAL ZINF_FMT_INCLUDE_DIR)
    set(_zinf_fmt_first "${PROJECT_BINARY_DIR}/zinf_fmt_first")
    file(MAKE_DIRECTORY "${_zinf_fmt_first}")
    file(CREATE_LINK "${ZINF_FMT_INCLUDE_DIR}/fmt" "${_zinf_fmt_first}/fmt" SYMBOLIC)
    target_include_directories(zinf_torch SYSTEM BEFORE INTERFACE "${_zinf_fmt_first}")
    message(STATUS "zinf: LibTorch ships fmt headers; zinf's targets use ${ZINF_FMT_INCLUDE_DIR}/fmt")
  endif()
endif()

# CUDA: the runtime API is called from plain C++ (no nvcc needed for it), so the CUDA
# pieces compile and link wherever the toolkit is installed, device or not.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  message(STATUS "zinf: CUDA toolkit ${CUDAToolkit_VERSION} found; CUDA pieces are built")
  set(ZINF_HAVE_CUDA ON)
else()
  message(STATUS "zinf: CUDA toolkit not found; CUDA pieces are skipped")
  set(ZINF_HAVE_CUDA OFF)
endif()

# NCCL: its C API is called from plain C++ like the CUDA runtime. NCCL ships no CMake config;
# the header and library sit in the CUDA toolkit's folders here (/usr/local/cuda/include/nccl.h,
# /usr/local/cuda/lib64/libnccl.so). ZINF_WITH_NCCL=OFF builds without it even when found.
option(ZINF_WITH_NCCL "Build the NCCL communicator when CUDA and NCCL are found" ON)
set(ZINF_HAVE_NCCL OFF)
if(ZINF_WITH_NCCL AND ZINF_HAVE_CUDA)
  find_path(ZINF_NCCL_INCLUDE_DIR nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_TARGET_DIR}/include
                  /usr/local/cuda/include)
  find_library(ZINF_NCCL_LIBRARY NAMES nccl
               HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_TARGET_DIR}/lib64
                     /usr/local/cuda/lib64)
  if(ZINF_NCCL_INCLUDE_DIR AND ZINF_NCCL_LIBRARY)
    file(STRINGS "${ZINF_NCCL_INCLUDE_DIR}/nccl.h" _zinf_nccl_version
         REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE "[^0-9;]" "" _zinf_nccl_version "${_zinf_nccl_version}")
    string(REPLACE ";" "." _zinf_nccl_version "${_zinf_nccl_version}")
    message(STATUS "zinf: NCCL ${_zinf_nccl_version} found (${ZINF_NCCL_LIBRARY}); the NCCL "
                   "communicator is built")
    add_library(zinf_nccl INTERFACE)
    target_link_libraries(zinf_nccl INTERFACE ${ZINF_NCCL_LIBRARY} CUDA::cudart)
    target_include_directories(zinf_nccl SYSTEM INTERFACE ${ZINF_NCCL_INCLUDE_DIR})
    set(ZINF_HAVE_NCCL ON)
  else()
    message(STATUS "zinf: NCCL not found; the NCCL communicator is skipped")
  endif()
elseif(ZINF_WITH_NCCL)
  message(STATUS "zinf: no CUDA toolkit; the NCCL communicator is skipped")
endif()
