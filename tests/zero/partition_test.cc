// PartitionLayout: slices, padding, sub-groups and overlaps, against a brute-force model of
// the layout on random parameter lists.

#include "zero/partition.h"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <vector>

#include "tests/common/seed.h"
#include "zero/error.h"

namespace zinf::zero {
namespace {

TEST(PartitionLayout, SlicesCoverEveryElementOnceAcrossRanks) {
  const uint64_t seed = testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 5);
    std::vector<uint64_t> numels(1 + rng() % 12);
    for (uint64_t& n : numels) n = 1 + rng() % 100;
    const uint64_t sub_group = 1 + rng() % 64;
    // owner[p][e]: how many ranks own element e of param p (must be exactly one).
    std::vector<std::vector<int>> owners(numels.size());
    for (size_t p = 0; p < numels.size(); ++p) owners[p].assign(numels[p], 0);
    uint64_t partition_numel = 0;
    for (int r = 0; r < world; ++r) {
      PartitionLayout layout(numels, world, r, sub_group);
      if (r == 0) {
        partition_numel = layout.partition_numel();
      }
      EXPECT_EQ(layout.partition_numel(), partition_numel) << "rank " << r;
      uint64_t offset = 0;
      for (size_t p = 0; p < numels.size(); ++p) {
        const ParamSlice& s = layout.slice(p);
        EXPECT_EQ(s.slice_numel, (numels[p] + world - 1) / world);
        EXPECT_EQ(s.partition_offset, offset);
        offset += s.slice_numel;
        for (uint64_t e = 0; e < s.valid_numel; ++e) {
          ++owners[p][s.slice_begin + e];
        }
        EXPECT_LE(s.valid_numel, s.slice_numel);
      }
      EXPECT_EQ(offset, layout.partition_numel());
      // Sub-groups tile the partition in order, each at most sub_group elements.
      uint64_t covered = 0;
      for (const SubGroupRange& g : layout.sub_groups()) {
        EXPECT_EQ(g.offset, covered);
        EXPECT_GT(g.numel, 0u);
        EXPECT_LE(g.numel, sub_group);
        covered += g.numel;
      }
      EXPECT_EQ(covered, layout.partition_numel());
    }
    for (size_t p = 0; p < numels.size(); ++p) {
      for (uint64_t e = 0; e < numels[p]; ++e) {
        ASSERT_EQ(owners[p][e], 1) << "param " << p << " element " << e << " world " << world;
      }
    }
  }
}

TEST(PartitionLayout, OverlapsMatchABruteForceMap) {
  const uint64_t seed = testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 30; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 4);
    std::vector<uint64_t> numels(1 + rng() % 10);
    for (uint64_t& n : numels) n = 1 + rng() % 50;
    PartitionLayout layout(numels, world, static_cast<int>(rng() % world), 1 + rng() % 40);
    // Brute force: partition element -> (param, slice offset).
    std::vector<std::pair<size_t, uint64_t>> map;
    for (size_t p = 0; p < numels.size(); ++p) {
      for (uint64_t e = 0; e < layout.slice(p).slice_numel; ++e) map.push_back({p, e});
    }
    ASSERT_EQ(map.size(), layout.partition_numel());
    const uint64_t begin = rng() % map.size();
    const uint64_t count = rng() % (map.size() - begin + 1);
    uint64_t next = begin;
    layout.for_each_overlap(
        begin, count,
        [&](size_t p, uint64_t slice_offset, uint64_t partition_offset, uint64_t numel) {
          EXPECT_EQ(partition_offset, next);
          EXPECT_GT(numel, 0u);
          for (uint64_t k = 0; k < numel; ++k) {
            ASSERT_EQ(map[partition_offset + k].first, p);
            ASSERT_EQ(map[partition_offset + k].second, slice_offset + k);
          }
          next += numel;
        });
    EXPECT_EQ(next, begin + count);
  }
}

TEST(PartitionLayout, PaddingOnlySlicesOfTheLastRanks) {
  // 5 elements over 4 ranks: slices of 2; rank 2 owns element 4 and a pad, rank 3 only pads.
  PartitionLayout r2({5}, 4, 2, 100);
  EXPECT_EQ(r2.slice(0).slice_numel, 2u);
  EXPECT_EQ(r2.slice(0).slice_begin, 4u);
  EXPECT_EQ(r2.slice(0).valid_numel, 1u);
  PartitionLayout r3({5}, 4, 3, 100);
  EXPECT_EQ(r3.slice(0).valid_numel, 0u);
  EXPECT_EQ(r3.partition_numel(), 2u);
}

TEST(PartitionLayout, RejectsBadArguments) {
  EXPECT_THROW(PartitionLayout({1}, 0, 0, 1), ZeroError);
  EXPECT_THROW(PartitionLayout({1}, 2, 2, 1), ZeroError);
  EXPECT_THROW(PartitionLayout({1}, 1, 0, 0), ZeroError);
  try {
    PartitionLayout({3, 0}, 1, 0, 1);
    FAIL() << "a parameter without elements was accepted";
  } catch (const ZeroError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zinf::zero
