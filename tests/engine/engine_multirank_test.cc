// The Engine on 2 Gloo ranks against plain LibTorch in one process, and the Engine in bf16
// and fp16 against fp32.
//
// Parity (issue 10's acceptance, 2 ranks): the reference model trained 20 fp32 steps by
// plain LibTorch AdamW on a global batch of 4 samples per step, and by the Engine on 2 ranks
// with micro-batch 2 each (rank r takes samples r and r + 2 of every global batch, as
// engine/data's SampleLoader deals them), at stage 0, 1, 2, 3, stage 3 with params and
// optimizer on CPU, and stage 3 with params and optimizer on NVMe: the loss the engine
// reports (the global batch's mean, averaged across the ranks) equals the reference's
// within 1e-4 relative at every step, on both ranks (stage 3 in bf16 on 2 ranks: within
// kBf16Tolerance of it). The launching test runs the reference itself; each case starts its
// 2 ranks as child processes (tests/common/multi_process.h), which print their losses on a
// LOSSES line.
//
// bf16: the Engine at stage 3 with bf16 parameters and gradients (fp32 master weights)
// trains (the loss falls) and stays within kBf16Tolerance of the fp32 Engine's losses.
//
// fp16: the same at stage 3 and at stage 3 with CPU offload, within kFp16Tolerance, with
// dynamic loss scaling; and a loss scale too large for fp16 gradients is halved on each
// overflow (the steps skipped and counted) until the model trains.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/llama.h"
#include "tests/common/multi_process.h"
#include "tests/common/temp_dir.h"
#include "tests/common/test_accelerator.h"
#include "tests/engine/tiny_llama.h"

