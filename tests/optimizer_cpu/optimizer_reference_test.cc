// Every optimizer rule against the double-precision reference (reference.h) over 10 steps,
// at every SIMD level this machine has (forced in turn), for every combination of grad dtype,
// state dtype and 16-bit copy-out, on odd lengths and misaligned starts.
//
// fp32 states: the reference runs its own trajectory from the same start and must stay
// within a few fp32 ulps. bf16 states (and Lion, whose sign() would turn a 1-ulp difference
// into an lr-sized one): before each step the reference restarts from the kernel's stored
// state, so each step is checked tightly and rounding differences cannot compound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "optimizer_cpu/adagrad.h"
#include "optimizer_cpu/adam.h"
#include "optimizer_cpu/lion.h"
#include "optimizer_cpu/simd_level.h"
#include "tests/optimizer_cpu/reference.h"
#include "tests/optimizer_cpu/test_util.h"

namespace zinf::optimizer_cpu::testing {
namespace {

enum class Rule { kAdamW, kAdamWNoBias, kAdamL2, kAdamL2NoBias, kAdagrad, kLion };

std::string rule_name(Rule r) {
  switch (r) {
    case Rule::kAdamW:
      return "AdamW";
    case Rule::kAdamWNoBias:
      return "AdamWNoBias";
    case Rule::kAdamL2:
      return "AdamL2";
    case Rule::kAdamL2NoBias:
      return "AdamL2NoBias";
    case Rule::kAdagrad:
      return "Adagrad";
    case Rule::kLion:
      return "Lion";
  }
  return "?";
}

bool is_adam(Rule r) { return r != Rule::kAdagrad && r != Rule::kLion; }

AdamConfig adam_config(Rule r) {
  AdamConfig c;
  c.lr = 1e-2f;
  c.weight_decay = 0.1f;
  c.adamw_mode = r == Rule::kAdamW || r == Rule::kAdamWNoBias;
  c.bias_correction = r == Rule::kAdamW || r == Rule::kAdamL2;
  return c;
}

AdagradConfig adagrad_config() {
  AdagradConfig c;
  c.lr = 0.1f;
  c.lr_decay = 0.01f;
  c.weight_decay = 0.05f;
  return c;
}

LionConfig lion_config() {
  LionConfig c;
  c.lr = 1e-3f;
  c.weight_decay = 0.1f;
  return c;
}

std::unique_ptr<Optimizer> make_optimizer(Rule r) {
  if (is_adam(r)) return std::make_unique<AdamOptimizer>(adam_config(r));
  if (r == Rule::kAdagrad) return std::make_unique<AdagradOptimizer>(adagrad_config());
  return std::make_unique<LionOptimizer>(lion_config());
}

// Elementwise |actual - expected| <= rtol * |expected| + atol; reports the first miss.
::testing::AssertionResult close(const char* what, const std::vector<double>& actual,
                                 const std::vector<double>& expected, double rtol, double atol) {
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double err = std::fabs(actual[i] - expected[i]);
    if (!(err <= rtol * std::fabs(expected[i]) + atol)) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "] = " << actual[i] << ", reference " << expected[i]
             << " (error " << err << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

struct Case {
  Rule rule;
  DType grad_dtype;
  DType state_dtype;
  std::optional<DType> copy_dtype;
  std::size_t numel;
  std::size_t misalign;
  float grad_scale;
  std::uint64_t seed;
};

std::string describe(const Case& c) {
  return rule_name(c.rule) + " grad=" + dtype_name(c.grad_dtype) +
         " state=" + dtype_name(c.state_dtype) +
         " copy=" + (c.copy_dtype ? dtype_name(*c.copy_dtype) : std::string("none")) +
         " numel=" + std::to_string(c.numel) + " misalign=" + std::to_string(c.misalign) +
         " grad_scale=" + std::to_string(c.grad_scale) + " seed=" + std::to_string(c.seed) +
         " simd=" + std::string(active_simd_level());
}

constexpr int kSteps = 10;

// Runs kSteps steps of `c` and checks each against the reference.
void run_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const std::size_t n = c.numel;
  const bool uses_m = c.rule != Rule::kAdagrad;
  const bool uses_v = c.rule != Rule::kLion;
  // Lion's sign() and rounded states: restart the reference from the kernel every step.
  const bool resync = c.state_dtype != DType::kFloat32 || c.rule == Rule::kLion;

  Buffer p(DType::kFloat32, n, c.misalign);
  Buffer g(c.grad_dtype, n, (c.misalign + 1) % 4);
  Buffer m(c.state_dtype, n, (c.misalign + 2) % 4);
  Buffer v(c.state_dtype, n, (c.misalign + 3) % 4);
  std::optional<Buffer> copy;
  if (c.copy_dtype) copy.emplace(*c.copy_dtype, n, c.misalign);
  for (std::size_t i = 0; i < n; ++i) {
    p.set(i, normal(rng));
    m.set(i, 0.1 * normal(rng));
    v.set(i, c.rule == Rule::kAdagrad ? std::fabs(normal(rng)) : 0.01 * std::fabs(normal(rng)));
  }
  std::vector<double> rp = p.values(), rm = m.values(), rv = v.values();

  std::unique_ptr<Optimizer> opt = make_optimizer(c.rule);
  for (int t = 1; t <= kSteps; ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    // Gradients of magnitude ~1 after scaling, rounded to the grad dtype.
    for (std::size_t i = 0; i < n; ++i) g.set(i, normal(rng) / c.grad_scale);
    std::vector<double> rg = g.values();
    for (double& x : rg) x *= c.grad_scale;

    if (resync) {
      rp = p.values();
      rm = m.values();
      rv = v.values();
    }
    StepArgs args;
    args.params = p.f32();
    args.grads = g.data();
    args.grad_dtype = c.grad_dtype;
    args.exp_avg = uses_m ? m.data() : nullptr;
    args.exp_avg_sq = uses_v ? v.data() : nullptr;
    args.state_dtype = c.state_dtype;
    args.numel = n;
    args.grad_scale = c.grad_scale;
    if (copy) {
      args.param_copy = copy->data();
      args.param_copy_dtype = *c.copy_dtype;
    }
    args.step = t;
    const StepResult result = opt->step(args);
    ASSERT_EQ(result.nonfinite_grads, 0u);
    ASSERT_FALSE(result.skipped);

    if (is_adam(c.rule)) {
      reference_adam(adam_config(c.rule), t, rp, rm, rv, rg);
    } else if (c.rule == Rule::kAdagrad) {
      reference_adagrad(adagrad_config(), t, rp, rv, rg);
    } else {
      reference_lion(lion_config(), rp, rm, rg);
    }

    // fp32 params: a few ulps per step (accumulated over the steps without resync).
    const double p_tol = resync ? 1e-6 : 3e-6;
    ASSERT_TRUE(close("params", p.values(), rp, p_tol, p_tol));
    // bf16 states: one rounding to 8 mantissa bits (2^-9 relative) on top of the fp32 error.
    const double s_rtol = c.state_dtype == DType::kBFloat16 ? 1.0 / 256 : 1e-5;
    if (uses_m) {
      ASSERT_TRUE(close("exp_avg", m.values(), rm, s_rtol, 1e-7));
    }
    if (uses_v) {
      ASSERT_TRUE(close("exp_avg_sq", v.values(), rv, s_rtol, 1e-9));
    }
    if (copy) {
      // The copy is the updated fp32 param rounded to nearest even: bit-exact.
      for (std::size_t i = 0; i < n; ++i) {
        const float x = p.f32()[i];
        const std::uint16_t want =
            *c.copy_dtype == DType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x);
        ASSERT_EQ(copy->bits16(i), want) << "param_copy[" << i << "] of " << x;
      }
    }
  }
}

class ReferenceTest : public ::testing::TestWithParam<std::tuple<SimdLevel, Rule>> {
 protected:
  void SetUp() override { force_simd_level(std::get<0>(GetParam())); }
  void TearDown() override { reset_simd_level(); }
};

TEST_P(ReferenceTest, AllDtypesOddLengthsMisaligned) {
  const Rule rule = std::get<1>(GetParam());
  const DType grad_dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const DType state_dtypes[] = {DType::kFloat32, DType::kBFloat16};
  const std::optional<DType> copy_dtypes[] = {std::nullopt, DType::kBFloat16, DType::kFloat16};
  const std::size_t lengths[] = {1, 5, 16, 17, 63, 1021};
  std::uint64_t seed = test_seed();
  for (DType grad : grad_dtypes) {
    for (DType state : state_dtypes) {
      for (const auto& copy : copy_dtypes) {
        for (std::size_t k = 0; k < std::size(lengths); ++k) {
          const float scale = (seed % 2 == 0) ? 1.0f : 0.125f;
          run_case(Case{rule, grad, state, copy, lengths[k], k % 4, scale, seed++});
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Several TBB tiles (and so several threads), fp32 everything, with a bf16 copy.
TEST_P(ReferenceTest, ManyTiles) {
  const Rule rule = std::get<1>(GetParam());
  run_case(Case{rule, DType::kFloat32, DType::kFloat32, DType::kBFloat16, 3 * 65536 + 13, 1, 0.5f,
                test_seed() + 1000});
}

INSTANTIATE_TEST_SUITE_P(Levels, ReferenceTest,
                         ::testing::Combine(::testing::ValuesIn(available_simd_levels()),
                                            ::testing::Values(Rule::kAdamW, Rule::kAdamWNoBias,
                                                              Rule::kAdamL2, Rule::kAdamL2NoBias,
                                                              Rule::kAdagrad, Rule::kLion)),
                         [](const auto& param_info) {
                           return std::string(to_string(std::get<0>(param_info.param))) + "_" +
                                  rule_name(std::get<1>(param_info.param));
                         });

}  // namespace
}  // namespace zinf::optimizer_cpu::testing
