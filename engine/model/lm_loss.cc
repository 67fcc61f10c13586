#include "engine/model/lm_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>

#include "engine/model/attention.h"

namespace zinf::engine {
namespace {

std::atomic<uint64_t> g_full_logits_limit{kFullLogitsLimitBytes};

int64_t rows_per_chunk(int64_t tokens, int64_t vocab, int64_t chunk_rows) {
  if (chunk_rows > 0) return std::min(chunk_rows, tokens);
  return std::clamp<int64_t>(
      static_cast<int64_t>(kLogitsChunkBytes) / std::max<int64_t>(1, vocab * 4), 1, tokens);
}

// The fp32 logits of rows [a, b).
at::Tensor chunk_logits(const at::Tensor& hidden, const at::Tensor& weight, int64_t a, int64_t b) {
  return portable_matmul(hidden.narrow(0, a, b - a), weight.t()).to(at::kFloat);
}

struct ChunkedLmLoss : public torch::autograd::Function<ChunkedLmLoss> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, int64_t chunk_rows) {
    const int64_t tokens = hidden.size(0);
    const int64_t rows = rows_per_chunk(tokens, weight.size(0), chunk_rows);
    // Sum of (log-sum-exp - the target's logit), row by row, in fp64 across chunks so the
    // mean does not depend on the chunking beyond fp32 rounding within a row.
    at::Tensor total = at::zeros({}, hidden.options().dtype(at::kDouble));
    // Each row's log-sum-exp, kept so the backward forms the softmax without reducing again.
    at::Tensor lse = at::empty({tokens}, hidden.options().dtype(at::kFloat));
    for (int64_t a = 0; a < tokens; a += rows) {
      const int64_t b = std::min(tokens, a + rows);
      const at::Tensor logits = chunk_logits(hidden, weight, a, b);
      const at::Tensor target = targets.narrow(0, a, b - a).unsqueeze(1);
      const at::Tensor row_lse = at::logsumexp(logits, 1);
      lse.narrow(0, a, b - a).copy_(row_lse);
      total += (row_lse - logits.gather(1, target).squeeze(1)).sum().to(at::kDouble);
    }
    ctx->save_for_backward({hidden, weight, targets, lse});
    ctx->saved_data["rows"] = rows;
    return {(total / static_cast<double>(tokens)).to(at::kFloat)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& targets = saved[2];
    const at::Tensor& lse = saved[3];
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const int64_t tokens = hidden.size(0);
    const at::ScalarType dtype = hidden.scalar_type();
    // d loss / d logit = (softmax - one_hot) * grad / tokens.
    const at::Tensor scale = grads[0].to(at::kFloat) / static_cast<double>(tokens);
    at::Tensor d_hidden = at::empty_like(hidden, at::MemoryFormat::Contiguous);
    at::Tensor d_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    for (int64_t a = 0; a < tokens; a += rows) {
      const int64_t b = std::min(tokens, a + rows);
      // In place on the chunk's logits: one [rows, vocab] fp32 tensor at a time (written
      // as expressions, the logits, their difference to the log-sum-exp, its exponential and
      // the scaled result were four).
      at::Tensor d_logits = chunk_logits(hidden, weight, a, b);
      d_logits.sub_(lse.narrow(0, a, b - a).unsqueeze(1)).exp_();
      d_logits.scatter_add_(1, targets.narrow(0, a, b - a).unsqueeze(1),
                            at::full({b - a, 1}, -1.0, d_logits.options()));
      const at::Tensor d_chunk = d_logits.mul_(scale).to(dtype);
      d_hidden.narrow(0, a, b - a).copy_(portable_matmul(d_chunk, weight));
      if (dtype == at::kFloat) {
        d_weight.addmm_(d_chunk.t(), hidden.narrow(0, a, b - a));  // in place: no [vocab, dim]
      } else {                                                     // temporary per chunk
        d_weight.add_(portable_matmul(d_chunk.t(), hidden.narrow(0, a, b - a)).to(at::kFloat));
      }
    }
    return {d_hidden, d_weight.to(weight.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

uint64_t full_logits_limit() noexcept { return g_full_logits_limit.load(); }

void set_full_logits_limit(uint64_t bytes) noexcept { g_full_logits_limit.store(bytes); }

at::Tensor chunked_lm_loss(const at::Tensor& hidden, const at::Tensor& weight,
                           const at::Tensor& targets, int64_t chunk_rows) {
  return ChunkedLmLoss::apply(hidden, weight, targets, chunk_rows)[0];
}

}  // namespace zinf::engine
