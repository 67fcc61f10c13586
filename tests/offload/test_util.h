// Helpers shared by the offload tests: random data drawn from a seeded generator, and a
// check for /dev/shm. The temporary directory and the seed policy (test_seed(),
// ZINF_TRACE_SEED) are the shared ones in tests/common.
//
// Thread safety: the helpers hold no state; a generator passed in must not be shared.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace zinf::offload::testing {

inline std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t bytes) {
  std::vector<uint8_t> data(bytes);
  for (auto& b : data) {
    b = static_cast<uint8_t>(rng());
  }
  return data;
}

inline std::vector<float> random_floats(std::mt19937& rng, size_t numel, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> data(numel);
  for (auto& x : data) {
    x = normal(rng);
  }
  return data;
}

// Whether /dev/shm is a usable tmpfs for the buffered-fallback tests.
inline bool have_dev_shm() { return std::filesystem::is_directory("/dev/shm"); }

}  // namespace zinf::offload::testing
