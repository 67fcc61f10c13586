// Helpers shared by the offload tests: a self-removing temporary directory, and seeded
// random data whose seed is printed when a test fails.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace zinf::offload::testing {

// A fresh directory under `base` (default: $TMPDIR or /tmp), removed with its contents.
class TempDir {
 public:
  explicit TempDir(const std::string& base = "") {
    std::string root = base;
    if (root.empty()) {
      const char* env = std::getenv("TMPDIR");
      root = env != nullptr && *env != '\0' ? env : "/tmp";
    }
    std::string templ = root + "/zinf_offload_test.XXXXXX";
    std::vector<char> buffer(templ.begin(), templ.end());
    buffer.push_back('\0');
    if (::mkdtemp(buffer.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp under " << root << " failed: " << std::strerror(errno);
    } else {
      path_ = buffer.data();
    }
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) {
      std::filesystem::remove_all(path_, ignored);
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A seed from the environment (ZINF_TEST_SEED) or a random one; tests trace it.
inline uint32_t test_seed() {
  if (const char* env = std::getenv("ZINF_TEST_SEED"); env != nullptr && *env != '\0') {
    return static_cast<uint32_t>(std::stoul(env));
  }
  return std::random_device{}();
}

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

#define ZINF_TRACE_SEED(seed) SCOPED_TRACE("seed " + std::to_string(seed) + " (ZINF_TEST_SEED)")
