// `zinf train` and `zinf estimate` run as the real binary: a shortened bare run (its summary,
// the PNG, the swap folder emptied), the example configs, bad configs, Ctrl-C at a step
// boundary, and the estimate's plan and DeepSpeed table.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
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
using zinf::testing::TempDir;
using zinf::testing::ZinfRun;

const std::string kExamples = std::string(ZINF_SHARED_DIR) + "/examples";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool is_png(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, sizeof magic);
  return in.gcount() == 8 && std::string(magic, 8) == std::string("\x89PNG\r\n\x1a\n", 8);
}

// The number after `label` in `text` (e.g. "loss 3.1 -> 2.2": label "-> " gives 2.2).
double number_after(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  if (at == std::string::npos) return -1.0;
  return std::stod(text.substr(at + label.size()));
}

std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The bare run shortened (40 steps of 2 micro-batches instead of 60 of 8: about 20 s on 2
// quiet cores) still ends below the corpus's unigram entropy.
TEST(CliTrain, ShortBareRunBeatsUnigramEntropyPrintsSummaryWritesPngAndRemovesSwap) {
  TempDir swap, out;
  ASSERT_TRUE(swap.ok() && out.ok());
  const std::string png = out.path() + "/loss.png";
  ZinfRun run = run_zinf({"train", "--steps", "40", "--grad-accum", "2", "--threads", "2",
                          "--nvme-path", swap.path(), "--plot", png},
                         {}, SIGINT, 300);
  ASSERT_FALSE(run.timed_out) << run.out << run.err;
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  // Start-up: threads, the resolved values, the model against its budget, the corpus.
  EXPECT_TRUE(contains(run.out, "2 compute threads per rank (--threads)")) << run.out;
  EXPECT_TRUE(contains(run.out, "config: embedded default")) << run.out;
  EXPECT_TRUE(contains(run.out, "gradient_accumulation_steps = 2 (--grad-accum)")) << run.out;
  EXPECT_TRUE(contains(run.out, "zero_optimization.reduce_bucket_size = 65536 (auto: hidden^2"))
      << run.out;
  EXPECT_TRUE(std::regex_search(run.out, std::regex("model small: [0-9.]+ M parameters")))
      << run.out;
  const double ratio = number_after(run.out, "B/param) = ");
  EXPECT_GE(ratio, 4.0) << "the bare budget must be at most 1/4 of the model states\n" << run.out;
  EXPECT_TRUE(contains(run.out, "unigram entropy")) << run.out;
  EXPECT_TRUE(contains(run.out, "swap folder: " + swap.path() + "/zinf-train-")) << run.out;
  // Progress (plain lines: stdout is a pipe) and the summary.
  EXPECT_TRUE(contains(run.out, "step 1/40  loss ")) << run.out;
  EXPECT_TRUE(contains(run.out, "step 40/40  loss ")) << run.out;
  EXPECT_TRUE(contains(run.out, "== zinf train: 40 steps of small")) << run.out;
  EXPECT_TRUE(std::regex_search(run.out, std::regex("throughput  [0-9.]+ tokens/s"))) << run.out;
  for (const char* tier : {"device", "compute", "pinned", "host", "nvme", "peak RSS"}) {
    EXPECT_TRUE(std::regex_search(run.out, std::regex(std::string("\n") + tier + " +[0-9]")))
        << tier << "\n"
        << run.out;
  }
  EXPECT_TRUE(std::regex_search(run.out, std::regex("nvme +[0-9.]+ [KMG]iB +[0-9.]+ [KMG]iB")))
      << "params and optimizer states on NVMe\n"
      << run.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run.out, m,
                                std::regex("\nloss +([0-9.]+) -> ([0-9.]+) .*unigram "
                                           "entropy ([0-9.]+): beaten by")))
      << run.out;
  const double start = std::stod(m[1]), end = std::stod(m[2]), entropy = std::stod(m[3]);
  EXPECT_GT(entropy, 1.0) << run.out;
  EXPECT_GT(start, entropy) << run.out;
  EXPECT_LT(end, entropy) << run.out;
  EXPECT_TRUE(contains(run.out, "loss plot   " + png)) << run.out << run.err;
  EXPECT_TRUE(is_png(png)) << png;
  EXPECT_TRUE(fs::is_empty(swap.path())) << "the swap folder was left behind";
}

TEST(CliTrain, ExampleConfigsRunAFewSteps) {
  for (const char* name : {"zero2.json", "zero3_nvme.json"}) {
    SCOPED_TRACE(name);
    TempDir swap;
    ASSERT_TRUE(swap.ok());
    ZinfRun run =
        run_zinf({"train", "--config", kExamples + "/" + name, "--model", "tiny", "--steps", "2",
                  "--threads", "2", "--nvme-path", swap.path(), "--plot", ""},
                 {}, SIGINT, 300);
    ASSERT_FALSE(run.timed_out) << run.out << run.err;
    EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_TRUE(contains(run.out, std::string("config: ") + kExamples + "/" + name)) << run.out;
    EXPECT_TRUE(contains(run.out, "== zinf train: 2 steps of tiny")) << run.out;
    EXPECT_TRUE(fs::is_empty(swap.path())) << "swap files left behind";
  }
}

