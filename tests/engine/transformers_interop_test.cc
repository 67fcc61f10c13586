// transformers itself against zinf's files (issue 21; label "deepspeed"): a Hugging Face
// Llama folder is trained by the real `zinf train --init-from` (the bare run: stage 3, params
// and optimizer on NVMe), saved, consolidated by the real `zinf zero-to-fp32` into one
// model.safetensors and into sharded pytorch_model-*.bin files with their index, and
// transformers' LlamaForCausalLM.from_pretrained loads both (tests/engine/transformers_logits.py,
// run by the project's virtual environment .venv/, made by scripts/install-venv.sh). Its
// logits must be the logits zinf computes from the same consolidated weights.
//
// Skipped, with the reason, where .venv/ is absent or has no transformers.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/hf_checkpoint.h"
#include "engine/model/llama.h"
#include "serialization/safetensors.h"
#include "tests/common/run_logged.h"
#include "tests/common/temp_dir.h"
#include "tests/common/venv.h"

namespace zinf::engine {
namespace {

namespace fs = std::filesystem;
using ::zinf::testing::run_logged;

// Absolute, on logits of magnitude up to ~5: LibTorch and transformers sum in their own
// orders (~1e-6 at fp32); hf_checkpoint_test uses the same margin.
constexpr double kLogitTolerance = 2e-5;

at::Tensor tensor_of(const serialization::SafetensorsReader& reader, const std::string& name,
                     at::ScalarType type) {
  const serialization::TensorInfo* info = reader.find(name);
  if (info == nullptr) {
    ADD_FAILURE() << name << " is not in the logits file";
    return {};
  }
  const std::span<const uint8_t> bytes = reader.data(*info);
  return at::from_blob(const_cast<uint8_t*>(bytes.data()),
                       std::vector<int64_t>(info->shape.begin(), info->shape.end()), type)
      .clone();
}

// zinf's logits for `tokens` from the Hugging Face folder `folder` (a plain LlamaModel filled
// by HfCheckpoint::read, no engine).
at::Tensor zinf_logits(const std::string& folder, const at::Tensor& tokens) {
  const HfCheckpoint ckpt = HfCheckpoint::open(folder);
  LlamaModel model(ckpt.config());
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    at::Tensor full = item.value();
    ckpt.read(item.key(), full);
  }
  return model->forward(tokens);
}

// transformers_logits.py's logits of `folders` (quoted, each after a space) into
// `dir`/logits.safetensors.
::testing::AssertionResult run_transformers_logits(const ::zinf::testing::TempDir& dir,
                                                   const std::string& folders) {
  return run_logged("'" + std::string(ZINF_VENV_PYTHON) + "' " + ZINF_TRANSFORMERS_LOGITS_SCRIPT +
                        " '" + dir.file("logits.safetensors") + "'" + folders,
                    dir.file("logits.log"));
}

// Expects `got` (transformers') within 1e-5 of the largest logit of `want` (zinf's); returns
// that relative difference.
double expect_relatively_close(const at::Tensor& got, const at::Tensor& want) {
  EXPECT_EQ(got.sizes(), want.sizes());
  if (got.sizes() != want.sizes()) return 1.0;
  const double largest = want.abs().max().item<double>();
  const double relative = (got - want).abs().max().item<double>() / largest;
  EXPECT_LE(relative, 1e-5) << "largest |logit| " << largest;
  return relative;
}

// Why this test cannot run here, or "" when it can.
std::string missing_environment() {
  return ::zinf::testing::venv_missing(ZINF_VENV_PYTHON, "transformers, safetensors");
}

TEST(TransformersInterop, FromPretrainedLoadsZeroToFp32OutputWithZinfsLogits) {
  if (const std::string why = missing_environment(); !why.empty()) GTEST_SKIP() << why;
  ::zinf::testing::TempDir dir;
  const std::string zinf = ZINF_BINARY;

  // The initial weights: a tiny fp32 Llama folder (vocab 256: the default corpus's bytes).
  ASSERT_TRUE(run_logged(std::string("/usr/bin/python3 ") + ZINF_HF_SCRIPT + " '" +
                             dir.file("init") + "' --dtype float32 --seed 3",
                         dir.file("init.log")));
  // Three steps of the bare run, saved.
  ASSERT_TRUE(run_logged("'" + zinf + "' train --init-from '" + dir.file("init") +
                             "' --steps 3 --seq-len 16 --micro-batch 2 --plot '' --nvme-path '" +
                             dir.path() + "' --save '" + dir.file("ckpt") + "'",
                         dir.file("train.log")));
  // One safetensors file, and .bin shards of at most 40 kB with pytorch_model.bin.index.json.
  ASSERT_TRUE(run_logged("'" + zinf + "' zero-to-fp32 -q --safe-serialization '" +
                             dir.file("ckpt") + "' '" + dir.file("st") + "'",
                         dir.file("st.log")));
  ASSERT_TRUE(run_logged("'" + zinf + "' zero-to-fp32 -q --max-shard-size 40KB '" +
                             dir.file("ckpt") + "' '" + dir.file("bin") + "'",
                         dir.file("bin.log")));
  ASSERT_TRUE(fs::exists(dir.file("bin") + "/pytorch_model.bin.index.json"))
      << "the .bin output is not sharded";
  // zero-to-fp32 writes the weights only, as DeepSpeed's does: the model's config.json comes
  // from the folder it started from.
  for (const char* out : {"st", "bin"}) {
    fs::copy_file(dir.file("init") + "/config.json", dir.file(out) + "/config.json");
  }

  ASSERT_TRUE(run_transformers_logits(dir, " '" + dir.file("st") + "' '" + dir.file("bin") + "'"));
  const auto expected = serialization::SafetensorsReader::open(dir.file("logits.safetensors"));
  const at::Tensor tokens = tensor_of(expected, "tokens", at::kLong);
  ASSERT_TRUE(tokens.defined());
  const at::Tensor want = zinf_logits(dir.file("st"), tokens);
  // The weights trained: the consolidated model is not the one it started from.
  EXPECT_GT((want - zinf_logits(dir.file("init"), tokens)).abs().max().item<double>(), 1e-4);

  const char* names[] = {"model.safetensors", "pytorch_model-*.bin (sharded)"};
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(names[i]);
    const at::Tensor got = tensor_of(expected, "logits" + std::to_string(i), at::kFloat);
    ASSERT_TRUE(got.defined());
    ASSERT_EQ(got.sizes(), want.sizes());
    const double diff = (got - want).abs().max().item<double>();
    EXPECT_LE(diff, kLogitTolerance) << "largest |logit| " << want.abs().max().item<double>();
    std::cout << "LOGITS transformers from_pretrained of zero-to-fp32's " << names[i]
              << ": max |transformers - zinf| " << diff << " (largest |logit| "
              << want.abs().max().item<double>() << ")\n";
  }
}

