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
  include(cmake/zinf_find_torch.cmake)
  zinf_find_torch()
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
  zinf_fmt_before_torch(zinf_torch)
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
