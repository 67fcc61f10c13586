// zinf.overlap_optimizer on one rank: the same training with the optimizer overlapped with
// the backward and without it must end with the same master weights, moments and model
// parameters, bit for bit, at stages 1-3 with the optimizer on CPU and on NVMe — including
// steps where clipping triggers (the speculated updates are rolled back and redone) and
// steps an Inf skips (rolled back, nothing changed). The overlapped runs must have kept
// some updates and rolled back some, or the test proves nothing.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "offload/cpu_accelerator.h"
#include "optimizer_cpu/adam.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "tests/zero/test_model.h"
#include "zero/comm/single_communicator.h"
#include "zero/loss_scaler.h"
#include "zero/zero_model.h"

namespace zinf::zero {
namespace {

using testing::make_batch;
using testing::make_net;
using testing::NetShape;

constexpr int kSteps = 7;
// Steps whose first parameter's gradient (the input projection's weight, the last to be
// final, its sub-group the partition's first) is multiplied by kBoost: their gradient norm is
// far above the others', so a clipping norm between the two clips exactly these, and only
// once the backward has ended — after the later sub-groups were updated speculatively, so
// they are rolled back. A step right after a clipped one is not speculated (it would most
// likely clip again): 2 and 5 leave room between them.
constexpr int kBoosted[] = {2, 5};
constexpr double kBoost = 1000.0;
constexpr int kInfStep = 3;  // with `inject`: one element of that gradient becomes +Inf

struct Plan {
  std::string name;
  ZeroConfig config;
  int micro_batches = 1;
  bool boost = false;   // kBoosted steps
  bool inject = false;  // the Inf of kInfStep
};

struct Result {
  std::vector<float> states;          // params, exp_avg, exp_avg_sq of the partition
  std::vector<torch::Tensor> params;  // the model's parameters
  std::vector<double> norms;          // per step
  std::vector<bool> skipped;          // per step
  OverlapStats overlap;
};

std::vector<float> optimizer_states(ZeroModel& model) {
  std::vector<float> all;
  offload::OptimizerSwapper& swapper = model.optimizer().swapper();
  for (offload::OptimizerState state :
       {offload::OptimizerState::kParams, offload::OptimizerState::kExpAvg,
        offload::OptimizerState::kExpAvgSq}) {
    for (size_t g = 0; g < swapper.sub_group_count(); ++g) {
      const size_t at = all.size();
      all.resize(at + swapper.sub_group_range(g).second);
      swapper.read_sub_group(state, g, all.data() + at);
    }
  }
  return all;
}

Result train(const Plan& plan, bool overlap, double clip, uint64_t seed) {
  NetShape shape;
  testing::Net net = make_net(shape, seed);
  const bool fp16 = plan.config.precision == Precision::kFloat16;
  if (fp16) net->to(at::kHalf);
  auto inject = std::make_shared<bool>(false);
  auto boost = std::make_shared<double>(1.0);
  net->embed->weight.register_hook([inject, boost](const torch::Tensor& grad) {
    torch::Tensor out = grad * *boost;
    if (*inject) out.view(-1)[0] = std::numeric_limits<float>::infinity();
    return out;
  });
  ZeroConfig config = plan.config;
  config.overlap_optimizer = overlap;
  config.gradient_clipping = clip;
  config.gradient_accumulation_steps = plan.micro_batches;
  offload::CpuAccelerator accelerator(1ull << 30);
  SingleCommunicator comm;
  optimizer_cpu::AdamConfig adam_config;
  adam_config.lr = 1e-2f;
  adam_config.adamw_mode = true;
  adam_config.weight_decay = 0.01f;
  optimizer_cpu::AdamOptimizer adam(adam_config);
  ZeroModel model(*net, config, accelerator, comm, adam);
  LossScaler scaler = fp16 ? LossScaler(config.loss_scale) : LossScaler();
  Result r;
  int64_t applied = 0;
  for (int step = 0; step < kSteps; ++step) {
    *boost = 1.0;
    for (int b : kBoosted) {
      if (plan.boost && step == b) *boost = kBoost;
    }
    *inject = plan.inject && step == kInfStep;
    for (int mb = 0; mb < plan.micro_batches; ++mb) {
      if (overlap && mb + 1 == plan.micro_batches) {
        model.speculate_step(applied + 1, scaler.scale());
      }
      const testing::Batch b = make_batch(shape, 8, seed, step * plan.micro_batches + mb);
      model.begin_micro_batch(mb);
      const torch::Tensor x = fp16 ? b.x.to(at::kHalf) : b.x;
      const torch::Tensor loss =
          torch::mse_loss(net->forward(x).to(at::kFloat), b.y) / plan.micro_batches;
      model.backward(loss * scaler.scale());
      model.end_micro_batch();
    }
    const OptimizerStepOutcome outcome = model.step(applied + 1, scaler.scale());
    scaler.update(outcome.skipped);
    if (!outcome.skipped) ++applied;
    r.norms.push_back(outcome.grad_norm);
    r.skipped.push_back(outcome.skipped);
  }
  r.states = optimizer_states(model);
  for (const torch::Tensor& p : testing::unique_parameters(net)) {
    r.params.push_back(p.detach().clone());
  }
  r.overlap = model.stats().overlap;
  return r;
}

void expect_identical(const Plan& plan) {
  const uint64_t seed = ::zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  SCOPED_TRACE(plan.name);
  double clip = 0.0;
  if (plan.boost) {
    // A clipping norm above every plain step's norm and below every boosted one's.
    const Result calibration = train(plan, false, 0.0, seed);
    double plain = 0.0;
    for (int step = 0; step < kSteps; ++step) {
      bool boosted = false;
      for (int b : kBoosted) boosted = boosted || b == step;
      if (!boosted && !calibration.skipped[step]) plain = std::max(plain, calibration.norms[step]);
    }
    clip = 3.0 * plain;
  }
  const Result off = train(plan, false, clip, seed);
  const Result on = train(plan, true, clip, seed);
  ASSERT_EQ(off.states.size(), on.states.size());
  EXPECT_EQ(std::memcmp(off.states.data(), on.states.data(), off.states.size() * sizeof(float)), 0)
      << "master weights or moments differ";
  ASSERT_EQ(off.params.size(), on.params.size());
  for (size_t i = 0; i < off.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(off.params[i], on.params[i])) << "model parameter " << i;
  }
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(off.skipped[step], on.skipped[step]) << "step " << step;
    if (!off.skipped[step]) {
      EXPECT_EQ(off.norms[step], on.norms[step]) << "step " << step;
    }
  }
  EXPECT_EQ(off.overlap.speculated, 0u);
  EXPECT_GT(on.overlap.committed, 0u) << "no update was kept from behind the backward";
  if (plan.boost || plan.inject) {
    EXPECT_GT(on.overlap.rolled_back, 0u) << "the rollback path did not run";
  }
  std::cout << "OVERLAP " << plan.name << ": " << on.overlap.speculated
            << " sub-group updates behind the backward, " << on.overlap.committed << " kept, "
            << on.overlap.rolled_back << " rolled back" << std::endl;
}