// transformers' own LlamaForCausalLM on grouped-query (2 key/value heads for 4), multi-query
// (1) and explicit-head_dim (16 where hidden / heads is 8) folders: zinf's logits from the
// same folder agree.
TEST(TransformersInterop, GroupedQueryAttentionAndHeadDimGiveTransformersLogits) {
  if (const std::string why = missing_environment(); !why.empty()) GTEST_SKIP() << why;
  ::zinf::testing::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> shapes{
      {"gqa", "--kv-heads 2"}, {"mqa-head-dim", "--kv-heads 1 --head-dim 16"}};
  std::string folders;
  for (const auto& [name, args] : shapes) {
    ASSERT_TRUE(run_logged(std::string("/usr/bin/python3 ") + ZINF_HF_SCRIPT + " '" +
                               dir.file(name) + "' --dtype float32 --seed 5 " + args,
                           dir.file(name + ".log")));
    folders += " '" + dir.file(name) + "'";
  }
  ASSERT_TRUE(run_transformers_logits(dir, folders));
  const auto expected = serialization::SafetensorsReader::open(dir.file("logits.safetensors"));
  const at::Tensor tokens = tensor_of(expected, "tokens", at::kLong);
  ASSERT_TRUE(tokens.defined());
  for (size_t i = 0; i < shapes.size(); ++i) {
    SCOPED_TRACE(shapes[i].first);
    const at::Tensor want = zinf_logits(dir.file(shapes[i].first), tokens);
    const at::Tensor got = tensor_of(expected, "logits" + std::to_string(i), at::kFloat);
    ASSERT_TRUE(got.defined());
    ASSERT_EQ(got.sizes(), want.sizes());
    const double diff = (got - want).abs().max().item<double>();
    EXPECT_LE(diff, kLogitTolerance) << "largest |logit| " << want.abs().max().item<double>();
    std::cout << "LOGITS transformers " << shapes[i].first << ": max |transformers - zinf| " << diff
              << " (largest |logit| " << want.abs().max().item<double>() << ")\n";
  }
}

