// The reference model: shapes, parameter names and count, deterministic initialisation that
// depends only on the seed and the name, causality, and that it learns.

#include "engine/model/llama.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <set>
#include <string>

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

TEST(Llama, RejectsShapesThatCannotWork) {
  LlamaConfig c = *named_llama("tiny", 256);
  c.num_heads = 5;  // 64 / 5
  EXPECT_THROW(c.validate(), std::invalid_argument);
  EXPECT_FALSE(named_llama("huge", 256).has_value());
}

}  // namespace
}  // namespace zinf::engine
