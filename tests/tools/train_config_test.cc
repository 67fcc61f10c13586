// tools/train_config: the swap-buffer check that resolve_run_config runs against the model
// counts only the parameters zero swaps (the decoder layers' ones): the embedding and an
// untied lm_head sit outside every ZeroBlock and stay resident, so their size must neither
// fail a config nor be needed to pass it.
#include "tools/train_config.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

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

// With the optimizer on NVMe the config turns on zinf.overlap_optimizer and zinf.grad_offload
// "cpu" by default; fit_defaults turns them off, overlap first, where the host memory (or the
// swap folders' space) is short, saying why, and never touches a key the config gave. The
// Engine plans what the estimate plans with the grads in host memory.
TEST(TrainConfig, DefaultsStandBackWhereTheyDoNotFit) {
  ::zinf::testing::TempDir dir;
  const engine::LlamaConfig model = wide_vocab(false);
  nlohmann::json root = nvme_params(dir.path(), 1500);
  root["zero_optimization"]["sub_group_size"] = 20000;
  root["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", dir.path()}};
  const config::RunConfig c = resolve_run_config(root, "test", {}, model, nullptr);
  ASSERT_TRUE(c.zero.overlap_optimizer);
  ASSERT_TRUE(c.zero.host_grads);
  constexpr int64_t kSeq = 16;
  const engine::PlanInputs in = llama_plan_inputs(model, c, 1, 1, kSeq);
  auto need = [&](bool overlap, bool host_grads) {
    engine::PlanInputs v = in;
    v.zero.overlap_optimizer = overlap;
    v.zero.host_grads = host_grads;
    const engine::MemoryPlan p = engine::plan_memory(v);
    return p.host + p.pinned + p.host_peak_init;
  };
  const uint64_t both = need(true, true), grads_only = need(false, true), none = need(false, false);
  ASSERT_GT(both, grads_only);
  ASSERT_GT(grads_only, none);
  auto fit = [&](uint64_t available, bool given) {
    engine::PlanInputs v = in;
    v.zero.overlap_optimizer_given = v.zero.host_grads_given = given;
    engine::MemoryPlan plan = engine::plan_memory(v);
    engine::FitLimits limits;
    limits.host_available = available;
    const std::vector<std::string> lines = engine::fit_defaults(v, plan, limits);
    EXPECT_EQ(plan.host, engine::plan_memory(v).host) << "the plan was not redone";
    return std::make_pair(v.zero, lines);
  };
  {
    const auto [z, lines] = fit(both, false);
    EXPECT_TRUE(z.overlap_optimizer && z.host_grads);
    EXPECT_TRUE(lines.empty());
  }
  {
    const auto [z, lines] = fit(grads_only, false);
    EXPECT_FALSE(z.overlap_optimizer);
    EXPECT_TRUE(z.host_grads);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find("zinf.overlap_optimizer off"), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find(engine::format_bytes(grads_only)), std::string::npos) << lines[0];
  }
  {
    const auto [z, lines] = fit(none, false);
    EXPECT_FALSE(z.overlap_optimizer || z.host_grads);
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_NE(lines[1].find("zinf.grad_offload \"nvme\" for this run"), std::string::npos)
        << lines[1];
    EXPECT_NE(lines[1].find(engine::format_bytes(grads_only)), std::string::npos) << lines[1];
  }
  {
    // Swap space for half the spare extents: the overlap keeps a window of last sub-groups,
    // the largest that fits, and says so.
    engine::PlanInputs v = in;
    v.zero.overlap_optimizer = false;
    const uint64_t without = engine::plan_memory(v).nvme;
    engine::MemoryPlan plan = engine::plan_memory(in);
    const uint64_t with = plan.nvme;
    ASSERT_GT(with, without);
    engine::FitLimits limits;
    limits.host_available = both;
    limits.swap_free = without + (with - without) / 2;
    v = in;
    const std::vector<std::string> lines = engine::fit_defaults(v, plan, limits);
    EXPECT_TRUE(v.zero.overlap_optimizer);
    EXPECT_GT(v.zero.overlap_sub_groups, 0u);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find("for the last " + std::to_string(v.zero.overlap_sub_groups) + " of "),
              std::string::npos)
        << lines[0];
    EXPECT_LE(plan.nvme, *limits.swap_free);
    engine::PlanInputs wider = v;
    ++wider.zero.overlap_sub_groups;
    EXPECT_GT(engine::plan_memory(wider).nvme, *limits.swap_free) << "not the largest window";
  }
  {
    const auto [z, lines] = fit(none, true);  // given keys stay, whatever they cost
    EXPECT_TRUE(z.overlap_optimizer && z.host_grads);
    EXPECT_TRUE(lines.empty());
  }
  // The Engine's plan and what its optimizer holds: the grads in host memory, 4 B/element.
  engine::EngineOptions o = engine_options(c, zero::LaunchEnv{}, kSeq, 1);
  o.activations = engine::llama_activations(model, 1, kSeq, 4);
  o.steps_per_print = 0;
  auto module = std::make_shared<engine::LlamaModelImpl>(model);
  engine::Engine engine(module, o, [](const std::string& name, at::Tensor& full) {
    engine::init_parameter(1, name, full);
  });
  ASSERT_TRUE(engine.options().zero.host_grads) << "the default stood back on this machine";
  const engine::MemoryPlan estimated = engine::plan_memory(in);
  EXPECT_EQ(estimated.host, engine.plan().host);
  EXPECT_EQ(estimated.pinned, engine.plan().pinned);
  EXPECT_EQ(estimated.nvme, engine.plan().nvme);
  EXPECT_GE(engine.plan().host, engine.zero_model().layout().partition_numel() * 4);
  EXPECT_NE(engine.zero_model().optimizer().swapper().memory(offload::OptimizerState::kGrads),
            nullptr);
}

}  // namespace
}  // namespace zinf::tools