// The families of make_transformers_families.py written now by the transformers of .venv/
// (the committed folders hf_checkpoint_test reads were written by 5.24.0): zinf's logits from
// each folder are transformers' within 1e-5 of the largest logit.
TEST(TransformersInterop, EveryFamilyOfThisTransformersGivesItsLogits) {
  if (const std::string why = missing_environment(); !why.empty()) GTEST_SKIP() << why;
  ::zinf::testing::TempDir dir;
  ASSERT_TRUE(run_logged(
      "'" + std::string(ZINF_VENV_PYTHON) + "' " + ZINF_FAMILIES_SCRIPT + " '" + dir.path() + "'",
      dir.file("families.log")));
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    const auto expected = serialization::SafetensorsReader::open(entry.path().string() +
                                                                 "/expected_logits.safetensors");
    const at::Tensor want = tensor_of(expected, "logits", at::kFloat);
    const at::Tensor got =
        zinf_logits(entry.path().string(), tensor_of(expected, "tokens", at::kLong));
    ASSERT_EQ(got.sizes(), want.sizes());
    const double largest = want.abs().max().item<double>();
    const double relative = (got - want).abs().max().item<double>() / largest;
    EXPECT_LE(relative, 1e-5) << "largest |logit| " << largest;
    std::cout << "LOGITS transformers " << name << ": max |transformers - zinf| / largest |logit| "
              << relative << "\n";
    ++checked;
  }
  EXPECT_GE(checked, 8) << "make_transformers_families.py wrote fewer folders than its cases";
}

// A Qwen3 folder (q/k norms, biases, yarn, bf16) and a Qwen2 folder (q/k/v biases, sliding
// layer, tied, shards) written by transformers are trained by the real `zinf train
// --init-from` (stage 3, params and optimizer on NVMe), consolidated by `zinf zero-to-fp32`,
// and transformers' AutoModelForCausalLM loads the result: its logits are zinf's from the same
// weights, and the weights moved. Every parameter name zinf gives the new tensors (biases,
// q_norm, k_norm) is therefore one transformers knows.
TEST(TransformersInterop, QwenFoldersTrainAndComeBackToTransformers) {
  if (const std::string why = missing_environment(); !why.empty()) GTEST_SKIP() << why;
  ::zinf::testing::TempDir dir;
  const std::string zinf = ZINF_BINARY;
  const std::vector<std::string> cases{"qwen3_bias_yarn_bf16",
                                       "qwen2_bias_sliding_tied_bf16_sharded"};
  std::string names;
  for (const std::string& c : cases) names += " " + c;
  ASSERT_TRUE(run_logged("'" + std::string(ZINF_VENV_PYTHON) + "' " + ZINF_FAMILIES_SCRIPT + " '" +
                             dir.file("init") + "'" + names,
                         dir.file("families.log")));
  {
    // Ids below the folders' vocabulary of 48, with some structure to learn.
    std::ofstream data(dir.file("tokens.u16"), std::ios::binary);
    for (int i = 0; i < 4096; ++i) {
      const auto token = static_cast<uint16_t>((i * 7 + i / 5) % 48);
      data.write(reinterpret_cast<const char*>(&token), sizeof(token));  // little-endian host
    }
  }
  std::string folders;
  for (const std::string& c : cases) {
    SCOPED_TRACE(c);
    const std::string init = dir.file("init") + "/" + c;
    ASSERT_TRUE(run_logged("'" + zinf + "' train --init-from '" + init + "' --data '" +
                               dir.file("tokens.u16") +
                               "' --steps 3 --seq-len 12 --micro-batch 2 --plot '' --nvme-path '" +
                               dir.path() + "' --save '" + dir.file(c + ".ckpt") + "'",
                           dir.file(c + ".train.log")));
    std::ifstream log(dir.file(c + ".train.log"));
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("architecture: " + std::string(c.starts_with("qwen3") ? "qwen3" : "qwen2")),
              std::string::npos)
        << "no architecture line in the train log";
    ASSERT_TRUE(run_logged("'" + zinf + "' zero-to-fp32 -q --safe-serialization '" +
                               dir.file(c + ".ckpt") + "' '" + dir.file(c) + "'",
                           dir.file(c + ".st.log")));
    fs::copy_file(init + "/config.json", dir.file(c) + "/config.json");
    folders += " '" + dir.file(c) + "'";
  }
  ASSERT_TRUE(run_transformers_logits(dir, folders));
  const auto expected = serialization::SafetensorsReader::open(dir.file("logits.safetensors"));
  const at::Tensor tokens = tensor_of(expected, "tokens", at::kLong);
  ASSERT_TRUE(tokens.defined());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i]);
    const at::Tensor want = zinf_logits(dir.file(cases[i]), tokens);
    EXPECT_GT(
        (want - zinf_logits(dir.file("init") + "/" + cases[i], tokens)).abs().max().item<double>(),
        1e-4)
        << "the weights did not move";
    const at::Tensor got = tensor_of(expected, "logits" + std::to_string(i), at::kFloat);
    ASSERT_TRUE(got.defined());
    const double relative = expect_relatively_close(got, want);
    std::cout << "LOGITS transformers from_pretrained of trained " << cases[i]
              << ": max |transformers - zinf| / largest |logit| " << relative << "\n";
  }
}

}  // namespace
}  // namespace zinf::engine