// zinf.activation_offload "nvme" through the CLI: the plan names the offloaded activations,
// the summary says how many layer inputs went to NVMe and came back, and the swap folder
// (activation.swp included) is emptied at the end.
TEST(CliTrain, ActivationOffloadToNvmeIsPlannedReportedAndCleanedUp) {
  TempDir swap, dir;
  ASSERT_TRUE(swap.ok() && dir.ok());
  const std::string config = write_file(dir.path(), "ds.json", R"({
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
      "zinf": {"activation_offload": "nvme"}})");
  ZinfRun run = run_zinf({"train", "--config", config, "--model", "tiny", "--steps", "3",
                          "--threads", "2", "--nvme-path", swap.path(), "--plot", ""},
                         {}, SIGINT, 300);
  ASSERT_FALSE(run.timed_out) << run.out << run.err;
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_TRUE(std::regex_search(run.out, std::regex("nvme +[0-9.]+ [KM]iB +\\(swap files; "
                                                    "offloaded activations [0-9.]+ KiB\\)")))
      << run.out;
  // tiny: 2 layers x 2 micro-batches x 3 steps.
  EXPECT_TRUE(contains(run.out, "activations 12 block inputs offloaded to nvme")) << run.out;
  EXPECT_TRUE(contains(run.out, "12 back (6 read ahead)")) << run.out;
  EXPECT_TRUE(fs::is_empty(swap.path())) << "swap files left behind";
}

// zero3_nvme.json fixes train_batch_size 8 and micro 2: one flag keeps the global batch and
// DeepSpeed's rule derives the other value; both flags recompute the global batch.
TEST(CliTrain, BatchOverridesFollowDeepSpeedsRules) {
  TempDir swap;
  ASSERT_TRUE(swap.ok());
  struct Case {
    std::vector<std::string> flags;
    std::string line;
    std::string batch;
  };
  const std::vector<Case> cases = {
      {{"--micro-batch", "4"},
       "gradient_accumulation_steps = 2 (train_batch_size / (micro x world size) = 8 / (4 x 1))",
       "batch: 8 samples x 64 tokens"},
      {{"--grad-accum", "1"},
       "train_micro_batch_size_per_gpu = 8 (train_batch_size / (world",
       "batch: 8 samples x 64 tokens"},
      {{"--micro-batch", "1", "--grad-accum", "2", "--lr", "5e-4"},
       "train_batch_size: recomputed from the overrides",
       "batch: 2 samples x 64 tokens"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"train",
                                     "--config",
                                     kExamples + "/zero3_nvme.json",
                                     "--model",
                                     "tiny",
                                     "--steps",
                                     "1",
                                     "--nvme-path",
                                     swap.path(),
                                     "--plot",
                                     ""};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    ZinfRun run = run_zinf(args);
    SCOPED_TRACE(c.flags[0]);
    EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_TRUE(contains(run.out, c.line)) << run.out;
    EXPECT_TRUE(contains(run.out, c.batch)) << run.out;
  }
}

// zero3_cpu_offload.json asks for fp16 with DeepSpeed's dynamic loss scaling (initial scale
// 2^16, hysteresis 2): it trains on the CPU accelerator too, saying once that the matmuls are
// computed in fp32 there, and the summary gives the loss scale and the skipped steps — after
// k >= 1 overflows the scale is 65536 / 2^(k - 1) (the first overflow spends the hysteresis).
TEST(CliTrain, Fp16ExampleTrainsWithDynamicLossScaling) {
  constexpr int kSteps = 4;
  ZinfRun run = run_zinf({"train", "--config", kExamples + "/zero3_cpu_offload.json", "--model",
                          "tiny", "--steps", std::to_string(kSteps), "--plot", ""});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_TRUE(contains(run.out, "vocab 256), fp16; model states")) << run.out;
  const bool cpu = contains(run.out, "zinf.accelerator.type = cpu");
  EXPECT_EQ(contains(run.out,
                     "fp16 on the CPU accelerator: matmuls (addmm, bmm) and SiLU "
                     "computed in fp32 and rounded to fp16"),
            cpu)
      << run.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      run.out, m,
      std::regex("fp16 +loss scale 65536 -> ([0-9]+); ([0-9]+) of ([0-9]+) steps skipped")))
      << run.out;
  const int skipped = std::stoi(m[2].str());
  EXPECT_EQ(std::stoi(m[3].str()), kSteps);
  EXPECT_LE(skipped, kSteps);
  EXPECT_EQ(std::stod(m[1].str()), skipped == 0 ? 65536.0 : std::ldexp(65536.0, 1 - skipped));
  // Every step's loss is a finite number near ln(256) = 5.55 (lr 3e-5 barely moves it).
  const std::regex step_line("step ([0-9]+)/[0-9]+  loss ([0-9.]+)");
  int lines = 0;
  for (auto it = std::sregex_iterator(run.out.begin(), run.out.end(), step_line);
       it != std::sregex_iterator(); ++it, ++lines) {
    EXPECT_NEAR(std::stod((*it)[2].str()), 5.55, 0.5) << it->str();
  }
  EXPECT_GE(lines, 1) << run.out;
}

