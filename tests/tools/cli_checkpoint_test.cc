// `zinf train --save / --load` run as the real binary: 4 steps saved, then resumed for 2 more,
// print the losses of an uninterrupted 6-step run (the step count, LR schedule and data
// position continue), and the lines say what was saved and loaded.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>

#include "tests/common/temp_dir.h"
#include "tests/tools/test_system.h"

namespace zinf::tools {
namespace {

namespace fs = std::filesystem;
using zinf::testing::loss_lines;
using zinf::testing::run_zinf;
using zinf::testing::TempDir;
using zinf::testing::ZinfRun;

// Stage 3 with params and optimizer on NVMe (the --nvme-path folder), a warm-up schedule that
// does not depend on the run's length, a loss line every step.
constexpr const char* kConfig = R"({
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_max_lr": 3e-3}},
  "zero_optimization": {
    "stage": 3,
    "sub_group_size": 20000,
    "offload_param": {"device": "nvme", "max_in_cpu": 0, "buffer_size": 1e5},
    "offload_optimizer": {"device": "nvme"},
    "stage3_gather_16bit_weights_on_model_save": true
  },
  "steps_per_print": 1
})";

ZinfRun train(const std::string& config, const std::string& swap, int steps,
              std::vector<std::string> extra) {
  std::vector<std::string> args = {
      "train",     "--config", config,        "--model", "tiny",   "--steps", std::to_string(steps),
      "--threads", "2",        "--nvme-path", swap,      "--plot", ""};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_zinf(args, {}, SIGINT, 300);
}

TEST(CliCheckpoint, SaveThenLoadContinuesWithTheUninterruptedLosses) {
  TempDir dir, swap, ckpt;
  ASSERT_TRUE(dir.ok() && swap.ok() && ckpt.ok());
  const std::string config = dir.path() + "/config.json";
  std::ofstream(config) << kConfig;

  const ZinfRun whole = train(config, swap.path(), 6, {});
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  const ZinfRun first =
      train(config, swap.path(), 4, {"--save", ckpt.path(), "--save-interval", "2"});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  EXPECT_NE(first.out.find("checkpoint saved: " + ckpt.path() + "/global_step2"), std::string::npos)
      << first.out << first.err;
  EXPECT_NE(first.out.find("checkpoint saved: " + ckpt.path() + "/global_step4"), std::string::npos)
      << first.out << first.err;
  // Each save was prepared before its step, which wrote the optimizer states.
  EXPECT_NE(first.out.find("optimizer states into it)"), std::string::npos) << first.out;
  EXPECT_TRUE(fs::exists(ckpt.path() + "/global_step4/pytorch_model.bin"));
  std::string latest;
  std::ifstream(ckpt.path() + "/latest") >> latest;
  EXPECT_EQ(latest, "global_step4");

  const ZinfRun resumed = train(config, swap.path(), 6, {"--load", ckpt.path()});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("checkpoint loaded: " + ckpt.path() + "/global_step4 (step 4;"),
            std::string::npos)
      << resumed.out;

  const auto want = loss_lines(whole.out);
  const auto before = loss_lines(first.out);
  const auto after = loss_lines(resumed.out);
  ASSERT_EQ(want.size(), 6u) << whole.out;
  ASSERT_EQ(after.size(), 2u) << resumed.out;
  for (int step = 1; step <= 4; ++step) EXPECT_EQ(before.at(step), want.at(step)) << step;
  for (int step = 5; step <= 6; ++step) EXPECT_EQ(after.at(step), want.at(step)) << step;

  // --tag picks an older checkpoint.
  const ZinfRun older =
      train(config, swap.path(), 3, {"--load", ckpt.path(), "--tag", "global_step2"});
  ASSERT_EQ(older.exit_code, 0) << older.out << older.err;
  const auto third = loss_lines(older.out);
  ASSERT_EQ(third.size(), 1u) << older.out;
  EXPECT_EQ(third.at(3), want.at(3));
}

// Ctrl-C stops at a step boundary and saves there; --load continues from that step.
TEST(CliCheckpoint, CtrlCSavesAtTheStepBoundary) {
  TempDir dir, swap, ckpt;
  ASSERT_TRUE(dir.ok() && swap.ok() && ckpt.ok());
  const std::string config = dir.path() + "/config.json";
  std::ofstream(config) << kConfig;
  ZinfRun run = run_zinf(
      {"train", "--config", config, "--model", "tiny", "--steps", "100000", "--threads", "2",
       "--nvme-path", swap.path(), "--plot", "", "--save", ckpt.path()},
      [](const std::string& out) { return out.find("step 2 |") != out.npos; }, SIGINT, 300);
  ASSERT_TRUE(run.signal_sent) << run.out << run.err;
  EXPECT_EQ(run.exit_code, 130) << run.out << run.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run.out, m, std::regex("stopped at the boundary of step ([0-9]+)")))
      << run.out;
  const std::string tag = "global_step" + std::string(m[1]);
  EXPECT_NE(run.out.find("checkpoint saved: " + ckpt.path() + "/" + tag), std::string::npos)
      << run.out;
  std::string latest;
  std::ifstream(ckpt.path() + "/latest") >> latest;
  EXPECT_EQ(latest, tag);
  const ZinfRun resumed = train(config, swap.path(), std::stoi(m[1]) + 1, {"--load", ckpt.path()});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_EQ(loss_lines(resumed.out).size(), 1u) << resumed.out;
}

}  // namespace
}  // namespace zinf::tools
