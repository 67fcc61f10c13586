#include "engine/model/fused_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "engine/model/attention.h"

namespace zinf::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// SiLU has no LibTorch 1.13 CPU kernel in fp16: portable_matmul's rule (attention.h).
at::Tensor portable_silu(const at::Tensor& x) {
  if (!fp16_on_cpu(x)) {
    return at::silu(x);
  }
  return at::silu(x.to(at::kFloat)).to(at::kHalf);
}

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor scale = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
    ctx->save_for_backward({x, weight, scale});
    return (xf * scale * weight.to(at::kFloat)).to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& scale = saved[2];
    const at::Tensor dy = grads[0].to(at::kFloat);  // may be grads[0] itself: read only
    at::Tensor normed = x.to(at::kFloat) * scale;
    const int64_t dim = x.size(-1);
    const at::Tensor d_weight = (dy * normed).reshape({-1, dim}).sum(0).to(weight.scalar_type());
    at::Tensor g = dy * weight.to(at::kFloat);
    const at::Tensor dot = (g * normed).mean(-1, /*keepdim=*/true);
    g.sub_(normed.mul_(dot)).mul_(scale);
    return {g.to(x.scalar_type()), d_weight, at::Tensor()};
  }
};

struct SwigluFunction : public torch::autograd::Function<SwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return portable_silu(gate) * up;
  }

  // Autograd's chain for silu(gate) * up: the product's backward gives dy * up and
  // dy * silu(gate); silu's backward turns the first into gate's gradient. Here the first
  // becomes gate's gradient in place, and silu(gate) is recomputed into up's.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& gate = saved[0];
    const at::Tensor& up = saved[1];
    const at::Tensor& dy = grads[0];
    at::Tensor d_gate = dy * up;
    if (fp16_on_cpu(gate)) {
      d_gate = at::silu_backward(d_gate.to(at::kFloat), gate.to(at::kFloat)).to(at::kHalf);
    } else {
      at::silu_backward_out(d_gate, d_gate, gate);
    }
    at::Tensor d_up = portable_silu(gate).mul_(dy);
    return {d_gate, d_up};
  }
};

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return SwigluFunction::apply(gate, up);
}

}  // namespace zinf::engine