TEST(CliTrain, BadConfigsGiveTheirMessageAndFail) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  struct Case {
    std::string json;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"({"train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
       "zero_optimization.offload_param"},
      {R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true},
           "bf16": {"enabled": true}})",
       "bf16.enabled"},
      {R"({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2,
           "gradient_accumulation_steps": 2})",
       "train_batch_size 7"},
      {R"({"train_micro_batch_size_per_gpu": 1,)", "bad.json"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    const std::string path = write_file(dir.path(), "bad.json", c.json);
    ZinfRun run =
        run_zinf({"train", "--config", path, "--model", "tiny", "--steps", "1", "--plot", ""});
    EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
    EXPECT_TRUE(contains(run.err, c.message)) << run.err;
    EXPECT_FALSE(contains(run.out, "== zinf train")) << run.out;
  }
  ZinfRun missing = run_zinf({"train", "--config", dir.path() + "/none.json", "--plot", ""});
  EXPECT_EQ(missing.exit_code, 2) << missing.out << missing.err;
  EXPECT_TRUE(contains(missing.err, dir.path() + "/none.json")) << missing.err;
  ZinfRun no_data = run_zinf({"train", "--data", dir.path() + "/none.txt", "--plot", ""});
  EXPECT_EQ(no_data.exit_code, 2) << no_data.out << no_data.err;
  EXPECT_TRUE(contains(no_data.err, dir.path() + "/none.txt")) << no_data.err;
}

TEST(CliTrain, SigintStopsAtAStepBoundaryAndRemovesSwapFiles) {
  TempDir swap;
  ASSERT_TRUE(swap.ok());
  ZinfRun run = run_zinf(
      {"train", "--steps", "100000", "--grad-accum", "1", "--threads", "2", "--nvme-path",
       swap.path(), "--plot", ""},
      [](const std::string& out) { return contains(out, "step 1/100000"); }, SIGINT, 300);
  ASSERT_TRUE(run.signal_sent) << run.out << run.err;
  ASSERT_FALSE(run.timed_out) << run.out << run.err;
  EXPECT_EQ(run.term_signal, 0);
  EXPECT_EQ(run.exit_code, 130) << run.out << run.err;
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(run.out, m,
                        std::regex("SIGINT received: stopped at the boundary of step ([0-9]+) of "
                                   "100000; swap files removed")))
      << run.out;
  const int stopped = std::stoi(m[1]);
  EXPECT_GE(stopped, 1);
  EXPECT_TRUE(contains(run.out, "== zinf train: " + std::to_string(stopped) + " steps of small"))
      << run.out;
  EXPECT_TRUE(fs::is_empty(swap.path())) << "swap files left behind";
}

