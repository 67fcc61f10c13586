# Install rules and the CMake package: `cmake --install build --prefix P` gives
#
#   P/lib/libzinf_*.a              the libraries this build made
#   P/bin/zinf                     the CLI
#   P/include/zinf/<layer>/*.h     public headers, at their repo-relative paths, so a consumer
#                                  includes "engine/engine.h" as zinf's own sources do
#   P/lib/cmake/zinf/              zinfConfig.cmake, zinfConfigVersion.cmake, zinfTargets.cmake
#
# and a consumer writes `find_package(zinf REQUIRED)` and links `zinf::engine`,
# `zinf::zero`, `zinf::aio`, ... (the same names exist as ALIAS targets in this build tree).
# Included at the end of the top-level CMakeLists.txt, after every target exists. A library
# in the list below that this build does not make (ZINF_WITH_TORCH=OFF, or a layer that has
# not landed yet) is skipped. Helper targets the libraries link (zinf_libaio, zinf_torch,
# zinf_nccl) are found by walking the link interfaces and exported with them; the packages
# behind the imported targets they reference are re-found by zinfConfig.cmake.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ZINF_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/zinf")
set(ZINF_INSTALL_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}/zinf")

# The libraries users link, bottom up.
set(_zinf_install_libraries
    zinf_aio
    zinf_optimizer_cpu
    zinf_offload
    zinf_serialization
    zinf_consolidate
    zinf_config
    zinf_data
    zinf_comm
    zinf_zero
    zinf_torch
    zinf_engine)

# The link items of `target` (PRIVATE items of a static library show up as $<LINK_ONLY:x>).
function(_zinf_link_items target out)
  get_target_property(_items ${target} INTERFACE_LINK_LIBRARIES)
  set(_result "")
  foreach(_item IN LISTS _items)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" _item "${_item}")
    if(_item AND NOT _item MATCHES "^\\$<" AND NOT _item STREQUAL "_items-NOTFOUND")
      list(APPEND _result "${_item}")
    endif()
  endforeach()
  set(${out} "${_result}" PARENT_SCOPE)
endfunction()

# Include directories of `target`: the trees of this build stay as they are here
# ($<BUILD_INTERFACE:...>); once installed, <prefix>/include/zinf takes their place.
function(_zinf_install_include_dirs target)
  get_target_property(_dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT _dirs)
    return()
  endif()
  set(_rewritten "")
  set(_in_tree FALSE)
  set(_has_install FALSE)
  foreach(_dir IN LISTS _dirs)
    if(_dir MATCHES "^\\$<INSTALL_INTERFACE:")
      set(_has_install TRUE)
    elseif(NOT _dir MATCHES "^\\$<")
      cmake_path(IS_PREFIX PROJECT_SOURCE_DIR "${_dir}" _in_source)
      cmake_path(IS_PREFIX PROJECT_BINARY_DIR "${_dir}" _in_binary)
      if(_in_source OR _in_binary)
        set(_dir "$<BUILD_INTERFACE:${_dir}>")
        set(_in_tree TRUE)
      endif()
    endif()
    list(APPEND _rewritten "${_dir}")
  endforeach()
  if(_in_tree AND NOT _has_install)
    list(APPEND _rewritten "$<INSTALL_INTERFACE:${ZINF_INSTALL_INCLUDEDIR}>")
  endif()
  set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_rewritten}")
endfunction()

# Every zinf target to export (the listed libraries that exist, and the non-imported targets
# they link) and every imported target the export refers to.
set(_zinf_export_targets "")
set(_zinf_imported_deps "")
set(_zinf_pending "")
foreach(_target IN LISTS _zinf_install_libraries)
  if(TARGET ${_target})
    list(APPEND _zinf_pending ${_target})
  endif()
endforeach()
while(_zinf_pending)
  list(POP_FRONT _zinf_pending _target)
  get_target_property(_aliased ${_target} ALIASED_TARGET)
  if(_aliased)
    set(_target ${_aliased})
  endif()
  if(_target IN_LIST _zinf_export_targets OR _target IN_LIST _zinf_imported_deps)
    continue()
  endif()
  get_target_property(_imported ${_target} IMPORTED)
  if(_imported)
    list(APPEND _zinf_imported_deps ${_target})
    continue()
  endif()
  list(APPEND _zinf_export_targets ${_target})
  _zinf_link_items(${_target} _items)
  foreach(_item IN LISTS _items)
    if(TARGET ${_item})
      list(APPEND _zinf_pending ${_item})
    elseif(_item MATCHES "::" AND NOT _item IN_LIST _zinf_imported_deps)
      # An imported target found in a sub-folder (find_package(ZLIB) in serialization)
      # is not visible here, but the export names it all the same.
      list(APPEND _zinf_imported_deps ${_item})
    endif()
  endforeach()
