// DeepSpeed itself against zinf's checkpoints, both ways (issue 21; label "deepspeed"): one
// Hugging Face Llama folder, one ds_config.json (ZeRO-3, AdamW, fp32, clipping at 1.0), one
// pre-tokenized file and the same sample order (bench/deepspeed/train/ds_train_worker.py
// re-does zinf's). The real `zinf train --init-from` trains 4 steps uninterrupted, then:
//   - zinf saves at step 2, and DeepSpeed's engine.load_checkpoint resumes from that folder
//     (transformers' LlamaForCausalLM under deepspeed.initialize, 1 rank, Gloo);
//   - DeepSpeed trains 2 steps and saves, and `zinf train --load` resumes from its folder.
// Steps 3 and 4 of both resumed runs must have the uninterrupted run's losses. A checkpoint
// read with its parameters at the wrong offsets, moments of another gradient scale, a wrong
// step count or the wrong samples shows in those losses (the sizes below are what each gave).
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

namespace {

namespace fs = std::filesystem;
using ::zinf::testing::run_logged;

// Relative, on losses near 6: the two runtimes compute with their own kernels (LibTorch's,
// transformers'), so the same step differs in the last digits; they agree to ~1e-7 relative
// here. zinf's old parameter order moved DeepSpeed's resumed steps by 5.5e-2; moments of
// unclipped gradients resumed with clipping moved step 4 by 1.8e-4 (on another data file).
constexpr double kLossTolerance = 2e-5;

std::string missing_environment() {
  if (!fs::exists(ZINF_VENV_PYTHON)) {
    return std::string(ZINF_VENV_PYTHON) + " is absent: make it with scripts/install-venv.sh";
  }
  const std::string probe = std::string("DS_ACCELERATOR=cpu '") + ZINF_VENV_PYTHON +
                            "' -c 'import deepspeed, transformers' > /dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    return std::string(ZINF_VENV_PYTHON) +
           " cannot import deepspeed and transformers (made with --torch-only?): run "
           "scripts/install-venv.sh";
  }
  return "";
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

void expect_near_relative(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, kLossTolerance * std::abs(want)) << what;
  std::cout << std::setprecision(9) << "LOSS " << what << ": " << got << " vs uninterrupted zinf "
            << want << " (relative difference " << std::abs(got - want) / std::abs(want) << ")\n";
}

TEST(DeepSpeedInterop, EachResumesFromTheOthersCheckpointWithTheUninterruptedLosses) {
  if (const std::string why = missing_environment(); !why.empty()) GTEST_SKIP() << why;
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
  const std::string config_body = R"(
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                  "weight_decay": 0.0, "torch_adam": true}},
    "gradient_clipping": 1.0, "zero_optimization": {"stage": 3}, "steps_per_print": 100)";
  {
    std::ofstream(dir.file("ds.json")) << "{" << config_body << "}\n";
    std::ofstream(dir.file("zinf.json"))
        << "{" << config_body << ",\n    \"csv_monitor\": {\"enabled\": true, \"output_path\": \""
        << dir.file("csv") << "\", \"job_name\": \"run\"}}\n";
  }
  const std::string common = " --data '" + dir.file("tokens.u16") + "' --seq-len 16";
  auto zinf_train = [&](const std::string& name, const std::string& extra) {
    fs::remove_all(dir.file("csv"));
    const bool ok = run_logged(
        zinf + " train --init-from '" + dir.file("init") + "' --config '" + dir.file("zinf.json") +
            "'" + common + " --micro-batch 2 --plot '' --nvme-path '" + dir.path() + "' " + extra,
        dir.file(name + ".log"));
    EXPECT_TRUE(ok);
    return csv_losses(dir.file("csv") + "/run/Train_Samples_train_loss.csv");
  };
  auto deepspeed = [&](const std::string& name, const std::string& extra) {
    const std::string env =
        "DS_ACCELERATOR=cpu RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 "
        "LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
        std::to_string(::zinf::testing::free_port()) + " ";
    EXPECT_TRUE(run_logged(env + "'" + ZINF_VENV_PYTHON + "' " + ZINF_DS_WORKER + " --model '" +
                               dir.file("init") + "' --config '" + dir.file("ds.json") + "'" +
                               common + " " + extra,
                           dir.file(name + ".log")));
    return ds_losses(dir.file(name + ".log"));
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
    expect_near_relative(loss, want[static_cast<size_t>(step - 1)],
                         "DeepSpeed from zinf's step-2 checkpoint, step " + std::to_string(step));
  }

  // DeepSpeed's checkpoint, zinf resumes.
  const auto ds_first = deepspeed("ds-save", "--steps 2 --save '" + dir.file("ds-ckpt") + "'");
  ASSERT_EQ(ds_first.size(), 2u) << read_all(dir.file("ds-save.log"));
  expect_near_relative(ds_first[0].second, want[0], "DeepSpeed, step 1");
  const std::vector<double> zinf_resumed =
      zinf_train("zinf-resume", "--steps 4 --load '" + dir.file("ds-ckpt") + "'");
  const std::string resume_log = read_all(dir.file("zinf-resume.log"));
  ASSERT_NE(resume_log.find("checkpoint loaded"), std::string::npos) << resume_log;
  EXPECT_NE(resume_log.find("the data goes on at sample 4"), std::string::npos) << resume_log;
  ASSERT_EQ(zinf_resumed.size(), 2u) << resume_log;
  for (size_t i = 0; i < 2; ++i) {
    expect_near_relative(zinf_resumed[i], want[2 + i],
                         "zinf from DeepSpeed's step-2 checkpoint, step " + std::to_string(3 + i));
  }
}

}  // namespace
