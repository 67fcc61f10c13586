// The glue of `zinf train` and `zinf estimate` to engine/config: a DeepSpeed config (a file,
// or the embedded bare one) with the command line's overrides applied, every "auto" resolved
// from the model and the world size, and the result mapped onto EngineOptions.
//
// Overrides: --micro-batch, --grad-accum and --lr replace the file's values (or fill its
// "auto"); when the file fixes train_batch_size and the two others, the override recomputes
// train_batch_size rather than failing the batch-size check. --nvme-path replaces
// zinf.nvme_paths (one folder for both tiers) as the file is read (config::ParseOverrides). Each
// override is listed with the resolved values so the start-up lines say where every value came
// from.
//
// Errors: config::ConfigError (naming the source, the JSON path and the reason) for the
// config; std::invalid_argument for a bad command-line value. Thread safety: pure functions
// except load_config_json (reads a file) and check_nvme_paths inside resolve (probes folders).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/config/run_config.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/model/llama.h"

namespace zinf::tools {

// The command line's part of a config.
struct ConfigOverrides {
  std::optional<int64_t> micro_batch;
  std::optional<int64_t> grad_accum;
  std::optional<double> lr;
  std::optional<int64_t> steps;           // the run's steps (scheduler "auto" total_num_steps)
  std::string nvme_path;                  // zinf.nvme_paths = [nvme_path] when not empty
  std::optional<uint64_t> memory_budget;  // zinf.accelerator.memory_budget in bytes
  int world_size = 1;
  bool check_paths = true;  // probe the swap folders (off for `zinf estimate`)
};

// The JSON document of a config file. Throws config::ConfigError naming the file when it
// cannot be read or is not JSON (with the line and column).
[[nodiscard]] nlohmann::json load_config_json(const std::string& path);

// parse_config_json + overrides + resolve_auto for `model`. `override_lines` receives one
// "key = value (--flag)" line per override applied.
[[nodiscard]] config::RunConfig resolve_run_config(const nlohmann::json& root,
                                                   const std::string& source,
                                                   const ConfigOverrides& overrides,
                                                   const engine::LlamaConfig& model,
                                                   std::vector<std::string>* override_lines);

// Model states per parameter counted for the bare run's budget: fp32 params, grads, and
// Adam's exp_avg and exp_avg_sq (16 B, the same as DeepSpeed's mixed-precision 2 + 2 + 12).
inline constexpr uint64_t kStateBytesPerParam = 16;

// The bare run's config for `model` (default_train_config): the CPU accelerator's budget 1/4
// of the model states, swap buffers of the largest swapped parameter (resolve_auto checks
// every layer parameter against them; the embedding and head stay resident), one decoder
// layer gathered at a time; `steps` sizes the warm-up. A global batch of 16 samples: 2 per
// micro-batch x 8 on one rank, 1 x 16 / world_size on several.
[[nodiscard]] nlohmann::json bare_config(const engine::LlamaConfig& model, int64_t steps,
                                         int world_size);

// The element counts of the parameters zero swaps at stage 3 (the decoder layers', inside
// ZeroBlocks), in registration order, for resolve_auto's swap-buffer check. The embedding,
// the final norm and an untied lm_head are used outside every block and stay resident.
[[nodiscard]] std::vector<uint64_t> llama_swapped_param_numels(const engine::LlamaConfig& model);

// The memory plan's inputs for `model` under a resolved config, as the Engine will form
// them from the built module: every parameter trainable, the decoder layers' in blocks and
// the rest used outside them; activations for `micro_batch` samples of `seq_len` tokens.
[[nodiscard]] engine::PlanInputs llama_plan_inputs(const engine::LlamaConfig& model,
                                                   const config::RunConfig& config, int world_size,
                                                   int64_t micro_batch, int64_t seq_len);

// The element type the parameters are kept in under `precision`.
[[nodiscard]] at::ScalarType parameter_dtype(zero::Precision precision);
[[nodiscard]] const char* precision_name(zero::Precision precision);

// A resolved RunConfig as EngineOptions (zero config, optimizer, LR and momentum schedules,
// batch, logging, accelerator, communicator). `threads` is the compute threads per rank (0:
// LibTorch's setting); monitor and log callbacks are left for the caller.
[[nodiscard]] engine::EngineOptions engine_options(const config::RunConfig& config,
                                                   const zero::LaunchEnv& launch,
                                                   int64_t tokens_per_sample, int threads);

}  // namespace zinf::tools
