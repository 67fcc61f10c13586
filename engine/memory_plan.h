// MemoryPlan: the bytes a run needs on each tier — accelerator (device), pinned host, plain
// host, NVMe — computed from the model's parameter list and the ZeRO config before anything
// is allocated. The engine checks it against the accelerator budget and the pinned-memory
// limit before any work (a run that cannot fit fails at once, with this table), allocates
// exactly what it plans, and reports the plan beside the measured peaks at the end. The plan
// is the sum of what each component states it allocates (offload/footprint.h: the swappers,
// the partitioned optimizer, the reducer, the coordinator, activation offload, the tied
// router), from the sizes their constructors use; a test holds the measured figures to it.
// `zinf estimate` prints the same plan without running.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "optimizer_cpu/optimizer.h"
#include "zero/zero_config.h"

namespace zinf::engine {

// One parameter as the plan sees it.
struct PlanParam {
  uint64_t numel = 0;
  bool trainable = true;
  bool in_block = false;      // used by some ZeroBlock
  bool outside_use = false;   // used outside every block
  bool tied_outside = false;  // two or more names outside the blocks: its gradient is parked
                              // in pinned memory between uses (zero/tied_grads.h)
};

// What the model computes with, per micro-batch, besides zinf's own buffers: the inputs its
// ZeroBlocks save for the backward (one per block) and the rest LibTorch holds at the peak
// (the residual stream, one block's recomputation with its gradients, the head and the loss).
struct ActivationEstimate {
  uint64_t saved_input_bytes = 0;  // one block's saved input
  uint64_t saved_inputs = 0;       // blocks whose input is saved
  uint64_t working_bytes = 0;      // the rest, on the device
  [[nodiscard]] uint64_t total() const noexcept {
    return saved_inputs * saved_input_bytes + working_bytes;
  }
};

struct PlanInputs {
  std::vector<PlanParam> params;
  zero::ZeroConfig zero;
  int world_size = 1;
  // The arrays the optimizer keeps besides params and grads (Adam: m, v; Adagrad/Lion: one).
  optimizer_cpu::StateArrays optimizer_states =
      optimizer_cpu::state_arrays(optimizer_cpu::OptimizerKind::kAdam);
  ActivationEstimate activations;  // the model's estimate for one micro-batch (0: unknown)
  // False on CUDA and on the strict device: the gradient reducer then copies what host code
  // reads into a pinned staging buffer (zero/grad_reducer.h), which the plan counts.
  bool host_reads_device_memory = true;
};

struct MemoryPlan {
  // Device.
  uint64_t device_resident = 0;     // parameters always in full (stages 0-2, outside blocks)
  uint64_t device_slices = 0;       // stage 3 slices kept on the device (offload_param none)
  uint64_t device_gathered = 0;     // stage 3: gathered at the live limit, persistent ones, copies
  uint64_t device_buckets = 0;      // gradient reduction buckets
  uint64_t device_optimizer = 0;    // offload_optimizer none: the optimizer's arrays
  uint64_t device_activations = 0;  // LibTorch's: the working set, and saved inputs kept
  // Of `pinned` and `nvme` below: the saved inputs zinf.activation_offload moves there.
  uint64_t pinned_activations = 0;
  uint64_t nvme_activations = 0;
  // Host.
  uint64_t pinned = 0;          // pools, staging buffers, pinned CPU-tier slices
  uint64_t host = 0;            // in-memory optimizer arrays (offload cpu), unpinned slices
  uint64_t host_peak_init = 0;  // transient at start-up: one full fp32 parameter
  // NVMe.
  uint64_t nvme = 0;

  uint64_t partition_numel = 0;  // this rank's optimizer partition
  uint64_t model_numel = 0;      // trainable elements

  [[nodiscard]] uint64_t device_total() const noexcept {
    return device_resident + device_slices + device_gathered + device_buckets + device_optimizer +
           device_activations;
  }
  // A table, one tier per line, with units ("device  1.23 GiB = resident ... + ...").
  [[nodiscard]] std::string table() const;
};

[[nodiscard]] MemoryPlan plan_memory(const PlanInputs& inputs);

// "1.50 GiB", "512 B": binary units, two decimals.
[[nodiscard]] std::string format_bytes(uint64_t bytes);

}  // namespace zinf::engine
