// The long-sequence attention (engine/model/attention.h) and language-model loss
// (engine/model/lm_loss.h) against their plain formulations: outputs and gradients, causal and
// sliding-window, for chunks of 1 row to the whole sequence, in fp32 and bf16; and LlamaModel
// taking the long paths (their thresholds lowered) computes the loss, logits and parameter
// gradients of the plain paths.
#include "engine/model/attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <string>
#include <vector>

#include "engine/model/llama.h"
#include "engine/model/lm_loss.h"

namespace zinf::engine {
namespace {

struct Grads {
  at::Tensor out, dq, dk, dv;
};

Grads run(bool chunked, const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0,
          const at::Tensor& d_out, int64_t window, int64_t rows) {
  const at::Tensor q = q0.detach().clone().requires_grad_(true);
  const at::Tensor k = k0.detach().clone().requires_grad_(true);
  const at::Tensor v = v0.detach().clone().requires_grad_(true);
  const at::Tensor out =
      chunked ? memory_efficient_attention(q, k, v, window, rows) : full_attention(q, k, v, window);
  out.backward(d_out);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}

TEST(Attention, ChunkedEqualsTheFullMatrixForwardAndBackward) {
  at::manual_seed(11);
  const int64_t seq = 37;
  const at::Tensor q = at::randn({2, 3, seq, 8});
  const at::Tensor k = at::randn({2, 3, seq, 8});
  const at::Tensor v = at::randn({2, 3, seq, 8});
  const at::Tensor d_out = at::randn({2, 3, seq, 8});
  for (int64_t window : {0, 5}) {
    const Grads want = run(false, q, k, v, d_out, window, 0);
    for (int64_t rows : {1, 4, 16, 37, 0}) {
      SCOPED_TRACE("window " + std::to_string(window) + ", rows " + std::to_string(rows));
      const Grads got = run(true, q, k, v, d_out, window, rows);
      EXPECT_LE(max_diff(got.out, want.out), 2e-6);
      EXPECT_LE(max_diff(got.dq, want.dq), 2e-5);
      EXPECT_LE(max_diff(got.dk, want.dk), 2e-5);
      EXPECT_LE(max_diff(got.dv, want.dv), 2e-5);
    }
  }
}

TEST(Attention, ChunkedBf16StaysWithinBf16OfTheFullMatrix) {
  at::manual_seed(12);
  const int64_t seq = 40;
  const at::Tensor q = at::randn({1, 2, seq, 16}).to(at::kBFloat16);
  const at::Tensor k = at::randn({1, 2, seq, 16}).to(at::kBFloat16);
  const at::Tensor v = at::randn({1, 2, seq, 16}).to(at::kBFloat16);
  const at::Tensor d_out = at::randn({1, 2, seq, 16}).to(at::kBFloat16);
  for (int64_t window : {0, 9}) {
    SCOPED_TRACE(window);
    const Grads want = run(false, q, k, v, d_out, window, 0);
    const Grads got = run(true, q, k, v, d_out, window, 7);
    EXPECT_EQ(got.out.scalar_type(), at::kBFloat16);
    EXPECT_EQ(got.dq.scalar_type(), at::kBFloat16);
    // bf16 keeps 8 bits: a few units of 2^-8 relative to the values (|x| up to ~4).
    EXPECT_LE(max_diff(got.out, want.out), 0.05);
    EXPECT_LE(max_diff(got.dq, want.dq), 0.1);
    EXPECT_LE(max_diff(got.dk, want.dk), 0.1);
    EXPECT_LE(max_diff(got.dv, want.dv), 0.1);
  }
}

// A two-layer GQA model, the second layer with a sliding window: with the thresholds at 0
// every attention takes the long-sequence path (chunked; on LibTorch 2.x the unwindowed layer
// takes scaled_dot_product_attention) and the loss the chunked head, and the logits, the loss
// and every parameter's gradient are the plain paths'.
TEST(Attention, LlamaModelOnTheLongPathComputesThePlainPathsValues) {
  LlamaConfig c;
  c.vocab_size = 40, c.hidden_size = 32, c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 2;
  c.intermediate_size = 48, c.max_seq_len = 64;
  c.attention_windows = {0, 6};
  LlamaModel model(c);
  model->initialize(5);
  const at::Tensor tokens = at::randint(0, 40, {2, 48}, at::kLong);
  const at::Tensor targets = at::randint(0, 40, {2, 48}, at::kLong);
  auto pass = [&] {
    model->zero_grad();
    const at::Tensor logits = model->forward(tokens).detach();
    const at::Tensor loss = model->loss(tokens, targets);
    loss.backward();
    std::vector<at::Tensor> grads{logits, loss.detach().reshape({1})};
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const std::vector<at::Tensor> plain = pass();
  const uint64_t scores_limit = full_scores_limit();
  const uint64_t logits_limit = full_logits_limit();
  set_full_scores_limit(0);
  set_full_logits_limit(0);
  const std::vector<at::Tensor> chunked = pass();
  set_full_scores_limit(scores_limit);
  set_full_logits_limit(logits_limit);
  ASSERT_EQ(plain.size(), chunked.size());
  EXPECT_LE(max_diff(plain[0], chunked[0]), 1e-5) << "logits";
  for (size_t i = 1; i < plain.size(); ++i) {
    const double scale = std::max(1e-3, plain[i].abs().max().item<double>());
    EXPECT_LE(max_diff(plain[i], chunked[i]) / scale, 1e-4)
        << (i == 1 ? std::string("the loss") : "parameter " + std::to_string(i - 2));
  }
}

struct LossGrads {
  double loss;
  at::Tensor d_hidden, d_weight;
};

LossGrads lm_loss(bool chunked, const at::Tensor& hidden0, const at::Tensor& weight0,
                  const at::Tensor& targets, int64_t rows) {
  const at::Tensor hidden = hidden0.detach().clone().requires_grad_(true);
  const at::Tensor weight = weight0.detach().clone().requires_grad_(true);
  const at::Tensor loss =
      chunked ? chunked_lm_loss(hidden, weight, targets, rows)
              : at::cross_entropy_loss(at::matmul(hidden, weight.t()).to(at::kFloat), targets);
  (loss * 3.0).backward();  // a gradient other than 1 reaches the backward
  return {loss.item<double>(), hidden.grad(), weight.grad()};
}

TEST(LmLoss, ChunkedEqualsTheLogitsCrossEntropyForwardAndBackward) {
  at::manual_seed(13);
  const at::Tensor hidden = at::randn({37, 16});
  const at::Tensor weight = at::randn({50, 16}) * 0.5;
  const at::Tensor targets = at::randint(0, 50, {37}, at::kLong);
  const LossGrads want = lm_loss(false, hidden, weight, targets, 0);
  for (int64_t rows : {1, 5, 16, 37, 0}) {
    SCOPED_TRACE(rows);
    const LossGrads got = lm_loss(true, hidden, weight, targets, rows);
    EXPECT_NEAR(got.loss, want.loss, 2e-6 * std::abs(want.loss));
    EXPECT_LE(max_diff(got.d_hidden, want.d_hidden), 1e-6);
    EXPECT_LE(max_diff(got.d_weight, want.d_weight), 1e-6);
  }
}

TEST(LmLoss, ChunkedBf16StaysWithinBf16OfTheLogitsCrossEntropy) {
  at::manual_seed(14);
  const at::Tensor hidden = at::randn({40, 32}).to(at::kBFloat16);
  const at::Tensor weight = (at::randn({64, 32}) * 0.3).to(at::kBFloat16);
  const at::Tensor targets = at::randint(0, 64, {40}, at::kLong);
  const LossGrads want = lm_loss(false, hidden, weight, targets, 0);
  const LossGrads got = lm_loss(true, hidden, weight, targets, 7);
  EXPECT_EQ(got.d_hidden.scalar_type(), at::kBFloat16);
  EXPECT_EQ(got.d_weight.scalar_type(), at::kBFloat16);
  EXPECT_NEAR(got.loss, want.loss, 1e-4 * std::abs(want.loss));
  // Gradients of order 0.1: bf16's 8 bits, and the fp32 accumulation of d_weight across
  // chunks where autograd sums in bf16.
  EXPECT_LE(max_diff(got.d_hidden, want.d_hidden), 2e-3);
  EXPECT_LE(max_diff(got.d_weight, want.d_weight), 1e-2);
}

}  // namespace
}  // namespace zinf::engine
