// Tests of ExtentSpans, NvmeStore's first-fit allocator: exact offsets for first fit, reuse of
// a freed span, merging with both neighbours, and end() dropping when the tail is freed.
#include "offload/extent_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace zinf::offload {
namespace {

constexpr uint64_t kPage = 4096;

TEST(ExtentSpans, TakesFromTheEndWhenNothingIsFree) {
  ExtentSpans spans;
  EXPECT_EQ(spans.end(), 0u);
  EXPECT_EQ(spans.take(kPage), 0u);
  EXPECT_EQ(spans.take(3 * kPage), kPage);
  EXPECT_EQ(spans.take(kPage), 4 * kPage);
  EXPECT_EQ(spans.end(), 5 * kPage);
}

TEST(ExtentSpans, FirstFitTakesTheLowestSpanThatIsLargeEnough) {
  ExtentSpans spans;
  ASSERT_EQ(spans.take(kPage), 0u);
  const uint64_t small = spans.take(2 * kPage);  // [4096, 12288)
  ASSERT_EQ(small, kPage);
  ASSERT_EQ(spans.take(kPage), 3 * kPage);
  const uint64_t large = spans.take(4 * kPage);  // [16384, 32768)
  ASSERT_EQ(large, 4 * kPage);
  ASSERT_EQ(spans.take(kPage), 8 * kPage);
  ASSERT_EQ(spans.end(), 9 * kPage);
  EXPECT_FALSE(spans.give_back(small, 2 * kPage));
  EXPECT_FALSE(spans.give_back(large, 4 * kPage));
  // Too large for the lower hole: the upper one, whose rest [28672, 32768) stays free.
  EXPECT_EQ(spans.take(3 * kPage), 4 * kPage);
  // Both holes fit one page: the lowest wins (not the exact fit at 7 pages).
  EXPECT_EQ(spans.take(kPage), kPage);
  EXPECT_EQ(spans.take(kPage), 2 * kPage);
  EXPECT_EQ(spans.take(kPage), 7 * kPage);
  // Every hole is filled: the next one comes from the end.
  EXPECT_EQ(spans.take(kPage), 9 * kPage);
  EXPECT_EQ(spans.end(), 10 * kPage);
}

TEST(ExtentSpans, ReusesAFreedSpan) {
  ExtentSpans spans;
  const uint64_t first = spans.take(2 * kPage);
  ASSERT_EQ(spans.take(kPage), 2 * kPage);
  EXPECT_FALSE(spans.give_back(first, 2 * kPage));
  EXPECT_EQ(spans.end(), 3 * kPage);
  EXPECT_EQ(spans.take(2 * kPage), 0u);
  EXPECT_EQ(spans.end(), 3 * kPage);
  EXPECT_EQ(spans.take(kPage), 3 * kPage);
}

TEST(ExtentSpans, MergesAFreedSpanWithBothNeighbours) {
  ExtentSpans spans;
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(spans.take(kPage), i * kPage);
  }
  EXPECT_FALSE(spans.give_back(0, kPage));
  EXPECT_FALSE(spans.give_back(2 * kPage, kPage));
  EXPECT_FALSE(spans.give_back(kPage, kPage));  // joins [0, 4096) and [8192, 12288)
  EXPECT_EQ(spans.end(), 4 * kPage);
  // Three pages fit only in the merged span.
  EXPECT_EQ(spans.take(3 * kPage), 0u);
  EXPECT_EQ(spans.end(), 4 * kPage);
  EXPECT_EQ(spans.take(kPage), 4 * kPage);
}

TEST(ExtentSpans, FreeingTheTailLowersTheEnd) {
  ExtentSpans spans;
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_EQ(spans.take(2 * kPage), 2 * i * kPage);
  }
  EXPECT_TRUE(spans.give_back(4 * kPage, 2 * kPage));
  EXPECT_EQ(spans.end(), 4 * kPage);
  EXPECT_FALSE(spans.give_back(0, 2 * kPage));
  EXPECT_EQ(spans.end(), 4 * kPage);
  // The tail merges with the free span before it: the end drops to 0.
  EXPECT_TRUE(spans.give_back(2 * kPage, 2 * kPage));
  EXPECT_EQ(spans.end(), 0u);
  // No free span is left behind at or above the end.
  EXPECT_EQ(spans.take(kPage), 0u);
  EXPECT_EQ(spans.take(kPage), kPage);
  EXPECT_EQ(spans.end(), 2 * kPage);
}

}  // namespace
}  // namespace zinf::offload
