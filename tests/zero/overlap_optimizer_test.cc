// zinf.overlap_optimizer on one rank (tests/zero/overlap_train.h says what is checked): every
// stage with the optimizer on CPU and on NVMe, gradient accumulation, fp16 with a dynamic
// loss scale. Two ranks: zero_multirank_test's "overlap" suite.

#include <gtest/gtest.h>

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
