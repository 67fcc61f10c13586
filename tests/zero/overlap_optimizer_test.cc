// zinf.overlap_optimizer on one rank (tests/zero/overlap_train.h says what is checked): every
// stage with the optimizer on CPU and on NVMe, gradient accumulation, fp16 with a dynamic
// loss scale. Two ranks: zero_multirank_test's "overlap" suite.

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "tests/zero/overlap_train.h"
#include "zero/comm/single_communicator.h"

namespace zinf::zero {
namespace {

using testing::OverlapPlan;

void expect_identical(const OverlapPlan& plan) {
  const uint64_t seed = ::zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  SingleCommunicator comm;
  testing::expect_overlap_identical(plan, seed, comm);
}

TEST(OverlapOptimizer, EveryStageOnTheCpuTierIsBitIdenticalWithClippingAndOverflow) {
  for (int stage = 1; stage <= 3; ++stage) {
    for (bool inject : {false, true}) {
      OverlapPlan p;
      p.name = "stage " + std::to_string(stage) + (inject ? ", Inf" : ", clipping");
      p.config.stage = stage;
      p.config.offload_optimizer = OffloadTarget::kCpu;
      p.config.sub_group_size = 97;
      p.boost = !inject;
      p.inject = inject;
      expect_identical(p);
    }
  }
}

TEST(OverlapOptimizer, NvmeTierIsBitIdenticalWithClippingOverflowAndAccumulation) {
  ::zinf::testing::TempDir dir;
  for (const bool pipeline : {false, true}) {
    OverlapPlan p;
    p.name = std::string("nvme, clipping and Inf") + (pipeline ? ", pipelined" : "");
    p.config = testing::overlap_on_nvme(dir.path());
    p.config.pipeline_read = p.config.pipeline_write = pipeline;
    p.boost = p.inject = true;
    expect_identical(p);
  }
  OverlapPlan accumulated;
  accumulated.name = "nvme, 3 micro-batches, params on nvme";
  accumulated.config = testing::overlap_on_nvme(dir.path());
  accumulated.config.offload_param = OffloadTarget::kNvme;
  accumulated.config.param_persistence_threshold = 13;
  accumulated.micro_batches = 3;
  accumulated.boost = true;
  expect_identical(accumulated);
  accumulated.name = "nvme, 3 micro-batches, grads in host memory, clipping and Inf";
  accumulated.config.offload_param = OffloadTarget::kNone;
  accumulated.config.host_grads = true;
  accumulated.inject = true;
  expect_identical(accumulated);
}

// zinf.grad_offload "cpu" against "nvme", both without the overlap: the grads summed in host
// memory give the same master weights, moments, parameters and norms as the grads summed
// through the swap files, bit for bit, over 3 micro-batches a step, at stages 1 to 3.
TEST(GradOffload, HostGradsAreBitIdenticalToGradsOnNvme) {
  ::zinf::testing::TempDir dir;
  const uint64_t seed = ::zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  SingleCommunicator comm;
  for (int stage = 1; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    OverlapPlan p;
    p.config = testing::overlap_on_nvme(dir.path());
    p.config.stage = stage;
    p.micro_batches = 3;
    p.inject = true;
    const testing::OverlapResult disk = testing::train_overlap(p, false, 0.0, seed, comm);
    p.config.host_grads = true;
    const testing::OverlapResult host = testing::train_overlap(p, false, 0.0, seed, comm);
    ASSERT_EQ(disk.states.size(), host.states.size());
    EXPECT_EQ(std::memcmp(disk.states.data(), host.states.data(), disk.states.size() * 4), 0)
        << "master weights or moments differ";
    ASSERT_EQ(disk.params.size(), host.params.size());
    for (size_t i = 0; i < disk.params.size(); ++i) {
      EXPECT_TRUE(torch::equal(disk.params[i], host.params[i])) << "model parameter " << i;
    }
    EXPECT_EQ(disk.skipped, host.skipped);
    for (int step = 0; step < testing::kSteps; ++step) {
      if (!disk.skipped[step]) {
        EXPECT_EQ(disk.norms[step], host.norms[step]) << "step " << step;
      }
    }
    EXPECT_TRUE(host.skipped[testing::kInfStep]);
    EXPECT_FALSE(disk.grads_in_memory);
    EXPECT_TRUE(host.grads_in_memory) << "the grads did not stay in host memory";
    // The grads' traffic is gone: 3 micro-batches' sums written and read back, and the step's
    // read of them (the counters are the run's, start-up included).
    EXPECT_LT(host.nvme_bytes, disk.nvme_bytes);
  }
}

TEST(OverlapOptimizer, Fp16OverflowSkipsAreRolledBack) {
  ::zinf::testing::TempDir dir;
  OverlapPlan p;
  p.name = "fp16, stage 2, optimizer on cpu, dynamic loss scale";
  p.config = testing::overlap_on_nvme(dir.path());
  p.config.stage = 2;
  p.config.offload_optimizer = OffloadTarget::kCpu;
  p.config.precision = Precision::kFloat16;
  p.config.loss_scale.initial_scale_power = 8;
  p.config.loss_scale.loss_scale_window = 2;
  p.inject = true;
  expect_identical(p);
  p.name = "fp16, stage 3, optimizer on nvme";
  p.config = testing::overlap_on_nvme(dir.path());
  p.config.precision = Precision::kFloat16;
  p.config.loss_scale.initial_scale_power = 8;
  p.config.loss_scale.loss_scale_window = 2;
  expect_identical(p);
}

}  // namespace
}  // namespace zinf::zero
