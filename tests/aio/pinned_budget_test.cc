// The pinned-memory budget: every PinnedBuffer is charged while it lives, a buffer past the
// limit is refused with the numbers before anything is allocated, and the account stays
// exact when many threads allocate at once.
#include "aio/pinned_budget.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "aio/pinned_buffer.h"

namespace zinf::aio {
namespace {

class PinnedBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override { base_ = pinned_memory_usage().in_use; }
  void TearDown() override { reset_pinned_memory_limit(); }
  uint64_t base_ = 0;  // pinned by anything else in this process
};

TEST_F(PinnedBudgetTest, BuffersAreChargedWhileTheyLive) {
  {
    PinnedBuffer a(5000);  // capacity 8192
    PinnedBuffer b(4096);
    EXPECT_EQ(pinned_memory_usage().in_use, base_ + 8192 + 4096);
    PinnedBuffer c(std::move(a));  // a move changes no account
    EXPECT_EQ(pinned_memory_usage().in_use, base_ + 8192 + 4096);
  }
  EXPECT_EQ(pinned_memory_usage().in_use, base_);
  EXPECT_GE(pinned_memory_usage().peak, base_ + 8192 + 4096);
}

TEST_F(PinnedBudgetTest, BufferPastTheLimitIsRefusedWithTheNumbers) {
  set_pinned_memory_limit(base_ + 64 * 1024);
  PinnedBuffer held(48 * 1024);
  try {
    PinnedBuffer refused(32 * 1024);
    FAIL() << "a buffer past the limit was allocated";
  } catch (const PinnedMemoryLimitError& e) {
    EXPECT_EQ(e.requested(), 32u * 1024);
    EXPECT_EQ(e.in_use(), base_ + 48 * 1024);
    EXPECT_EQ(e.limit(), base_ + 64 * 1024);
    const std::string what = e.what();
    EXPECT_NE(what.find("32.00 KiB more requested"), std::string::npos) << what;
    EXPECT_NE(what.find("zinf.pinned_memory_limit"), std::string::npos) << what;
  }
  // The refused buffer took nothing; what fits still works.
  EXPECT_EQ(pinned_memory_usage().in_use, base_ + 48 * 1024);
  PinnedBuffer fits(16 * 1024);
  EXPECT_EQ(pinned_memory_usage().in_use, base_ + 64 * 1024);
}

TEST_F(PinnedBudgetTest, LoweredLimitRefusesUntilMemoryIsFreed) {
  auto held = std::make_unique<PinnedBuffer>(64 * 1024);
  set_pinned_memory_limit(base_ + 16 * 1024);  // below what is pinned now
  EXPECT_THROW(PinnedBuffer(4096), PinnedMemoryLimitError);
  held.reset();
  PinnedBuffer now_fits(16 * 1024);
  EXPECT_THROW(set_pinned_memory_limit(0), std::invalid_argument);
}

TEST_F(PinnedBudgetTest, DefaultLimitIsAFractionOfRam) {
  reset_pinned_memory_limit();
  const PinnedMemoryUsage u = pinned_memory_usage();
  EXPECT_TRUE(u.limit_is_default);
  ASSERT_GT(physical_memory_bytes(), 0u);
  EXPECT_EQ(u.limit, default_pinned_memory_limit());
  EXPECT_EQ(u.limit, static_cast<uint64_t>(static_cast<double>(physical_memory_bytes()) *
                                           kDefaultPinnedFraction));
  const std::string line = describe_pinned_memory();
  EXPECT_NE(line.find("pinned memory:"), std::string::npos) << line;
  EXPECT_NE(line.find("% of"), std::string::npos) << line;
  set_pinned_memory_limit(1 << 20);
  EXPECT_FALSE(pinned_memory_usage().limit_is_default);
  EXPECT_NE(describe_pinned_memory().find("limit 1.00 MiB"), std::string::npos);
}

TEST_F(PinnedBudgetTest, ConcurrentBuffersKeepTheAccountExact) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  set_pinned_memory_limit(base_ + kThreads * 3 * 8192);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kRounds; ++i) {
        PinnedBuffer a(4096 * (1 + (t + i) % 2));
        PinnedBuffer b(100);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(pinned_memory_usage().in_use, base_);
  EXPECT_LE(pinned_memory_usage().peak, base_ + kThreads * 3 * 8192);
}

}  // namespace
}  // namespace zinf::aio
