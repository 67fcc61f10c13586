// Runtime SIMD dispatch: what is available, forcing a level, ZINF_SIMD.
#include "optimizer_cpu/simd_level.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace zinf::optimizer_cpu {
namespace {

TEST(SimdLevelTest, ScalarAndBaselineAreAvailable) {
  const std::vector<SimdLevel> levels = available_simd_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), SimdLevel::kScalar);
#if defined(__x86_64__)
  EXPECT_NE(std::find(levels.begin(), levels.end(), SimdLevel::kSse2), levels.end());
  EXPECT_EQ(std::find(levels.begin(), levels.end(), SimdLevel::kNeon), levels.end());
#endif
}

TEST(SimdLevelTest, DefaultIsWidest) {
  if (std::getenv("ZINF_SIMD") != nullptr) GTEST_SKIP() << "ZINF_SIMD is set";
  reset_simd_level();
  EXPECT_EQ(active_simd(), available_simd_levels().back());
  EXPECT_EQ(active_simd_level(), to_string(available_simd_levels().back()));
}

TEST(SimdLevelTest, ForceAndReset) {
  const SimdLevel before = active_simd();
  for (SimdLevel level : available_simd_levels()) {
    force_simd_level(level);
    EXPECT_EQ(active_simd(), level);
    EXPECT_EQ(active_simd_level(), to_string(level));
  }
  reset_simd_level();
  EXPECT_EQ(active_simd(), before);
}

TEST(SimdLevelTest, RefusesUnavailableLevel) {
#if defined(__x86_64__)
  try {
    force_simd_level(SimdLevel::kNeon);
    FAIL() << "forcing NEON on x86-64 should throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("level"), std::string::npos) << e.what();
  }
  EXPECT_NE(active_simd(), SimdLevel::kNeon);
#else
  GTEST_SKIP() << "only checked on x86-64";
#endif
}

TEST(SimdLevelTest, ParsesNames) {
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kSse2, SimdLevel::kAvx2,
                          SimdLevel::kAvx512, SimdLevel::kNeon}) {
    EXPECT_EQ(parse_simd_level(to_string(level)), level);
  }
  EXPECT_THROW((void)parse_simd_level("avx1024"), std::invalid_argument);
  EXPECT_THROW((void)parse_simd_level(""), std::invalid_argument);
}

// ZINF_SIMD is read once per process: check it in a child process of this very binary.
TEST(SimdLevelTest, EnvironmentSelectsLevel) {
  if (const char* env = std::getenv("ZINF_SIMD")) {
    // In the child: the requested level (scalar is available everywhere) must be active.
    EXPECT_EQ(active_simd_level(), std::string(env));
    return;
  }
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) GTEST_SKIP() << "cannot find /proc/self/exe";
  self[len] = '\0';
  const std::string command = std::string("ZINF_SIMD=scalar '") + self +
                              "' --gtest_filter=SimdLevelTest.EnvironmentSelectsLevel "
                              ">/dev/null 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

}  // namespace
}  // namespace zinf::optimizer_cpu
