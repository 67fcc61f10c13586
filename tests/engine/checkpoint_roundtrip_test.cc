// Train -> save -> consolidate -> load: a model trained by the Engine is saved with
// save_checkpoint, consolidated by the real `zinf zero-to-fp32` binary (safetensors and torch
// .bin output), and the consolidated weights are loaded into a plain LlamaModel (no engine):
// its logits equal the trained model's (fp32, exact), at stages 1, 2 and 3, stage 3 with
// params and optimizer on NVMe, and with tied embeddings (the alias written once).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/engine.h"
#include "engine/model/llama.h"
#include "serialization/safetensors.h"
#include "serialization/torch_archive.h"
#include "tests/common/run_logged.h"
#include "tests/common/temp_dir.h"
#include "tests/engine/tiny_llama.h"

namespace zinf::engine {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kSeq = 16;
constexpr int64_t kVocab = 64;

struct Case {
  std::string name;
  int stage = 3;
  bool nvme = false;
  bool tied = false;
};

EngineOptions options_for(const Case& c, const std::string& nvme) {
  EngineOptions o;
  o.zero.stage = c.stage;
  o.optimizer.type = optimizer_cpu::OptimizerKind::kAdamW;
  o.optimizer.lr = 3e-3;
  o.micro_batch_size = 4;
  o.tokens_per_sample = kSeq;
  o.steps_per_print = 0;
  o.memory_budget = 1ull << 30;
  if (c.nvme) {
    o.zero.offload_optimizer = zero::OffloadTarget::kNvme;
    o.zero.offload_param = zero::OffloadTarget::kNvme;
    o.zero.nvme_paths = {nvme};
    o.zero.sub_group_size = 5000;  // several sub-groups: the flat groups are cut
    o.zero.param_buffer_size = 4000;
    o.zero.param_max_in_cpu = 0;
    o.zero.aio.backend = aio::BackendKind::kPsync;
  }
  return o;
}

// Runs `zinf zero-to-fp32 checkpoint out extra`; its output on failure.
::testing::AssertionResult consolidate(const std::string& checkpoint, const std::string& out,
                                       const std::string& extra) {
  return ::zinf::testing::run_logged(
      std::string(ZINF_BINARY) + " zero-to-fp32 -q '" + checkpoint + "' '" + out + "' " + extra,
      out + ".log");
}

// Copies the tensors `lookup(name)` gives into a fresh model's parameters (every name must
// be found) and returns the model's logits for `tokens`.
template <typename Lookup>
at::Tensor plain_logits(const LlamaConfig& config, const at::Tensor& tokens, Lookup&& lookup) {
  LlamaModel model(config);
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const at::Tensor value = lookup(item.key());
    EXPECT_TRUE(value.defined()) << item.key() << " is not in the consolidated output";
    if (!value.defined()) continue;
    EXPECT_EQ(value.sizes(), item.value().sizes()) << item.key();
    item.value().copy_(value);
  }
  return model->forward(tokens);
}

at::Tensor from_bytes(std::span<const uint8_t> bytes, const std::vector<int64_t>& shape) {
  return at::from_blob(const_cast<uint8_t*>(bytes.data()), shape, at::kFloat).clone();
}

TEST(CheckpointRoundTrip, ConsolidatedWeightsGiveTheTrainedModelsLogits) {
  const std::vector<Case> cases{{"stage1", 1},
                                {"stage2", 2},
                                {"stage3", 3},
                                {"stage3-nvme", 3, true},
                                {"stage3-tied", 3, false, true}};
  const at::Tensor tokens = testing::arithmetic_batch(77, 2, kSeq).first;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ::zinf::testing::TempDir dir;
    LlamaConfig config = testing::tiny_llama(kVocab);
    config.tie_embeddings = c.tied;
    auto model = std::make_shared<LlamaModelImpl>(config);
    const EngineOptions o = options_for(c, dir.path());
    Engine engine(model, o,
                  [](const std::string& name, at::Tensor& full) { init_parameter(5, name, full); });
    for (int s = 0; s < 4; ++s) {
      engine.train_batch([&](int) {
        auto [x, y] = testing::arithmetic_batch(100 + s, 4, kSeq);
        return model->loss(x, y);
      });
    }
    const at::Tensor want = engine.evaluate([&] { return model->forward(tokens); }).clone();
    engine.save_checkpoint(dir.file("ckpt"));

    // safetensors: every parameter once; a tied head is an alias of the embedding.
    ASSERT_TRUE(consolidate(dir.file("ckpt"), dir.file("st"), "--safe-serialization"));
    const auto st = serialization::SafetensorsReader::open(dir.file("st") + "/model.safetensors");
    const at::Tensor got_st = plain_logits(config, tokens, [&](const std::string& name) {
      std::string key = name;
      if (st.find(key) == nullptr && c.tied && key == "lm_head.weight") {
        key = "model.embed_tokens.weight";
        EXPECT_NE(st.metadata().find("aliases"), st.metadata().end()) << "no alias recorded";
      }
      const serialization::TensorInfo* info = st.find(key);
      if (info == nullptr) return at::Tensor();
      return from_bytes(st.data(*info), {info->shape.begin(), info->shape.end()});
    });
    EXPECT_TRUE(at::equal(got_st, want)) << "max |diff| " << (got_st - want).abs().max();

    // torch .bin: the same values through the pickle reader.
    ASSERT_TRUE(consolidate(dir.file("ckpt"), dir.file("bin"), ""));
    const auto bin = serialization::TorchArchive::open(dir.file("bin") + "/pytorch_model.bin");
    const at::Tensor got_bin = plain_logits(config, tokens, [&](const std::string& name) {
      const serialization::PickleValue* v = bin.root().find(name);
      if (v == nullptr) return at::Tensor();
      const serialization::TensorRef& t = v->tensor();
      EXPECT_TRUE(t.is_contiguous()) << name;
      return from_bytes(bin.storage_bytes(t.storage).subspan(t.storage_offset * 4, t.numel() * 4),
                        t.shape);
    });
    EXPECT_TRUE(at::equal(got_bin, want)) << "max |diff| " << (got_bin - want).abs().max();
  }
}

}  // namespace
}  // namespace zinf::engine
