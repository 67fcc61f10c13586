// rms_norm and swiglu (engine/model/fused_ops.h) against autograd's own chain of the same
// formula: the forward bit for bit, swiglu's gradients bit for bit, rms_norm's to fp32
// rounding (and to 1e-10 in fp64, where rounding is out of the way); and they save less.

#include "engine/model/fused_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/compute_memory.h"
#include "engine/model/attention.h"
#include "tests/common/seed.h"

namespace zinf::engine {
namespace {

at::Tensor reference_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (normed * w.to(at::kFloat)).to(x.scalar_type());
}

at::Tensor reference_swiglu(const at::Tensor& gate, const at::Tensor& up) {
  const at::Tensor s =
      fp16_on_cpu(gate) ? at::silu(gate.to(at::kFloat)).to(at::kHalf) : at::silu(gate);
  return s * up;
}

// The gradients of sum(f(inputs) * dy) with respect to `inputs`, and f's value.
template <typename F>
std::vector<at::Tensor> grads_of(F f, std::vector<at::Tensor> inputs, const at::Tensor& dy,
                                 at::Tensor* value) {
  for (at::Tensor& t : inputs) t = t.detach().clone().set_requires_grad(true);
  const at::Tensor y = f(inputs);
  *value = y.detach();
  y.backward(dy);
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : inputs) out.push_back(t.grad());
  return out;
}

double relative(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor da = a.to(at::kDouble), db = b.to(at::kDouble);
  return (da - db).norm().item<double>() / std::max(db.norm().item<double>(), 1e-300);
}

TEST(FusedOps, RmsNormEqualsTheFormulaForwardAndItsGradientsToRounding) {
  const uint64_t seed = ::zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  at::manual_seed(static_cast<int64_t>(seed));
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    // [batch, seq, heads, head_dim] as q_norm sees it, and the plain [batch, seq, hidden].
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{2, 7, 3, 16}, std::vector<int64_t>{3, 5, 40}}) {
      const at::Tensor x = (at::randn(shape) * 3).to(dtype);
      const at::Tensor w = (at::rand({shape.back()}) + 0.5).to(dtype);
      const at::Tensor dy = at::randn(shape).to(dtype);
      at::Tensor got_y, want_y;
      const auto got =
          grads_of([](const std::vector<at::Tensor>& in) { return rms_norm(in[0], in[1], 1e-6); },
                   {x, w}, dy, &got_y);
      const auto want = grads_of(
          [](const std::vector<at::Tensor>& in) { return reference_rms_norm(in[0], in[1], 1e-6); },
          {x, w}, dy, &want_y);
      EXPECT_TRUE(at::equal(got_y, want_y));
      // The norm computes in fp32 whatever the dtype: fp32 rounding; bf16's own rounding of
      // the results on top.
      const double tolerance = dtype == at::kBFloat16 ? 1e-2 : 1e-6;
      EXPECT_LT(relative(got[0], want[0]), tolerance);
      EXPECT_LT(relative(got[1], want[1]), tolerance);
      EXPECT_EQ(got[0].scalar_type(), dtype);
      EXPECT_EQ(got[1].scalar_type(), dtype);
    }
  }
}

TEST(FusedOps, SwigluEqualsAutogradsChainBitForBit) {
  const uint64_t seed = ::zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  at::manual_seed(static_cast<int64_t>(seed));
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    const at::Tensor gate = (at::randn({4, 9, 33}) * 4).to(dtype);
    const at::Tensor up = at::randn({4, 9, 33}).to(dtype);
    const at::Tensor dy = at::randn({4, 9, 33}).to(dtype);
    at::Tensor got_y, want_y;
    const auto got =
        grads_of([](const std::vector<at::Tensor>& in) { return swiglu(in[0], in[1]); }, {gate, up},
                 dy, &got_y);
    const auto want =
        grads_of([](const std::vector<at::Tensor>& in) { return reference_swiglu(in[0], in[1]); },
                 {gate, up}, dy, &want_y);
    EXPECT_TRUE(at::equal(got_y, want_y));
    EXPECT_TRUE(at::equal(got[0], want[0]));
    EXPECT_TRUE(at::equal(got[1], want[1]));
  }
}

// What stays alive between the forward and the backward: x and a scale per row for the
// norm (autograd's chain: the normalised rows too, and on LibTorch 1.13 one more tensor the
// size of x), gate and up for swiglu (autograd: silu(gate) too).
TEST(FusedOps, KeepLessForTheBackwardThanAutogradsChain) {
  track_compute_memory();
  constexpr int64_t kRows = 512, kDim = 256;
  const uint64_t size = kRows * kDim * 4;
  auto kept = [](auto f, std::vector<at::Tensor> inputs) {
    for (at::Tensor& t : inputs) t.set_requires_grad(true);
    const uint64_t before = compute_memory(at::kCPU).in_use_bytes;
    at::Tensor y = f(inputs);
    const uint64_t after = compute_memory(at::kCPU).in_use_bytes;
    y.sum().backward();
    return after - before;  // y and what its graph saved
  };
  const at::Tensor w = at::rand({kDim});
  const uint64_t norm =
      kept([](const std::vector<at::Tensor>& in) { return rms_norm(in[0], in[1], 1e-6); },
           {at::randn({kRows, kDim}), w.clone()});
  const uint64_t norm_chain =
      kept([](const std::vector<at::Tensor>& in) { return reference_rms_norm(in[0], in[1], 1e-6); },
           {at::randn({kRows, kDim}), w.clone()});
  EXPECT_LT(norm, size + size / 8) << "the output and the row scales";
  // The normalised rows at least: LibTorch 2.11's chain keeps them besides its output, 1.13's
  // one more tensor of x's size.
  EXPECT_GE(norm_chain, norm + size);
  const uint64_t glu = kept([](const std::vector<at::Tensor>& in) { return swiglu(in[0], in[1]); },
                            {at::randn({kRows, kDim}), at::randn({kRows, kDim})});
  const uint64_t glu_chain =
      kept([](const std::vector<at::Tensor>& in) { return reference_swiglu(in[0], in[1]); },
           {at::randn({kRows, kDim}), at::randn({kRows, kDim})});
  EXPECT_EQ(glu, size) << "the output only";
  EXPECT_EQ(glu_chain, glu + size) << "and silu(gate)";
}

}  // namespace
}  // namespace zinf::engine