endwhile()

# Names in the package: zinf_engine -> zinf::engine.
foreach(_target IN LISTS _zinf_export_targets)
  string(REGEX REPLACE "^zinf_" "" _short ${_target})
  set_target_properties(${_target} PROPERTIES EXPORT_NAME ${_short})
  if(NOT TARGET zinf::${_short})
    add_library(zinf::${_short} ALIAS ${_target})
  endif()
  _zinf_install_include_dirs(${_target})
endforeach()

install(TARGETS ${_zinf_export_targets}
        EXPORT zinfTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# The CLI. Its shared dependencies outside the system's folders (the CUDA runtime, NCCL) are
# found through the install RPATH.
if(TARGET zinf)
  set_target_properties(zinf PROPERTIES EXPORT_NAME zinf INSTALL_RPATH_USE_LINK_PATH TRUE)
  _zinf_install_include_dirs(zinf)
  if(NOT TARGET zinf::zinf)
    add_executable(zinf::zinf ALIAS zinf)
  endif()
  install(TARGETS zinf EXPORT zinfTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# `cmake --build build --target zinf_installable` builds everything `cmake --install` copies
# (tests/install runs it first, so the test also works after a partial build).
add_custom_target(zinf_installable)
foreach(_target IN LISTS _zinf_export_targets ITEMS zinf)
  if(TARGET ${_target})
    add_dependencies(zinf_installable ${_target})
  endif()
endforeach()

# A sanitizer build's libraries need the sanitizer's runtime in whatever links them.
if(ZINF_SANITIZER_FLAGS)
  foreach(_target IN LISTS _zinf_export_targets)
    foreach(_flag IN LISTS ZINF_SANITIZER_FLAGS)
      string(REPLACE "," "$<COMMA>" _flag "${_flag}")
      set_property(TARGET ${_target} APPEND PROPERTY INTERFACE_LINK_OPTIONS
                                                     "$<INSTALL_INTERFACE:${_flag}>")
    endforeach()
  endforeach()
endif()

# ---- headers ---------------------------------------------------------------------------------
# Each exported library's headers (its folder, less sub-folders that are libraries of their
# own), plus every repo header they include ("zero/zero_config.h" from engine/config), so the
# installed headers compile on their own whichever layers this build made.
set(_zinf_headers "")
foreach(_target IN LISTS _zinf_export_targets)
  get_target_property(_dir ${_target} SOURCE_DIR)
  if(_dir STREQUAL PROJECT_SOURCE_DIR)
    continue()  # helper targets declared in cmake/ have no headers of their own
  endif()
  file(GLOB_RECURSE _found CONFIGURE_DEPENDS RELATIVE "${PROJECT_SOURCE_DIR}" "${_dir}/*.h")
  foreach(_header IN LISTS _found)
    # Skip a header that lives under a sub-folder with its own CMakeLists.txt.
    cmake_path(GET _header PARENT_PATH _parent)
    set(_own_library FALSE)
    while(_parent AND NOT "${PROJECT_SOURCE_DIR}/${_parent}" STREQUAL _dir)
      if(EXISTS "${PROJECT_SOURCE_DIR}/${_parent}/CMakeLists.txt")
        set(_own_library TRUE)
        break()
      endif()
      cmake_path(GET _parent PARENT_PATH _parent)
    endwhile()
    if(NOT _own_library)
      list(APPEND _zinf_headers ${_header})
    endif()
  endforeach()
endforeach()
set(_zinf_pending ${_zinf_headers})
while(_zinf_pending)
  list(POP_FRONT _zinf_pending _header)
  file(STRINGS "${PROJECT_SOURCE_DIR}/${_header}" _includes REGEX "^#include \"[^\"]+\"")
  foreach(_line IN LISTS _includes)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" _included "${_line}")
    if(EXISTS "${PROJECT_SOURCE_DIR}/${_included}" AND NOT _included IN_LIST _zinf_headers)
      list(APPEND _zinf_headers ${_included})
      list(APPEND _zinf_pending ${_included})
    endif()
  endforeach()
endwhile()
list(REMOVE_DUPLICATES _zinf_headers)
foreach(_header IN LISTS _zinf_headers)
  cmake_path(GET _header PARENT_PATH _parent)
  install(FILES "${PROJECT_SOURCE_DIR}/${_header}"
          DESTINATION "${ZINF_INSTALL_INCLUDEDIR}/${_parent}")
endforeach()

# ---- package ---------------------------------------------------------------------------------
# What zinfConfig.cmake must find before it loads zinfTargets.cmake: the package behind each
# imported target the export refers to.
set(_zinf_dependency_lines "")
set(_zinf_find_torch FALSE)
foreach(_dep IN LISTS _zinf_imported_deps)
  if(_dep MATCHES "^PkgConfig::(.+)$")
    set(_prefix ${CMAKE_MATCH_1})
    set(_module ${${_prefix}_MODULE_NAME})
    list(APPEND _zinf_dependency_lines "find_dependency(PkgConfig)"
         "pkg_check_modules(${_prefix} QUIET IMPORTED_TARGET ${_module})
if(NOT ${_prefix}_FOUND)
  set(zinf_NOT_FOUND_MESSAGE \"zinf needs pkg-config's ${_module}, which was not found\")
  set(zinf_FOUND FALSE)
  return()
endif()")
  elseif(_dep MATCHES "^CUDA::")
    list(APPEND _zinf_dependency_lines "find_dependency(CUDAToolkit)")
  elseif(_dep MATCHES "^(Threads|TBB|fmt|spdlog|nlohmann_json|CLI11|ZLIB|libzip)::")
    list(APPEND _zinf_dependency_lines "find_dependency(${CMAKE_MATCH_1})")
  elseif(_dep MATCHES "^(torch|torch_library|torch_cpu|torch_cuda|c10|c10_cuda)$")
    set(_zinf_find_torch TRUE)
  else()
    message(WARNING "zinf: the exported targets refer to ${_dep}; cmake/zinf_install.cmake "
                    "does not know the package that provides it, so find_package(zinf) will "
                    "not find it.")
  endif()
endforeach()
if(_zinf_find_torch)
  # LibTorch's own package (TorchConfig.cmake) defines torch, torch_library and c10. It is found
  # as zinf's build found it (cmake/zinf_find_torch.cmake, installed beside zinfConfig.cmake),
  # by default the same LibTorch, whose libraries zinf::torch names by their paths.
  list(APPEND _zinf_dependency_lines
       "include(\"\${CMAKE_CURRENT_LIST_DIR}/zinf_find_torch.cmake\")"
       "if(NOT Torch_DIR)\n  set(Torch_DIR \"${Torch_DIR}\")\nendif()"
       "zinf_find_torch()")
  install(FILES "${CMAKE_CURRENT_LIST_DIR}/zinf_find_torch.cmake"
          DESTINATION ${ZINF_INSTALL_CMAKEDIR})
endif()
list(REMOVE_DUPLICATES _zinf_dependency_lines)
list(JOIN _zinf_dependency_lines "\n" ZINF_CONFIG_DEPENDENCIES)
set(ZINF_CONFIG_TARGETS "")
foreach(_target IN LISTS _zinf_export_targets)
  get_target_property(_short ${_target} EXPORT_NAME)
  string(APPEND ZINF_CONFIG_TARGETS " zinf::${_short}")
endforeach()
string(STRIP "${ZINF_CONFIG_TARGETS}" ZINF_CONFIG_TARGETS)

install(EXPORT zinfTargets NAMESPACE zinf:: DESTINATION ${ZINF_INSTALL_CMAKEDIR})
configure_package_config_file(
  "${CMAKE_CURRENT_LIST_DIR}/zinfConfig.cmake.in" "${PROJECT_BINARY_DIR}/zinfConfig.cmake"
  INSTALL_DESTINATION ${ZINF_INSTALL_CMAKEDIR})
write_basic_package_version_file("${PROJECT_BINARY_DIR}/zinfConfigVersion.cmake"
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/zinfConfig.cmake"
              "${PROJECT_BINARY_DIR}/zinfConfigVersion.cmake"
        DESTINATION ${ZINF_INSTALL_CMAKEDIR})
