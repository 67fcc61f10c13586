// The reference model: shapes, parameter names and count, deterministic initialisation that
// depends only on the seed and the name, causality, that it learns, and that in fp16 on the
// CPU (matmuls and SiLU computed in fp32, rounded to fp16) its gradients are fp16 and near
// the fp32 model's.

#include "engine/model/llama.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <set>
#include <string>

#include "tests/common/seed.h"

namespace zinf::engine {
namespace {

TEST(Llama, ParameterNamesFollowHuggingFaceAndTheCountMatches) {
  LlamaConfig c = *named_llama("tiny", 256);
  LlamaModel model(c);
  std::set<std::string> names;
  int64_t count = 0;
  for (const auto& p : model->named_parameters()) {
    names.insert(p.key());
    count += p.value().numel();
  }
  EXPECT_TRUE(names.count("model.embed_tokens.weight"));
  EXPECT_TRUE(names.count("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.1.mlp.down_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.1.post_attention_layernorm.weight"));
  EXPECT_TRUE(names.count("model.norm.weight"));
  EXPECT_TRUE(names.count("lm_head.weight"));
  EXPECT_EQ(count, c.parameter_count());
  c.tie_embeddings = true;
  LlamaModel tied(c);
  EXPECT_EQ(tied->lm_head->weight.unsafeGetTensorImpl(),
            tied->model->embed_tokens->weight.unsafeGetTensorImpl());
}

TEST(Llama, InitialisationDependsOnlyOnSeedAndName) {
  at::Tensor a = at::empty({7, 5});
  at::Tensor b = at::empty({7, 5});
  init_parameter(42, "model.layers.3.mlp.up_proj.weight", a);
  init_parameter(42, "model.layers.3.mlp.up_proj.weight", b);
  EXPECT_TRUE(at::equal(a, b));
  init_parameter(43, "model.layers.3.mlp.up_proj.weight", b);
  EXPECT_FALSE(at::equal(a, b));
  init_parameter(42, "model.layers.3.mlp.gate_proj.weight", b);
  EXPECT_FALSE(at::equal(a, b));
  EXPECT_NEAR(a.std().item<double>(), 0.02, 0.01);
  init_parameter(42, "model.norm.weight", b);
  EXPECT_TRUE(at::equal(b, at::ones_like(b)));
}

TEST(Llama, OutputAtAPositionIgnoresLaterTokens) {
  LlamaModel model(*named_llama("tiny", 50));
  model->initialize(1);
  at::NoGradGuard no_grad;
  at::Tensor tokens = at::randint(50, {2, 12}, at::kLong);
  at::Tensor changed = tokens.clone();
  changed.narrow(1, 8, 4).fill_(3);
  const at::Tensor a = model->forward(tokens).narrow(1, 0, 8);
  const at::Tensor b = model->forward(changed).narrow(1, 0, 8);
  EXPECT_TRUE(at::allclose(a, b, 1e-5, 1e-6));
  EXPECT_FALSE(at::allclose(model->forward(tokens), model->forward(changed), 1e-5, 1e-6));
}

TEST(Llama, LearnsARepeatingSequence) {
  LlamaModel model(*named_llama("tiny", 16));
  model->initialize(3);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  at::Tensor seq = at::arange(33, at::kLong).remainder(8).unsqueeze(0).repeat({4, 1});
  at::Tensor x = seq.narrow(1, 0, 32), y = seq.narrow(1, 1, 32);
  double first = 0, last = 0;
  for (int i = 0; i < 60; ++i) {
    opt.zero_grad();
    at::Tensor loss = model->loss(x, y);
    if (i == 0) first = loss.item<double>();
    last = loss.item<double>();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.2 * first);
}

// LibTorch 1.13 has no CPU fp16 matmul or SiLU: the fp16 model runs them in fp32 behind
// casts that autograd sees. Forward and backward work, every gradient arrives in fp16, and
// loss and gradients stay near the fp32 model's with the same weights. The loss is scaled by
// 2^16 before backward as fp16 training does (unscaled, small gradient elements would flush
// to zero in fp16). Bounds: fp16 rounds each value to 2^-12 relative; the weights, every
// activation and every gradient are rounded; measured over 6 seeds at most 5e-6 relative on
// the loss and 1.4e-3 on a parameter's gradient (relative norm of the difference), so 1e-4
// and 1e-2 leave room for other seeds and still catch a wrong or missing gradient.
TEST(Llama, Fp16OnTheCpuGivesFp16GradientsNearFp32) {
  const uint64_t seed = ::zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  const LlamaConfig c = *named_llama("tiny", 64);
  LlamaModel fp32(c);
  LlamaModel fp16(c, at::kHalf);
  fp32->initialize(seed);
  fp16->initialize(seed);
  at::manual_seed(seed);
  const at::Tensor tokens = at::randint(64, {3, 21}, at::kLong);
  const at::Tensor x = tokens.narrow(1, 0, 20), y = tokens.narrow(1, 1, 20);
  constexpr double kScale = 65536.0;
  const at::Tensor loss32 = fp32->loss(x, y);
  const at::Tensor loss16 = fp16->loss(x, y);
  EXPECT_EQ(loss16.scalar_type(), at::kFloat);  // logits and loss in fp32
  (loss32 * kScale).backward();
  (loss16 * kScale).backward();
  EXPECT_NEAR(loss16.item<double>(), loss32.item<double>(), 1e-4 * loss32.item<double>());
  const auto want = fp32->named_parameters();
  double worst = 0.0;
  for (const auto& item : fp16->named_parameters()) {
    SCOPED_TRACE(item.key());
    EXPECT_EQ(item.value().scalar_type(), at::kHalf);
    const at::Tensor g16 = item.value().grad();
    ASSERT_TRUE(g16.defined());
    ASSERT_EQ(g16.scalar_type(), at::kHalf);
    const at::Tensor g = g16.to(at::kFloat);
    EXPECT_TRUE(at::isfinite(g).all().item<bool>());
    const at::Tensor g32 = want[item.key()].grad();
    const double error = (g - g32).norm().item<double>() / g32.norm().item<double>();
    EXPECT_LT(error, 1e-2);
    worst = std::max(worst, error);
  }
  std::cout << "FP16 on the CPU: loss " << loss16.item<double>() << " (fp32 "
            << loss32.item<double>() << "), worst relative gradient error " << worst << "\n";
}

TEST(Llama, RejectsShapesThatCannotWork) {
  LlamaConfig c = *named_llama("tiny", 256);
  c.num_heads = 5;  // 64 / 5
  EXPECT_THROW(c.validate(), std::invalid_argument);
  EXPECT_FALSE(named_llama("huge", 256).has_value());
}

}  // namespace
}  // namespace zinf::engine
