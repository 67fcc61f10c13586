// DeepSpeed itself against zinf's checkpoints, both ways (issue 21; label "deepspeed"): one
// Hugging Face Llama folder, one ds_config.json (ZeRO-3, AdamW, clipping at 1.0), one
// pre-tokenized file and the same sample order (bench/deepspeed/train/ds_train_worker.py
// re-does zinf's). The real `zinf train --init-from` trains 4 steps uninterrupted, then:
//   - zinf saves at step 2, and DeepSpeed's engine.load_checkpoint resumes from that folder
//     (transformers' LlamaForCausalLM under deepspeed.initialize, Gloo);
//   - DeepSpeed trains 2 steps and saves, and `zinf train --load` resumes from its folder.
// Steps 3 and 4 of both resumed runs must have the uninterrupted run's losses: on 1 rank in
// fp32 and bf16, and on 2 ranks with zinf's params and optimizer on NVMe. A checkpoint read
// with its parameters at the wrong offsets, moments of another gradient scale, a wrong step
// count or the wrong samples shows in those losses (the sizes below are what each gave). A
// DeepSpeed stage-2 checkpoint is refused, saying what to do instead.
//
// Skipped, with the reason, where .venv/ is absent or cannot import deepspeed and transformers.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "tests/common/multi_process.h"
#include "tests/common/run_logged.h"
#include "tests/common/temp_dir.h"
#include "tests/common/venv.h"

namespace {

namespace fs = std::filesystem;
using ::zinf::testing::run_logged;

// Relative, on losses near 6: the two runtimes compute with their own kernels (LibTorch's,
// transformers'), so the same step differs in the last digits; they agree to ~1e-7 relative
// here. zinf's old parameter order moved DeepSpeed's resumed steps by 5.5e-2; moments of
// unclipped gradients resumed with clipping moved step 4 by 1.8e-4 (on another data file).
constexpr double kLossTolerance = 2e-5;

std::string missing_environment() {
  return ::zinf::testing::venv_missing(ZINF_VENV_PYTHON, "deepspeed, transformers");
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The losses of a csv_monitor's Train_Samples_train_loss.csv, in order.
std::vector<double> csv_losses(const std::string& path) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // step,train_loss
  while (std::getline(in, line)) {
    if (const size_t comma = line.find(','); comma != std::string::npos) {
      out.push_back(std::stod(line.substr(comma + 1)));
    }
  }
  return out;
}

// Step number -> loss of the worker's "ds-step N loss X ..." lines.
std::vector<std::pair<int, double>> ds_losses(const std::string& log) {
  std::vector<std::pair<int, double>> out;
  const std::regex line(R"(ds-step (\d+) loss (\S+) )");
  const std::string text = read_all(log);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator();
       ++it) {
    out.emplace_back(std::stoi((*it)[1].str()), std::stod((*it)[2].str()));
  }
  return out;
}

// One way of running both sides.
struct Case {
  int ranks = 1;
  bool bf16 = false;
  bool zinf_on_nvme = false;  // zinf's params and optimizer on NVMe (DeepSpeed's config: none)
  double tolerance = kLossTolerance;
};

