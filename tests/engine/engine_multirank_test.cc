// The Engine on 2 Gloo ranks against plain LibTorch in one process, and the Engine in bf16
// against fp32.
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
#include "tests/engine/tiny_llama.h"

namespace zinf::engine {
namespace {

constexpr int kSteps = 20;
constexpr int kWorld = 2;
constexpr int64_t kGlobalBatch = 4;  // samples per optimizer step, all ranks together
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

LlamaConfig tiny() { return testing::tiny_llama(kVocab); }

// Global batch `step`, from a generator seeded by the step.
std::pair<at::Tensor, at::Tensor> global_batch(int64_t step) {
  return testing::arithmetic_batch(5000 + static_cast<uint64_t>(step), kGlobalBatch, kSeq);
}

// Rank `rank`'s share of a global batch: rows rank, rank + world, ...
at::Tensor share(const at::Tensor& global, int rank, int world) {
  return global.slice(0, rank, global.size(0), world).contiguous();
}

void init(const std::string& name, at::Tensor& full) { init_parameter(kInitSeed, name, full); }

std::vector<double> train_reference() {
  LlamaModel model(tiny());
  model->initialize(kInitSeed);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(kLr).weight_decay(0.01));
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    auto [x, y] = global_batch(s);
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
  o.optimizer.type = "AdamW";
  o.optimizer.lr = kLr;
  o.optimizer.weight_decay = 0.01;
  o.tokens_per_sample = kSeq;
  o.steps_per_print = 0;
  o.memory_budget = 1ull << 30;
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
std::vector<double> train_engine(EngineOptions options, at::ScalarType dtype) {
  const int rank = options.launch.rank;
  const int world = options.launch.world_size;
  options.micro_batch_size = kGlobalBatch / world;
  auto model = std::make_shared<LlamaModelImpl>(tiny(), dtype);
  Engine engine(model, options, init);
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
  const std::vector<double> losses =
      train_engine(o, o.zero.precision == zero::Precision::kBFloat16 ? at::kBFloat16 : at::kFloat);
  std::string line = "LOSSES";
  for (double v : losses) {
    char text[40];
    std::snprintf(text, sizeof(text), " %.17g", v);
    line += text;
  }
  std::cout << line << std::endl;
}

// ---- launching side ------------------------------------------------------------------------

TEST(EngineMultirank, TwoRanksMatchPlainLibTorchAtEveryStage) {
  if (::zinf::testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  const std::vector<double> want = train_reference();
  ASSERT_LT(want.back(), want.front());
  for (const std::string& name : case_names()) {
    SCOPED_TRACE(name);
    ::zinf::testing::TempDir nvme;
    ::zinf::testing::RanksOptions o;
    o.world_size = kWorld;
    o.test = "EngineMultirankRank.DISABLED_Train";
    o.deadline = std::chrono::seconds(60);
    o.env = {{"ZINF_TEST_CASE", name},
             {"ZINF_TEST_NVME_DIR", nvme.path()},
             {"OMP_NUM_THREADS", "1"}};  // the ranks share the machine's cores
    const std::vector<::zinf::testing::RankResult> results = ::zinf::testing::run_ranks(o);
    ASSERT_EQ(results.size(), static_cast<size_t>(kWorld));
    for (const ::zinf::testing::RankResult& r : results) {
      ASSERT_TRUE(r.passed()) << ::zinf::testing::describe(r);
      const std::vector<double> got = parse_losses(r.output);
      ASSERT_EQ(got.size(), want.size()) << ::zinf::testing::describe(r);
      // bf16 against the fp32 reference: kBf16Tolerance (see there).
      const double tolerance = name == "stage3_bf16" ? kBf16Tolerance : 1e-4;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], tolerance * std::abs(want[i]))
            << "rank " << r.rank << ", step " << i + 1;
      }
      if (r.rank == 0) {
        std::cout << "PARITY " << name << ": 2 ranks vs plain LibTorch, max relative loss "
                  << "difference over " << kSteps << " steps " << max_relative_difference(got, want)
                  << "\n";
      }
    }
  }
}

TEST(EngineBf16, TrainsAndStaysNearFp32) {
  if (::zinf::testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  EngineOptions o = options_for("stage3", "");
  const std::vector<double> fp32 = train_engine(o, at::kFloat);
  o.zero.precision = zero::Precision::kBFloat16;
  const std::vector<double> bf16 = train_engine(o, at::kBFloat16);
  ASSERT_EQ(bf16.size(), fp32.size());
  // Trains: the last steps' losses well below the first step's.
  EXPECT_LT(bf16.back(), 0.8 * bf16.front());
  for (size_t i = 0; i < bf16.size(); ++i) {
    EXPECT_NEAR(bf16[i], fp32[i], kBf16Tolerance * fp32[i]) << "step " << i + 1;
  }
  std::cout << "BF16 stage 3, 1 rank: loss " << bf16.front() << " -> " << bf16.back() << " (fp32 "
            << fp32.front() << " -> " << fp32.back() << "); max relative difference from fp32 over "
            << kSteps << " steps " << max_relative_difference(bf16, fp32) << "\n";
}

}  // namespace
}  // namespace zinf::engine
