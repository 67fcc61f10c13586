// The Engine against plain LibTorch on the reference model: 20 fp32 steps with the same
// initialisation, data and AdamW give the same losses (relative 1e-4) at stage 0, 1, 2, 3,
// stage 3 with the optimizer on CPU and stage 3 with parameters and optimizer on NVMe;
// gradient accumulation; the LR schedule reaches the optimizer; fp16 loss scaling skips
// steps on overflow; a plan larger than the budget is refused before any work.

#include "engine/engine.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <string>
#include <vector>

#include "aio/pinned_budget.h"
#include "engine/model/llama.h"
#include "tests/common/small_tmpfs.h"
#include "tests/common/temp_dir.h"
#include "tests/common/test_accelerator.h"
#include "tests/engine/tiny_llama.h"

namespace zinf::engine {
namespace {

constexpr int64_t kSeq = 16;
constexpr int64_t kVocab = 64;

LlamaConfig tiny() { return testing::tiny_llama(kVocab); }

// Samples of micro-batch i, from a generator seeded by i.
std::pair<at::Tensor, at::Tensor> batch(int64_t i, int64_t size) {
  return testing::arithmetic_batch(1000 + static_cast<uint64_t>(i), size, kSeq);
}

std::vector<double> train_plain(int steps, int accumulation, int64_t micro, double lr) {
  LlamaModel model(tiny());
  model->initialize(7);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(lr).weight_decay(0.01));
  std::vector<double> losses;
  int64_t index = 0;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    double total = 0;
    for (int m = 0; m < accumulation; ++m) {
      auto [x, y] = batch(index++, micro);
      at::Tensor loss = model->loss(x, y);
      total += loss.item<double>();
      (loss / accumulation).backward();
    }
    opt.step();
    losses.push_back(total / accumulation);
  }
  return losses;
}

EngineOptions options_for(int stage, int accumulation, int64_t micro, double lr) {
  EngineOptions o;
  o.zero.stage = stage;
  o.zero.gradient_accumulation_steps = accumulation;
  o.optimizer.type = optimizer_cpu::OptimizerKind::kAdamW;
  o.optimizer.lr = lr;
  o.optimizer.weight_decay = 0.01;
  o.micro_batch_size = micro;
  o.tokens_per_sample = kSeq;
  o.steps_per_print = 0;
  o.memory_budget = 1ull << 30;
  o.accelerator = ::zinf::testing::test_accelerator();
  return o;
}

std::vector<double> train_engine(const EngineOptions& options, int steps) {
  auto model = std::make_shared<LlamaModelImpl>(tiny());
  Engine engine(model, options,
                [](const std::string& name, at::Tensor& full) { init_parameter(7, name, full); });
  std::vector<double> losses;
  int64_t index = 0;
  for (int s = 0; s < steps; ++s) {
    const StepReport r = engine.train_batch([&](int) {
      auto [x, y] = batch(index++, options.micro_batch_size);
      // Onto the engine's device (a no-op on the CPU and strict devices; CUDA under
      // ZINF_TEST_ACCELERATOR=cuda, as scripts/gpu-check.sh runs it).
      return model->loss(x.to(engine.device()), y.to(engine.device()));
    });
    losses.push_back(r.loss);
  }
  return losses;
}

void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i])) << "step " << i + 1;
  }
}

TEST(EngineParity, Fp32LossesMatchPlainLibTorchAtEveryStage) {
  const std::vector<double> want = train_plain(20, 1, 4, 3e-3);
  EXPECT_LT(want.back(), want.front());
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    expect_same_losses(train_engine(options_for(stage, 1, 4, 3e-3), 20), want);
  }
  {
    SCOPED_TRACE("stage 3, offload_optimizer cpu");
    EngineOptions o = options_for(3, 1, 4, 3e-3);
    o.zero.offload_optimizer = zero::OffloadTarget::kCpu;
    o.zero.offload_param = zero::OffloadTarget::kCpu;
    expect_same_losses(train_engine(o, 20), want);
  }
  {
    SCOPED_TRACE("stage 3, params and optimizer on nvme");
    ::zinf::testing::TempDir dir;
    EngineOptions o = options_for(3, 1, 4, 3e-3);
    o.zero.offload_optimizer = zero::OffloadTarget::kNvme;
    o.zero.offload_param = zero::OffloadTarget::kNvme;
    o.zero.nvme_paths = {dir.path()};
    o.zero.sub_group_size = 5000;
    o.zero.param_buffer_size = 4000;
    o.zero.param_max_in_cpu = 0;
    o.zero.pipeline_read = o.zero.pipeline_write = true;
    o.zero.prefetch_bucket_size = 10000;
    o.zero.aio.backend = aio::BackendKind::kPsync;
    expect_same_losses(train_engine(o, 20), want);
  }
}

