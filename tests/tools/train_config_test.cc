// tools/train_config: the swap-buffer check that resolve_run_config runs against the model
// counts only the parameters zero swaps (the decoder layers' ones): the embedding and an
// untied lm_head sit outside every ZeroBlock and stay resident, so their size must neither
// fail a config nor be needed to pass it.
#include "tools/train_config.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/common/temp_dir.h"

namespace zinf::tools {
namespace {

// A model whose embedding (and head) are far larger than any layer parameter.
engine::LlamaConfig wide_vocab(bool tied) {
  engine::LlamaConfig c;
  c.vocab_size = 4096;
  c.hidden_size = 32;
  c.intermediate_size = 88;  // the largest layer parameters: 32 x 88 = 2816 elements
  c.num_layers = 2;
  c.num_heads = 4;
  c.tie_embeddings = tied;
  return c;
}

nlohmann::json nvme_params(const std::string& dir, uint64_t buffer_size) {
  nlohmann::json root = nlohmann::json::parse(R"({
    "train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "buffer_count": 2, "max_in_cpu": 0}}})");
  root["zero_optimization"]["offload_param"]["nvme_path"] = dir;
  root["zero_optimization"]["offload_param"]["buffer_size"] = buffer_size;
  return root;
}

TEST(TrainConfig, SwapBufferCheckIgnoresTheResidentEmbeddingAndHead) {
  ::zinf::testing::TempDir dir;
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied embeddings" : "untied lm_head");
    const engine::LlamaConfig model = wide_vocab(tied);
    // 2 buffers of 1500 elements hold a 2816-element layer parameter; the 131072-element
    // embedding / lm_head never goes through them.
    EXPECT_NO_THROW(
        (void)resolve_run_config(nvme_params(dir.path(), 1500), "test", {}, model, nullptr));
    // 2 buffers of 1000 do not hold a layer parameter: the message gives its size.
    try {
      (void)resolve_run_config(nvme_params(dir.path(), 1000), "test", {}, model, nullptr);
      ADD_FAILURE() << "no error for buffers smaller than a layer parameter";
    } catch (const config::ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("zero_optimization.offload_param.buffer_count"), std::string::npos)
          << what;
      EXPECT_NE(what.find("2816 elements"), std::string::npos) << what;
    }
  }
}

TEST(TrainConfig, SwappedParamNumelsAreTheLayersOnly) {
  for (const bool tied : {true, false}) {
    const engine::LlamaConfig model = wide_vocab(tied);
    uint64_t total = 0;
    for (uint64_t n : llama_swapped_param_numels(model)) total += n;
    // Per layer: two norms (h), q/k/v/o (h^2), gate/up/down (h x inter).
    EXPECT_EQ(total, 2u * (2 * 32 + 4 * 32 * 32 + 3 * 32 * 88));
  }
}

}  // namespace
}  // namespace zinf::tools
