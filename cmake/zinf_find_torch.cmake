# Finding LibTorch, for zinf's build (cmake/zinf_dependencies.cmake) and for projects that
# find_package(zinf) (installed beside zinfConfig.cmake, which calls the same two commands):
# Debian's LibTorch 1.13 (CPU) and a pip torch 2.x's (torch.utils.cmake_prefix_path; CUDA on
# Linux) both work.
#
#   zinf_find_torch()               find_package(Torch REQUIRED), its prerequisites first
#   zinf_fmt_before_torch(target)   Debian's fmt headers ahead of LibTorch's for `target`

# A macro, so that TORCH_LIBRARIES and the rest of find_package(Torch)'s results land in the
# caller's scope.
macro(zinf_find_torch)
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
  # TorchConfig finds Caffe2's config and libtorch and libc10 with find_package/find_library
  # (... PATHS <its own folders>), which look in the system's folders first: with Debian's
  # LibTorch installed too, a pip torch's config would take Debian's. Its own folders go first
  # while it runs.
  set(_zinf_library_path "${CMAKE_LIBRARY_PATH}")
  set(_zinf_prefix_path "${CMAKE_PREFIX_PATH}")
  if(EXISTS "${_zinf_torch_lib}/libc10.so")
    list(PREPEND CMAKE_LIBRARY_PATH "${_zinf_torch_lib}")
    get_filename_component(_zinf_torch_configs "${ZINF_TORCH_CONFIG_DIR}/.." ABSOLUTE)
    list(PREPEND CMAKE_PREFIX_PATH "${_zinf_torch_configs}")
  endif()
  find_package(Torch REQUIRED)
  set(CMAKE_LIBRARY_PATH "${_zinf_library_path}")
  set(CMAKE_PREFIX_PATH "${_zinf_prefix_path}")
  message(STATUS "zinf: LibTorch ${Torch_VERSION} (${Torch_DIR}; ${c10_LIBRARY})")
endmacro()

# A pip torch ships fmt's headers (fmt 12 in torch 2.11) in its include folder, which comes
# before /usr/include; zinf links Debian's libfmt 9, and spdlog is built on it. A folder
# holding just a link to the fmt headers of fmt::fmt goes before LibTorch's folders on
# `target`. Needs fmt::fmt and zinf_find_torch()'s results; a no-op for Debian's LibTorch.
function(zinf_fmt_before_torch target)
  get_target_property(_fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  find_path(_fmt_dir fmt/format.h HINTS ${_fmt_include} NO_CACHE REQUIRED)
  file(REAL_PATH "${_fmt_dir}" _fmt_dir)
  file(REAL_PATH "${TORCH_INSTALL_PREFIX}/include" _torch_include)
  if(EXISTS "${_torch_include}/fmt" AND NOT _torch_include STREQUAL _fmt_dir)
    set(_fmt_first "${PROJECT_BINARY_DIR}/zinf_fmt_first")
    file(MAKE_DIRECTORY "${_fmt_first}")
    file(CREATE_LINK "${_fmt_dir}/fmt" "${_fmt_first}/fmt" SYMBOLIC)
    target_include_directories(${target} SYSTEM BEFORE INTERFACE "${_fmt_first}")
    message(STATUS "zinf: LibTorch ships fmt headers; ${target} uses ${_fmt_dir}/fmt")
  endif()
endfunction()