TEST(EngineParity, GradientAccumulation) {
  const std::vector<double> want = train_plain(5, 4, 2, 3e-3);
  expect_same_losses(train_engine(options_for(3, 4, 2, 3e-3), 5), want);
}

TEST(Engine, LrScheduleReachesTheOptimizerAndTheReport) {
  EngineOptions o = options_for(2, 1, 2, 1e-3);
  o.lr_schedule = [](int64_t step) { return 1e-3 * static_cast<double>(step); };
  auto model = std::make_shared<LlamaModelImpl>(tiny());
  Engine engine(model, o,
                [](const std::string& name, at::Tensor& full) { init_parameter(1, name, full); });
  for (int s = 1; s <= 3; ++s) {
    const StepReport r = engine.train_batch([&](int) {
      auto [x, y] = batch(s, 2);
      return model->loss(x, y);
    });
    EXPECT_DOUBLE_EQ(r.lr, 1e-3 * s);
    EXPECT_EQ(r.global_step, s);
    EXPECT_EQ(r.global_samples, 2 * s);
    EXPECT_GT(r.tokens_per_second, 0.0);
  }
}

TEST(Engine, Fp16OverflowSkipsTheStepAndLowersTheScale) {
  EngineOptions o = options_for(3, 1, 2, 1e-3);
  o.zero.precision = zero::Precision::kFloat16;
  o.zero.loss_scale.initial_scale_power = 8;
  o.zero.loss_scale.hysteresis = 1;
  auto model = std::make_shared<LlamaModelImpl>(tiny());
  Engine engine(model, o,
                [](const std::string& name, at::Tensor& full) { init_parameter(1, name, full); });
  // A loss that overflows fp16 once scaled: the gradients become Inf.
  const StepReport r = engine.train_batch([&](int) {
    auto [x, y] = batch(1, 2);
    (void)y;
    return model->model->embed_tokens->weight.to(at::kFloat).sum() * 1e30;
  });
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(engine.skipped_steps(), 1);
  EXPECT_EQ(engine.loss_scaler().scale(), 128.0);
}

TEST(Engine, APlanOverTheBudgetIsRefusedWithTheTable) {
  EngineOptions o = options_for(0, 1, 2, 1e-3);
  o.memory_budget = 64 * 1024;  // far below the resident parameters
  auto model = std::make_shared<LlamaModelImpl>(tiny());
  try {
    Engine engine(model, o);
    FAIL() << "accepted";
  } catch (const EngineError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("memory_budget"), std::string::npos) << message;
    EXPECT_NE(message.find("resident params"), std::string::npos) << message;
  }
}

TEST(Engine, APlanOverThePinnedLimitIsRefusedWithTheNumbers) {
  ::zinf::testing::TempDir dir;
  EngineOptions o = options_for(3, 1, 2, 1e-3);
  o.zero.offload_optimizer = zero::OffloadTarget::kNvme;
  o.zero.offload_param = zero::OffloadTarget::kNvme;
  o.zero.nvme_paths = {dir.path()};
  o.zero.pinned_memory_limit = 4096;  // one page: far below the pools
  auto model = std::make_shared<LlamaModelImpl>(tiny());
  try {
    Engine engine(model, o);
    FAIL() << "accepted";
  } catch (const EngineError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("pinned host memory"), std::string::npos) << message;
    EXPECT_NE(message.find("zinf.pinned_memory_limit allows 4096 B"), std::string::npos) << message;
  }
  aio::reset_pinned_memory_limit();
}