namespace zinf::engine {
namespace {

constexpr int kSteps = 20;
constexpr int kWorld = 2;
constexpr int64_t kGlobalBatch = 4;  // samples per optimizer step, all ranks together (2 ranks)
constexpr int64_t kSeq = 16;
constexpr int64_t kVocab = 64;
constexpr double kLr = 3e-3;
constexpr uint64_t kInitSeed = 11;
// bf16 against fp32, relative, every step: bf16 keeps 8 significant bits (relative rounding
// 2^-9 per value), the parameters are rounded from the fp32 master weights at every step and
// the forward and backward of 3 layers add those errors up; measured 0.064% at most over the
// 20 steps (see the BF16 line), so 1% leaves room for other seeds and kernels without hiding
// a broken bf16 path (a wrong gradient or a lost update moves the loss by more than that
// within a few steps: the loss falls by 38% over the run).
constexpr double kBf16Tolerance = 0.01;
// fp16 against fp32, relative, every step: fp16 keeps 11 significant bits (relative rounding
// 2^-12 per value, 8x finer than bf16's) and on the CPU its matmuls accumulate in fp32 as a
// GPU's do; measured 0.029% at most over the 20 steps at stage 3 and at stage 3 with CPU
// offload (see the FP16 lines; bf16: 0.064%). 0.5% leaves 17x room for other seeds and
// kernels; a broken fp16 path (a gradient lost in the casts, a wrong unscale by the loss
// scale of 65536) moves the loss by more than that within a few steps.
constexpr double kFp16Tolerance = 0.005;

LlamaConfig tiny() { return testing::tiny_llama(kVocab); }

// Samples per optimizer step: kGlobalBatch, or ZINF_TEST_GLOBAL_BATCH in ranks launched with
// another (3 ranks take 6).
int64_t global_batch_size() {
  const char* env = std::getenv("ZINF_TEST_GLOBAL_BATCH");
  return env != nullptr ? std::stoll(env) : kGlobalBatch;
}

// Global batch `step`, from a generator seeded by the step.
std::pair<at::Tensor, at::Tensor> global_batch(int64_t step, int64_t size = global_batch_size()) {
  return testing::arithmetic_batch(5000 + static_cast<uint64_t>(step), size, kSeq);
}

// Rank `rank`'s share of a global batch: rows rank, rank + world, ...
at::Tensor share(const at::Tensor& global, int rank, int world) {
  return global.slice(0, rank, global.size(0), world).contiguous();
}

void init(const std::string& name, at::Tensor& full) { init_parameter(kInitSeed, name, full); }

std::vector<double> train_reference(int64_t global = kGlobalBatch) {
  LlamaModel model(tiny());
  model->initialize(kInitSeed);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(kLr).weight_decay(0.01));
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    auto [x, y] = global_batch(s, global);
    at::Tensor loss = model->loss(x, y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// The cases, by name (ZINF_TEST_CASE in the ranks).
const std::vector<std::string>& case_names() {
  static const std::vector<std::string> names{"stage0",     "stage1",      "stage2",     "stage3",
                                              "stage3_cpu", "stage3_nvme", "stage3_bf16"};
  return names;
}

EngineOptions options_for(const std::string& name, const std::string& nvme_dir) {
  EngineOptions o;
  o.zero.stage = name == "stage0" ? 0 : name == "stage1" ? 1 : name == "stage2" ? 2 : 3;
  o.optimizer.type = optimizer_cpu::OptimizerKind::kAdamW;
  o.optimizer.lr = kLr;
  o.optimizer.weight_decay = 0.01;
  o.tokens_per_sample = kSeq;
  o.steps_per_print = 0;
  o.memory_budget = 1ull << 30;
  o.accelerator = ::zinf::testing::test_accelerator();
  if (name == "stage3_cpu") {
    o.zero.offload_optimizer = zero::OffloadTarget::kCpu;
    o.zero.offload_param = zero::OffloadTarget::kCpu;
  } else if (name == "stage3_bf16") {
    o.zero.precision = zero::Precision::kBFloat16;
  } else if (name == "stage3_nvme") {
    o.zero.offload_optimizer = zero::OffloadTarget::kNvme;
    o.zero.offload_param = zero::OffloadTarget::kNvme;
    o.zero.nvme_paths = {nvme_dir};
    o.zero.sub_group_size = 5000;  // sub-groups and pool buffers that cut through parameters
    o.zero.param_buffer_size = 4000;
    o.zero.param_max_in_cpu = 0;
    o.zero.pipeline_read = o.zero.pipeline_write = true;
    o.zero.prefetch_bucket_size = 10000;
    o.zero.aio.backend = aio::BackendKind::kPsync;
  }
  return o;
}

// Trains kSteps steps with the Engine: each rank takes its share of every global batch.
std::vector<double> train_engine(EngineOptions options, at::ScalarType dtype,
                                 std::string* accelerator = nullptr) {
  const int rank = options.launch.rank;
  const int world = options.launch.world_size;
  options.micro_batch_size = global_batch_size() / world;
  auto model = std::make_shared<LlamaModelImpl>(tiny(), dtype);
  Engine engine(model, options, init);
  if (accelerator != nullptr) {
    *accelerator = std::string(engine.accelerator().name());
  }
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    const StepReport r = engine.train_batch([&](int) {
      auto [x, y] = global_batch(s);
      return model->loss(share(x, rank, world), share(y, rank, world));
    });
    losses.push_back(r.loss);
  }
  return losses;
}

// Largest |got - want| / |want| over the steps.
double max_relative_difference(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  }
  return worst;
}

// The numbers of the line starting "LOSSES " in a rank's output.
std::vector<double> parse_losses(const std::string& output) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("LOSSES ", 0) != 0) {
      continue;
    }
    std::istringstream values(line.substr(7));
    std::vector<double> losses;
    for (double v; values >> v;) {
      losses.push_back(v);
    }
    return losses;
  }
  return {};
}

// ---- a rank ------------------------------------------------------------------------------

