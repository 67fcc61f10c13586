// What a new user gets wrong with `zinf train`, run as the real binary: each mistake ends in
// one line naming the file, key or offset, with exit code 2 for a usage or config error, and
// nothing already safe (another run's checkpoints, a user's files) is lost.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/tools/test_system.h"

namespace zinf::tools {
namespace {

namespace fs = std::filesystem;
using zinf::testing::run_zinf;
using zinf::testing::run_zinf_signals;
using zinf::testing::TempDir;
using zinf::testing::ZinfRun;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string write_file(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Stage 3, params and optimizer on NVMe (the --nvme-path folder), a loss line every step.
constexpr const char* kNvmeConfig = R"({
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
  "zero_optimization": {
    "stage": 3,
    "sub_group_size": 20000,
    "offload_param": {"device": "nvme", "max_in_cpu": 0, "buffer_size": 1e5},
    "offload_optimizer": {"device": "nvme"}
  },
  "steps_per_print": 1
})";

// `zinf train --config C --model tiny --seq-len 32 --steps N ...` on the NVMe config.
ZinfRun train(const std::string& config, const std::string& swap, int steps,
              std::vector<std::string> extra, int timeout_s = 300) {
  std::vector<std::string> args = {"train",
                                   "--config",
                                   config,
                                   "--model",
                                   "tiny",
                                   "--steps",
                                   std::to_string(steps),
                                   "--seq-len",
                                   "32",
                                   "--threads",
                                   "2",
                                   "--nvme-path",
                                   swap,
                                   "--plot",
                                   ""};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_zinf(args, {}, SIGINT, timeout_s);
}

std::string latest_of(const std::string& folder) {
  std::string tag;
  std::ifstream(folder + "/latest") >> tag;
  return tag;
}

// Defect: a fresh run's --save replaced another run's global_step2, moved `latest` back from
// global_step4 and deleted a user's file in the tag folder.
TEST(CliUserErrors, AFreshRunDoesNotReplaceAnotherRunsCheckpoints) {
  TempDir dir, swap, ck;
  ASSERT_TRUE(dir.ok() && swap.ok() && ck.ok());
  const std::string config = write_file(dir.path() + "/c.json", kNvmeConfig);
  const ZinfRun first =
      train(config, swap.path(), 4, {"--save", ck.path(), "--save-interval", "2"});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  ASSERT_EQ(latest_of(ck.path()), "global_step4");
  write_file(ck.path() + "/global_step2/notes.txt", "the user's");
  const std::string step2 = ck.path() + "/global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt";
  const std::string before = read_file(step2);
  ASSERT_FALSE(before.empty());

  // Refused at start-up, before any step, naming the folder and its latest checkpoint.
  const ZinfRun second = train(config, swap.path(), 2, {"--save", ck.path(), "--seed", "9"});
  EXPECT_EQ(second.exit_code, 2) << second.out << second.err;
  EXPECT_TRUE(contains(second.err, "--save " + ck.path() +
                                       ": holds another run's checkpoints "
                                       "(latest global_step4"))
      << second.err;
  EXPECT_FALSE(contains(second.out, "step 1")) << second.out;
  EXPECT_EQ(latest_of(ck.path()), "global_step4");
  EXPECT_EQ(read_file(step2), before);
  EXPECT_EQ(read_file(ck.path() + "/global_step2/notes.txt"), "the user's");

  // --overwrite: the tag this run saves still holds the user's file, so it is refused too.
  const ZinfRun forced =
      train(config, swap.path(), 2, {"--save", ck.path(), "--seed", "9", "--overwrite"});
  EXPECT_EQ(forced.exit_code, 2) << forced.out << forced.err;
  EXPECT_TRUE(
      contains(forced.err, "global_step2 holds an entry that zinf did not write (notes.txt)"))
      << forced.err;
  EXPECT_EQ(read_file(step2), before);

  // With the user's file elsewhere, --overwrite replaces global_step2, says that latest moves
  // back, and leaves global_step4 and the user's other files alone.
  fs::rename(ck.path() + "/global_step2/notes.txt", ck.path() + "/global_step4/notes.txt");
  write_file(ck.path() + "/README", "mine");
  const ZinfRun replaced =
      train(config, swap.path(), 2, {"--save", ck.path(), "--seed", "9", "--overwrite"});
  ASSERT_EQ(replaced.exit_code, 0) << replaced.out << replaced.err;
  EXPECT_TRUE(contains(replaced.out, "latest moves back from global_step4 to global_step2"))
      << replaced.out;
  EXPECT_EQ(latest_of(ck.path()), "global_step2");
  EXPECT_NE(read_file(step2), before) << "global_step2 was not replaced";
  EXPECT_EQ(read_file(ck.path() + "/global_step4/notes.txt"), "the user's");
  EXPECT_TRUE(fs::exists(ck.path() + "/global_step4/zero_pp_rank_0_mp_rank_00_model_states.pt"));
  EXPECT_EQ(read_file(ck.path() + "/README"), "mine");

  // Resuming from the folder needs no flag.
  const ZinfRun resumed = train(config, swap.path(), 3, {"--save", ck.path(), "--load", ck.path()});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_EQ(latest_of(ck.path()), "global_step3");
}

TEST(CliUserErrors, AnUnwritableSaveFolderIsRefusedAtStartUp) {
  TempDir swap;
  ASSERT_TRUE(swap.ok());
  const ZinfRun run = run_zinf({"train", "--model", "tiny", "--steps", "2", "--nvme-path",
                                swap.path(), "--plot", "", "--save", "/proc/zinf-x"});
  EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
  EXPECT_TRUE(contains(run.err, "--save /proc/zinf-x: cannot create")) << run.err;
  EXPECT_FALSE(contains(run.out, "zinf train:")) << "refused before the start-up lines\n"
                                                 << run.out;
}

// Defect: one id of 4000000000 in a .u32 file sized the vocabulary from the data, planned
// 512 G parameters and crashed in a 1 TB allocation.
TEST(CliUserErrors, ATokenIdPastTheVocabularyIsNamedWithItsOffset) {
  TempDir dir, swap;
  ASSERT_TRUE(dir.ok() && swap.ok());
  std::vector<uint32_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(i % 200);
  ids[1000] = 4000000000u;
  const std::string data = dir.path() + "/bad.u32";
  std::ofstream(data, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * sizeof(uint32_t)));
  const ZinfRun run = run_zinf({"train", "--model", "tiny", "--steps", "1", "--data", data,
                                "--nvme-path", swap.path(), "--plot", ""});
  EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
  EXPECT_TRUE(contains(run.err, data + ": token id 4000000000 at byte offset 4000 (token 1000)"))
      << run.err;
  EXPECT_TRUE(contains(run.err, "262144")) << run.err;
  EXPECT_EQ(run.term_signal, 0);
}

