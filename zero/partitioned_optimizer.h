// PartitionedOptimizer: this rank's share of the optimizer — the fp32 master weights, the
// optimizer's states and the gradients of its flat partition (zero/partition.h) — on the tier
// `offload_optimizer.device` names, and one optimizer step over it.
//
// Tiers: none and cpu keep the arrays in host memory (with the CPU accelerator, device
// memory is host memory; the engine's memory plan counts `none` as device bytes); nvme keeps
// them in swap files, moved sub-group by sub-group through pinned buffers by the
// OptimizerSwapper (pipeline_read / pipeline_write).
//
// Gradients arrive already reduced (zero/grad_reducer.h): accumulate() adds a scaled piece
// at a partition offset. In memory they are added in place. On NVMe they are gathered in a
// pinned staging buffer one sub-group at a time (two buffers: one is written to its swap
// file in the background while the next fills), so each sub-group's grads are written once
// per micro-batch, as a whole; a sub-group revisited out of order, or one that holds the
// sums of earlier micro-batches, is read back first. The sub-group staged at the end of a
// micro-batch stays staged into the next one (written only when another sub-group needs
// the buffer, or at the last micro-batch): with one sub-group, the grads are written once
// per step and never read back before the step. When every sub-group has a buffer set of
// its own in the swapper (offload/optimizer_swapper.h), "written" means copied into that
// set: the grads never reach the disk.
//
// Global norm and overflow without an extra pass over NVMe: when a sub-group's grads are
// final (last micro-batch) its sum of squares and its count of NaN/Inf values are taken
// from the staging buffer before it is written (in memory: one pass at the end of the last
// micro-batch). step() combines the ranks' figures with one all-reduce, then either skips
// the step (any NaN/Inf: fp16 overflow, or a diverged run) before any state is touched, or
// runs it with the gradients multiplied by clip_coefficient / loss_scale inside the
// optimizer's single pass. Never a half-applied step.
//
// Thread safety: one driving thread calls everything; the NVMe writes it starts run on one
// background thread and are waited for before any other call touches the swapper.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "aio/pinned_buffer.h"
#include "offload/nvme_store.h"
#include "offload/optimizer_swapper.h"
#include "optimizer_cpu/optimizer.h"
#include "zero/comm/communicator.h"
#include "zero/partition.h"
#include "zero/zero_config.h"

namespace zinf::zero {

struct OptimizerStepOutcome {
  bool skipped = false;    // NaN/Inf in the gradients: no state was changed
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradients
  uint64_t nonfinite = 0;  // NaN/Inf gradient elements over all ranks
  double clip_coefficient = 1.0;
  double seconds = 0.0;  // wall time of the update
};

class PartitionedOptimizer {
 public:
  // `store` is required for offload_optimizer nvme; `accelerator` (optional) gets the pinned
  // buffers registered. `norm_is_global`: every rank holds every gradient (stage 0), so the
  // norm needs no all-reduce. Throws ZeroError / offload::OffloadError with the numbers when
  // the tier cannot be set up (buffer_count, free space).
  PartitionedOptimizer(const PartitionLayout& layout, const ZeroConfig& config,
                       optimizer_cpu::Optimizer& optimizer, offload::NvmeStore* store,
                       offload::Accelerator* accelerator, Communicator& comm, bool norm_is_global);
  ~PartitionedOptimizer();

  // The swapper's config for `config` over a partition cut into `sub_groups` (the layout's).
  [[nodiscard]] static offload::OptimizerSwapperConfig swapper_config(
      const ZeroConfig& config, std::vector<uint64_t> sub_groups);
  // What the optimizer allocates besides the layout: its swapper's footprint, and with the
  // optimizer on NVMe the two pinned gradient staging buffers of a sub-group each. The
  // arrays kept in memory are counted as host bytes.
  [[nodiscard]] static offload::Footprint footprint(const ZeroConfig& config,
                                                    std::vector<uint64_t> sub_groups,
                                                    optimizer_cpu::StateArrays states);

  PartitionedOptimizer(const PartitionedOptimizer&) = delete;
  PartitionedOptimizer& operator=(const PartitionedOptimizer&) = delete;

  // ---- initial master weights: the partition's fp32 values in order (padding included),
  // in pieces of any size; the optimizer states start at zero.
  void append_master(const float* data, uint64_t numel);
  // Throws ZeroError unless exactly partition_numel elements were appended.
  void finish_master();

  // ---- gradients. micro_batch counts from 0 within the optimizer step; the last is
  // gradient_accumulation_steps - 1.
  void begin_micro_batch(int micro_batch);
  // Adds scale x grads[0..numel) (of `dtype`) to partition elements [offset, offset + numel).
  void accumulate(uint64_t offset, const void* grads, DType dtype, uint64_t numel, float scale);
  void end_micro_batch();

  // ---- the update, after the last micro-batch. `step`: 1-based count of applied steps.
  // The sink receives the updated params in the compute precision (see OptimizerSwapper).
  [[nodiscard]] OptimizerStepOutcome step(int64_t step, double loss_scale,
                                          const offload::ParamCopySink& sink);

  [[nodiscard]] offload::OptimizerSwapper& swapper() noexcept { return *swapper_; }
  [[nodiscard]] const PartitionLayout& layout() const noexcept { return layout_; }
  // Pinned bytes: the swapper's pools and the staging buffers.
  [[nodiscard]] uint64_t pinned_bytes() const noexcept;

 private:
  void stage(size_t sub_group);  // make `sub_group` the staged one
  void flush_staged();           // hand the staged sub-group to the writer
  void wait_write();
  void measure(size_t sub_group, const float* grads, uint64_t numel);

  const PartitionLayout& layout_;
  const ZeroConfig config_;
  Communicator& comm_;
  offload::Accelerator* accelerator_;  // may be null: collectives on host memory then
  const bool norm_is_global_;
  std::unique_ptr<offload::OptimizerSwapper> swapper_;
  bool nvme_ = false;

  // Initialisation.
  uint64_t appended_ = 0;
  std::vector<float> init_buffer_;  // one sub-group, nvme only

  // Gradients.
  int micro_batch_ = 0;
  bool last_micro_batch_ = true;
  std::vector<double> sumsq_;        // per sub-group, final values of this step
  std::vector<uint64_t> nonfinite_;  // per sub-group
  std::vector<bool> on_disk_;        // nvme: the swap file holds this step's sums so far
  std::vector<bool> touched_;        // touched during this micro-batch
  aio::PinnedBuffer staging_[2];     // nvme: fp32, one sub-group each
  int staged_slot_ = 0;
  long staged_ = -1;         // sub-group in staging_[staged_slot_], or -1
  std::future<void> write_;  // background write of the other slot
};

}  // namespace zinf::zero