TEST(EngineMultirankRank, DISABLED_Train) {
  const char* name = std::getenv("ZINF_TEST_CASE");
  const char* nvme = std::getenv("ZINF_TEST_NVME_DIR");
  ASSERT_NE(name, nullptr);
  EngineOptions o = options_for(name, nvme != nullptr ? nvme : "");
  o.launch = zero::detect_launch_env();
  o.comm.backend = "gloo";
  o.zero.comm_timeout = std::chrono::milliseconds(30'000);
  std::string accelerator;
  const std::vector<double> losses = train_engine(
      o, o.zero.precision == zero::Precision::kBFloat16 ? at::kBFloat16 : at::kFloat, &accelerator);
  std::cout << "ACCELERATOR " << accelerator << std::endl;
  std::string line = "LOSSES";
  for (double v : losses) {
    char text[40];
    std::snprintf(text, sizeof(text), " %.17g", v);
    line += text;
  }
  std::cout << line << std::endl;
}

// ---- launching side ------------------------------------------------------------------------

// Launches `world` ranks per case, each taking global / world samples of every global batch,
// and compares every rank's losses with plain LibTorch on the whole global batch. The ranks
// run on the accelerator the tests run on (tests/common/test_accelerator.h) and say so.
void expect_ranks_match_reference(int world, int64_t global,
                                  const std::vector<std::string>& cases) {
  const std::vector<double> want = train_reference(global);
  ASSERT_LT(want.back(), want.front());
  for (const std::string& name : cases) {
    SCOPED_TRACE(name);
    ::zinf::testing::TempDir nvme;
    ::zinf::testing::RanksOptions o;
    o.world_size = world;
    o.test = "EngineMultirankRank.DISABLED_Train";
    o.deadline = std::chrono::seconds(90);
    o.env = {{"ZINF_TEST_CASE", name},
             {"ZINF_TEST_NVME_DIR", nvme.path()},
             {"ZINF_TEST_GLOBAL_BATCH", std::to_string(global)},
             {"OMP_NUM_THREADS", "1"}};  // the ranks share the machine's cores
    const std::vector<::zinf::testing::RankResult> results = ::zinf::testing::run_ranks(o);
    ASSERT_EQ(results.size(), static_cast<size_t>(world));
    for (const ::zinf::testing::RankResult& r : results) {
      ASSERT_TRUE(::zinf::testing::rank_passed(r));
      EXPECT_NE(r.output.find("ACCELERATOR " + ::zinf::testing::test_accelerator() + "\n"),
                std::string::npos)
          << ::zinf::testing::describe(r);
      const std::vector<double> got = parse_losses(r.output);
      ASSERT_EQ(got.size(), want.size()) << ::zinf::testing::describe(r);
      // bf16 against the fp32 reference: kBf16Tolerance (see there).
      const double tolerance = name == "stage3_bf16" ? kBf16Tolerance : 1e-4;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], tolerance * std::abs(want[i]))
            << "rank " << r.rank << ", step " << i + 1;
      }
      if (r.rank == 0) {
        std::cout << "PARITY " << name << ": " << world << " ranks on "
                  << ::zinf::testing::test_accelerator()
                  << " vs plain LibTorch, max relative loss difference over " << kSteps << " steps "
                  << max_relative_difference(got, want) << "\n";
      }
    }
  }
}

