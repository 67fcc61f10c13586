#include "engine/model/attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

namespace zinf::engine {
namespace {

std::atomic<uint64_t> g_full_scores_limit{kFullScoresLimitBytes};

// Rows per chunk: about 16 MiB of fp32 scores, at least 16 rows, at most the sequence.
int64_t rows_per_chunk(const at::Tensor& q, int64_t chunk_rows) {
  const int64_t seq = q.size(2);
  if (chunk_rows > 0) return std::min(chunk_rows, seq);
  const int64_t per_row = std::max<int64_t>(1, q.size(0) * q.size(1) * seq * 4);
  return std::clamp<int64_t>(static_cast<int64_t>(kScoresChunkBytes) / per_row, 16, seq);
}

// The first key rows [a, ...) may see: 0, or with a window the oldest key inside it.
int64_t first_key(int64_t a, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, a - window + 1) : 0;
}

// The scaled, masked fp32 scores of query rows [a, b) against keys [lo, b) (no later key is
// visible to any of these rows).
at::Tensor chunk_scores(const at::Tensor& q, const at::Tensor& k, int64_t a, int64_t b, int64_t lo,
                        int64_t window) {
  const double root = std::sqrt(static_cast<double>(q.size(-1)));
  const at::Tensor scores =
      portable_matmul(q.narrow(2, a, b - a), k.narrow(2, lo, b - lo).transpose(-2, -1))
          .to(at::kFloat) /
      root;
  const at::TensorOptions ids = at::TensorOptions().device(q.device()).dtype(at::kLong);
  const at::Tensor rows = at::arange(a, b, ids).unsqueeze(1);
  const at::Tensor cols = at::arange(lo, b, ids).unsqueeze(0);
  at::Tensor hidden = cols > rows;
  if (window > 0) hidden = at::logical_or(hidden, cols <= rows - window);
  return scores.masked_fill(hidden, -std::numeric_limits<float>::infinity());
}

// Forward keeps the output and each row's log-sum-exp; backward recomputes the probabilities
// chunk by chunk from them.
struct ChunkedAttention : public torch::autograd::Function<ChunkedAttention> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, int64_t window,
                                                int64_t chunk_rows) {
    const int64_t seq = q.size(2);
    const int64_t rows = rows_per_chunk(q, chunk_rows);
    at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
    at::Tensor lse = at::empty({q.size(0), q.size(1), seq},
                               at::TensorOptions().device(q.device()).dtype(at::kFloat));
    for (int64_t a = 0; a < seq; a += rows) {
      const int64_t b = std::min(seq, a + rows);
      const int64_t lo = first_key(a, window);
      const at::Tensor scores = chunk_scores(q, k, a, b, lo, window);
      // One reduction gives both the row's log-sum-exp (kept for backward) and the
      // probabilities.
      const at::Tensor row_lse = at::logsumexp(scores, -1, /*keepdim=*/true);
      const at::Tensor probs = at::exp(scores - row_lse).to(q.scalar_type());
      out.narrow(2, a, b - a).copy_(portable_matmul(probs, v.narrow(2, lo, b - lo)));
      lse.narrow(2, a, b - a).copy_(row_lse.squeeze(-1));
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["window"] = window;
    ctx->saved_data["rows"] = rows;
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& q = saved[0];
    const at::Tensor& k = saved[1];
    const at::Tensor& v = saved[2];
    const at::Tensor& out = saved[3];
    const at::Tensor& lse = saved[4];
    const int64_t window = ctx->saved_data["window"].toInt();
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const at::Tensor d_out = grads[0].contiguous();
    const int64_t seq = q.size(2);
    const double root = std::sqrt(static_cast<double>(q.size(-1)));
    const at::ScalarType dtype = q.scalar_type();
    // sum_j p_ij dP_ij = dO_i . O_i: the softmax backward's row term without the full P.
    const at::Tensor row_term = (d_out.to(at::kFloat) * out.to(at::kFloat)).sum(-1, true);
    at::Tensor dq = at::empty_like(q, at::MemoryFormat::Contiguous);
    at::Tensor dk = at::zeros(k.sizes(), k.options().dtype(at::kFloat));
    at::Tensor dv = at::zeros(v.sizes(), v.options().dtype(at::kFloat));
    for (int64_t a = 0; a < seq; a += rows) {
      const int64_t b = std::min(seq, a + rows);
      const int64_t lo = first_key(a, window);
      const at::Tensor probs =
          at::exp(chunk_scores(q, k, a, b, lo, window) - lse.narrow(2, a, b - a).unsqueeze(-1));
      const at::Tensor d_out_rows = d_out.narrow(2, a, b - a);
      const at::Tensor keys = k.narrow(2, lo, b - lo);
      dv.narrow(2, lo, b - lo)
          .add_(portable_matmul(probs.to(dtype).transpose(-2, -1), d_out_rows).to(at::kFloat));
      const at::Tensor d_probs =
          portable_matmul(d_out_rows, v.narrow(2, lo, b - lo).transpose(-2, -1)).to(at::kFloat);
      const at::Tensor d_scores =
          (probs * (d_probs - row_term.narrow(2, a, b - a)) / root).to(dtype);
      dq.narrow(2, a, b - a).copy_(portable_matmul(d_scores, keys));
      dk.narrow(2, lo, b - lo)
          .add_(portable_matmul(d_scores.transpose(-2, -1), q.narrow(2, a, b - a)).to(at::kFloat));
    }
    return {dq, dk.to(dtype), dv.to(dtype), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool fp16_on_cpu(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf && t.device().is_cpu();
}

at::Tensor portable_matmul(const at::Tensor& a, const at::Tensor& b) {
  if (!fp16_on_cpu(a) && !fp16_on_cpu(b)) {
    return at::matmul(a, b);
  }
  return at::matmul(a.to(at::kFloat), b.to(at::kFloat)).to(at::kHalf);
}

uint64_t full_scores_limit() noexcept { return g_full_scores_limit.load(); }

void set_full_scores_limit(uint64_t bytes) noexcept { g_full_scores_limit.store(bytes); }

at::Tensor memory_efficient_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      int64_t window, int64_t chunk_rows) {
  return ChunkedAttention::apply(q, k, v, window, chunk_rows)[0];
}

at::Tensor full_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          int64_t window) {
  const int64_t seq = q.size(2);
  at::Tensor scores = portable_matmul(q, k.transpose(-2, -1)).to(at::kFloat) /
                      std::sqrt(static_cast<double>(q.size(-1)));
  // Query i sees keys j <= i, and with a window only j > i - window.
  const at::TensorOptions flags = at::TensorOptions().device(q.device()).dtype(at::kBool);
  at::Tensor hidden = at::ones({seq, seq}, flags).triu(1);
  if (window > 0 && window < seq) {
    hidden = at::logical_or(hidden, at::ones({seq, seq}, flags).tril(-window));
  }
  scores = scores.masked_fill(hidden, -std::numeric_limits<float>::infinity());
  const at::Tensor probs = at::softmax(scores, -1).to(q.scalar_type());
  return portable_matmul(probs, v);
}

}  // namespace zinf::engine
