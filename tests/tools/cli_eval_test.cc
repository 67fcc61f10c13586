// `zinf train --eval-data` as the real binary: the held-out loss before training, every
// --eval-interval steps and at the end, in the log, csv_monitor's Train_Samples_eval_loss.csv,
// the plot and the summary; evaluating leaves the training exactly as it was without it; two
// ranks evaluate the same samples as one rank with twice the micro-batch and report the same
// loss; bad arguments are refused before training, naming the file or the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/multi_process.h"
#include "tests/common/run_logged.h"
#include "tests/common/temp_dir.h"
#include "tests/tools/file_bytes.h"
#include "tests/tools/test_system.h"

namespace zinf::tools {
namespace {

namespace fs = std::filesystem;
using zinf::testing::read_file;
using zinf::testing::run_logged;
using zinf::testing::run_zinf;
using zinf::testing::TempDir;
using zinf::testing::ZinfRun;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Held-out text unlike the training corpus's first samples, and a stage-3 config with
// csv_monitor into `dir`/csv/run.
struct EvalSetup {
  TempDir dir;
  std::string eval_text;
  std::string config;
  EvalSetup() {
    std::ostringstream text;
    for (int i = 0; i < 200; ++i) {
      text << "Line " << i << ": the quick brown fox jumps over the lazy dog, "
           << (i % 3 == 0 ? "twice" : "once") << ".\n";
    }
    eval_text = dir.file("held_out.txt");
    std::ofstream(eval_text) << text.str();
    config = dir.file("zinf.json");
    std::ofstream(config) << R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "zero_optimization": {"stage": 3},
      "csv_monitor": {"enabled": true, "output_path": ")"
                          << dir.file("csv") << R"(", "job_name": "run"}})";
  }
  std::string csv(const std::string& name) const { return dir.file("csv") + "/run/" + name; }
};

// (samples, value) rows of a csv_monitor file, after its header.
std::vector<std::pair<int64_t, double>> csv_rows(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::pair<int64_t, double>> rows;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    const size_t comma = line.find(',');
    rows.emplace_back(std::stoll(line.substr(0, comma)), std::stod(line.substr(comma + 1)));
  }
  return rows;
}

TEST(CliEval, HeldOutLossIsReportedEverywhereAndLeavesTrainingAsItWas) {
  EvalSetup s;
  const std::string png = s.dir.file("loss.png");
  const std::vector<std::string> common = {
      "train",     "--config", s.config,    "--model", "tiny",        "--steps",   "6",
      "--seq-len", "32",       "--threads", "2",       "--nvme-path", s.dir.path()};
  std::vector<std::string> with_eval = common;
  for (const char* a :
       {"--eval-data", "", "--eval-interval", "2", "--eval-batches", "3", "--plot", ""}) {
    with_eval.emplace_back(a);
  }
  with_eval[common.size() + 1] = s.eval_text;
  with_eval.back() = png;
  ZinfRun run = run_zinf(with_eval, {}, SIGINT, 300);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::string eval_csv = s.csv("Train_Samples_eval_loss.csv");
  ASSERT_TRUE(fs::exists(eval_csv)) << run.out;
  EXPECT_EQ(read_file(eval_csv).substr(0, read_file(eval_csv).find('\n')), "step,eval_loss");
  const auto evals = csv_rows(eval_csv);
  const auto train_with = read_file(s.csv("Train_Samples_train_loss.csv"));

  // Before training, at steps 2, 4 and 6 (global batch 4: samples 0, 8, 16, 24).
  ASSERT_EQ(evals.size(), 4u) << read_file(eval_csv);
  for (size_t i = 0; i < evals.size(); ++i) {
    EXPECT_EQ(evals[i].first, static_cast<int64_t>(8 * i));
    const std::regex line("eval at step " + std::to_string(2 * i) +
                          ": loss ([0-9.]+), perplexity ([0-9.]+) \\(192 tokens held out");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(run.out, m, line)) << run.out;
    EXPECT_NEAR(std::stod(m[1]), evals[i].second, 5e-5);
    EXPECT_NEAR(std::stod(m[2]), std::exp(evals[i].second),
                0.01 + 1e-4 * std::exp(evals[i].second));
  }
  // Adam at 3e-3 on English text: the held-out English loss falls.
  EXPECT_LT(evals.back().second, evals.front().second - 0.1) << read_file(eval_csv);
  EXPECT_TRUE(contains(run.out, "eval: byte-level text " + s.eval_text)) << run.out;
  EXPECT_TRUE(contains(run.out, "3 micro-batch(es) of 2 x 32 tokens per rank (192 tokens in all)"))
      << run.out;
  EXPECT_TRUE(std::regex_search(
      run.out, std::regex("eval loss +[0-9.]+ -> [0-9.]+ \\(perplexity [0-9.]+ -> [0-9.]+\\) at "
                          "steps 0 -> 6, on 192 held-out tokens of " +
                          s.eval_text)))
      << run.out;
  EXPECT_TRUE(contains(run.out, "loss plot   " + png)) << run.out << run.err;
  // The evaluations' cost on a line of its own, kept out of the training's figures.
  EXPECT_TRUE(std::regex_search(
      run.out, std::regex("evaluation  4 pass\\(es\\) in [0-9.]+ s: param fetch [0-9.]+ s")))
      << run.out;

  // Without --eval-data the same run trains to the same losses, bit for bit as csv prints them.
  fs::remove_all(s.dir.file("csv"));
  std::vector<std::string> without = common;
  without.insert(without.end(), {"--plot", ""});
  ZinfRun plain = run_zinf(without, {}, SIGINT, 300);
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  EXPECT_EQ(read_file(s.csv("Train_Samples_train_loss.csv")), train_with);
  EXPECT_FALSE(fs::exists(s.csv("Train_Samples_eval_loss.csv")));
  EXPECT_FALSE(contains(plain.out, "eval")) << plain.out;
}

