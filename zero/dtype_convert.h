// Element-wise conversions between the gradient and parameter element types (fp32, bf16,
// fp16) and fp32, on raw buffers, with the rounding the optimizer's kernels use
// (optimizer_cpu/half.h: round to nearest even, NaN stays NaN). Parallel over TBB for
// large buffers.
//
// Thread safety: pure functions on the caller's buffers.
#pragma once

#include <cstdint>

#include "zero/comm/communicator.h"
#include "zero/zero_config.h"

namespace zinf::zero {

// dst[i] = float(src[i]) for src of `dtype` (fp32, bf16 or fp16).
void to_float(const void* src, DType dtype, float* dst, uint64_t numel);
// dst[i] = convert(src[i]) to `dtype` (fp32, bf16 or fp16).
void from_float(const float* src, void* dst, DType dtype, uint64_t numel);
// dst[i] += scale * float(src[i]).
void accumulate_scaled(float* dst, const void* src, DType dtype, uint64_t numel, float scale);
// dst[i] = convert(src[i]) between any two of fp32, bf16, fp16 (a copy when equal).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, uint64_t numel);

// Sum of squares (in double) and count of NaN/Inf values of data[0..numel).
struct NormPart {
  double sumsq = 0.0;
  uint64_t nonfinite = 0;
};
[[nodiscard]] NormPart norm_part(const float* data, uint64_t numel);

// The element type the model computes in (params, grads) at `precision`.
[[nodiscard]] DType compute_dtype(Precision precision) noexcept;

}  // namespace zinf::zero
