// Two of a Llama layer's element-wise pieces as autograd functions of their own, so that the
// backward keeps less of the layer's recomputation alive. Their forward runs the very ops of
// the formula as before (the same values, bit for bit); what changes is what is saved:
//
// rms_norm(x, weight, eps) = (x * rsqrt(mean(x^2, -1) + eps)) * weight, in fp32, rounded to
//   x's dtype. Autograd's chain of that formula keeps the normalised rows (fp32, the size of
//   x) until the norm's backward, and LibTorch 1.13's one more tensor that size (an fp32 copy
//   of a 16-bit x besides): FusedOps.KeepLessForTheBackwardThanAutogradsChain. This keeps x
//   (alive anyway: the residual stream) and one fp32 scale per row, and the backward
//   recomputes the normalised rows. Its gradients are the closed form
//   dx = r * (g - n * mean(g * n, -1)), dw = sum(dy * n) with n the normalised rows,
//   r the row's scale and g = dy * w: equal to autograd's chain up to fp32 rounding.
//
// swiglu(gate, up) = silu(gate) * up. Autograd would keep silu(gate) besides gate and up;
//   this keeps gate and up, and its backward forms silu's gradient in place of the product's
//   (the same values as autograd's: the same kernels in the same order), holding two
//   gradients the size of gate at once instead of three.
//
// On a layer of 4096 tokens of the SmolLM-135M shape, with LibTorch 1.13, the two norms
// (18 MiB each) and silu(gate) (24 MiB) no longer held: 60 MiB less on the device at the peak
// of its backward (bench/long_seq).
//
// Thread safety: reentrant (ATen ops only).
#pragma once

#include <ATen/core/Tensor.h>

namespace zinf::engine {

// x [..., dim] (any float dtype), weight [dim] -> x's shape and dtype; differentiable with
// respect to x and weight.
[[nodiscard]] at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// gate and up of one shape and dtype -> silu(gate) * up; differentiable with respect to both.
// fp16 on the CPU computes silu in fp32 (attention.h's fp16_on_cpu rule).
[[nodiscard]] at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

}  // namespace zinf::engine
