// Properties of the optimizers beyond the reference values: results independent of thread
// count, tiling and alignment; 16-bit conversions in the kernels bit-exact with half.h;
// non-finite gradients counted (and steps skipped on request); beta powers on resume and
// beta changes; concurrent steps; argument checks.
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "optimizer_cpu/adagrad.h"
#include "optimizer_cpu/adam.h"
#include "optimizer_cpu/lion.h"
#include "optimizer_cpu/simd_level.h"
#include "tests/optimizer_cpu/reference.h"
#include "tests/optimizer_cpu/test_util.h"

namespace zinf::optimizer_cpu::testing {
namespace {

// One Adam problem (params, grads, states, bf16 copy) with seeded random contents.
struct AdamProblem {
  AdamProblem(std::size_t n, std::uint64_t seed, DType grad_dtype = DType::kFloat32,
              DType state_dtype = DType::kFloat32, std::size_t misalign = 0)
      : p(DType::kFloat32, n, misalign),
        g(grad_dtype, n, misalign),
        m(state_dtype, n, misalign),
        v(state_dtype, n, misalign),
        copy(DType::kBFloat16, n, misalign) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal;
    for (std::size_t i = 0; i < n; ++i) {
      p.set(i, normal(rng));
      g.set(i, normal(rng));
      m.set(i, 0.1 * normal(rng));
      v.set(i, 0.01 * std::fabs(normal(rng)));
    }
  }

  StepArgs args(std::int64_t step, std::size_t begin = 0, std::size_t end = SIZE_MAX) {
    end = std::min(end, p.numel());
    const std::size_t gs = dtype_size(g.dtype()), ss = dtype_size(m.dtype());
    StepArgs a;
    a.params = p.f32() + begin;
    a.grads = static_cast<const unsigned char*>(g.data()) + begin * gs;
    a.grad_dtype = g.dtype();
    a.exp_avg = static_cast<unsigned char*>(m.data()) + begin * ss;
    a.exp_avg_sq = static_cast<unsigned char*>(v.data()) + begin * ss;
    a.state_dtype = m.dtype();
    a.numel = end - begin;
    a.param_copy = static_cast<unsigned char*>(copy.data()) + begin * 2;
    a.param_copy_dtype = DType::kBFloat16;
    a.step = step;
    return a;
  }

  // Everything the step writes, for bit-exact comparisons.
  std::vector<std::vector<unsigned char>> state() const {
    return {p.bytes(), m.bytes(), v.bytes(), copy.bytes()};
  }

  Buffer p, g, m, v, copy;
};

class PerLevelTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override { force_simd_level(GetParam()); }
  void TearDown() override { reset_simd_level(); }
};

INSTANTIATE_TEST_SUITE_P(Levels, PerLevelTest, ::testing::ValuesIn(available_simd_levels()),
                         [](const auto& param_info) {
                           return std::string(to_string(param_info.param));
                         });

TEST_P(PerLevelTest, ThreadCountDoesNotChangeResults) {
  const std::size_t n = 5 * 65536 + 7;
  std::vector<std::vector<std::vector<unsigned char>>> results;
  for (int threads : {1, 2, 3}) {
    AdamProblem problem(n, test_seed(), DType::kBFloat16, DType::kBFloat16);
    AdamOptimizer opt({.lr = 1e-2f, .weight_decay = 0.01f});
    tbb::task_arena arena(threads);
    arena.execute([&] {
      for (int t = 1; t <= 3; ++t) ASSERT_EQ(opt.step(problem.args(t)).nonfinite_grads, 0u);
    });
    results.push_back(problem.state());
  }
  EXPECT_TRUE(results[0] == results[1]);
  EXPECT_TRUE(results[0] == results[2]);
}

TEST_P(PerLevelTest, SplitAndAlignmentDoNotChangeResults) {
  const std::size_t n = 1000 + 3;
  AdamProblem whole(n, test_seed());
  AdamProblem split(n, test_seed());
  AdamProblem shifted(n, test_seed(), DType::kFloat32, DType::kFloat32, 3);
  AdamOptimizer opt({.lr = 1e-2f, .weight_decay = 0.01f, .adamw_mode = false});
  for (int t = 1; t <= 3; ++t) {
    (void)opt.step(whole.args(t));
    // Two sub-groups of one step, cut at an odd element.
    (void)opt.step(split.args(t, 0, 333));
    (void)opt.step(split.args(t, 333));
    (void)opt.step(shifted.args(t));
  }
  EXPECT_TRUE(whole.state() == split.state());
  EXPECT_TRUE(whole.state() == shifted.state());
}

