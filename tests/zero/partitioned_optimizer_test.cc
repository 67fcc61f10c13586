// Tests of PartitionedOptimizer's gradient accumulation on NVMe against the same partition
// in memory: equal results bit for bit, and the NVMe bytes it moves (the sub-group staged at
// the end of a micro-batch stays staged: its sums are not written and read back).
#include "zero/partitioned_optimizer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "offload/nvme_store.h"
#include "optimizer_cpu/adam.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "zero/comm/single_communicator.h"

namespace zinf::zero {
namespace {

using offload::OptimizerState;
using zinf::testing::TempDir;
using zinf::testing::test_seed;

struct Trained {
  std::vector<float> params;
  uint64_t bytes_read_before_step = 0;  // optimizer tier NVMe reads during accumulation
  uint64_t bytes_written_before_step = 0;
  uint64_t set_bytes_before_step = 0;  // grads copied into the swapper's buffer sets
  std::vector<uint16_t> copies;        // the last step's bf16 params, as the sink saw them
  OverlapStats overlap;
};

// Two steps of `micro_batches` micro-batches; each micro-batch adds seeded grads for every
// parameter in backward order (last parameter first), each as one gradient.
Trained train(OffloadTarget tier, uint64_t sub_group_size, const std::vector<uint64_t>& numels,
              uint32_t seed, const std::string& dir, int micro_batches = 4, bool overlap = false,
              bool host_grads = false, size_t window = 0) {
  PartitionLayout layout(numels, 1, 0, sub_group_size);
  ZeroConfig config;
  config.stage = 3;
  config.gradient_accumulation_steps = micro_batches;
  config.sub_group_size = sub_group_size;
  config.offload_optimizer = tier;
  config.precision = Precision::kBFloat16;  // the sink's copies: bf16
  config.overlap_optimizer = overlap;
  config.host_grads = host_grads && tier == OffloadTarget::kNvme;
  config.overlap_sub_groups = window;
  optimizer_cpu::AdamOptimizer adam;
  std::unique_ptr<offload::NvmeStore> store;
  if (tier == OffloadTarget::kNvme) {
    offload::NvmeStoreConfig sc;
    sc.nvme_path = dir;
    sc.name = "optimizer";
    sc.aio.backend = aio::BackendKind::kPsync;
    store = std::make_unique<offload::NvmeStore>(sc);
  }
  SingleCommunicator comm;
  PartitionedOptimizer opt(layout, config, adam, store.get(), nullptr, comm, true);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> master(layout.partition_numel());
  for (float& x : master) x = normal(rng);
  opt.append_master(master.data(), master.size());
  opt.finish_master();
  Trained run;
  for (int64_t step = 1; step <= 2; ++step) {
    const offload::OffloadCounters before = opt.swapper().counters();
    for (int mb = 0; mb < micro_batches; ++mb) {
      if (overlap && mb + 1 == micro_batches) opt.speculate_step(step, 1.0);
      opt.begin_micro_batch(mb);
      for (size_t p = numels.size(); p-- > 0;) {
        const ParamSlice& s = layout.slice(p);
        std::vector<float> grads(s.numel);
        for (float& g : grads) g = normal(rng);
        opt.accumulate(s.partition_offset, grads.data(), DType::kFloat32, s.numel, 0.5f);
      }
      opt.end_micro_batch();
    }
    const offload::OffloadCounters after = opt.swapper().counters();
    run.bytes_read_before_step = after.nvme_bytes_read - before.nvme_bytes_read;
    run.bytes_written_before_step = after.nvme_bytes_written - before.nvme_bytes_written;
    run.set_bytes_before_step = after.cpu_bytes_written - before.cpu_bytes_written;
    run.copies.assign(layout.partition_numel(), 0);
    const OptimizerStepOutcome outcome =
        opt.step(step, 1.0, [&](uint64_t offset, const void* data, uint64_t numel) {
          std::memcpy(run.copies.data() + offset, data, numel * sizeof(uint16_t));
        });
    EXPECT_FALSE(outcome.skipped);
  }
  run.params.resize(layout.partition_numel());
  opt.swapper().read_state(OptimizerState::kParams, run.params.data());
  run.overlap = opt.overlap_stats();
  return run;
}

TEST(PartitionedOptimizer, NvmeAccumulationMatchesMemoryAndReadsNoGradsBack) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  const std::vector<uint64_t> numels = {3000, 1000, 500};
  // One sub-group: its grads stay staged over the micro-batches and are handed over once per
  // step, into the swapper's buffer set (which has that sub-group to itself), not to disk.
  const Trained memory = train(OffloadTarget::kCpu, 1'000'000, numels, seed, dir.path());
  const Trained nvme = train(OffloadTarget::kNvme, 1'000'000, numels, seed, dir.path());
  EXPECT_EQ(nvme.params, memory.params);
  EXPECT_EQ(nvme.bytes_read_before_step, 0u);
  EXPECT_EQ(nvme.bytes_written_before_step, 0u);
  EXPECT_EQ(nvme.set_bytes_before_step, 4500u * sizeof(float));
  // Several sub-groups (grads arrive last first): still equal; only the sub-group staged
  // last stays in memory between micro-batches.
  const Trained split = train(OffloadTarget::kNvme, 1024, numels, seed, dir.path());
  EXPECT_EQ(split.params, memory.params);
  EXPECT_GT(split.bytes_read_before_step, 0u);
}

// One micro-batch, sub-groups of 1024 elements: the parameters (last first) cross sub-group
// boundaries, and each sub-group is staged once, written once and never read back before
// the step.
TEST(PartitionedOptimizer, GradientsAcrossSubGroupsAreNotReadBackInTheBackwardOrder) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  const std::vector<uint64_t> numels = {3000, 1000, 500};
  const Trained memory = train(OffloadTarget::kCpu, 1024, numels, seed, dir.path(), 1);
  const Trained nvme = train(OffloadTarget::kNvme, 1024, numels, seed, dir.path(), 1);
  EXPECT_EQ(nvme.params, memory.params);
  EXPECT_EQ(nvme.bytes_read_before_step, 0u);
  EXPECT_EQ(nvme.bytes_written_before_step, 4500u * sizeof(float));
}