void resume_both_ways(const Case& c) {
  ::zinf::testing::TempDir dir;
  const std::string zinf = std::string("'") + ZINF_BINARY + "'";

  // A tiny fp32 Llama folder (vocab 256), and 16 Ki tokens with some structure to learn.
  ASSERT_TRUE(run_logged(std::string("/usr/bin/python3 ") + ZINF_HF_SCRIPT + " '" +
                             dir.file("init") + "' --dtype float32 --seed 3",
                         dir.file("init.log")));
  {
    std::ofstream data(dir.file("tokens.u16"), std::ios::binary);
    uint32_t x = 12345;
    for (int i = 0; i < 16384; ++i) {
      x = x * 1103515245u + 12345u;
      const auto token = static_cast<uint16_t>((i % 7 == 0) ? (x >> 16) % 256 : (i * 31) % 97);
      data.write(reinterpret_cast<const char*>(&token), sizeof(token));  // little-endian host
    }
  }
  const std::string config_body = std::string(R"(
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                  "weight_decay": 0.0, "torch_adam": true}},
    "gradient_clipping": 1.0, "steps_per_print": 100, "bf16": {"enabled": )") +
                                  (c.bf16 ? "true" : "false") + "}";
  {
    std::ofstream(dir.file("ds.json"))
        << "{" << config_body << ",\n    \"zero_optimization\": {\"stage\": 3}}\n";
    const std::string nvme = "{\"device\": \"nvme\", \"nvme_path\": \"" + dir.path() + "\"}";
    std::ofstream(dir.file("zinf.json"))
        << "{" << config_body << ",\n    \"zero_optimization\": {\"stage\": 3"
        << (c.zinf_on_nvme ? ", \"offload_param\": " + nvme + ", \"offload_optimizer\": " + nvme
                           : std::string())
        << "},\n    \"csv_monitor\": {\"enabled\": true, \"output_path\": \"" << dir.file("csv")
        << "\", \"job_name\": \"run\"}}\n";
  }
  // Each rank a process of its own with torch.distributed's environment (rank 0 serves the
  // store): DeepSpeed's and zinf's LibTorch may be of other versions, whose stores do not
  // speak to each other (zinf built on Debian's LibTorch 1.13 under .venv's torchrun 2.x
  // waits forever). One OpenMP thread each when ranks share the cores, and no spinning.
  auto launch = [&](const std::string& program) {
    const std::string port = std::to_string(::zinf::testing::free_port());
    std::string command;
    for (int r = 0; r < c.ranks; ++r) {
      command += "DS_ACCELERATOR=cpu OMP_WAIT_POLICY=PASSIVE " +
                 std::string(c.ranks > 1 ? "OMP_NUM_THREADS=1 " : "") +
                 "RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
                 " WORLD_SIZE=" + std::to_string(c.ranks) +
                 " LOCAL_WORLD_SIZE=" + std::to_string(c.ranks) +
                 " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " + program +
                 (r + 1 < c.ranks ? " & p" + std::to_string(r) + "=\\$!; " : "; ");
    }
    // The exit status: 0 when every rank's is.
    command += "s=\\$?;";
    for (int r = 0; r + 1 < c.ranks; ++r) command += " wait \\$p" + std::to_string(r) + " || s=1;";
    return "sh -c \"" + command + " exit \\$s\"";
  };
  const std::string common = " --data '" + dir.file("tokens.u16") + "' --seq-len 16";
  auto zinf_train = [&](const std::string& name, const std::string& extra) {
    fs::remove_all(dir.file("csv"));
    const bool ok = run_logged(
        launch(zinf + " train --init-from '" + dir.file("init") + "' --config '" +
               dir.file("zinf.json") + "'" + common + " --micro-batch 2 --plot '' " + extra),
        dir.file(name + ".log"));
    EXPECT_TRUE(ok);
    // Rank 0 trained in a world of all the ranks: its steps' collectives needed every one.
    const std::string world = "world size = 2 x 1 x " + std::to_string(c.ranks) + ")";
    EXPECT_NE(read_all(dir.file(name + ".log")).find(world), std::string::npos)
        << read_all(dir.file(name + ".log"));
    return csv_losses(dir.file("csv") + "/run/Train_Samples_train_loss.csv");
  };
  auto deepspeed = [&](const std::string& name, const std::string& extra) {
    EXPECT_TRUE(run_logged(launch("'" + std::string(ZINF_VENV_PYTHON) + "' " + ZINF_DS_WORKER +
                                  " --model '" + dir.file("init") + "' --config '" +
                                  dir.file("ds.json") + "'" + common + " " + extra),
                           dir.file(name + ".log")));
    EXPECT_NE(read_all(dir.file(name + ".log")).find(" world " + std::to_string(c.ranks) + "\n"),
              std::string::npos)
        << read_all(dir.file(name + ".log"));
    return ds_losses(dir.file(name + ".log"));
  };
  auto expect_near = [&](double got, double want, const std::string& what) {
    EXPECT_NEAR(got, want, c.tolerance * std::abs(want)) << what;
    std::cout << std::setprecision(9) << "LOSS " << what << ": " << got << " vs uninterrupted zinf "
              << want << " (relative difference " << std::abs(got - want) / std::abs(want) << ")\n";
  };

  const std::vector<double> want = zinf_train("zinf-4", "--steps 4");
  ASSERT_EQ(want.size(), 4u) << read_all(dir.file("zinf-4.log"));
  // The steps move the weights (the loss of this data goes up before it comes down): a load
  // that restored nothing would show.
  EXPECT_GT(std::abs(want[3] - want[0]), 1e-2);

  // zinf's checkpoint, DeepSpeed resumes.
  ASSERT_EQ(zinf_train("zinf-2", "--steps 2 --save '" + dir.file("zinf-ckpt") + "'").size(), 2u);
  const auto ds_resumed =
      deepspeed("ds-resume", "--steps 4 --load '" + dir.file("zinf-ckpt") + "'");
  ASSERT_NE(read_all(dir.file("ds-resume.log")).find("global_steps 2"), std::string::npos)
      << read_all(dir.file("ds-resume.log"));
  ASSERT_EQ(ds_resumed.size(), 2u) << read_all(dir.file("ds-resume.log"));
  for (const auto& [step, loss] : ds_resumed) {
    expect_near(loss, want[static_cast<size_t>(step - 1)],
                "DeepSpeed from zinf's step-2 checkpoint, step " + std::to_string(step));
  }

  // DeepSpeed's checkpoint, zinf resumes.
  const auto ds_first = deepspeed("ds-save", "--steps 2 --save '" + dir.file("ds-ckpt") + "'");
  ASSERT_EQ(ds_first.size(), 2u) << read_all(dir.file("ds-save.log"));
  expect_near(ds_first[0].second, want[0], "DeepSpeed, step 1");
  const std::vector<double> zinf_resumed =
      zinf_train("zinf-resume", "--steps 4 --load '" + dir.file("ds-ckpt") + "'");
  const std::string resume_log = read_all(dir.file("zinf-resume.log"));
  ASSERT_NE(resume_log.find("checkpoint loaded"), std::string::npos) << resume_log;
  EXPECT_NE(resume_log.find("the data goes on at sample " + std::to_string(4 * c.ranks)),
            std::string::npos)
      << resume_log;
  ASSERT_EQ(zinf_resumed.size(), 2u) << resume_log;
  for (size_t i = 0; i < 2; ++i) {
    expect_near(zinf_resumed[i], want[2 + i],
                "zinf from DeepSpeed's step-2 checkpoint, step " + std::to_string(3 + i));
  }
}