// Large steps write the 16-bit copy with non-temporal stores from an aligned point on; the
// result must be the same as the plain path's (two calls below the streaming threshold).
TEST_P(PerLevelTest, StreamedCopyMatchesPlainCopy) {
  const std::size_t n = (std::size_t{1} << 20) + 37;
  for (DType copy_dtype : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype_name(copy_dtype));
    AdamProblem streamed(n, test_seed(), DType::kFloat32, DType::kFloat32, 1);
    AdamProblem plain(n, test_seed(), DType::kFloat32, DType::kFloat32, 1);
    Buffer streamed_copy(copy_dtype, n, 3), plain_copy(copy_dtype, n, 3);
    AdamOptimizer opt;
    StepArgs a = streamed.args(1);
    a.param_copy = streamed_copy.data();
    a.param_copy_dtype = copy_dtype;
    (void)opt.step(a);
    for (std::size_t begin : {std::size_t{0}, n / 2}) {
      StepArgs b = plain.args(1, begin, begin == 0 ? n / 2 : n);
      b.param_copy = static_cast<std::uint16_t*>(plain_copy.data()) + begin;
      b.param_copy_dtype = copy_dtype;
      (void)opt.step(b);
    }
    EXPECT_TRUE(streamed.state() == plain.state());
    EXPECT_TRUE(streamed_copy.bytes() == plain_copy.bytes());
    for (std::size_t i = 0; i < n; i += 4099) {
      const float x = streamed.p.f32()[i];
      ASSERT_EQ(streamed_copy.bits16(i),
                copy_dtype == DType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x));
    }
  }
}

// Lion with beta1 = beta2 = 0 and lr = 0 stores exactly g * 1 as its state and leaves the
// params alone: a window onto the kernels' loads, stores and copy-out conversions.
TEST_P(PerLevelTest, KernelConversionsAreBitExact) {
  LionOptimizer lion({.lr = 0.0f, .beta1 = 0.0f, .beta2 = 0.0f});
  std::mt19937 rng(test_seed());
  const std::size_t n = 65536 + 5;
  for (DType grad_dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (DType state_dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (DType copy_dtype : {DType::kBFloat16, DType::kFloat16}) {
        SCOPED_TRACE(dtype_name(grad_dtype) + "/" + dtype_name(state_dtype) + "/" +
                     dtype_name(copy_dtype));
        Buffer p(DType::kFloat32, n, 1), g(grad_dtype, n, 3), m(state_dtype, n, 2),
            copy(copy_dtype, n, 1);
        for (std::size_t i = 0; i < n; ++i) {
          const auto bits = static_cast<std::uint32_t>(rng());
          p.f32()[i] = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
          if (grad_dtype == DType::kFloat32) {
            g.f32()[i] = std::bit_cast<float>(bits);
          } else {
            g.set_bits16(i, static_cast<std::uint16_t>(i));  // every 16-bit pattern
          }
          m.set(i, 0.0);
        }
        StepArgs a;
        a.params = p.f32();
        a.grads = g.data();
        a.grad_dtype = grad_dtype;
        a.exp_avg = m.data();
        a.state_dtype = state_dtype;
        a.numel = n;
        a.param_copy = copy.data();
        a.param_copy_dtype = copy_dtype;
        const StepResult r = lion.step(a);
        std::uint64_t nonfinite = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double gi = g.get(i);
          nonfinite += std::isfinite(gi) ? 0 : 1;
          if (std::isnan(gi)) {
            ASSERT_TRUE(std::isnan(m.get(i))) << i;
          } else if (state_dtype == DType::kFloat32) {
            ASSERT_EQ(m.get(i), gi) << i;
          } else if (gi != 0.0) {
            ASSERT_EQ(m.bits16(i), float_to_bf16(static_cast<float>(gi))) << i << " " << gi;
          }
          const float pi = p.f32()[i];
          const std::uint16_t want =
              copy_dtype == DType::kBFloat16 ? float_to_bf16(pi) : float_to_fp16(pi);
          if (std::isnan(pi)) {
            ASSERT_TRUE(std::isnan(copy.get(i))) << i;
          } else {
            ASSERT_EQ(copy.bits16(i), want) << i << " " << pi;
          }
        }
        EXPECT_EQ(r.nonfinite_grads, nonfinite);
        EXPECT_EQ(count_nonfinite(g.data(), grad_dtype, n), nonfinite);
      }
    }
  }
}

