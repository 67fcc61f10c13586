// ActivationOffload: where ZeroBlocks keep their saved inputs between a micro-batch's forward
// and its backward when `zinf.activation_offload` (or DeepSpeed's
// activation_checkpointing.cpu_checkpointing) moves them off the device.
//
// A ZeroBlock keeps only its input for the backward, which recomputes the block from it
// (zero/zero_block.h); with a block per decoder layer those inputs are the activations that
// grow with depth, batch and sequence. Here each one leaves the device as soon as the block's
// forward starts:
//   cpu   copied into a pinned host buffer of its own, copied back in the block's backward;
//   nvme  copied into a pinned staging buffer and written to an extent of the `activation`
//         swap file (offload/nvme_store.h) while the block computes; in the backward it is read
//         back, and as soon as one input is back the read of the input saved before it (the
//         next backward's) starts, so the read overlaps this block's recomputation.
// Pinned buffers and extents are kept and reused from one micro-batch to the next, so after
// the first step nothing is allocated. A token (a tensor of no elements) stands for each saved
// input in the autograd graph: restoring frees the copy, and a graph dropped without its
// backward frees it when the token goes.
//
// Errors: an I/O error or a checksum mismatch of the swap file passes through as
// offload::OffloadError (naming the file and offset); restoring an input twice (a second
// backward through one graph) is ZeroError. A failure met while a token is freed (no caller
// to tell) is thrown by the next save or restore.
//
// Thread safety: every method may be called from any thread (one mutex); forward and
// backward of one graph run in order, as autograd runs them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "offload/footprint.h"
#include "offload/nvme_store.h"
#include "zero/zero_config.h"

namespace zinf::zero {

struct ActivationOffloadStats {
  uint64_t saved = 0;             // inputs saved (micro-batches x blocks)
  uint64_t restored = 0;          // inputs brought back for a backward
  uint64_t saved_bytes = 0;       // their bytes in total
  uint64_t largest_saved = 0;     // most bytes held off the device at once
  uint64_t pinned_bytes = 0;      // pinned buffers kept (cpu: the inputs; nvme: staging)
  uint64_t nvme_bytes = 0;        // extents kept in the swap file
  double write_wait_seconds = 0;  // forward: waited for an earlier input's write
  double read_wait_seconds = 0;   // backward: waited for an input's read
  uint64_t prefetched = 0;        // restores whose read had started ahead
};

class ActivationOffload {
 public:
  // `tier` is kCpu or kNvme; `store` (kNvme: required) must outlive this object.
  ActivationOffload(OffloadTarget tier, offload::NvmeStore* store);
  // Waits for the writes and reads in flight (errors are dropped: nothing is read any more)
  // and frees the buffers and extents.
  ~ActivationOffload();

  // What the saved inputs of one micro-batch take off the device: `saved_inputs` inputs of
  // `input_bytes` each on `tier`: all but the one being recomputed in pinned buffers (cpu), or
  // all in the swap file through at most two pinned staging buffers (nvme). The device keeps
  // the one being recomputed (device).
  [[nodiscard]] static offload::Footprint footprint(OffloadTarget tier, uint64_t input_bytes,
                                                    uint64_t saved_inputs);

  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // Takes a copy of `x` off its device and returns the token that names it. The caller may
  // drop `x` at once.
  [[nodiscard]] at::Tensor save(const at::Tensor& x);
  // The input `token` names, as a new contiguous tensor on the device it was saved from; its
  // copy is freed. Starts the read of the input saved before it (nvme).
  [[nodiscard]] at::Tensor restore(const at::Tensor& token);

  [[nodiscard]] OffloadTarget tier() const noexcept;
  [[nodiscard]] ActivationOffloadStats stats() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace zinf::zero
