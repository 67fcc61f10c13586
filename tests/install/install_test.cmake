# Run by CTest (tests/install/CMakeLists.txt) as `cmake -P`: installs zinf's build
# ZINF_BUILD_DIR into a fresh prefix under ZINF_WORK_DIR, configures and builds the project
# ZINF_PROJECT_DIR against that prefix alone, and runs its ZINF_PROGRAM [ZINF_ARG] in a
# scratch folder. Passes when every stage succeeds, the project found zinf in the prefix,
# and the output matches ZINF_EXPECT (a regex) and, with ZINF_STEPS, holds a finite loss line
# "step N loss X" for exactly steps 1..ZINF_STEPS. The work folder is removed on success and
# kept (its path printed) on failure.
cmake_minimum_required(VERSION 3.25)
foreach(_var ZINF_BUILD_DIR ZINF_PROJECT_DIR ZINF_WORK_DIR ZINF_GENERATOR ZINF_PROGRAM)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "install_test.cmake: ${_var} is not set")
  endif()
endforeach()

set(_prefix "${ZINF_WORK_DIR}/prefix")
set(_project_build "${ZINF_WORK_DIR}/build")
set(_scratch "${ZINF_WORK_DIR}/run")
file(REMOVE_RECURSE "${ZINF_WORK_DIR}")
file(MAKE_DIRECTORY "${_scratch}")

# Runs one stage; on failure prints its output and stops the test.
function(zinf_stage name timeout_s)
  execute_process(COMMAND ${ARGN}
                  WORKING_DIRECTORY "${_scratch}"
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out
                  TIMEOUT ${timeout_s})
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${_rc}):\n  ${ARGN}\n${_out}\n"
                        "work folder kept: ${ZINF_WORK_DIR}")
  endif()
  set(ZINF_STAGE_OUTPUT "${_out}" PARENT_SCOPE)
endfunction()

# What `cmake --install` copies must exist: build it (a no-op after a full build).
zinf_stage("build" 600 "${CMAKE_COMMAND}" --build "${ZINF_BUILD_DIR}" --target zinf_installable)
zinf_stage("install" 120 "${CMAKE_COMMAND}" --install "${ZINF_BUILD_DIR}" --prefix "${_prefix}")
foreach(_file lib/cmake/zinf/zinfConfig.cmake lib/cmake/zinf/zinfConfigVersion.cmake
              lib/cmake/zinf/zinfTargets.cmake include/zinf/aio/handle.h bin/zinf)
  if(NOT EXISTS "${_prefix}/${_file}")
    message(FATAL_ERROR "install: ${_prefix}/${_file} is missing")
  endif()
endforeach()

# The project sees the prefix only: no package registry, and zinf's build and source trees
# are nowhere on its search path.
set(_configure "${CMAKE_COMMAND}" -S "${ZINF_PROJECT_DIR}" -B "${_project_build}"
    -G "${ZINF_GENERATOR}" "-DCMAKE_PREFIX_PATH=${_prefix}"
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
foreach(_pair "CMAKE_BUILD_TYPE=${ZINF_BUILD_TYPE}" "CMAKE_C_COMPILER=${ZINF_C_COMPILER}"
              "CMAKE_CXX_COMPILER=${ZINF_CXX_COMPILER}"
              "CMAKE_CXX_COMPILER_LAUNCHER=${ZINF_COMPILER_LAUNCHER}")
  if(NOT _pair MATCHES "=$")
    list(APPEND _configure "-D${_pair}")
  endif()
endforeach()
zinf_stage("configure ${ZINF_PROJECT_DIR}" 240 ${_configure})
file(STRINGS "${_project_build}/CMakeCache.txt" _zinf_dir REGEX "^zinf_DIR:")
if(NOT _zinf_dir STREQUAL "zinf_DIR:PATH=${_prefix}/lib/cmake/zinf")
  message(FATAL_ERROR "${ZINF_PROJECT_DIR} found zinf at '${_zinf_dir}', not in ${_prefix}")
endif()
zinf_stage("build ${ZINF_PROJECT_DIR}" 300 "${CMAKE_COMMAND}" --build "${_project_build}")

zinf_stage("${ZINF_PROGRAM} ${ZINF_ARG}" 120 "${_project_build}/${ZINF_PROGRAM}" ${ZINF_ARG})
message("${ZINF_STAGE_OUTPUT}")
if(ZINF_EXPECT AND NOT ZINF_STAGE_OUTPUT MATCHES "${ZINF_EXPECT}")
  message(FATAL_ERROR "${ZINF_PROGRAM} printed nothing matching '${ZINF_EXPECT}'; "
                      "work folder kept: ${ZINF_WORK_DIR}")
endif()
if(ZINF_STEPS)
  foreach(_step RANGE 1 ${ZINF_STEPS})
    if(NOT ZINF_STAGE_OUTPUT MATCHES "\nstep ${_step} loss [0-9]+\\.[0-9]+ ")
      message(FATAL_ERROR "${ZINF_PROGRAM} printed no finite loss for step ${_step}; "
                          "work folder kept: ${ZINF_WORK_DIR}")
    endif()
  endforeach()
  math(EXPR _next "${ZINF_STEPS} + 1")
  if(ZINF_STAGE_OUTPUT MATCHES "\nstep ${_next} ")
    message(FATAL_ERROR "${ZINF_PROGRAM} ran more than the ${ZINF_STEPS} steps it was asked for")
  endif()
endif()
file(REMOVE_RECURSE "${ZINF_WORK_DIR}")
