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
