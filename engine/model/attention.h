// Causal self-attention that never holds the whole [seq, seq] score matrix, forward or
// backward, so sequences of thousands of tokens train within the memory plan.
//
// memory_efficient_attention() computes softmax(q k^T / sqrt(d) + mask) v over query chunks:
// each chunk's scores, [batch, heads, rows, keys it may see], exist only while that chunk is
// computed; the forward keeps the output and each row's log-sum-exp, and the backward
// recomputes each chunk's probabilities from them (as flash attention does) to form dq, dk
// and dv. Peak extra memory: one chunk's scores in fp32 (chunk_rows x seq per head) and
// fp32 accumulators for dk and dv. The masks are the causal one and, with `window` > 0, a
// sliding window (query i sees keys j with i - window < j <= i).
//
// Numerics follow the model's plain attention: scores from a matmul in the inputs' dtype,
// scaled and soft-maxed in fp32, probabilities rounded to the dtype before multiplying v. On
// CPU fp16 tensors the matmuls run in fp32 and round to fp16, as elsewhere in the model.
//
// Thread safety: reentrant (ATen ops only).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace zinf::engine {

// The score bytes (fp32) above which LlamaModel's attention takes this path (or, in a
// LibTorch 2.x build without a window, ATen's scaled_dot_product_attention, whose CPU and CUDA
// kernels hold no score matrix either): 64 MiB, a 2048-token sequence with 4 heads.
inline constexpr uint64_t kFullScoresLimitBytes = 64ull << 20;
// The fp32 scores one chunk of the long-sequence path holds (rows chosen to fit it).
inline constexpr uint64_t kScoresChunkBytes = 16ull << 20;

// The bytes above which the model's attention leaves full_attention (kFullScoresLimitBytes
// unless set; process-wide). Tests lower it to take the long-sequence path at short lengths.
[[nodiscard]] uint64_t full_scores_limit() noexcept;
void set_full_scores_limit(uint64_t bytes) noexcept;

// LibTorch 1.13 has no CPU kernels for matmul in fp16 (addmm, bmm): on CPU fp16 tensors
// portable_matmul runs it in fp32 and rounds the result to fp16, as a GPU's fp16 GEMM
// accumulates in fp32 and rounds its output (an autograd op: gradients come back in fp16).
// Every other dtype and device takes at::matmul unchanged.
[[nodiscard]] bool fp16_on_cpu(const at::Tensor& t);
[[nodiscard]] at::Tensor portable_matmul(const at::Tensor& a, const at::Tensor& b);

// q [batch, heads, seq, d], k and v the same shape (key/value heads already repeated for
// grouped-query attention) -> [batch, heads, seq, d]. `chunk_rows` 0 picks rows so one chunk's
// scores take about 16 MiB. Differentiable with respect to q, k and v.
[[nodiscard]] at::Tensor memory_efficient_attention(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, int64_t window,
                                                    int64_t chunk_rows = 0);

// The plain formulation (the whole score matrix, autograd's own backward), for the model's
// short sequences and as the reference of the tests.
[[nodiscard]] at::Tensor full_attention(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, int64_t window);

}  // namespace zinf::engine
