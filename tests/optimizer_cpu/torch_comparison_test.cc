// zinf's Adam (L2), AdamW and Adagrad against LibTorch's torch::optim on the same data:
// 10 steps with fresh random gradients, fp32 states, at every SIMD level; params and states
// must agree to a relative error of 1e-6, in the max norm (max |zinf - torch| / max |torch|)
// and in the 2-norm. (Element-wise ratios are meaningless near zero, where both sides round
// the cancellation of O(1) terms differently.)
#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "optimizer_cpu/adagrad.h"
#include "optimizer_cpu/adam.h"
#include "optimizer_cpu/simd_level.h"
#include "tests/optimizer_cpu/test_util.h"

namespace zinf::optimizer_cpu::testing {
namespace {

constexpr std::int64_t kNumel = 100003;  // two TBB tiles and a tail
constexpr int kSteps = 10;
constexpr double kRelTol = 1e-6;

at::Tensor as_tensor(std::vector<float>& v) {
  return torch::from_blob(v.data(), {static_cast<std::int64_t>(v.size())});
}

// The key of `param`'s state in `opt.state()`: LibTorch 1.13 keys it by the address of the
// parameter's TensorImpl as text (what `ostream << ptr` prints), LibTorch 2.x by the address.
template <typename Optimizer>
auto state_key(const Optimizer& opt, const at::Tensor& param) {
  using Key = typename std::decay_t<decltype(opt.state())>::key_type;
  void* const impl = param.unsafeGetTensorImpl();
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << impl;
    return text.str();
  } else {
    return Key{impl};
  }
}

// Relative error of `zinf` against `torch` in the max norm and the 2-norm.
void expect_agree(const char* what, std::vector<float>& zinf, const at::Tensor& torch_values) {
  const at::Tensor z = as_tensor(zinf).to(torch::kFloat64);
  const at::Tensor t = torch_values.to(torch::kFloat64);
  const double max_rel = (z - t).abs().max().item<double>() / t.abs().max().item<double>();
  const double l2_rel = (z - t).norm().item<double>() / t.norm().item<double>();
  EXPECT_LE(max_rel, kRelTol) << what;
  EXPECT_LE(l2_rel, kRelTol) << what;
  std::printf("%-10s relative error: max norm %.2e, 2-norm %.2e\n", what, max_rel, l2_rel);
}

class TorchComparisonTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override { force_simd_level(GetParam()); }
  void TearDown() override { reset_simd_level(); }

  // Random params and kSteps gradients, identical for both sides.
  void make_data() {
    std::mt19937_64 rng(test_seed());
    std::normal_distribution<float> normal;
    params_.resize(kNumel);
    for (float& x : params_) x = normal(rng);
    grads_.assign(kSteps, std::vector<float>(kNumel));
    for (auto& g : grads_) {
      for (float& x : g) x = normal(rng);
    }
  }

  std::vector<float> params_;
  std::vector<std::vector<float>> grads_;
};

void run_adam(const std::vector<float>& params0, std::vector<std::vector<float>>& grads,
              bool adamw) {
  const AdamConfig config{.lr = 1e-2f,
                          .beta1 = 0.9f,
                          .beta2 = 0.999f,
                          .eps = 1e-8f,
                          .weight_decay = 0.1f,
                          .bias_correction = true,
                          .adamw_mode = adamw};
  std::vector<float> p = params0, m(kNumel, 0.0f), v(kNumel, 0.0f);
  AdamOptimizer zinf_adam(config);

  at::Tensor tp = torch::from_blob(const_cast<float*>(params0.data()), {kNumel}).clone();
  std::unique_ptr<torch::optim::Optimizer> torch_opt;
  if (adamw) {
    torch_opt = std::make_unique<torch::optim::AdamW>(std::vector<at::Tensor>{tp},
                                                      torch::optim::AdamWOptions(config.lr)
                                                          .betas({config.beta1, config.beta2})
                                                          .eps(config.eps)
                                                          .weight_decay(config.weight_decay));
  } else {
    torch_opt = std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{tp},
                                                     torch::optim::AdamOptions(config.lr)
                                                         .betas({config.beta1, config.beta2})
                                                         .eps(config.eps)
                                                         .weight_decay(config.weight_decay));
  }
  for (int t = 1; t <= kSteps; ++t) {
    std::vector<float>& g = grads[static_cast<std::size_t>(t - 1)];
    StepArgs args;
    args.params = p.data();
    args.grads = g.data();
    args.exp_avg = m.data();
    args.exp_avg_sq = v.data();
    args.numel = kNumel;
    args.step = t;
    ASSERT_EQ(zinf_adam.step(args).nonfinite_grads, 0u);
    tp.mutable_grad() = as_tensor(g).clone();
    (void)torch_opt->step();
  }
  const auto& state = torch_opt->state().at(state_key(*torch_opt, tp));
  at::Tensor torch_m, torch_v;
  if (adamw) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    torch_m = s.exp_avg();
    torch_v = s.exp_avg_sq();
  } else {
    const auto& s = static_cast<const torch::optim::AdamParamState&>(*state);
    torch_m = s.exp_avg();
    torch_v = s.exp_avg_sq();
  }
  expect_agree("params", p, tp);
  expect_agree("exp_avg", m, torch_m);
  expect_agree("exp_avg_sq", v, torch_v);
}

TEST_P(TorchComparisonTest, AdamWithL2MatchesTorchAdam) {
  make_data();
  run_adam(params_, grads_, false);
}

TEST_P(TorchComparisonTest, AdamWMatchesTorchAdamW) {
  make_data();
  run_adam(params_, grads_, true);
}

TEST_P(TorchComparisonTest, AdagradMatchesTorchAdagrad) {
  make_data();
  const AdagradConfig config{.lr = 0.1f, .lr_decay = 0.01f, .eps = 1e-10f, .weight_decay = 0.05f};
  std::vector<float> p = params_, sum(kNumel, 0.0f);
  AdagradOptimizer zinf_adagrad(config);
  at::Tensor tp = as_tensor(params_).clone();
  torch::optim::Adagrad torch_adagrad(std::vector<at::Tensor>{tp},
                                      torch::optim::AdagradOptions(config.lr)
                                          .lr_decay(config.lr_decay)
                                          .eps(config.eps)
                                          .weight_decay(config.weight_decay));
  for (int t = 1; t <= kSteps; ++t) {
    std::vector<float>& g = grads_[static_cast<std::size_t>(t - 1)];
    StepArgs args;
    args.params = p.data();
    args.grads = g.data();
    args.exp_avg_sq = sum.data();
    args.numel = kNumel;
    args.step = t;
    ASSERT_EQ(zinf_adagrad.step(args).nonfinite_grads, 0u);
    tp.mutable_grad() = as_tensor(g).clone();
    (void)torch_adagrad.step();
  }
  const auto& state = static_cast<const torch::optim::AdagradParamState&>(
      *torch_adagrad.state().at(state_key(torch_adagrad, tp)));
  expect_agree("params", p, tp);
  expect_agree("sum", sum, state.sum());
}

INSTANTIATE_TEST_SUITE_P(Levels, TorchComparisonTest, ::testing::ValuesIn(available_simd_levels()),
                         [](const auto& param_info) {
                           return std::string(to_string(param_info.param));
                         });

}  // namespace
}  // namespace zinf::optimizer_cpu::testing
