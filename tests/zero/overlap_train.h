// The optimizer-overlap check shared by the one-process test (overlap_optimizer_test.cc) and
// the ranks of zero_multirank_test: the test net trained with zinf.overlap_optimizer and
// without it must end with the same master weights, moments and model parameters, bit for
// bit, through steps that clip (the speculated updates are rolled back and redone) and steps
// an Inf skips; the overlapped run must have kept some updates and rolled back some.
//
// Thread safety: none (test code).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "offload/cpu_accelerator.h"
#include "optimizer_cpu/adam.h"
#include "tests/zero/test_model.h"
#include "zero/comm/communicator.h"
#include "zero/loss_scaler.h"
#include "zero/zero_model.h"

namespace zinf::zero::testing {

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

struct OverlapPlan {
  std::string name;
  ZeroConfig config;
  int micro_batches = 1;
  bool boost = false;   // kBoosted steps
  bool inject = false;  // the Inf of kInfStep
};

struct OverlapResult {
  std::vector<float> states;          // params, exp_avg, exp_avg_sq of the partition
  std::vector<torch::Tensor> params;  // the model's parameters
  std::vector<double> norms;          // per step
  std::vector<bool> skipped;          // per step
  OverlapStats overlap;
  bool grads_in_memory = false;  // the optimizer's grads are a host array (zinf.grad_offload)
  uint64_t nvme_bytes = 0;       // the optimizer tier's NVMe bytes read and written
};

// This rank's fp32 master weights, exp_avg and exp_avg_sq, as the optimizer tier holds them.
inline std::vector<float> optimizer_states(ZeroModel& model) {
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

inline OverlapResult train_overlap(const OverlapPlan& plan, bool overlap, double clip,
                                   uint64_t seed, Communicator& comm) {
  NetShape shape;
  Net net = make_net(shape, seed + static_cast<uint64_t>(comm.rank()));  // rank 0's win
  const bool fp16 = plan.config.precision == Precision::kFloat16;
  if (fp16) net->to(at::kHalf);
  auto inject = std::make_shared<bool>(false);
  auto boost = std::make_shared<double>(1.0);
  const bool injector = comm.rank() == 0;  // the other ranks see it only through the norm
  net->embed->weight.register_hook([inject, boost, injector](const torch::Tensor& grad) {
    torch::Tensor out = grad * *boost;
    if (*inject && injector) out.view(-1)[0] = std::numeric_limits<float>::infinity();
    return out;
  });
  ZeroConfig config = plan.config;
  config.overlap_optimizer = overlap;
  config.gradient_clipping = clip;
  config.gradient_accumulation_steps = plan.micro_batches;
  offload::CpuAccelerator accelerator(1ull << 30);
  optimizer_cpu::AdamConfig adam_config;
  adam_config.lr = 1e-2f;
  adam_config.adamw_mode = true;
  adam_config.weight_decay = 0.01f;
  optimizer_cpu::AdamOptimizer adam(adam_config);
  ZeroModel model(*net, config, accelerator, comm, adam);
  LossScaler scaler = fp16 ? LossScaler(config.loss_scale) : LossScaler();
  OverlapResult r;
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
      // 8 samples per micro-batch, split over the ranks.
      const Batch b = make_batch(shape, 8, seed, step * plan.micro_batches + mb);
      const int64_t per_rank = 8 / comm.world_size();
      const torch::Tensor x = b.x.narrow(0, comm.rank() * per_rank, per_rank);
      const torch::Tensor y = b.y.narrow(0, comm.rank() * per_rank, per_rank);
      model.begin_micro_batch(mb);
      const torch::Tensor loss =
          torch::mse_loss(net->forward(fp16 ? x.to(at::kHalf) : x).to(at::kFloat), y) /
          plan.micro_batches;
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
  for (const torch::Tensor& p : unique_parameters(net)) {
    r.params.push_back(p.detach().clone());
  }
  r.overlap = model.stats().overlap;
  offload::OptimizerSwapper& swapper = model.optimizer().swapper();
  r.grads_in_memory = swapper.memory(offload::OptimizerState::kGrads) != nullptr;
  const offload::OffloadCounters c = swapper.counters();
  r.nvme_bytes = c.nvme_bytes_read + c.nvme_bytes_written;
  return r;
}

inline void expect_overlap_identical(const OverlapPlan& plan, uint64_t seed, Communicator& comm) {
  SCOPED_TRACE(plan.name);
  double clip = 0.0;
  if (plan.boost) {
    // A clipping norm above every plain step's norm and below every boosted one's.
    const OverlapResult calibration = train_overlap(plan, false, 0.0, seed, comm);
    double plain = 0.0;
    for (int step = 0; step < kSteps; ++step) {
      bool boosted = false;
      for (int b : kBoosted) boosted = boosted || b == step;
      if (!boosted && !calibration.skipped[step]) plain = std::max(plain, calibration.norms[step]);
    }
    clip = 3.0 * plain;
  }
  const OverlapResult off = train_overlap(plan, false, clip, seed, comm);
  const OverlapResult on = train_overlap(plan, true, clip, seed, comm);
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
  if (comm.rank() != 0) return;
  std::cout << "OVERLAP " << plan.name << ": " << on.overlap.speculated
            << " sub-group updates behind the backward, " << on.overlap.committed << " kept, "
            << on.overlap.rolled_back << " rolled back" << std::endl;
}

// Stage 3 with the optimizer on NVMe under `dir` (psync), in sub-groups of 97 elements.
inline ZeroConfig overlap_on_nvme(const std::string& dir) {
  ZeroConfig c;
  c.stage = 3;
  c.offload_optimizer = OffloadTarget::kNvme;
  c.nvme_paths = {dir};
  c.aio.backend = aio::BackendKind::kPsync;
  c.sub_group_size = 97;  // sub-groups cut through parameters
  return c;
}

}  // namespace zinf::zero::testing
