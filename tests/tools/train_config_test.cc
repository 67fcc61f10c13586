// tools/train_config: the swap-buffer check that resolve_run_config runs against the model
// counts only the parameters zero swaps (the decoder layers' ones): the embedding and an
// untied lm_head sit outside every ZeroBlock and stay resident, so their size must neither
// fail a config nor be needed to pass it.
#include "tools/train_config.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/model/llama.h"
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

// `zinf estimate` and the start-up check plan from the model's shapes (llama_plan_inputs);
// the Engine plans from the module it was given. The two agree on every tier, tied or not
// (a tied embedding and head park one gradient in pinned memory: zero/tied_grads.h).
TEST(TrainConfig, TheEstimatedPlanIsTheEnginesOwn) {
  ::zinf::testing::TempDir dir;
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied embeddings" : "untied lm_head");
    const engine::LlamaConfig model = wide_vocab(tied);
    const config::RunConfig c =
        resolve_run_config(nvme_params(dir.path(), 1500), "test", {}, model, nullptr);
    constexpr int64_t kSeq = 16;
    const int64_t micro = c.batch.micro_batch_per_gpu.value_or(1);
    const engine::MemoryPlan estimated =
        engine::plan_memory(llama_plan_inputs(model, c, 1, micro, kSeq));
    engine::EngineOptions o = engine_options(c, zero::LaunchEnv{}, kSeq, 1);
    o.activations = engine::llama_activations(model, micro, kSeq, 4);
    o.steps_per_print = 0;
    auto module = std::make_shared<engine::LlamaModelImpl>(model);
    engine::Engine engine(module, o, [](const std::string& name, at::Tensor& full) {
      engine::init_parameter(1, name, full);
    });
    const engine::MemoryPlan& built = engine.plan();
    EXPECT_EQ(estimated.pinned, built.pinned);
    EXPECT_EQ(estimated.device_total(), built.device_total());
    EXPECT_EQ(estimated.host, built.host);
    EXPECT_EQ(estimated.nvme, built.nvme);
    if (tied) {
      EXPECT_EQ(engine.zero_model().stats().pinned_bytes, built.pinned);
    }
  }
}

}  // namespace
}  // namespace zinf::tools