TEST_P(PerLevelTest, NonfiniteGradsAreCountedOrSkipped) {
  const std::size_t n = 101;
  for (DType grad_dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype_name(grad_dtype));
    for (bool skip : {false, true}) {
      AdamProblem problem(n, test_seed(), grad_dtype);
      problem.g.set(0, std::numeric_limits<double>::quiet_NaN());
      problem.g.set(17, HUGE_VAL);
      problem.g.set(n - 1, -HUGE_VAL);  // in the tail
      const auto before = problem.state();
      AdamOptimizer opt;
      StepArgs a = problem.args(1);
      a.skip_if_nonfinite = skip;
      const StepResult r = opt.step(a);
      EXPECT_EQ(r.nonfinite_grads, 3u);
      EXPECT_TRUE(r.found_nonfinite());
      EXPECT_EQ(r.skipped, skip);
      if (skip) {
        EXPECT_TRUE(problem.state() == before);
      } else {
        EXPECT_TRUE(std::isnan(problem.p.f32()[0]));
        EXPECT_TRUE(std::isfinite(problem.p.f32()[1]));
      }
    }
  }
  // A finite gradient that the scale pushes past FLT_MAX counts too.
  AdamProblem problem(n, test_seed());
  problem.g.set(5, 3e38);
  AdamOptimizer opt;
  StepArgs a = problem.args(1);
  a.grad_scale = 4.0f;
  a.skip_if_nonfinite = true;
  const StepResult r = opt.step(a);
  EXPECT_EQ(r.nonfinite_grads, 1u);
  EXPECT_TRUE(r.skipped);
}

TEST(AdamStepTest, BetaPowersFollowResumeAndBetaChanges) {
  const std::size_t n = 257;
  AdamConfig config{.lr = 1e-2f, .weight_decay = 0.1f};
  // Run 1: steps 1..6 in one optimizer (powers advanced by multiplication).
  AdamProblem run(n, test_seed());
  AdamOptimizer opt(config);
  for (int t = 1; t <= 5; ++t) (void)opt.step(run.args(t));
  // Run 2: a fresh optimizer resumes at step 6 from run 1's state (powers from pow()).
  AdamProblem resumed(n, test_seed());
  for (Buffer* b : {&resumed.p, &resumed.m, &resumed.v}) {
    Buffer* src = b == &resumed.p ? &run.p : (b == &resumed.m ? &run.m : &run.v);
    for (std::size_t i = 0; i < n; ++i) b->set(i, src->get(i));
  }
  std::vector<double> rp = run.p.values(), rm = run.m.values(), rv = run.v.values();
  (void)opt.step(run.args(6));
  AdamOptimizer fresh(config);
  (void)fresh.step(resumed.args(6));
  reference_adam(config, 6, rp, rm, rv, run.g.values());
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(resumed.p.get(i), run.p.get(i), 1e-7 * (1 + std::fabs(rp[i]))) << i;
    ASSERT_NEAR(run.p.get(i), rp[i], 1e-6 * (1 + std::fabs(rp[i]))) << i;
  }
  // New betas at step 7: powers recomputed for the new betas.
  config.beta1 = 0.8f;
  config.beta2 = 0.99f;
  opt.set_config(config);
  rp = run.p.values();
  rm = run.m.values();
  rv = run.v.values();
  (void)opt.step(run.args(7));
  reference_adam(config, 7, rp, rm, rv, run.g.values());
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(run.p.get(i), rp[i], 1e-6 * (1 + std::fabs(rp[i]))) << i;
  }
}

TEST(AdamStepTest, ConcurrentStepsOnDisjointArrays) {
  const std::size_t n = 4 * 65536 + 9;
  AdamProblem serial(n, test_seed());
  AdamProblem concurrent(n, test_seed());
  AdamOptimizer a, b;
  for (int t = 1; t <= 3; ++t) {
    (void)a.step(serial.args(t, 0, n / 2));
    (void)a.step(serial.args(t, n / 2));
    std::thread first([&] { (void)b.step(concurrent.args(t, 0, n / 2)); });
    std::thread second([&] { (void)b.step(concurrent.args(t, n / 2)); });
    first.join();
    second.join();
  }
  EXPECT_TRUE(serial.state() == concurrent.state());
}