// A model whose full parameters do not fit the host is refused before it is built.
TEST(CliUserErrors, AModelPastHostMemoryIsRefusedBeforeAnyAllocation) {
  TempDir dir, swap;
  ASSERT_TRUE(dir.ok() && swap.ok());
  std::vector<uint32_t> ids(4096, 1);
  ids[7] = 262143;  // the largest vocabulary a named model takes
  const std::string data = dir.path() + "/wide.u32";
  std::ofstream(data, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * sizeof(uint32_t)));
  // 13b with a 262144 vocabulary: 14 G parameters, 52 GiB to build in fp32, under a budget
  // that lets the device and pinned tiers pass.
  const std::string config =
      write_file(dir.path() + "/c.json", R"({"train_micro_batch_size_per_gpu": 1,
                                  "zero_optimization": {"stage": 0}})");
  const ZinfRun run = run_zinf({"train", "--config", config, "--model", "13b", "--steps", "1",
                                "--data", data, "--memory-budget", "4TiB", "--plot", ""});
  EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
  EXPECT_TRUE(contains(run.err, "of host memory")) << run.err;
  EXPECT_TRUE(contains(run.err, "available")) << run.err;
  EXPECT_EQ(run.term_signal, 0);
}

// Defect: --plot into a missing folder wrote the PNG's bytes to stdout at the end.
TEST(CliUserErrors, APlotPathThatCannotBeWrittenIsRefusedAtStartUp) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string png = dir.path() + "/nodir/loss.png";
  const ZinfRun run = run_zinf({"train", "--model", "tiny", "--steps", "1", "--plot", png});
  EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
  EXPECT_TRUE(
      contains(run.err, "--plot " + png + ": its folder " + dir.path() + "/nodir does not exist"))
      << run.err;
  EXPECT_FALSE(contains(run.out, "PNG")) << "image bytes on stdout";
}

