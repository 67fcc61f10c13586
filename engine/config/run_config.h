// RunConfig: everything a training run reads from a DeepSpeed JSON config (`ds_config.json`),
// with DeepSpeed's key names, defaults and meaning, plus zinf's own settings, which live only
// in the top-level "zinf" object so that the file stays valid for DeepSpeed.
//
// Reading a config is two steps:
//   1. parse_config(path) / parse_config_string(text) / parse_config_json(json): reads every
//      key, checks types and every rule that needs nothing but the file (stage and offload
//      combinations, fp16 with bf16, nvme without a path, ...). Values written "auto" keep
//      their defaults and are listed in RunConfig::auto_keys.
//   2. resolve_auto(config, context) (engine/config/resolve.h): fills every "auto" from the
//      model, the world size and the command line, completes the batch-size triangle, and
//      checks what needs those (batch sizes that disagree, nvme folders, swap buffers that
//      cannot hold the model's largest parameter).
//
// Numbers may be written in exponent form (5e8, 0.94e6); element and byte counts must be whole
// numbers. Keys zinf does not know are not errors: each gives one warning naming its JSON path
// (RunConfig::warnings; the caller prints them). DeepSpeed keys zinf accepts without acting on
// them give a warning when they ask for something zinf does not do.
//
// Errors: ConfigError, whose message names the config source, the JSON path and the reason,
// with the values involved ("ds.json: zero_optimization.offload_param: offloading parameters
// (device "cpu") needs stage 3; zero_optimization.stage is 2"). No other exception leaves
// these functions except std::bad_alloc.
//
// Thread safety: RunConfig is a plain value; the functions are pure except parse_config,
// which reads a file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "optimizer_cpu/optimizer.h"
#include "zero/zero_config.h"

namespace zinf::config {

// A config that cannot be used as written. path() is the JSON path of the offending key
// ("zero_optimization.offload_param.device"; empty for the file as a whole), reason() why.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(const std::string& source, const std::string& path, const std::string& reason);

  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] const std::string& reason() const noexcept { return reason_; }

 private:
  std::string source_;
  std::string path_;
  std::string reason_;
};

// ---- optimizer / scheduler ------------------------------------------------------------------

// The optimizer library's own kinds: the states each keeps are optimizer_cpu::state_arrays(),
// the spelling to_string() (found by argument-dependent lookup).
using OptimizerType = optimizer_cpu::OptimizerKind;

// The "optimizer" block. Defaults are those of DeepSpeed's CPU optimizers for the type
// (Adagrad: lr 1e-2, eps 1e-10; the others lr 1e-3, eps 1e-8).
struct OptimizerConfig {
  bool given = false;  // the file has an "optimizer" block
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  // Decoupled (AdamW) weight decay. DeepSpeed's rule: true for AdamW whatever the key says;
  // for Adam the key decides, and it defaults to true (so "Adam" is AdamW unless
  // adam_w_mode is false).
  bool adam_w_mode = true;

  // Arrays the optimizer keeps per parameter element, the fp32 params and grads included
  // (Adam/AdamW: params, grads, exp_avg, exp_avg_sq; Adagrad: params, grads, sum; Lion:
  // params, grads, exp_avg). offload_optimizer.buffer_count must be at least this.
  [[nodiscard]] int states_per_param() const noexcept;
};

enum class SchedulerType : uint8_t {
  kNone,  // constant lr (no "scheduler" block)
  kWarmupLR,
  kWarmupDecayLR,
  kWarmupCosineLR,
  kOneCycle,
  kLRRangeTest,
};
[[nodiscard]] std::string_view to_string(SchedulerType type);

enum class WarmupType : uint8_t { kLog, kLinear };