ZeroConfig on_nvme(const std::string& dir) {
  ZeroConfig c;
  c.stage = 3;
  c.offload_optimizer = OffloadTarget::kNvme;
  c.nvme_paths = {dir};
  c.aio.backend = aio::BackendKind::kPsync;
  c.sub_group_size = 97;  // sub-groups cut through parameters
  return c;
}

TEST(OverlapOptimizer, EveryStageOnTheCpuTierIsBitIdenticalWithClippingAndOverflow) {
  for (int stage = 1; stage <= 3; ++stage) {
    for (bool inject : {false, true}) {
      Plan p;
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
    Plan p;
    p.name = std::string("nvme, clipping and Inf") + (pipeline ? ", pipelined" : "");
    p.config = on_nvme(dir.path());
    p.config.pipeline_read = p.config.pipeline_write = pipeline;
    p.boost = p.inject = true;
    expect_identical(p);
  }
  Plan accumulated;
  accumulated.name = "nvme, 3 micro-batches, params on nvme";
  accumulated.config = on_nvme(dir.path());
  accumulated.config.offload_param = OffloadTarget::kNvme;
  accumulated.config.param_persistence_threshold = 13;
  accumulated.micro_batches = 3;
  accumulated.boost = true;
  expect_identical(accumulated);
}

TEST(OverlapOptimizer, Fp16OverflowSkipsAreRolledBack) {
  ::zinf::testing::TempDir dir;
  Plan p;
  p.name = "fp16, stage 2, optimizer on cpu, dynamic loss scale";
  p.config = on_nvme(dir.path());
  p.config.stage = 2;
  p.config.offload_optimizer = OffloadTarget::kCpu;
  p.config.precision = Precision::kFloat16;
  p.config.loss_scale.initial_scale_power = 8;
  p.config.loss_scale.loss_scale_window = 2;
  p.inject = true;
  expect_identical(p);
  p.name = "fp16, stage 3, optimizer on nvme";
  p.config = on_nvme(dir.path());
  p.config.precision = Precision::kFloat16;
  p.config.loss_scale.initial_scale_power = 8;
  p.config.loss_scale.loss_scale_window = 2;
  expect_identical(p);
}

}  // namespace
}  // namespace zinf::zero