// zinf.overlap_optimizer: the sub-groups final during the last micro-batch are updated on the
// optimizer's background thread while later gradients still arrive (this test's "backward"),
// and the result equals the plain step's bit for bit — master params and the sink's bf16
// copies — on both tiers, with one micro-batch and with several.
TEST(PartitionedOptimizer, OverlappedUpdatesEqualThePlainStepOnBothTiers) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const std::vector<uint64_t> numels = {700, 1300, 50, 2048, 999, 3};
  for (const OffloadTarget tier : {OffloadTarget::kCpu, OffloadTarget::kNvme}) {
    for (const int micro_batches : {1, 3}) {
      SCOPED_TRACE(std::string(tier == OffloadTarget::kNvme ? "nvme" : "cpu") + ", " +
                   std::to_string(micro_batches) + " micro-batches");
      TempDir dir;
      const Trained plain = train(tier, 500, numels, seed, dir.path(), micro_batches);
      const Trained overlapped = train(tier, 500, numels, seed, dir.path(), micro_batches, true);
      EXPECT_EQ(plain.params, overlapped.params);
      EXPECT_EQ(plain.copies, overlapped.copies);
      EXPECT_EQ(plain.overlap.speculated, 0u);
      // 11 sub-groups of 500, each updated as its last gradient arrives (the first two by
      // the last gradient), in both steps.
      EXPECT_EQ(overlapped.overlap.committed, 2u * 11u);
      EXPECT_EQ(overlapped.overlap.rolled_back, 0u);
    }
  }
}

// A window of the last 4 of 11 sub-groups (ZeroConfig::overlap_sub_groups, what fit_defaults
// sets where the whole overlap does not fit): only those are updated behind the backward, the
// rest by the step, and the result is the plain step's on both tiers.
TEST(PartitionedOptimizer, AnOverlapWindowUpdatesOnlyItsSubGroupsBehindTheBackward) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const std::vector<uint64_t> numels = {700, 1300, 50, 2048, 999, 3};
  for (const OffloadTarget tier : {OffloadTarget::kCpu, OffloadTarget::kNvme}) {
    SCOPED_TRACE(tier == OffloadTarget::kNvme ? "nvme" : "cpu");
    TempDir dir;
    const Trained plain = train(tier, 500, numels, seed, dir.path(), 3);
    const Trained windowed = train(tier, 500, numels, seed, dir.path(), 3, true, false, 4);
    EXPECT_EQ(plain.params, windowed.params);
    EXPECT_EQ(plain.copies, windowed.copies);
    EXPECT_EQ(windowed.overlap.committed, 2u * 4u);
    EXPECT_EQ(windowed.overlap.speculated, 2u * 4u);
  }
  EXPECT_EQ(PartitionedOptimizer::overlap_host_bytes(
                [] {
                  ZeroConfig c;
                  c.overlap_optimizer = true;
                  c.overlap_sub_groups = 2;
                  return c;
                }(),
                {500, 500, 500, 7}),
            (500u + 7u) * 4u);  // fp32: the last two sub-groups' params
}

// zinf.grad_offload "cpu": with the optimizer on NVMe the grads accumulate in host memory.
// Several sub-groups and micro-batches: the same params and copies as the in-memory tier,
// with and without the overlap, and not one grad byte moved to or from the disk before the
// step (on NVMe each micro-batch writes and reads back the sums of all but one sub-group).
TEST(PartitionedOptimizer, HostGradsOnNvmeMatchMemoryAndMoveNoGradBytes) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const std::vector<uint64_t> numels = {700, 1300, 50, 2048, 999, 3};
  TempDir dir;
  const Trained memory = train(OffloadTarget::kCpu, 500, numels, seed, dir.path());
  const Trained on_disk = train(OffloadTarget::kNvme, 500, numels, seed, dir.path());
  EXPECT_EQ(on_disk.params, memory.params);
  EXPECT_GT(on_disk.bytes_read_before_step, 0u);
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    const Trained host =
        train(OffloadTarget::kNvme, 500, numels, seed, dir.path(), 4, overlap, true);
    EXPECT_EQ(host.params, memory.params);
    EXPECT_EQ(host.copies, memory.copies);
    // Without the overlap the disk sees nothing before the step; with it, the speculated
    // updates of the last micro-batch read p, m and v and write them to spare extents.
    if (!overlap) {
      EXPECT_EQ(host.bytes_read_before_step, 0u);
      EXPECT_EQ(host.bytes_written_before_step, 0u);
    } else {
      EXPECT_EQ(host.overlap.committed, 2u * 11u);
    }
  }
}

}  // namespace
}  // namespace zinf::zero
