// Internal seam between the optimizers (adam.cc, ...) and the per-instruction-set kernel
// translation units (kernels_<level>.cc). Not part of the public API.
//
// Each kernel processes the elements [begin, end) of one step serially in the calling
// thread and returns how many scaled gradients in that range were NaN/Inf; the caller splits
// the work into tiles over TBB threads. Every kernel is compiled once per SIMD level with
// that level's -m flags; kernel_table() hands out the one active_simd() selects.
//
// Thread-safety: kernels are pure functions of their arguments; tables are immutable.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optimizer_cpu/optimizer.h"
#include "optimizer_cpu/simd_level.h"

namespace zinf::optimizer_cpu::detail {

// What is written as the 16-bit copy of the params.
enum class CopyOut : std::uint8_t { kNone, kBFloat16, kFloat16 };

// The arrays of one step; the same meaning as in StepArgs.
struct KernelArrays {
  float* params;
  const void* grads;
  void* exp_avg;
  void* exp_avg_sq;
  void* param_copy;
  DType grad_dtype;
  DType state_dtype;
  CopyOut copy_out;
  // Write the copy with non-temporal stores (large steps, where it will not stay cached).
  bool stream_copy;
  float grad_scale;
};

// Adam's per-step constants (see adam.h for the rule).
struct AdamCoefficients {
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  float inv_sqrt_bias_correction2;  // 1/sqrt(1 - beta2^t), or 1
  float step_size;                  // -lr / (1 - beta1^t), or -lr
  float decoupled_decay;            // -lr * wd in AdamW mode, else 0
  float l2_decay;                   // wd in L2 mode, else 0
};

struct AdagradCoefficients {
  float eps;
  float step_size;  // -lr / (1 + (t - 1) * lr_decay)
  float l2_decay;   // wd
};

struct LionCoefficients {
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float neg_lr;           // -lr
  float decoupled_decay;  // -lr * wd
};

struct KernelTable {
  std::uint64_t (*adam)(const AdamCoefficients&, const KernelArrays&, std::size_t begin,
                        std::size_t end);
  std::uint64_t (*adagrad)(const AdagradCoefficients&, const KernelArrays&, std::size_t begin,
                           std::size_t end);
  std::uint64_t (*lion)(const LionCoefficients&, const KernelArrays&, std::size_t begin,
                        std::size_t end);
  // NaN/Inf among data[i] * scale.
  std::uint64_t (*count_nonfinite)(const void* data, DType dtype, float scale, std::size_t begin,
                                   std::size_t end);
};

// Per-level tables; null when the level is not compiled for this target.
const KernelTable* kernels_scalar();
const KernelTable* kernels_sse2();
const KernelTable* kernels_avx2();
const KernelTable* kernels_avx512();
const KernelTable* kernels_neon();

// The table of `level` (which must be available), and of active_simd().
const KernelTable& kernel_table(SimdLevel level);
const KernelTable& active_kernel_table();

}  // namespace zinf::optimizer_cpu::detail
