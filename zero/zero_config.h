// ZeroConfig: the settings of the ZeRO stages, with DeepSpeed's names, defaults and units
// (the `zero_optimization`, `fp16`/`bf16`, `gradient_clipping` and zinf-only keys a run
// needs). The engine's Config fills it from the JSON file (names below are the JSON keys);
// the zero/ layer only reads it. Element counts are elements, not bytes.
//
// Thread safety: a plain value.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "aio/config.h"
#include "zero/error.h"

namespace zinf::zero {

// Element type of the model's params and grads during forward/backward (the master copy of
// the params the optimizer updates is always fp32).
enum class Precision : uint8_t { kFloat32, kBFloat16, kFloat16 };

// offload_param.device / offload_optimizer.device.
enum class OffloadTarget : uint8_t { kNone, kCpu, kNvme };

struct LossScaleConfig {
  // fp16 block: loss_scale 0 = dynamic, > 0 static.
  double loss_scale = 0.0;
  int initial_scale_power = 16;         // dynamic scaling starts at 2^initial_scale_power
  int loss_scale_window = 1000;         // steps without overflow before the scale doubles
  int hysteresis = 2;                   // overflows tolerated before the scale is lowered
  bool consecutive_hysteresis = false;  // refill hysteresis after each good step
  double min_loss_scale = 1.0;
};

struct ZeroConfig {
  int stage = 0;  // zero_optimization.stage: 0, 1, 2, 3
  Precision precision = Precision::kFloat32;
  LossScaleConfig loss_scale;      // used when precision is fp16
  double gradient_clipping = 0.0;  // max global L2 norm; 0 = off

  // Gradient reduction.
  bool reduce_scatter = true;                 // false: all-reduce, then keep the own slice
  uint64_t reduce_bucket_size = 500'000'000;  // elements per reduction bucket
  bool overlap_comm = true;                   // reduce while backward runs
  bool contiguous_gradients = true;           // accepted; grads are always bucketed
  // communication_data_type: "" (the grads' own type), "fp32", "fp16", "bf16".
  std::string communication_data_type;
  int gradient_accumulation_steps = 1;

  // Optimizer partition.
  uint64_t sub_group_size = 1'000'000'000;

  // Stage 3.
  uint64_t prefetch_bucket_size = 50'000'000;         // stage3_prefetch_bucket_size
  uint64_t param_persistence_threshold = 100'000;     // stage3_param_persistence_threshold
  uint64_t model_persistence_threshold = UINT64_MAX;  // stage3_model_persistence_threshold
  uint64_t max_live_parameters = 1'000'000'000;       // stage3_max_live_parameters
  uint64_t max_reuse_distance = 1'000'000'000;        // stage3_max_reuse_distance

  // offload_param (stage 3 only).
  OffloadTarget offload_param = OffloadTarget::kNone;
  size_t param_buffer_count = 5;              // offload_param.buffer_count
  uint64_t param_buffer_size = 100'000'000;   // offload_param.buffer_size (elements)
  uint64_t param_max_in_cpu = 1'000'000'000;  // offload_param.max_in_cpu (elements)

  // offload_optimizer.
  OffloadTarget offload_optimizer = OffloadTarget::kNone;
  size_t optimizer_buffer_count = 4;  // offload_optimizer.buffer_count
  bool pipeline_read = false;
  bool pipeline_write = false;
  // zinf.overlap_optimizer: on the last micro-batch of a step, each sub-group is updated as
  // soon as its gradients are final, behind the rest of the backward, speculatively and with
  // exact rollback (zero/partitioned_optimizer.h). The config layer resolves the key's
  // default (on for offload_optimizer nvme, off elsewhere).
  bool overlap_optimizer = false;
  // The key was given (not its default): the engine then keeps the overlap even where its
  // spare extents or held copies do not fit, and the start-up fails with the numbers.
  bool overlap_optimizer_given = false;
  // With the overlap: 0 lets every sub-group be updated behind the backward; N > 0 only the
  // last N of the partition (the first to be final), so that the spare extents and the held
  // params cost N sub-groups' worth. Set by the engine where the whole does not fit
  // (engine::fit_defaults).
  size_t overlap_sub_groups = 0;
  // zinf.grad_offload "cpu" (offload_optimizer nvme): the optimizer's fp32 gradient partition
  // is kept in host memory (4 bytes per element) instead of swap files, so the sums of a step's
  // micro-batches are not written and read back between them, and the step reads no grads
  // from the disk. The config layer turns it on by default with the optimizer on NVMe; the
  // engine turns that default off where the host memory it needs is not available.
  bool host_grads = false;
  bool host_grads_given = false;  // the key was given: kept even where it does not fit

  // zinf.activation_offload: where ZeroBlocks keep their saved inputs between forward and
  // backward (zero/activation_offload.h); kNone: on the device.
  OffloadTarget activation_offload = OffloadTarget::kNone;
  std::string activation_nvme_path;  // its swap folder; empty: nvme_paths

  // Swap folders (offload_*.nvme_path, or zinf.nvme_paths), the aio block, checksums.
  // Every store stripes across nvme_paths, except that a tier with its own folder
  // (DeepSpeed's offload_param.nvme_path / offload_optimizer.nvme_path, when zinf.nvme_paths
  // is not given) keeps its swap files there alone, as DeepSpeed does.
  // The config layer (engine/config/parse_config.cc) decides these folders from the keys and
  // refuses an nvme tier without one; swap_folders() is the one place that reads them.
  std::vector<std::string> nvme_paths;
  std::string param_nvme_path;      // offload_param.nvme_path; empty: nvme_paths
  std::string optimizer_nvme_path;  // offload_optimizer.nvme_path; empty: nvme_paths
  aio::AioConfig aio;
  bool swap_checksums = true;  // zinf.swap_checksums
  // zinf.pinned_memory_limit (bytes): the process's pinned-memory limit
  // (aio/pinned_budget.h); unset: the default, a fraction of physical RAM.
  std::optional<uint64_t> pinned_memory_limit;

  // zinf.comm_timeout_s.
  std::chrono::milliseconds comm_timeout{300'000};

  // The folders a tier's swap store writes to: its own folder when it has one, else every
  // swap folder (striped when there are several). The config layer never leaves an nvme tier
  // without one; a ZeroConfig filled by hand that does gets a ZeroError naming the fields.
  enum class SwapTier : uint8_t { kParam, kOptimizer, kActivation };
  // "param", "optimizer", "activation": the tier's swap file stem and its own folder's field.
  [[nodiscard]] static const char* swap_tier_name(SwapTier tier) noexcept {
    return tier == SwapTier::kParam       ? "param"
           : tier == SwapTier::kOptimizer ? "optimizer"
                                          : "activation";
  }
  [[nodiscard]] std::vector<std::string> swap_folders(SwapTier tier) const {
    const std::string& own = tier == SwapTier::kParam       ? param_nvme_path
                             : tier == SwapTier::kOptimizer ? optimizer_nvme_path
                                                            : activation_nvme_path;
    if (!own.empty()) return {own};
    if (nvme_paths.empty()) {
      const std::string name = swap_tier_name(tier);
      throw ZeroError("the " + name +
                      " swap store has no folder: set ZeroConfig::nvme_paths or its " + name +
                      "_nvme_path");
    }
    return nvme_paths;
  }
};

}  // namespace zinf::zero
