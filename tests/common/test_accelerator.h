// The accelerator the engine's tests run on: "cpu" unless ZINF_TEST_ACCELERATOR names
// another. The `strict` ctest label registers the engine's parity suites a second time with
// ZINF_TEST_ACCELERATOR=strict (tests/engine/CMakeLists.txt), so the same matrix runs on the
// strict device (offload/strict_accelerator.h); ranks launched by run_ranks inherit it.
#pragma once

#include <cstdlib>
#include <string>

namespace zinf::testing {

inline std::string test_accelerator() {
  const char* env = std::getenv("ZINF_TEST_ACCELERATOR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("cpu");
}

}  // namespace zinf::testing
