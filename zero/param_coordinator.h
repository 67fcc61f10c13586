// ParamCoordinator: decides, at stage 3, when each parameter is gathered and released, so the
// full parameters a block needs are present when it runs and as few others as possible are.
//
// The model's heavy modules are blocks (zero/zero_block.h); every block lists the parameters
// it uses (a tied parameter may be listed by several). A pass is one micro-batch: forward
// enters the blocks in order, backward enters them again in reverse; each entry is a trace
// event. The first pass is recorded and runs on demand: entering a block gathers its
// parameters and waits for them, leaving it releases them. Later passes replay the recorded
// trace:
//   - Prefetch. After a block is entered, the parameters of the blocks that follow in the
//     trace are brought closer in three levels, issued in order of their latency: NVMe
//     reads for the next 4 x stage3_prefetch_bucket_size elements (or, when they hold more,
//     the next 2 blocks of the trace: a block's reads start while the block two before it
//     computes, however small the bucket), host->device copies for the next 2 x, all-gathers
//     for the next 1 x — each level issued for its whole window
//     before the next level starts, so every level has the most time to finish before it is
//     needed. All-gathers are issued in trace order and never beyond
//     stage3_max_live_parameters gathered elements; they depend only on the trace and the
//     config, never on timing, so every rank issues the same collectives in the same order.
//   - Next block. Leaving a block issues the next block's own fetch in the trace at once
//     (making room as entering it would), so it runs while the caller finishes with the
//     block it left (e.g. hands that block's gradients over) instead of when the next block
//     is entered. Only with prefetching on (stage3_prefetch_bucket_size > 0).
//   - Reuse. Leaving a block keeps a parameter gathered when its next use in the trace comes
//     within stage3_max_reuse_distance elements (the elements of the parameters used in
//     between) — e.g. the last block's parameters between its forward and its backward.
//     With keep_across_passes, a parameter that the pass does not use again is kept for the
//     next pass the same way, its next use counted in the recording's first positions:
//     backward ends with the first block, the next micro-batch's forward starts with it, so
//     that block is not fetched again. end_pass() then keeps what was kept so (unless the
//     pass left the recording); release_all() releases it.
//   - Persistence. Parameters marked persistent (at most
//     stage3_param_persistence_threshold elements, or outside every block) are gathered at
//     their first use and stay gathered; they are not counted in the live elements.
//   - Limit. The non-persistent gathered elements never exceed stage3_max_live_parameters:
//     when a block needs room, retained parameters are released first (farthest next use
//     first), then prefetched ones (farthest first). A block that alone needs more than the
//     limit is refused at construction (ZeroError with the numbers).
//   - Trace change. A pass whose blocks differ from the recording logs one warning naming
//     the position and the first differing block (for a pass that ends early: the recorded
//     block that did not come), falls back to on demand for the rest of the pass (releasing
//     what it prefetched for the old order), and the new order is recorded for the next
//     pass.
//
// The data movement is the ParamFetcher's (declared below; zero/param_store.h implements it
// over the tiers); tests drive the coordinator with a fake one that checks the limits at
// every event.
//
// Thread safety: none; one driving thread (the one running forward and backward) calls
// everything. After an exception from the fetcher, call reset() before the next pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zero/zero_config.h"

namespace zinf::zero {

// The three levels of bringing one parameter's full tensor to the device. Calls for one
// parameter come in order (read, copy, gather; each at most once until release), and the
// coordinator's calls come from its driving thread.
class ParamFetcher {
 public:
  virtual ~ParamFetcher() = default;
  // Level 1: start reading the parameter's partition from NVMe into pinned memory. Returns
  // false when it cannot be started now (no free pinned buffer); the coordinator tries
  // again at a later event. Tiers without NVMe return true at once.
  virtual bool start_read(size_t param) = 0;
  // Level 2: start copying the partition to device memory (after its read, which this may
  // wait for, or queue behind).
  virtual void start_copy(size_t param) = 0;
  // Level 3: start the all-gather of the full parameter (after its copy). Allocates
  // numel elements of device memory.
  virtual void start_gather(size_t param) = 0;
  // Blocks until the gathered parameter is usable by the block's computation.
  virtual void wait_gathered(size_t param) = 0;
  // Frees the full parameter and whatever earlier level holds (waiting for work in flight).
  virtual void release(size_t param) = 0;
};

struct CoordinatorConfig {
  uint64_t prefetch_bucket_size = 50'000'000;    // stage3_prefetch_bucket_size (elements)
  uint64_t max_live_parameters = 1'000'000'000;  // stage3_max_live_parameters
  uint64_t max_reuse_distance = 1'000'000'000;   // stage3_max_reuse_distance
  // Passes follow each other with unchanged parameters (the caller calls release_all()
  // when they change): reuse reaches into the next pass (see Reuse above).
  bool keep_across_passes = false;
};

// The coordinator's settings from the stage-3 keys.
[[nodiscard]] inline CoordinatorConfig coordinator_config(const ZeroConfig& config) noexcept {
  CoordinatorConfig c;
  c.prefetch_bucket_size = config.prefetch_bucket_size;
  c.max_live_parameters = config.max_live_parameters;
  c.max_reuse_distance = config.max_reuse_distance;
  return c;
}

struct CoordinatorStats {
  uint64_t live_elements = 0;        // non-persistent elements gathered now
  uint64_t live_high_water = 0;      // most non-persistent elements gathered at once
  uint64_t persistent_elements = 0;  // gathered persistent elements
  uint64_t prefetched = 0;           // gathers issued ahead of their block
  uint64_t on_demand = 0;            // gathers issued when their block was entered
  uint64_t retained = 0;             // releases skipped for reuse
  uint64_t kept_for_next_pass = 0;   // releases skipped for reuse in the next pass
  uint64_t trace_changes = 0;        // passes that diverged from the recording
  uint64_t passes = 0;
  // Most elements gathered at once, persistent ones included: counted from the issue of a
  // gather (when the fetcher allocates its memory) to its release, prefetches included.
  uint64_t gathered_high_water = 0;
  // Time enter() spent making its block's own parameters usable — room made, on-demand
  // fetches issued, gathers waited for: what prefetching did not hide (a prefetch miss) —
  // and leave() spent issuing the next block's own fetch. Issuing the prefetches for later
  // blocks is not counted.
  double block_wait_seconds = 0.0;
};

class ParamCoordinator {
 public:
  // `param_numels[p]`: elements of parameter p's full tensor. `block_params[b]`: the
  // parameters block b uses. `persistent[p]`: keep p gathered once fetched. Throws ZeroError
  // when a block's non-persistent parameters alone exceed max_live_parameters, or for an
  // index out of range. `fetcher` must outlive the coordinator.
  ParamCoordinator(const CoordinatorConfig& config, std::vector<uint64_t> param_numels,
                   std::vector<std::vector<size_t>> block_params, std::vector<bool> persistent,
                   ParamFetcher& fetcher);

