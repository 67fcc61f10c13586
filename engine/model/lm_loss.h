// The language-model loss without the [tokens, vocab] logits: the output head and the
// cross-entropy computed together over chunks of tokens, forward and backward.
//
// chunked_lm_loss(hidden, weight, targets) is the mean over tokens of
// cross_entropy(hidden @ weight^T, targets), as LlamaModel's plain loss computes it (the
// matmul in hidden's dtype, logits and softmax in fp32). The forward keeps no logits: per
// chunk of rows it computes the chunk's logits, their log-sum-exp and the target's logit, and
// drops them. The backward recomputes each chunk's logits and forms
// d_logits = (softmax - one_hot(target)) / tokens, then d_hidden = d_logits @ weight and
// d_weight += d_logits^T @ hidden (accumulated in fp32), each chunk's d_logits formed in place
// on its logits. Peak extra memory: one chunk's logits in fp32 (about 32 MiB) and an fp32
// accumulator the size of weight — where the plain
// loss holds the logits, their softmax and their gradient, three times tokens x vocab x 4 bytes
// (2.4 GB for 4096 tokens of a 49152-token vocabulary).
//
// Thread safety: reentrant (ATen ops only).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace zinf::engine {

// The logits bytes (fp32) above which LlamaModel::loss takes chunked_lm_loss: 64 MiB.
inline constexpr uint64_t kFullLogitsLimitBytes = 64ull << 20;
// The fp32 logits one chunk of the chunked loss holds (rows chosen to fit it).
inline constexpr uint64_t kLogitsChunkBytes = 32ull << 20;
// Process-wide; tests lower it to take the chunked path at short lengths.
[[nodiscard]] uint64_t full_logits_limit() noexcept;
void set_full_logits_limit(uint64_t bytes) noexcept;

// hidden [tokens, dim] (any float dtype), weight [vocab, dim] (the same dtype), targets
// [tokens] (int64, each below vocab) -> a scalar fp32 loss, differentiable with respect to
// hidden and weight. `chunk_rows` 0: rows so one chunk's logits take about 32 MiB.
[[nodiscard]] at::Tensor chunked_lm_loss(const at::Tensor& hidden, const at::Tensor& weight,
                                         const at::Tensor& targets, int64_t chunk_rows = 0);

}  // namespace zinf::engine