// The "scheduler" block: DeepSpeed's parameter names and defaults (lr_schedules.py). The curves
// are in engine/config/lr_schedule.h.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;

  // WarmupLR, WarmupDecayLR.
  double warmup_min_lr = 0.0;
  // Unset: WarmupLR climbs to the optimizer's lr (DeepSpeed since #7360, June 2025),
  // WarmupDecayLR to 0.001 (its own default).
  std::optional<double> warmup_max_lr;
  int64_t warmup_num_steps = 1000;  // steps; DeepSpeed uses max(2, this)
  WarmupType warmup_type = WarmupType::kLog;
  // WarmupDecayLR and WarmupCosineLR (required there).
  int64_t total_num_steps = 0;
  // WarmupCosineLR (peak lr: the optimizer's lr).
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;

  // OneCycle (cycle_min_lr and cycle_max_lr are required).
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = 0;    // 0 when not given: the same as the first
  int64_t cycle_first_stair_count = 0;   // 0: continuous; n: n flat stairs per rising half
  int64_t cycle_second_stair_count = 0;  // the same for the falling half (default: the first)
  int64_t decay_step_size = 0;           // 0: no decay after the cycle
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;

  // LRRangeTest.
  double lr_range_test_min_lr = 1e-3;
  int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

// ---- batch, precision, monitoring, checkpoint -------------------------------------------------

// train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size.
// Unset (or "auto") until resolve_auto() completes the triangle; all three set after it.
struct BatchConfig {
  std::optional<int64_t> train_batch_size;             // samples per optimizer step, all ranks
  std::optional<int64_t> micro_batch_per_gpu;          // train_micro_batch_size_per_gpu
  std::optional<int64_t> gradient_accumulation_steps;  // micro-batches per optimizer step
};

// fp16 / bf16 blocks. The loss-scaling keys of "fp16" are in ZeroConfig::loss_scale and the
// chosen precision in ZeroConfig::precision.
struct PrecisionConfig {
  bool fp16_enabled = false;
  bool fp16_auto_cast = false;  // accepted; zinf runs the whole model in the 16-bit type
  bool bf16_enabled = false;
};

// "csv_monitor": rank 0 appends `step,value` rows to <output_path>/<job_name>/<event>.csv.
struct CsvMonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

struct CheckpointConfig {
  std::string tag_validation = "Warn";  // "Ignore", "Warn" or "Fail"
  bool load_universal = false;
  bool use_node_local_storage = false;
  // zero_optimization.stage3_gather_16bit_weights_on_model_save.
  bool gather_16bit_weights_on_model_save = false;
};

// Keys of zero_optimization that ZeroConfig does not carry.
struct ZeroExtraConfig {
  bool allgather_partitions = true;              // stage 1/2; ignored at stage 3
  uint64_t allgather_bucket_size = 500'000'000;  // elements; stage 1/2
  bool param_pin_memory = false;                 // offload_param.pin_memory
  bool optimizer_pin_memory = false;             // offload_optimizer.pin_memory
  bool fast_init = false;                        // offload_optimizer.fast_init
  double offload_ratio = 1.0;                    // offload_optimizer.ratio; < 1 needs stage 3
  std::string param_nvme_path;                   // offload_param.nvme_path as written
  std::string optimizer_nvme_path;               // offload_optimizer.nvme_path as written
};

// ---- the "zinf" object ------------------------------------------------------------------------

enum class AcceleratorType : uint8_t { kAuto, kCpu, kCuda, kStrict };
[[nodiscard]] std::string_view to_string(AcceleratorType type);