// Defect: `zinf train --model tiny` failed its own budget check; --memory-budget sets it.
TEST(CliUserErrors, EveryNamedModelRunsBareAndMemoryBudgetSetsTheBudget) {
  TempDir swap;
  ASSERT_TRUE(swap.ok());
  const ZinfRun tiny = run_zinf({"train", "--model", "tiny", "--steps", "1", "--grad-accum", "1",
                                 "--nvme-path", swap.path(), "--plot", ""},
                                {}, SIGINT, 300);
  EXPECT_EQ(tiny.exit_code, 0) << tiny.out << tiny.err;
  EXPECT_TRUE(contains(tiny.out, "accelerator budget raised from")) << tiny.out;
  EXPECT_TRUE(contains(tiny.out, "== zinf train: 1 steps of tiny")) << tiny.out;

  const ZinfRun small = run_zinf({"train", "--model", "tiny", "--steps", "1", "--nvme-path",
                                  swap.path(), "--plot", "", "--memory-budget", "64KiB"});
  EXPECT_EQ(small.exit_code, 2) << small.out << small.err;
  EXPECT_TRUE(contains(small.out, "zinf.accelerator.memory_budget = 64.00 KiB (--memory-budget)"))
      << small.out;
  EXPECT_TRUE(contains(small.err, "the budget (zinf.accelerator.memory_budget) is 64.00 KiB"))
      << small.err;
  EXPECT_TRUE(contains(small.err, "--memory-budget")) << small.err;

  const ZinfRun bad = run_zinf({"train", "--memory-budget", "lots", "--plot", ""});
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_TRUE(contains(bad.err, "--memory-budget")) << bad.err;
}

// Defect: CLI11's own exit codes (105, 106) and config errors that exited 1.
TEST(CliUserErrors, UsageAndConfigErrorsExitTwo) {
  TempDir dir, swap, swap2;
  ASSERT_TRUE(dir.ok() && swap.ok() && swap2.ok());
  const ZinfRun steps = run_zinf({"train", "--steps", "two"});
  EXPECT_EQ(steps.exit_code, 2) << steps.out << steps.err;
  EXPECT_TRUE(contains(steps.err, "--steps")) << steps.err;
  const ZinfRun init = run_zinf({"train", "--init-from", dir.path() + "/missing"});
  EXPECT_EQ(init.exit_code, 2) << init.out << init.err;
  EXPECT_TRUE(contains(init.err, "--init-from")) << init.err;

  struct Case {
    std::string name;
    std::string json;
    std::string message;
  };
  const std::string nvme =
      R"("offload_param": {"device": "nvme", "max_in_cpu": 0, "buffer_size": 1e5},
                               "offload_optimizer": {"device": "nvme"})";
  const std::vector<Case> cases = {
      {"pinned limit",
       R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, )" + nvme +
           R"(}, "zinf": {"pinned_memory_limit": 4096, "nvme_paths": [")" + swap.path() + R"("]}})",
       "zinf.pinned_memory_limit allows 4096 B"},
      {"folder twice",
       R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, )" + nvme +
           R"(}, "zinf": {"nvme_paths": [")" + swap.path() + R"(", ")" + swap.path() + R"(/."]}})",
       "give each folder once"},
      {"buffer_size 1e15",
       R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
           "offload_param": {"device": "nvme", "max_in_cpu": 0, "buffer_size": 1e15},
           "offload_optimizer": {"device": "nvme"}}, "zinf": {"nvme_paths": [")" +
           swap.path() + R"("]}})",
       "pinned host memory"},
      {"sub_group_size 0",
       R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2,
           "sub_group_size": 0}})",
       "zero_optimization.sub_group_size"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = write_file(dir.path() + "/c.json", c.json);
    const ZinfRun run = run_zinf({"train", "--config", path, "--model", "tiny", "--steps", "1",
                                  "--threads", "2", "--plot", ""});
    EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
    EXPECT_TRUE(contains(run.err, c.message)) << run.err;
    if (c.name == "sub_group_size 0") {
      EXPECT_TRUE(contains(run.err, path)) << run.err;
    }
  }
}

