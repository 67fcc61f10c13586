// `zinf estimate`: the memory plan of a config and model without running anything — the
// same per-tier plan the engine checks and allocates from (engine/memory_plan.h) — and a
// table of model-state bytes per offload choice for a given node and accelerator count:
// zinf's own plan for each choice (device, pinned + plain host, NVMe per rank) beside the
// figures of DeepSpeed's `estimate_zero3_model_states_mem_needs_all_live` formula, so a
// DeepSpeed user can compare.
//
// Thread safety: free functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/llama.h"
#include "zero/zero_config.h"

namespace zinf::tools {

struct EstimateArgs {
  std::string config;      // DeepSpeed JSON; empty: the bare `zinf train` config
  std::string model_size;  // named size or a parameter count ("7e9", "1.3B", "350M")
  std::string init_from;   // or a Hugging Face model folder (its config.json)
  int64_t vocab_size = 32000;
  int gpus_per_node = 1;
  int nodes = 1;
  int64_t seq_len = 64;                // tokens per sample (activations)
  std::optional<int64_t> micro_batch;  // unset: the config's, else 1
};

// Prints the plan and the tables to stdout; returns the exit code (0; 2 with the message on
// stderr for a bad config or argument).
int run_estimate(const EstimateArgs& args);

// A named shape, or a Llama shape of about `size` parameters (hidden, heads and intermediate
// size of the named shape nearest in count, layers scaled to the count). Throws
// std::invalid_argument naming the text.
[[nodiscard]] engine::LlamaConfig llama_for_size(const std::string& size, int64_t vocab_size);

// One row of DeepSpeed's estimator: per-accelerator and per-node CPU bytes.
struct DeepSpeedEstimate {
  std::string offload_param, offload_optimizer;
  bool zero_init = true;
  uint64_t per_gpu = 0;
  uint64_t per_cpu = 0;
};
// DeepSpeed's estimate_zero3_model_states_mem_needs formula (additional_buffer_factor 1.5)
// for the six rows its *_all_live variant prints.
[[nodiscard]] std::vector<DeepSpeedEstimate> deepspeed_zero3_estimates(
    uint64_t total_params, uint64_t largest_layer_params, int gpus_per_node, int nodes);

}  // namespace zinf::tools