TEST(DeepSpeedInterop, OneRankFp32) {
  if (const std::string why = missing_environment(); !why.empty()) GTEST_SKIP() << why;
  resume_both_ways({});
}

TEST(DeepSpeedInterop, TwoRanksFp32WithZinfOnNvme) {
  if (const std::string why = missing_environment(); !why.empty()) GTEST_SKIP() << why;
  resume_both_ways({.ranks = 2, .zinf_on_nvme = true});
}

TEST(DeepSpeedInterop, OneRankBf16) {
  if (const std::string why = missing_environment(); !why.empty()) GTEST_SKIP() << why;
  // In bf16 the two runtimes' kernels round differently: step 1, from the same weights, differs
  // by 1.3e-3, and resumed steps by up to 2e-3 (a checkpoint read at wrong offsets: 5e-2).
  resume_both_ways({.bf16 = true, .tolerance = 5e-3});
}

// DeepSpeed's stages 1 and 2 cut each rank's partition from the flattened parameter group,
// zinf's per parameter: zinf refuses such a checkpoint, saying what to do instead.
TEST(DeepSpeedInterop, ADeepSpeedStage2CheckpointIsRefusedNamingTheWayOut) {
  if (const std::string why = missing_environment(); !why.empty()) GTEST_SKIP() << why;
  ::zinf::testing::TempDir dir;
  ASSERT_TRUE(run_logged(std::string("/usr/bin/python3 ") + ZINF_HF_SCRIPT + " '" +
                             dir.file("init") + "' --dtype float32 --seed 3",
                         dir.file("init.log")));
  {
    std::ofstream data(dir.file("tokens.u16"), std::ios::binary);
    for (int i = 0; i < 4096; ++i) {
      const auto token = static_cast<uint16_t>((i * 31) % 97);
      data.write(reinterpret_cast<const char*>(&token), sizeof(token));
    }
    std::ofstream(dir.file("ds.json")) << R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": true}},
      "zero_optimization": {"stage": 2}})";
  }
  const std::string common = " --data '" + dir.file("tokens.u16") + "' --seq-len 16";
  ASSERT_TRUE(run_logged(
      "DS_ACCELERATOR=cpu RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 "
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
          std::to_string(::zinf::testing::free_port()) + " '" + ZINF_VENV_PYTHON + "' " +
          ZINF_DS_WORKER + " --model '" + dir.file("init") + "' --config '" + dir.file("ds.json") +
          "'" + common + " --steps 1 --save '" + dir.file("ds-ckpt") + "'",
      dir.file("ds.log")));
  ASSERT_NE(read_all(dir.file("ds.log")).find("ds-saved"), std::string::npos)
      << read_all(dir.file("ds.log"));
  const std::string log = dir.file("zinf.log");
  EXPECT_FALSE(run_logged(std::string("'") + ZINF_BINARY + "' train --init-from '" +
                              dir.file("init") + "' --config '" + dir.file("ds.json") + "'" +
                              common + " --plot '' --steps 2 --load '" + dir.file("ds-ckpt") + "'",
                          log));
  const std::string text = read_all(log);
  EXPECT_NE(text.find("mp_rank_00_model_states.pt: written by DeepSpeed"), std::string::npos)
      << text;
  EXPECT_NE(text.find("at ZeRO stage 3 only"), std::string::npos) << text;
  EXPECT_NE(text.find("zinf zero-to-fp32"), std::string::npos) << text;
}

}  // namespace