// One rank with micro-batch 4 and two with micro-batch 2 evaluate the file's first 8 samples
// (rank r every second one): the same held-out loss before training.
TEST(CliEval, TwoRanksEvaluateTheSamplesOfOneRankAndAgree) {
  EvalSetup s;
  auto run = [&](int ranks, int micro) {
    const std::string port = std::to_string(::zinf::testing::free_port());
    std::string command;
    // Rank 0 (whose lines the log keeps) last, in the foreground.
    for (int r = ranks - 1; r >= 0; --r) {
      command +=
          "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE RANK=" + std::to_string(r) +
          " LOCAL_RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(ranks) +
          " LOCAL_WORLD_SIZE=" + std::to_string(ranks) +
          " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " '" + ZINF_BINARY +
          "' train --model tiny --steps 1 --seq-len 32 --plot '' --nvme-path '" + s.dir.path() +
          "' --micro-batch " + std::to_string(micro) +
          " --grad-accum 1 --eval-batches 2 --eval-data '" + s.eval_text + "'" +
          (r > 0 ? " > '" + s.dir.file("rank" + std::to_string(r) + ".log") + "' 2>&1 & p=\\$!; "
                 : "; ");
    }
    command += ranks > 1 ? "s=\\$?; wait \\$p || s=1; exit \\$s" : "exit \\$?";
    const std::string log = s.dir.file(std::to_string(ranks) + "ranks.log");
    EXPECT_TRUE(run_logged("sh -c \"" + command + "\"", log));
    const std::string text = read_file(log);
    EXPECT_TRUE(contains(
        text, "world size = " + std::to_string(micro) + " x 1 x " + std::to_string(ranks) + ")"))
        << text;
    std::smatch m;
    if (!std::regex_search(text, m, std::regex("eval at step 0: loss ([0-9.]+)"))) {
      ADD_FAILURE() << text;
      return -1.0;
    }
    EXPECT_TRUE(contains(text, "2 micro-batch(es) of " + std::to_string(micro) +
                                   " x 32 tokens per rank (256 tokens in all)"))
        << text;
    return std::stod(m[1]);
  };
  const double one = run(1, 4);
  const double two = run(2, 2);
  EXPECT_GT(one, 0.0);
  EXPECT_NEAR(one, two, 2e-4) << "one rank " << one << ", two ranks " << two;
  std::cout << "EVAL before training: 1 rank x micro 4 " << one << ", 2 ranks x micro 2 " << two
            << "\n";
}

TEST(CliEval, BadEvalArgumentsAreRefusedBeforeTraining) {
  EvalSetup s;
  // A token file with an id past the tiny model's vocabulary of 256 (the training data's).
  const std::string big_ids = s.dir.file("big.u16");
  {
    std::ofstream out(big_ids, std::ios::binary);
    for (uint16_t i = 0; i < 400; ++i) {
      const uint16_t id = i == 123 ? 300 : i % 200;
      out.write(reinterpret_cast<const char*>(&id), sizeof id);
    }
  }
  const std::string tiny_text = s.dir.file("tiny.txt");
  std::ofstream(tiny_text) << "too short for a sample of 33 bytes";
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> says;
  };
  // Training ids of the same kind (a token file) for the big-id case.
  const std::string train_ids = s.dir.file("train.u16");
  {
    std::ofstream out(train_ids, std::ios::binary);
    for (uint16_t i = 0; i < 4000; ++i) {
      const uint16_t id = static_cast<uint16_t>(i % 256);
      out.write(reinterpret_cast<const char*>(&id), sizeof id);
    }
  }
  const std::vector<Case> cases = {
      {{"--eval-data", s.dir.file("missing.txt")}, {"missing.txt"}},
      {{"--data", train_ids, "--eval-data", big_ids}, {"--eval-data", big_ids, "300", "256"}},
      {{"--eval-data", big_ids},
       {"--eval-data " + big_ids +
        " is a token file but the training data (the default "
        "corpus) is byte-level text"}},
      {{"--eval-data", tiny_text}, {tiny_text}},
      {{"--eval-interval", "2"}, {"--eval-interval without --eval-data"}},
      {{"--eval-data", s.eval_text, "--eval-batches", "0"}, {"--eval-batches 0 must be >= 1"}},
      {{"--eval-data", s.eval_text, "--eval-interval", "0"}, {"--eval-interval 0 must be >= 1"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags[0] + " " + c.flags[1] + (c.flags.size() > 2 ? " " + c.flags[2] : ""));
    std::vector<std::string> args = {"train", "--model",     "tiny",      "--steps",
                                     "1",     "--seq-len",   "32",        "--plot",
                                     "",      "--nvme-path", s.dir.path()};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    ZinfRun run = run_zinf(args, {}, SIGINT, 120);
    EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
    for (const std::string& part : c.says) {
      EXPECT_TRUE(contains(run.err, part)) << "no \"" << part << "\" in: " << run.err;
    }
    EXPECT_FALSE(contains(run.out, "step 1/1")) << "it trained first\n" << run.out;
  }
}

}  // namespace
}  // namespace zinf::tools