TEST(EngineMultirank, TwoRanksMatchPlainLibTorchAtEveryStage) {
  if (::zinf::testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  expect_ranks_match_reference(kWorld, kGlobalBatch, case_names());
}

// 3 ranks (slices padded: no parameter divides by 3) at stage 1, stage 3 and stage 3 on NVMe.
TEST(EngineMultirank, ThreeRanksMatchPlainLibTorch) {
  if (::zinf::testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  expect_ranks_match_reference(3, 6, {"stage1", "stage3", "stage3_nvme"});
}

// Trains `o` in fp32 and in `precision` (parameters allocated in `dtype`): the low-precision
// run trains (its last loss well below its first) and stays within `tolerance` of the fp32
// losses, relative, at every step. Prints "<label>: loss ... max relative difference ...".
void expect_trains_near_fp32(const std::string& label, EngineOptions o, zero::Precision precision,
                             at::ScalarType dtype, double tolerance) {
  const std::vector<double> fp32 = train_engine(o, at::kFloat);
  o.zero.precision = precision;
  const std::vector<double> low = train_engine(o, dtype);
  ASSERT_EQ(low.size(), fp32.size());
  EXPECT_LT(low.back(), 0.8 * low.front());
  for (size_t i = 0; i < low.size(); ++i) {
    EXPECT_NEAR(low[i], fp32[i], tolerance * fp32[i]) << "step " << i + 1;
  }
  std::cout << label << ": loss " << low.front() << " -> " << low.back() << " (fp32 "
            << fp32.front() << " -> " << fp32.back() << "); max relative difference from fp32 over "
            << kSteps << " steps " << max_relative_difference(low, fp32) << "\n";
}

TEST(EngineBf16, TrainsAndStaysNearFp32) {
  if (::zinf::testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  expect_trains_near_fp32("BF16 stage 3, 1 rank", options_for("stage3", ""),
                          zero::Precision::kBFloat16, at::kBFloat16, kBf16Tolerance);
}

// fp16 (parameters, ZeRO slices, gathered parameters, activations, gradients and their
// reduction in fp16; fp32 master weights; dynamic loss scaling from 2^16) at stage 3 and at
// stage 3 with parameters and optimizer offloaded to the CPU: on the CPU accelerator the
// model's matmuls and SiLU run in fp32 and round to fp16 (engine/model/llama.h).
TEST(EngineFp16, TrainsAndStaysNearFp32) {
  if (::zinf::testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  for (const std::string name : {"stage3", "stage3_cpu"}) {
    SCOPED_TRACE(name);
    expect_trains_near_fp32("FP16 " + name + ", 1 rank", options_for(name, ""),
                            zero::Precision::kFloat16, at::kHalf, kFp16Tolerance);
  }
}

// The dynamic loss scale on the model's own gradients: from 2^32 the scaled gradients
// overflow fp16 (the logits' gradient alone is about 2^32 / 64 tokens, beyond fp16's 65504),
// so the first steps are skipped — the first overflow spends the hysteresis of 2, each later
// one halves the scale — until the scale fits; then the run trains. Every skipped step is
// counted and leaves the parameters (and so the next step's loss on the same batch) as they
// were.
TEST(EngineFp16, OverflowingScaleIsHalvedUntilTheModelTrains) {
  if (::zinf::testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  EngineOptions o = options_for("stage3", "");
  o.zero.precision = zero::Precision::kFloat16;
  o.zero.loss_scale.initial_scale_power = 32;
  o.zero.loss_scale.hysteresis = 2;
  o.micro_batch_size = kGlobalBatch;
  auto model = std::make_shared<LlamaModelImpl>(tiny(), at::kHalf);
  Engine engine(model, o, init);
  std::vector<StepReport> reports;
  int64_t skipped = 0;
  int64_t batch_index = 0;  // advances only when a step is applied: a skipped step is retried
  for (int s = 0; s < 40; ++s) {
    const StepReport r = engine.train_batch([&](int) {
      auto [x, y] = global_batch(batch_index);
      return model->loss(x, y);
    });
    reports.push_back(r);
    if (r.skipped) {
      ++skipped;
    } else {
      ++batch_index;
    }
  }
  ASSERT_TRUE(reports.front().skipped);
  EXPECT_EQ(engine.skipped_steps(), skipped);
  // The scale never grows (window 1000) and only ever halves, after a skipped step; with the
  // hysteresis of 2 (not refilled within the window) every overflow but the first halves it.
  EXPECT_EQ(reports[0].loss_scale, std::ldexp(1.0, 32));
  for (size_t i = 1; i < reports.size(); ++i) {
    if (reports[i].loss_scale != reports[i - 1].loss_scale) {
      EXPECT_TRUE(reports[i - 1].skipped) << "step " << i + 1;
      EXPECT_EQ(reports[i].loss_scale, reports[i - 1].loss_scale / 2) << "step " << i + 1;
    }
    // A skipped step leaves the parameters: the retried batch gives the same loss.
    if (reports[i - 1].skipped) {
      EXPECT_EQ(reports[i].loss, reports[i - 1].loss) << "step " << i + 1;
    }
  }
  const double final_scale = engine.loss_scaler().scale();
  EXPECT_EQ(final_scale, std::ldexp(1.0, 32 - static_cast<int>(skipped - 1)));
  EXPECT_GT(skipped, 2);
  EXPECT_LT(skipped, 30) << "the scale never came down to where fp16 gradients fit";
  // Trains once the scale fits: the applied steps' losses fall.
  double first_applied = 0.0;
  for (const StepReport& r : reports) {
    if (!r.skipped) {
      first_applied = r.loss;
      break;
    }
  }
  EXPECT_LT(reports.back().loss, 0.8 * first_applied);
  std::cout << "FP16 overflow: scale 2^32 -> " << final_scale << ", " << skipped << " of "
            << reports.size() << " steps skipped; loss " << first_applied << " -> "
            << reports.back().loss << "\n";
}

}  // namespace
}  // namespace zinf::engine