// Under a launcher (here plain RANK / WORLD_SIZE variables) a Ctrl-C reaches a rank twice
// (the terminal's, then the launcher's): both only ask for the stop, so the rank still ends at
// a step boundary with its swap folder removed instead of dying mid-step.
TEST(CliTrain, TwoSigintsUnderALauncherStillStopAtABoundary) {
  TempDir swap;
  ASSERT_TRUE(swap.ok());
  std::vector<std::string> argv_text = {ZINF_BINARY,    "train",     "--steps",   "100000",
                                        "--grad-accum", "1",         "--threads", "2",
                                        "--nvme-path",  swap.path(), "--plot",    ""};
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string rank = "RANK=0", world = "WORLD_SIZE=1";
  std::vector<char*> envp = {rank.data(), world.data(), nullptr};
  int out_pipe[2];
  ASSERT_EQ(::pipe2(out_pipe, O_CLOEXEC), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(out_pipe[1], 2);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ASSERT_GT(pid, 0);
  ::close(out_pipe[1]);
  std::string out;
  bool first = false, sent = false;
  char buffer[4096];
  for (ssize_t got; (got = ::read(out_pipe[0], buffer, sizeof buffer)) != 0;) {
    if (got < 0) {
      if (errno == EINTR) continue;
      break;
    }
    out.append(buffer, static_cast<size_t>(got));
    // The second once the first has been seen (two pending SIGINTs would merge into one):
    // here while the run winds down, where a launcher's forwarded one may land.
    if (!first && contains(out, "step 1/100000")) {
      ::kill(pid, SIGINT);
      first = true;
    }
    if (first && !sent && contains(out, "SIGINT received")) {
      ::kill(pid, SIGINT);
      sent = true;
    }
  }
  ::close(out_pipe[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ASSERT_TRUE(sent) << out;
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << "\n" << out;
  EXPECT_EQ(WEXITSTATUS(status), 130) << out;
  EXPECT_TRUE(contains(out, "launcher env")) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("SIGINT received: stopped at the boundary of step [0-9]+ of 100000")))
      << out;
  EXPECT_TRUE(fs::is_empty(swap.path())) << "swap files left behind";
}

TEST(CliEstimate, PrintsThePlanAndTheDeepSpeedTable) {
  ZinfRun run = run_zinf({"estimate", "--config", kExamples + "/zero3_cpu_offload.json",
                          "--model-size", "1b", "--num-gpus", "8", "--num-nodes", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_TRUE(contains(run.out,
                       "stage 3, fp16, offload_param cpu, offload_optimizer cpu, 16 "
                       "rank(s)"))
      << run.out;
  EXPECT_TRUE(contains(run.out, "Memory plan per rank")) << run.out;
  EXPECT_TRUE(std::regex_search(run.out, std::regex("device +[0-9.]+ [KMG]iB +="))) << run.out;
  EXPECT_TRUE(contains(run.out, "2 node(s) x 8 GPU(s)")) << run.out;
  EXPECT_TRUE(contains(run.out, "offload_param=cpu, offload_optimizer=cpu, zero_init=1"))
      << run.out;
  EXPECT_TRUE(contains(run.out, "offload_param=none, offload_optimizer=none, zero_init=0"))
      << run.out;

  // DeepSpeed's formula worked by hand for 1b (vocab 32000): 940,640,256 params, largest
  // layer the embedding, 32000 x 2048 = 65,536,000. Params and optimizer on CPU, zero_init:
  // per GPU 4 x 65,536,000 B = 0.24 GiB, per CPU 940,640,256 x 18 x 1.5 B = 23.65 GiB.
  ZinfRun one = run_zinf({"estimate", "--model-size", "1b"});
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  EXPECT_TRUE(contains(one.out, "model 1b: 0.941 B parameters")) << one.out;
  EXPECT_TRUE(contains(one.out,
                       "config embedded default: stage 3, fp32, offload_param nvme, "
                       "offload_optimizer nvme"))
      << one.out;
  EXPECT_TRUE(contains(one.out,
                       "23.65GB    0.24GB offload_param=cpu, offload_optimizer=cpu, "
                       "zero_init=1"))
      << one.out;

  ZinfRun bad = run_zinf({"estimate", "--model-size", "lots"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(contains(bad.err, "--model-size \"lots\"")) << bad.err;
}

// `--init-from DIR` plans the exact model a Hugging Face folder's config.json describes
// (here a Qwen3 folder transformers wrote): its parameter count (transformers counted 22,752)
// and architecture; a folder without config.json, or with a key zinf cannot honour, is named.
TEST(CliEstimate, InitFromPlansTheFoldersOwnModel) {
  const std::string folder =
      std::string(ZINF_SOURCE_DIR) + "/tests/engine/data/transformers/families/qwen3_qk_norm_fp32";
  ZinfRun run = run_zinf({"estimate", "--init-from", folder});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_TRUE(contains(run.out,
                       "model qwen3_qk_norm_fp32: 0.000 B parameters (2 layers, hidden "
                       "32, intermediate 48, vocab 48)"))
      << run.out;
  EXPECT_TRUE(contains(run.out,
                       "architecture: qwen3; q/k RMSNorm; 4 heads (1 key/value), "
                       "head_dim 16"))
      << run.out;
  EXPECT_TRUE(contains(run.out, "Memory plan per rank")) << run.out;

  TempDir empty;
  ZinfRun missing = run_zinf({"estimate", "--init-from", empty.path()});
  EXPECT_EQ(missing.exit_code, 2) << missing.out;
  EXPECT_TRUE(contains(missing.err, empty.path() + "/config.json")) << missing.err;
  ZinfRun both = run_zinf({"estimate", "--init-from", folder, "--model-size", "1b"});
  EXPECT_NE(both.exit_code, 0);
  ZinfRun neither = run_zinf({"estimate"});
  EXPECT_EQ(neither.exit_code, 2);
  EXPECT_TRUE(contains(neither.err, "give --model-size or --init-from")) << neither.err;
}

}  // namespace
}  // namespace zinf::tools
