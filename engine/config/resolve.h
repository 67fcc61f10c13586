// Second step of reading a config: resolve_auto() fills every "auto" value from the model,
// the world size and the command line (AutoContext), completes the batch-size triangle, and
// runs the checks that need those facts. The rules are those of DeepSpeed and of the Hugging
// Face Trainer integration that gave "auto" its meaning:
//
//   train_micro_batch_size_per_gpu  the command line's micro batch
//   gradient_accumulation_steps     the command line's value
//   train_batch_size                micro x accumulation x world size
//     (then DeepSpeed's rules: any two of the three give the third; all three must agree;
//      only train_batch_size: accumulation 1; only the micro batch: accumulation 1)
//   gradient_clipping               the command line's max grad norm, else 1.0 (HF's default)
//   optimizer lr/betas/eps/weight_decay    the command line's, else HF's defaults
//                                          (5e-5, [0.9, 0.999], 1e-8, 0)
//   scheduler warmup_min_lr 0, warmup_max_lr = the optimizer's lr, warmup_num_steps = the
//     command line's (else 0), total_num_steps = the run's step count (required)
//   fp16.enabled / bf16.enabled     whether the command line asked for that precision
//   amp.enabled                     false (zinf has no apex AMP)
//   zero_optimization.reduce_bucket_size                  hidden^2
//   zero_optimization.stage3_prefetch_bucket_size         floor(0.9 x hidden^2)
//   zero_optimization.stage3_param_persistence_threshold  10 x hidden
//     (without a hidden size: DeepSpeed's defaults 5e8, 5e7, 1e5)
//   zinf.accelerator.type "auto"    cuda when a CUDA device is usable, else cpu
//
// Every value chosen is recorded in RunConfig::resolved; resolved_lines() gives them as
// printable lines for the engine to print once at start-up.
//
// Errors: ConfigError naming the JSON path, the reason and the numbers (three batch sizes
// that disagree; a swap folder that is missing or not writable; swap buffers that cannot hold
// the largest parameter partition). Thread safety: pure functions except check_nvme_paths,
// which creates and removes a probe file in each folder.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/config/run_config.h"

namespace zinf::config {

struct AutoContext {
  int world_size = 1;

  // From the command line; unset: not given there.
  std::optional<int64_t> micro_batch_per_gpu;          // --micro-batch
  std::optional<int64_t> gradient_accumulation_steps;  // --grad-accum
  std::optional<double> lr;                            // --lr
  std::optional<int64_t> total_steps;                  // --steps (scheduler total_num_steps)
  std::optional<int64_t> warmup_steps;                 // scheduler warmup_num_steps
  std::optional<double> max_grad_norm;                 // gradient_clipping
  std::optional<zero::Precision> precision;            // fp16.enabled / bf16.enabled
  // The command line's defaults, for a file whose batch sizes are all "auto" (a Hugging Face
  // Trainer config) and a command line that gives none: unset, such a file is refused.
  std::optional<int64_t> default_micro_batch_per_gpu;
  std::optional<int64_t> default_gradient_accumulation_steps;

  // From the model.
  std::optional<int64_t> hidden_size;
  // Element counts of the parameters zero swaps, in the order the engine registers them
  // (empty: the swap-buffer check is skipped; call validate_with_model() later).
  std::vector<uint64_t> param_numels;

  // From the machine.
  bool cuda_available = false;          // this build can compute on CUDA and a device is usable
  std::string cuda_unavailable_reason;  // why not, for the start-up line (may be empty)
  bool check_paths = true;              // run check_nvme_paths()
};

// Resolves every "auto" of `config` (RunConfig::auto_keys is empty afterwards), fills the
// batch sizes, and validates. Values given explicitly in the file are never replaced; a
// command-line override is applied by the caller to `config` before this call.
void resolve_auto(RunConfig& config, const AutoContext& context);

// "zero_optimization.reduce_bucket_size = 262144 (auto: hidden^2 = 512^2)", one line per
// value resolve_auto() chose, in order.
[[nodiscard]] std::vector<std::string> resolved_lines(const RunConfig& config);

// Each swap folder (config.zero.nvme_paths) must exist, be a directory, and take a new file.
// Throws ConfigError naming the key it came from (zinf.nvme_paths[i] or
// zero_optimization.offload_*.nvme_path), the folder and the system's reason.
void check_nvme_paths(const RunConfig& config);

// With params on nvme, each parameter partition (ceil(numel / world_size) elements) that
// max_in_cpu does not keep in CPU memory is read through ceil(partition / buffer_size) pool
// buffers at once; buffer_count must cover the largest. Throws ConfigError naming
// zero_optimization.offload_param.buffer_count with the numbers and the fix.
void validate_with_model(const RunConfig& config, const std::vector<uint64_t>& param_numels,
                         int world_size);

}  // namespace zinf::config
