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
// at a partition offset. In memory they are added in place: tiers none and cpu, and nvme with
// config.host_grads (zinf.grad_offload "cpu", the default where it fits: the fp32 sums of a
// step's micro-batches stay in host memory, 4 bytes per element, and the swapper's step reads
// them there; OptimizerSwapperConfig::grads_in_memory). On NVMe they are gathered in a
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
// Overlap with the backward (config.overlap_optimizer, armed for a step by
// speculate_step()): on the step's last micro-batch, a sub-group whose every element has
// received its gradient is final; its sum of squares is taken and, unless the step can
// already be seen not to use the armed scale (a NaN/Inf, or this rank's final sub-groups
// alone above the clipping norm), its update runs at once on the background thread
// (OptimizerSwapper::speculate: read p, m, v, the optimizer's pass, the new values to spare
// extents or over an undo copy) with clip coefficient 1, while the backward goes on with
// earlier blocks. The backward delivers gradients from the end of the partition to its
// start, so the sub-groups become final, and are updated, in reverse order. The gradients are
// taken from the staging buffer they were reduced into; they reach NVMe only when clipping
// is on (a rollback then redoes the update with them). The 16-bit copies of the speculated
// params wait in host memory until step() decides: the stage-3 slices and resident params are
// still in use by the backward. step() waits for the speculated updates, takes the global
// norm, and then either commits them (no clipping, no NaN/Inf: the armed scale was the right
// one), hands their copies to the sink and updates the other sub-groups; or rolls them back
// and runs the plain step (clipping: every sub-group with the clip coefficient; NaN/Inf: the
// step is skipped, nothing changed). Either way the outcome equals the step without overlap,
// bit for bit. A step after which clipping triggered does not speculate the next one (its
// norm will most likely clip again).
//
// Thread safety: one driving thread calls everything; the swapper calls it starts (gradient
// writes, speculative updates) run in order on one background thread and are waited for
// before the driving thread touches the swapper itself.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "aio/pinned_buffer.h"
#include "offload/nvme_store.h"
#include "offload/optimizer_swapper.h"
#include "optimizer_cpu/optimizer.h"
#include "zero/comm/communicator.h"
#include "zero/partition.h"
#include "zero/task_thread.h"
#include "zero/zero_config.h"

namespace zinf::zero {

struct OptimizerStepOutcome {
  bool skipped = false;    // NaN/Inf in the gradients: no state was changed
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradients
  uint64_t nonfinite = 0;  // NaN/Inf gradient elements over all ranks
  double clip_coefficient = 1.0;
  double seconds = 0.0;  // wall time of the update
  // Overlap (see the header comment): sub-groups updated behind the backward and kept, and
  // those rolled back; the time step() waited for the speculated updates to end.
  size_t overlapped = 0;
  size_t rolled_back = 0;
  double overlap_wait_seconds = 0.0;
};

// Overlap figures since construction.
struct OverlapStats {
  uint64_t steps = 0;                  // steps armed for overlap
  uint64_t speculated = 0;             // sub-group updates run behind the backward
  uint64_t committed = 0;              // of those, kept
  uint64_t rolled_back = 0;            // of those, undone (clipping, NaN/Inf, a changed scale)
  double wait_seconds = 0.0;           // step() waiting for them after the backward
  double backward_wait_seconds = 0.0;  // the backward waiting for a staging buffer
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
  // optimizer on NVMe and its grads there (not config.host_grads) the two pinned gradient
  // staging buffers of a sub-group each. The arrays kept in memory are counted as host bytes.
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

  // ---- overlap (config.overlap_optimizer): the step that the coming micro-batches end
  // will be `step` with `loss_scale`: its last micro-batch updates final sub-groups behind
  // the backward with these (see the header comment). No effect without the config key.
  void speculate_step(int64_t step, double loss_scale);
  [[nodiscard]] const OverlapStats& overlap_stats() const noexcept { return overlap_; }
  // Host bytes the overlap may hold: the 16-bit copies of every sub-group but the first (of
  // the window's, with config.overlap_sub_groups).
  [[nodiscard]] static uint64_t overlap_host_bytes(const ZeroConfig& config,
                                                   const std::vector<uint64_t>& sub_groups);

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
  // Waits for every task of the background thread; rethrows a gradient write's error.
  void wait_write();
  void wait_slot(int slot);  // until staging_[slot] may be filled again
  void measure(size_t sub_group, const float* grads, uint64_t numel);
  // Overlap: `numel` elements of `sub_group` arrived; true when it is final now.
  bool arrived(size_t sub_group, uint64_t numel);
  // Overlap: whether the final `sub_group` (measured) is updated at once, speculatively.
  bool should_speculate(size_t sub_group);
  // Posts the speculative update of `sub_group` (staging_[slot]'s grads; -1: in memory).
  void post_speculation(size_t sub_group, int slot);
  // Waits for the speculated updates; returns their outcome's part (see step()).
  void end_speculation(OptimizerStepOutcome& outcome, const offload::ParamCopySink& sink,
                       const offload::OptimizerStepOptions& options);
  // Undoes any speculation (a step abandoned, a failure); errors are dropped.
  void abandon_speculation() noexcept;

  const PartitionLayout& layout_;
  const ZeroConfig config_;
  Communicator& comm_;
  offload::Accelerator* accelerator_;  // may be null: collectives on host memory then
  const bool norm_is_global_;
  std::unique_ptr<offload::OptimizerSwapper> swapper_;
  bool nvme_ = false;
  bool host_grads_ = false;  // the grads array is in host memory (tiers none and cpu; nvme
                             // with config.host_grads): accumulated into in place

  // Initialisation.
  uint64_t appended_ = 0;
  std::vector<float> init_buffer_;  // one sub-group, nvme only

  // Gradients.
  int micro_batch_ = 0;
  bool last_micro_batch_ = true;
  std::vector<double> sumsq_;        // per sub-group, final values of this step
  std::vector<uint64_t> nonfinite_;  // per sub-group
  std::vector<bool> on_disk_;        // grads on NVMe: the swap file holds this step's sums
  std::vector<bool> touched_;        // touched during this micro-batch
  aio::PinnedBuffer staging_[2];     // grads on NVMe: fp32, one sub-group each
  int staged_slot_ = 0;
  long staged_ = -1;                // sub-group in staging_[staged_slot_], or -1
  std::future<void> slot_busy_[2];  // the task reading staging_[slot], if any

  // Overlap.
  struct Speculation {
    bool armed = false;    // speculate_step() was called for the coming step
    bool active = false;   // the last micro-batch of an armed step is running or ended
    bool stopped = false;  // this step will not use the armed scale: no more speculation
    bool keep_grads = false;
    offload::OptimizerStepOptions options;
    double final_sumsq = 0.0;   // of this rank's final sub-groups so far
    bool last_clipped = false;  // the previous step clipped
  } spec_;
  std::vector<uint64_t> remaining_;             // last micro-batch: elements still to come
  std::vector<std::vector<std::byte>> copies_;  // per sub-group: speculated 16-bit params
  std::vector<char> speculated_;                // per sub-group, this step
  std::mutex error_mutex_;
  std::exception_ptr spec_error_;  // the first failure of a speculative update
  OverlapStats overlap_;
  std::unique_ptr<TaskThread> worker_;  // last: its tasks use the members above
};

}  // namespace zinf::zero