struct ZinfConfig {
  // zinf.accelerator.type: "cuda" when a GPU is to be used, "cpu" for the CPU accelerator
  // (host memory under memory_budget), "strict" for the CPU accelerator with device memory
  // the host cannot read (offload/strict_accelerator.h: proves the device discipline without a
  // GPU), "auto" (resolve_auto: cuda when one is usable).
  AcceleratorType accelerator = AcceleratorType::kAuto;
  // zinf.accelerator.memory_budget in bytes ("8GB", "8GiB", 8e9); unset: the engine decides.
  std::optional<uint64_t> memory_budget_bytes;
  double comm_timeout_s = 300.0;  // rendezvous and every collective
  double io_timeout_s = 300.0;    // one NVMe transfer
  // zinf.nvme_paths: swap folders; when given they replace offload_*.nvme_path.
  std::vector<std::string> nvme_paths;
  bool swap_checksums = true;  // per-extent checksums on swap files
  // zinf.pinned_memory_limit in bytes; unset: no limit beyond what the pools need.
  std::optional<uint64_t> pinned_memory_limit_bytes;
  int threads = 0;                    // compute threads per rank; 0: the engine's default
  std::string comm_backend = "auto";  // zinf.comm_backend: auto, single, gloo, nccl
  // zinf.activation_offload: "none", "cpu", "nvme" (zero::ZeroConfig::activation_offload);
  // unset: DeepSpeed's activation_checkpointing.cpu_checkpointing decides (true: "cpu").
  std::optional<zero::OffloadTarget> activation_offload;
  bool cpu_checkpointing = false;  // activation_checkpointing.cpu_checkpointing
  // zinf.overlap_optimizer (zero::ZeroConfig::overlap_optimizer); unset: on where the
  // optimizer is on NVMe (its I/O is what the overlap hides, the cost is disk space), off on
  // the CPU tier, where the undo copies would cost 12 bytes of host memory per parameter.
  std::optional<bool> overlap_optimizer;
  // zinf.grad_offload: "cpu" or "nvme", where the optimizer's fp32 grads accumulate with
  // offload_optimizer nvme (zero::ZeroConfig::host_grads); unset: host memory where it fits.
  std::optional<zero::OffloadTarget> grad_offload;
};

// ---- the whole config -------------------------------------------------------------------------

// One value resolve_auto() chose: "zero_optimization.reduce_bucket_size", "262144",
// "auto: hidden^2 = 512^2".
struct ResolvedValue {
  std::string path;
  std::string value;
  std::string rule;
};

struct RunConfig {
  std::string source;  // the file name, or the name given to parse_config_string

  // zero_optimization, fp16 loss scaling, gradient_clipping, communication_data_type, aio,
  // and zinf.nvme_paths / swap_checksums / comm_timeout_s, as the zero layer reads them.
  zero::ZeroConfig zero;
  // The key each of zero.nvme_paths came from (same order), for messages:
  // "zinf.nvme_paths[1]", "zero_optimization.offload_param.nvme_path".
  std::vector<std::string> nvme_path_keys;
  ZeroExtraConfig zero_extra;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  BatchConfig batch;
  PrecisionConfig precision;
  int steps_per_print = 10;
  bool wall_clock_breakdown = false;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  CsvMonitorConfig csv_monitor;
  CheckpointConfig checkpoint;
  ZinfConfig zinf;

  // JSON paths written "auto" and not yet resolved (resolve_auto() empties it).
  std::set<std::string> auto_keys;
  // One message per unknown or unsupported key, each naming its JSON path.
  std::vector<std::string> warnings;
  // What resolve_auto() chose, in the order it chose it (see resolved_lines()).
  std::vector<ResolvedValue> resolved;

  [[nodiscard]] bool is_auto(std::string_view path) const {
    return auto_keys.count(std::string(path)) != 0;
  }
};

// Reads the file at `path`. Throws ConfigError naming the path when it cannot be read or is
// not JSON (with the line and column), and for every invalid value.
[[nodiscard]] RunConfig parse_config(const std::string& path);
// The same for JSON text; `source` names it in messages.
[[nodiscard]] RunConfig parse_config_string(std::string_view text,
                                            const std::string& source = "config");
// Values given beside the file (zinf train's flags), applied as the file is read, before
// anything is decided from them.
struct ParseOverrides {
  std::vector<std::string> nvme_paths;  // replaces zinf.nvme_paths when not empty
};

// The same for a parsed document.
[[nodiscard]] RunConfig parse_config_json(const nlohmann::json& root,
                                          const std::string& source = "config",
                                          const ParseOverrides& overrides = {});

// "auto" is written as a string in the file; this is the one spelling accepted.
inline constexpr std::string_view kAuto = "auto";

}  // namespace zinf::config