// Expects `f` to throw std::invalid_argument whose message names `name`.
template <class F>
void expect_invalid(F f, const std::string& name) {
  try {
    f();
    ADD_FAILURE() << "no exception for " << name;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(ArgumentTest, InvalidArgumentsThrowNamingTheParameter) {
  AdamProblem problem(10, test_seed());
  const auto before = problem.state();
  AdamOptimizer adam;
  auto with = [&](auto mutate) {
    StepArgs a = problem.args(1);
    mutate(a);
    return a;
  };
  expect_invalid([&] { (void)adam.step(with([](StepArgs& a) { a.params = nullptr; })); }, "params");
  expect_invalid([&] { (void)adam.step(with([](StepArgs& a) { a.grads = nullptr; })); }, "grads");
  expect_invalid([&] { (void)adam.step(with([](StepArgs& a) { a.exp_avg = nullptr; })); },
                 "exp_avg");
  expect_invalid([&] { (void)adam.step(with([](StepArgs& a) { a.exp_avg_sq = nullptr; })); },
                 "exp_avg_sq");
  expect_invalid([&] { (void)adam.step(with([](StepArgs& a) { a.step = 0; })); }, "step");
  expect_invalid([&] { (void)adam.step(with([](StepArgs& a) { a.grad_scale = 0.0f; })); },
                 "grad_scale");
  expect_invalid([&] { (void)adam.step(with([](StepArgs& a) { a.grad_scale = std::nanf(""); })); },
                 "grad_scale");
  expect_invalid(
      [&] { (void)adam.step(with([](StepArgs& a) { a.state_dtype = DType::kFloat16; })); },
      "state_dtype");
  expect_invalid(
      [&] { (void)adam.step(with([](StepArgs& a) { a.param_copy_dtype = DType::kFloat32; })); },
      "param_copy_dtype");
  EXPECT_TRUE(problem.state() == before);

  expect_invalid([] { AdamOptimizer bad({.beta1 = 1.0f}); }, "beta1");
  expect_invalid([] { AdamOptimizer bad({.beta2 = -0.1f}); }, "beta2");
  expect_invalid([] { AdamOptimizer bad({.lr = -1.0f}); }, "lr");
  expect_invalid([] { AdamOptimizer bad({.eps = std::nanf("")}); }, "eps");
  expect_invalid([] { AdagradOptimizer bad({.lr_decay = -1.0f}); }, "lr_decay");
  expect_invalid([] { LionOptimizer bad({.weight_decay = -1.0f}); }, "weight_decay");
  expect_invalid([&] { adam.set_lr(-1.0f); }, "lr");
  expect_invalid([] { (void)count_nonfinite(nullptr, DType::kFloat32, 3); }, "data");

  // Adagrad needs no exp_avg, Lion no exp_avg_sq; numel 0 needs no arrays at all.
  AdagradOptimizer adagrad;
  EXPECT_NO_THROW((void)adagrad.step(with([](StepArgs& a) { a.exp_avg = nullptr; })));
  LionOptimizer lion;
  EXPECT_NO_THROW((void)lion.step(with([](StepArgs& a) { a.exp_avg_sq = nullptr; })));
  StepArgs empty;
  EXPECT_EQ(adam.step(empty).nonfinite_grads, 0u);
  EXPECT_EQ(adam.name(), "adamw");
  EXPECT_EQ(AdamOptimizer({.adamw_mode = false}).name(), "adam");
  adam.set_lr(0.5f);
  EXPECT_EQ(adam.lr(), 0.5f);
}

// set_beta1 (a schedule cycling momentum): Adam's beta1 changes and nothing else, checked
// like set_config; the optimizers without a first-moment schedule say no and keep theirs.
TEST(OptimizerTest, SetBeta1ChangesAdamsBeta1Only) {
  AdamConfig config;
  config.lr = 0.01f;
  config.beta1 = 0.9f;
  config.beta2 = 0.95f;
  config.adamw_mode = true;
  AdamOptimizer adam(config);
  Optimizer& any = adam;
  EXPECT_TRUE(any.set_beta1(0.85f));
  const AdamConfig after = adam.config();
  EXPECT_EQ(after.beta1, 0.85f);
  EXPECT_EQ(after.beta2, 0.95f);
  EXPECT_EQ(after.lr, 0.01f);
  EXPECT_TRUE(after.adamw_mode);
  expect_invalid([&] { (void)any.set_beta1(1.5f); }, "beta1");
  EXPECT_EQ(adam.config().beta1, 0.85f);
  LionOptimizer lion;
  AdagradOptimizer adagrad;
  EXPECT_FALSE(static_cast<Optimizer&>(lion).set_beta1(0.5f));
  EXPECT_FALSE(static_cast<Optimizer&>(adagrad).set_beta1(0.5f));
  EXPECT_EQ(lion.config().beta1, LionConfig{}.beta1);
}

}  // namespace
}  // namespace zinf::optimizer_cpu::testing