  // Which parameters of `numels` (in order) are persistent: those of at most
  // `param_threshold` elements (stage3_param_persistence_threshold) while their running total
  // stays within `model_threshold` (stage3_model_persistence_threshold).
  [[nodiscard]] static std::vector<bool> persistent_params(const std::vector<uint64_t>& numels,
                                                           uint64_t param_threshold,
                                                           uint64_t model_threshold);
  // The most elements of these parameters on the device at once, on `world` ranks, with
  // their slices `offloaded` (offload_param cpu or nvme; without offload the slices stay on
  // the device and are not counted here).
  [[nodiscard]] static uint64_t device_elements_bound(const CoordinatorConfig& config,
                                                      const std::vector<uint64_t>& numels,
                                                      const std::vector<bool>& persistent,
                                                      int world, bool offloaded);

  ParamCoordinator(const ParamCoordinator&) = delete;
  ParamCoordinator& operator=(const ParamCoordinator&) = delete;

  // Starts a pass (a micro-batch's forward and backward). With `record` false (e.g. an
  // evaluation forward) the pass is fetched on demand and neither replays nor changes the
  // recorded trace.
  void begin_pass(bool record = true);
  // The block's parameters are gathered and usable when this returns.
  void enter(size_t block);
  // The block is done with its parameters for now. Replaying, this also issues the next
  // block's fetch (see Next block above), so the fetcher may be busy when it returns.
  void leave(size_t block);
  // Ends the pass: non-persistent parameters are released (but those kept for the next
  // pass, with keep_across_passes, when the pass followed the recording); the trace is
  // recorded when it was the first pass or differed from the recording.
  void end_pass();

  // Releases every gathered parameter, persistent ones included (e.g. after the optimizer
  // step changed the partitions; persistent ones are gathered again at their next use).
  void release_all();
  // Releases everything and forgets in-flight state after a failure (best effort).
  void reset() noexcept;

  [[nodiscard]] const CoordinatorStats& stats() const noexcept { return stats_; }
  [[nodiscard]] const std::vector<size_t>& recorded_trace() const noexcept { return trace_; }
  // The last trace-change warning (empty when none), for tests and logs.
  [[nodiscard]] const std::string& last_warning() const noexcept { return last_warning_; }

 private:
  enum Level : uint8_t { kNone = 0, kRead = 1, kCopied = 2, kGathered = 3 };
  struct Param {
    uint64_t numel = 0;
    bool persistent = false;
    Level level = kNone;
    bool available = false;    // wait_gathered() done since the gather
    bool used = false;         // entered by a block since the gather (not just prefetched)
    bool kept = false;         // kept gathered for the next pass (keep_across_passes)
    int active = 0;            // blocks entered and not left that use it
    std::vector<size_t> uses;  // trace positions that use it (recorded trace)
  };

  void raise_level(size_t p, Level level);
  void gather_now(size_t p, bool prefetch);
  void release_param(size_t p);
  // Distinct parameters of a block, in block order.
  const std::vector<size_t>& params_of(size_t block) const;
  void prefetch_from(size_t position);
  // Issues the own fetch of the block at trace `position` (replaying, after a leave()).
  void fetch_next_block(size_t position);
  // Whether p, not used again in this pass, is used again within max_reuse_distance
  // elements from the start of the next pass that replays the recording.
  bool reused_next_pass(size_t p) const;
  // Makes room for `needed` live elements, never releasing the params of `block`.
  void make_room(uint64_t needed, size_t block);
  // Trace position of p's next use after `position`, or SIZE_MAX.
  size_t next_use(size_t p, size_t position) const;
  void index_trace();
  bool replaying() const noexcept { return replay_ && !diverged_ && record_; }

  const CoordinatorConfig config_;
  std::vector<Param> params_;
  std::vector<std::vector<size_t>> blocks_;  // distinct params per block
  ParamFetcher& fetcher_;

  std::vector<size_t> trace_;  // recorded block order of a pass
  std::vector<uint64_t>
      elements_before_;          // per trace position: non-persistent elements used before it
  std::vector<size_t> current_;  // this pass's block order so far
  bool in_pass_ = false;
  bool record_ = true;     // this pass follows and updates the recording
  bool replay_ = false;    // a recording exists
  bool diverged_ = false;  // this pass left the recording
  size_t position_ = 0;    // trace position of the block entered last
  std::string last_warning_;
  CoordinatorStats stats_;
};

}  // namespace zinf::zero
