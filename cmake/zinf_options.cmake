# Compiler flags applied to zinf's own targets through zinf_target_defaults(); third-party
# headers are included as SYSTEM so their warnings never fail the build.

set(ZINF_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
    -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough -Wformat=2)
if(ZINF_WERROR)
  list(APPEND ZINF_WARNINGS -Werror)
endif()

set(ZINF_SANITIZER_FLAGS "")
if(ZINF_SANITIZE)
  set(ZINF_SANITIZER_FLAGS -fsanitize=${ZINF_SANITIZE} -fno-omit-frame-pointer
      -fno-sanitize-recover=all)
  add_compile_options(${ZINF_SANITIZER_FLAGS})
  add_link_options(${ZINF_SANITIZER_FLAGS})
  # GCC 12 under ASan warns that std::regex's inlined std::function moves "may be used
  # uninitialized" (a false positive, GCC bug 105616; engine/checkpoint.cc). The warning stays
  # an error in every other build.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND ZINF_SANITIZE MATCHES "address")
    list(APPEND ZINF_WARNINGS -Wno-maybe-uninitialized)
  endif()
endif()

# Apply zinf's warning set to a target built from our sources.
function(zinf_target_defaults target)
  target_compile_options(${target} PRIVATE ${ZINF_WARNINGS})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()

# zinf_add_test(NAME name SOURCES ... LIBS ... [LABELS ...] [TIMEOUT s])
# One GoogleTest executable registered with CTest, one CTest entry per test case.
function(zinf_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  zinf_target_defaults(${T_NAME})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  # gtest_discover_tests flattens PROPERTIES, so a list of labels would lose all but the
  # first: the labels are joined into one ("aio,tsan"). `ctest -L` takes a regular
  # expression, so `-L tsan` and `-L aio` both select such a test.
  string(JOIN "," _labels ${T_LABELS})
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60
                       PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${_labels}")
endfunction()

# zinf_add_strict_tests(TARGET target FILTER gtest-filter [TIMEOUT s])
# Registers the test cases of `target` that match FILTER a second time, as "strict:<case>"
# with the label "strict", run with ZINF_TEST_ACCELERATOR=strict: the same suite on the
# strict device (tests/common/test_accelerator.h).
function(zinf_add_strict_tests)
  cmake_parse_arguments(S "" "TARGET;FILTER;TIMEOUT" "" ${ARGN})
  if(NOT S_TIMEOUT)
    set(S_TIMEOUT 600)
  endif()
  gtest_discover_tests(${S_TARGET} DISCOVERY_TIMEOUT 60 TEST_PREFIX "strict:"
                       TEST_FILTER "${S_FILTER}"
                       PROPERTIES TIMEOUT ${S_TIMEOUT} LABELS "strict"
                                  ENVIRONMENT "ZINF_TEST_ACCELERATOR=strict")
endfunction()

# zinf_sanitized_torch_tests: the executables of every zinf_add_sanitized_tests() call, so a
# sanitized build of the LibTorch layers builds only what `ctest -L torch-san` runs (.ci/run).
if(ZINF_SANITIZE AND ZINF_WITH_TORCH)
  add_custom_target(zinf_sanitized_torch_tests)
endif()

# zinf_add_sanitized_tests(TARGET target FILTER gtest-filter [TIMEOUT s])
# In a sanitized build with LibTorch (ZINF_SANITIZE set, ZINF_WITH_TORCH on; a no-op in any
# other build): registers the cases of `target` that match FILTER a second time, as
# "san:<case>" with the label "torch-san", and links tests/common/sanitized_torch_runtime.cc
# into it (LibTorch, libgloo and libtbb are Debian's uninstrumented builds; that file says
# what that means for each sanitizer). The filters keep the sanitized suites to what they
# prove: the ZeRO layer, the Gloo communicator and the engine's threads, not every case.
function(zinf_add_sanitized_tests)
  cmake_parse_arguments(S "" "TARGET;FILTER;TIMEOUT" "" ${ARGN})
  if(NOT TARGET zinf_sanitized_torch_tests)
    return()
  endif()
  if(NOT S_TIMEOUT)
    set(S_TIMEOUT 600)
  endif()
  target_sources(${S_TARGET} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common/sanitized_torch_runtime.cc)
  target_link_libraries(${S_TARGET} PRIVATE TBB::tbb)
  add_dependencies(zinf_sanitized_torch_tests ${S_TARGET})
  gtest_discover_tests(${S_TARGET} DISCOVERY_TIMEOUT 120 TEST_PREFIX "san:"
                       TEST_FILTER "${S_FILTER}"
                       PROPERTIES TIMEOUT ${S_TIMEOUT} LABELS "torch-san")
endfunction()