// Defect: messages that named the wrong thing.
TEST(CliUserErrors, MessagesNameWhatIsWrong) {
  TempDir dir, swap;
  ASSERT_TRUE(dir.ok() && swap.ok());
  const std::string proc = write_file(dir.path() + "/proc.json", R"({
    "train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/proc"}}})");
  const ZinfRun on_proc =
      run_zinf({"train", "--config", proc, "--model", "tiny", "--steps", "1", "--plot", ""});
  EXPECT_EQ(on_proc.exit_code, 2) << on_proc.out << on_proc.err;
  EXPECT_TRUE(contains(on_proc.err, "/proc: is on procfs, a virtual file system")) << on_proc.err;
  EXPECT_FALSE(contains(on_proc.err, "No such file or directory")) << on_proc.err;

  const ZinfRun folder = run_zinf({"train", "--config", dir.path(), "--plot", ""});
  EXPECT_EQ(folder.exit_code, 2) << folder.out << folder.err;
  EXPECT_TRUE(contains(folder.err, "is a folder, not a config file")) << folder.err;
  EXPECT_FALSE(contains(folder.err, "not valid JSON")) << folder.err;

  // --load of a checkpoint already at --steps says there is nothing to train.
  TempDir ck;
  ASSERT_TRUE(ck.ok());
  const std::string config = write_file(dir.path() + "/c.json", kNvmeConfig);
  ASSERT_EQ(train(config, swap.path(), 2, {"--save", ck.path()}).exit_code, 0);
  const ZinfRun again = train(config, swap.path(), 1, {"--load", ck.path()});
  EXPECT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_TRUE(contains(again.out, "nothing to train: the checkpoint is at step 2 and --steps 1"))
      << again.out;
}

// Defect: a Hugging Face Trainer config, every batch size "auto", was refused without
// --micro-batch.
TEST(CliUserErrors, AllAutoBatchSizesTakeTheCommandLineDefaults) {
  TempDir dir, swap;
  ASSERT_TRUE(dir.ok() && swap.ok());
  const std::string config = write_file(dir.path() + "/hf.json", R"({
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 2}})");
  const ZinfRun run = run_zinf({"train", "--config", config, "--model", "tiny", "--steps", "1",
                                "--seq-len", "16", "--threads", "2", "--plot", ""},
                               {}, SIGINT, 300);
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_TRUE(contains(run.out,
                       "train_micro_batch_size_per_gpu = 2 (auto: the command line's "
                       "default (--micro-batch sets it))"))
      << run.out;
  EXPECT_TRUE(contains(run.out,
                       "gradient_accumulation_steps = 8 (auto: the command line's "
                       "default (--grad-accum sets it))"))
      << run.out;
  EXPECT_TRUE(contains(run.out, "train_batch_size = 16")) << run.out;
}

// Defect: in a long step the first Ctrl-C printed nothing and the second killed the process,
// skipping the checkpoint and leaving the swap files.
TEST(CliUserErrors, CtrlCTwiceInALongStepAbandonsItSavesAndCleansUp) {
  TempDir dir, swap, ck;
  ASSERT_TRUE(dir.ok() && swap.ok() && ck.ok());
  const std::string config = write_file(dir.path() + "/c.json", kNvmeConfig);
  const ZinfRun run = run_zinf_signals(
      {"train", "--config", config, "--model", "tiny", "--steps", "3", "--seq-len", "32",
       "--threads", "2", "--nvme-path", swap.path(), "--plot", "", "--save", ck.path(),
       "--grad-accum", "1000000"},
      // The first once the step shows its micro-batches (a plain line every 10 s).
      {{[](const std::string& out) { return contains(out, "step 1/3: micro-batch"); }, SIGINT},
       {[](const std::string& out) { return contains(out, "SIGINT received at step 1 of 3"); },
        SIGINT}},
      300);
  ASSERT_EQ(run.signals_sent, 2) << run.out << run.err;
  ASSERT_FALSE(run.timed_out) << run.out << run.err;
  EXPECT_EQ(run.exit_code, 130) << run.out << run.err;
  EXPECT_LT(run.seconds_after_last_signal, 30.0) << "the second Ctrl-C did not stop it soon";
  EXPECT_TRUE(contains(run.out, "SIGINT received at step 1 of 3, micro-batch")) << run.out;
  EXPECT_TRUE(contains(run.out, "Ctrl-C again abandons the step")) << run.out;
  EXPECT_TRUE(contains(run.out, "SIGINT again at step 1 of 3")) << run.out;
  EXPECT_TRUE(contains(run.out,
                       "stopped at the boundary of step 0 of 3; swap files removed; "
                       "step 1 abandoned"))
      << run.out;
  EXPECT_TRUE(contains(run.out, "step 0 saved in " + ck.path())) << run.out;
  EXPECT_EQ(latest_of(ck.path()), "global_step0");
  EXPECT_TRUE(fs::is_empty(swap.path())) << "swap files left behind";
}

}  // namespace
}  // namespace zinf::tools