// zinf.overlap_optimizer by default stands back, saying why at start-up, where its spare
// extents do not fit the swap folder; given explicitly, the run is refused with the numbers.
TEST(Engine, DefaultOverlapStandsBackWhereItsSpareExtentsDoNotFit) {
  EngineOptions o = options_for(3, 1, 2, 1e-3);
  o.zero.offload_optimizer = zero::OffloadTarget::kNvme;
  o.zero.sub_group_size = 2000;  // several sub-groups
  o.zero.overlap_optimizer = true;
  const auto init = [](const std::string& name, at::Tensor& full) {
    init_parameter(7, name, full);
  };
  // The swap files with and without the overlap, planned in a folder with room for both.
  uint64_t with = 0, without = 0;
  size_t sub_groups = 0;
  for (const bool overlap : {true, false}) {
    ::zinf::testing::TempDir dir;
    EngineOptions p = o;
    p.zero.nvme_paths = {dir.path()};
    p.zero.overlap_optimizer = overlap;
    p.zero.overlap_optimizer_given = true;
    Engine engine(std::make_shared<LlamaModelImpl>(tiny()), p, init);
    (overlap ? with : without) = engine.memory_report().plan.nvme;
    sub_groups = engine.zero_model().optimizer().swapper().sub_group_count();
  }
  ASSERT_GT(with, without);
  ASSERT_GT(sub_groups, 2u);
  auto train_one = [&](Engine& engine, const std::shared_ptr<LlamaModelImpl>& model) {
    (void)engine.train_batch([&](int) {
      auto [x, y] = batch(0, o.micro_batch_size);
      return model->loss(x, y);
    });
  };
  auto said = [](const std::vector<std::string>& lines, const std::string& what) {
    for (const std::string& line : lines) {
      if (line.find(what) != std::string::npos) return true;
    }
    return false;
  };
  {
    // Room for half the spare extents: a window of the last sub-groups keeps the overlap.
    const uint64_t room = without + (with - without) / 2;
    ::zinf::testing::SmallTmpfs fs(room);
    if (!fs.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs: " << fs.error();
    EngineOptions p = o;
    p.zero.nvme_paths = {fs.path()};
    std::vector<std::string> lines;
    p.log = [&](const std::string& line) { lines.push_back(line); };
    auto model = std::make_shared<LlamaModelImpl>(tiny());
    Engine engine(model, p, init);
    EXPECT_TRUE(said(lines, "zinf.overlap_optimizer for the last"))
        << "no start-up line says the overlap keeps a window";
    const size_t window = engine.options().zero.overlap_sub_groups;
    EXPECT_GT(window, 0u);
    EXPECT_LT(window, sub_groups);
    EXPECT_GT(engine.memory_report().plan.nvme, without);
    EXPECT_LE(engine.memory_report().plan.nvme, room);
    train_one(engine, model);
    EXPECT_EQ(engine.zero_model().stats().overlap.steps, 1u);
    EXPECT_LE(engine.zero_model().stats().overlap.speculated, window);
  }
  ::zinf::testing::SmallTmpfs fs(without);  // no room for a single spare extent
  if (!fs.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs: " << fs.error();
  o.zero.nvme_paths = {fs.path()};
  std::vector<std::string> lines;
  o.log = [&](const std::string& line) { lines.push_back(line); };
  {
    auto model = std::make_shared<LlamaModelImpl>(tiny());
    Engine engine(model, o, init);
    EXPECT_TRUE(said(lines, "zinf.overlap_optimizer off for this run"))
        << "no start-up line says the overlap is off";
    EXPECT_EQ(engine.memory_report().plan.nvme, without);
    train_one(engine, model);
    EXPECT_EQ(engine.zero_model().stats().overlap.steps, 0u);
  }
  o.zero.overlap_optimizer_given = true;
  try {
    Engine engine(std::make_shared<LlamaModelImpl>(tiny()), o, init);
    FAIL() << "an explicit overlap that does not fit was accepted";
  } catch (const std::exception& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(fs.path()), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace zinf::engine
