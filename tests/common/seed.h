// The seed policy shared by the test suites: test_seed() is ZINF_TEST_SEED when that is set
// (parsed with strtoull, base 0, so decimal and 0x-hex both work), else a fresh random seed
// from std::random_device on every call. A test takes its seed once, traces it with
// ZINF_TRACE_SEED, and derives everything random from it, so a failure prints the seed and
// rerunning with ZINF_TEST_SEED=<seed> replays it.
//
// Thread safety: test_seed() only reads the environment and may be called from any thread;
// ZINF_TRACE_SEED (SCOPED_TRACE) applies to the calling thread only.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace zinf::testing {

inline uint64_t test_seed() {
  if (const char* env = std::getenv("ZINF_TEST_SEED"); env != nullptr && *env != '\0') {
    return std::strtoull(env, nullptr, 0);
  }
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) | static_cast<uint64_t>(device());
}

// The message ZINF_TRACE_SEED attaches to failures.
inline std::string seed_trace_message(uint64_t seed) {
  std::string message("seed ");
  message.append(std::to_string(seed));
  message.append(" (rerun with ZINF_TEST_SEED=");
  message.append(std::to_string(seed));
  message.append(")");
  return message;
}

}  // namespace zinf::testing

// Attaches "seed N (rerun with ZINF_TEST_SEED=N)" to every failure in the enclosing scope.
#define ZINF_TRACE_SEED(seed) \
  SCOPED_TRACE(::zinf::testing::seed_trace_message(static_cast<uint64_t>(seed)))
