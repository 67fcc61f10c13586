// OptimizerSwapper: one rank's optimizer partition — the fp32 master params, the
// optimizer's states (Adam: m and v) and the grads — in the sub-groups it is handed
// (offload/sub_groups.h cuts them) and kept on NVMe (or in CPU memory), updated one sub-group at a
// time by a CPU optimizer from optimizer_cpu.
//
// step() walks the sub-groups in order. For each: read its states into pinned buffers,
// run the optimizer over them in one pass (the grads scaled by clip_coefficient /
// loss_scale inside the kernel, and a 16-bit copy of the new params written to a pinned
// buffer and handed to the ParamCopySink, e.g. for the ParamSwapper), then write params and
// states back (the grads are consumed, not written). With `pipeline_read` the next
// sub-group's reads are in flight while this one is updated; with `pipeline_write` this
// sub-group's writes run while the next one is updated. Results do not depend on the
// pipelining: every sub-group sees the same inputs and the same kernel.
//
// Pinned memory is fixed by the config: sets = 1 + pipeline_read + pipeline_write buffer
// sets, each `states` buffers of (largest sub-group) x 4 bytes (states: 4 for Adam — params,
// grads, m, v; 3 for Adagrad and Lion; one fewer with the grads in memory, below) plus one
// 16-bit copy buffer of its x 2 bytes. `buffer_count` (offload_optimizer.buffer_count) must be at
// least `states`; the constructor fails early with the numbers otherwise. pinned_bytes() reports
// the total. Each set's I/O queue has the state buffers registered (io_uring fixed buffers; when
// the kernel refuses, transfers take the normal path).
//
// The sets are a cache as well as a pipeline. Sub-group i always passes through set
// i % sets, and a set keeps its buffers between steps: after a step each set still holds
// the last sub-group it updated, its params and states equal to what was written to disk.
// A later read of those arrays (the next step's, read_sub_group, a checkpoint save) is
// served from the buffer instead of the disk; every update is still written to disk
// (write-through). When every sub-group has a set of its own (sub-groups <= sets, e.g. one
// sub-group) the grads live in the sets only: write_sub_group / write_grads of grads copy
// into the set and write nothing, so a step reads nothing from disk and writes p, m, v once.
// Writes through this class's other calls update a held buffer too, so the cache never
// serves stale values.
//
// Write-behind: step() returns while the writes of its last sub-group are in flight; they
// run behind the caller's next work (the forward and backward of the next step) and are
// waited for by the next call that touches the arrays (any call but counters/config
// accessors; flush() waits for them alone).
//
// Failure: any I/O error or corrupt extent throws OffloadError out of step() after every
// in-flight transfer has ended — or, for the last sub-group's writes, out of the next call
// that waits for them (that step counts as failed). Sub-groups before the failing one have
// been updated on disk; the step as a whole must be treated as failed (restore from a
// checkpoint). The I/O queues are closed then (a queue that saw an error may hold a broken
// aio handle), the next step makes fresh ones, and every cached buffer is dropped: later
// reads go to the disk, where a torn extent is reported as corrupt rather than read.
//
// Step observer: set_step_observer() hands step() an observer that sees each sub-group's
// updated arrays (params and the optimizer's states; not the grads) right after the
// optimizer ran over them, e.g. to write them into a checkpoint as the step updates them
// instead of reading them back afterwards. The arrays stay unchanged until the swapper calls
// release(i) for that sub-group or a later one: it does so before it overwrites a buffer it
// showed (the next reads into that buffer set) and, for every sub-group, before step()
// returns or throws. So an observer can work on them behind the step (one set's worth
// behind with one buffer set, more with pipelining) without copying them.
//
// Grads in host memory (config.grads_in_memory, device kNvme): the grads array is a host
// array like the CPU tier's, written through memory() or the calls below, and the step reads
// each sub-group's grads from it in place: no grad extent, no grad buffer in the sets, no grad
// bytes on the disk. A caller accumulating the grads of several micro-batches then never
// writes and reads them back between micro-batches.
//
// Speculative updates (config.speculate; zero/partitioned_optimizer.h overlaps them with the
// backward): speculate() updates one sub-group before the step is known to be valid, with
// options the step will most likely use, and keeps what is needed to undo it. On NVMe the new
// params and states go to the sub-group's spare extents (one per array besides the grads,
// allocated with the others) while the current extents keep the old values; on the CPU tier
// the arrays are updated in place after an undo copy of the sub-group is taken (nothing reads
// them until the step is decided). commit_speculation() makes the speculated values the
// current ones (on NVMe: the spare and current extents swap roles, once their writes have
// ended) and the next step() updates only the sub-groups not committed;
// rollback_speculation() forgets them (on the CPU tier: copies the undo back), so the next
// step() updates every sub-group from the old values. Either way the result equals a step()
// without speculation bit for bit: the same kernel sees the same inputs. A failed write to a
// spare extent is thrown by commit_speculation(), after a rollback: what was committed before
// is untouched.
//
// Thread safety: calls on one OptimizerSwapper must not overlap (one driving thread); the
// I/O it issues runs on aio's workers and the optimizer on TBB's. counters() may be called
// from any thread at any time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "offload/counters.h"
#include "offload/footprint.h"
#include "offload/nvme_store.h"
#include "offload/pinned_buffer_pool.h"
#include "optimizer_cpu/optimizer.h"

namespace zinf::offload {

class Accelerator;

enum class OffloadDevice { kCpu, kNvme };

struct OptimizerSwapperConfig {
  OffloadDevice device = OffloadDevice::kNvme;  // offload_optimizer.device
  // This rank's partition as its sub-groups' sizes, in order (offload/sub_groups.h cuts
  // them; the partition layout hands its cut down): their sum is the partition.
  std::vector<uint64_t> sub_groups;
  size_t buffer_count = 4;      // offload_optimizer.buffer_count
  bool pipeline_read = false;   // offload_optimizer.pipeline_read
  bool pipeline_write = false;  // offload_optimizer.pipeline_write
  optimizer_cpu::DType grad_dtype = optimizer_cpu::DType::kFloat32;
  // The copy of the updated params handed to the sink: bf16 or fp16 (converted in the
  // optimizer's pass), or fp32 (the sink then reads the updated master params themselves).
  optimizer_cpu::DType param_copy_dtype = optimizer_cpu::DType::kBFloat16;
  // Allow speculate(): spare extents (device kNvme) or undo arrays (kCpu) for the params and
  // the optimizer's states of every sub-group — or, with `speculate_window` N > 0, of the last
  // N sub-groups only (the first to be final in a backward; device kNvme: the others get no
  // spare extents and cannot be speculated).
  bool speculate = false;
  size_t speculate_window = 0;
  // Device kNvme: the grads array lives in host memory (memory(kGrads)) instead of swap
  // extents; the optimizer's pass reads it in place and it never reaches the disk. kCpu:
  // ignored (every array is in memory).
  bool grads_in_memory = false;
};

// What one step needs besides the stored arrays.
struct OptimizerStepOptions {
  int64_t step = 1;               // 1-based step number of the parameter group
  float loss_scale = 1.0f;        // grads are divided by it (fp16 dynamic scaling)
  float clip_coefficient = 1.0f;  // min(1, max_norm / global_norm): grads multiplied by it
  bool copy_params = true;        // produce the 16-bit copy and call the sink
};

struct OptimizerStepReport {
  uint64_t nonfinite_grads = 0;  // NaN/Inf grads after scaling, over all sub-groups
  size_t sub_groups = 0;
  double seconds = 0.0;  // wall time of the step
};

// Receives the 16-bit copy of sub-group params [offset, offset + numel) of the partition,
// valid only during the call.
using ParamCopySink = std::function<void(uint64_t offset, const void* data, uint64_t numel)>;

// The arrays of the partition, for loading and inspecting them (checkpoints, tests).
enum class OptimizerState { kParams, kGrads, kExpAvg, kExpAvgSq };

// Sees the arrays of each sub-group a step updates (see the header comment). Its calls come
// from the thread that drives step(); they must not throw (an observer keeps its own errors:
// the step's result does not depend on it).
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Sub-group `sub_group` [numel elements] is updated: `arrays[k]` holds kinds[k] (fp32;
  // kinds as states_per_param() counts them, kParams first; nullptr for kGrads), unchanged
  // until release(j) is called for some j >= sub_group.
  virtual void updated(size_t sub_group, uint64_t numel, const OptimizerState* kinds,
                       const void* const* arrays, size_t count) noexcept = 0;
  // Returns once nothing reads the arrays shown for sub-groups <= `sub_group` any more.
  virtual void release(size_t sub_group) noexcept = 0;
};

class OptimizerSwapper {
 public:
  // `optimizer` must outlive the swapper. `store` is required for device kNvme (and must
  // outlive the swapper), ignored for kCpu. `accelerator`, when given, gets the pinned
  // buffers registered. Allocates the extents and checks free space for them at once
  // (OffloadError kSpace), and the pools (kConfig if buffer_count is too small). A
  // constructor that throws gives back every extent it allocated.
  OptimizerSwapper(const OptimizerSwapperConfig& config, optimizer_cpu::Optimizer& optimizer,
                   NvmeStore* store, Accelerator* accelerator = nullptr);
  // Waits for transfers in flight, then returns every extent to the store.
  ~OptimizerSwapper();

  // What a swapper of `config` for an optimizer keeping `states` allocates: the state and
  // param-copy pools (pinned), the arrays kept in memory (host; device kCpu), the extents
  // (nvme; device kNvme).
  [[nodiscard]] static Footprint footprint(const OptimizerSwapperConfig& config,
                                           optimizer_cpu::StateArrays states);

  OptimizerSwapper(const OptimizerSwapper&) = delete;
  OptimizerSwapper& operator=(const OptimizerSwapper&) = delete;

  // Sets the fp32 master params [numel] and zeroes the optimizer states and the grads.
  void initialize(const float* params);

  // Stores grads [numel elements of grad_dtype] for partition elements [offset, offset +
  // numel). Whole sub-groups are written directly; parts of one are merged into it.
  void write_grads(uint64_t offset, const void* grads, uint64_t numel);

  // Loads / reads one whole array of the partition [numel] (fp32, or grad_dtype for grads).
  void load_state(OptimizerState state, const void* data);
  void read_state(OptimizerState state, void* data);

  // The same for one sub-group [sub_group_range(i).numel elements], so a partition larger
  // than memory can be filled, accumulated into and saved piece by piece.
  void write_sub_group(OptimizerState state, size_t sub_group, const void* data);
  void read_sub_group(OptimizerState state, size_t sub_group, void* data);
  // Device kNvme: the buffer that holds array `state` of `sub_group` [sub_group_range(i).numel
  // elements], when a buffer set holds it (see the header comment), else nullptr; device kCpu:
  // the array itself at the sub-group. Valid until the next call other than held(),
  // read_sub_group(), counters() or the accessors; read it, do not write it. Saves copy from
  // it instead of reading the sub-group into a buffer of their own.
  [[nodiscard]] const void* held(OptimizerState state, size_t sub_group);
  // Whether the optimizer keeps this array (Adagrad has no exp_avg, Lion no exp_avg_sq).
  [[nodiscard]] bool has_state(OptimizerState state) const noexcept;
  // First element and element count of sub-group i.
  [[nodiscard]] std::pair<uint64_t, uint64_t> sub_group_range(size_t sub_group) const;
  // An array kept in host memory (device kCpu: every one; kNvme with grads_in_memory: the
  // grads): the array itself [numel], for callers that accumulate into it in place (no step
  // may run meanwhile; a speculate() reads only its own sub-group's grads). Else nullptr.
  [[nodiscard]] void* memory(OptimizerState state);

  // One optimizer step over every sub-group (see the header comment).
  [[nodiscard]] OptimizerStepReport step(const OptimizerStepOptions& options,
                                         const ParamCopySink& sink = {});
  // The observer the following steps show their updated sub-groups to (nullptr: none). It
  // must outlive those steps or be replaced first.
  void set_step_observer(StepObserver* observer) noexcept { observer_ = observer; }
  [[nodiscard]] bool observed() const noexcept { return observer_ != nullptr; }
  // Waits for the writes the last step left in flight (write-behind) and throws their
  // error, if any. Device kCpu: nothing to do.
  void flush();

  // ---- speculative updates (see the header comment; config().speculate) ----
  // Updates sub-group `sub_group` with `options`, its final grads [numel fp32] at `grads`
  // (device kNvme: copied into the sub-group's buffer set, after which `grads_taken` is
  // called and `grads` may be reused; grads kept in memory (memory(kGrads) is not null):
  // nullptr, the grads array is used in place). The updated params in param_copy_dtype go to
  // `param_copy` [numel elements]. With `keep_grads` the grads are also stored (device kNvme,
  // written to their extent unless the set keeps them), so that a rollback can redo the update with
  // another scale. Returns the NaN/Inf count of the scaled grads. At most once per sub-group
  // between decisions.
  uint64_t speculate(size_t sub_group, const void* grads, const OptimizerStepOptions& options,
                     void* param_copy, bool keep_grads, const std::function<void()>& grads_taken);
  // Makes every speculated update current (see the header comment); the next step() leaves
  // those sub-groups alone. Throws OffloadError when a speculated write failed, after rolling
  // every speculated sub-group back.
  void commit_speculation();
  // Forgets every speculated update; returns how many sub-groups it undid.
  size_t rollback_speculation();
  // Whether speculate() may update this sub-group (config.speculate, and inside the window).
  [[nodiscard]] bool can_speculate(size_t sub_group) const noexcept;
  [[nodiscard]] bool speculated(size_t sub_group) const {
    return sub_groups_.at(sub_group).state == SubGroupState::kSpeculated;
  }

  [[nodiscard]] const OptimizerSwapperConfig& config() const noexcept { return config_; }
  [[nodiscard]] size_t sub_group_count() const noexcept { return sub_groups_.size(); }
  // Elements in the partition: the sum of config().sub_groups.
  [[nodiscard]] uint64_t numel() const noexcept { return numel_; }
  // Number of arrays per element kept (params, grads and the optimizer's states).
  [[nodiscard]] size_t states_per_param() const noexcept { return kinds_.size(); }
  // Pinned bytes held by this swapper's pools: fixed from construction on.
  [[nodiscard]] uint64_t pinned_bytes() const noexcept;
  [[nodiscard]] OffloadCounters counters() const;
  void reset_counters() noexcept { counters_.reset(); }

 private:
  enum class SubGroupState { kPlain, kSpeculated, kCommitted };
  static constexpr ExtentId kNoExtent = ~ExtentId{0};
  struct SubGroup {
    uint64_t offset = 0;  // first element in the partition
    uint64_t numel = 0;
    std::vector<ExtentId> extents;  // NVMe: one per kind in kinds_ (kNoExtent: in memory)
    std::vector<ExtentId> spare;    // NVMe with speculate: one per kind (the grads' kNoExtent)
    SubGroupState state = SubGroupState::kPlain;
  };
  struct BufferSet;

  size_t kind_index(OptimizerState state) const;
  // Array kinds_[k] is kept in host memory (memory_[k]), not in swap extents.
  [[nodiscard]] bool in_memory(size_t k) const noexcept;
  // Array kinds_[k] (at sub-group `sg`) in memory_.
  [[nodiscard]] std::byte* memory_at(size_t k, const SubGroup& sg);
  size_t element_bytes(OptimizerState state) const;
  void step_in_memory(const OptimizerStepOptions& options, const ParamCopySink& sink,
                      OptimizerStepReport& report);
  void step_nvme(const OptimizerStepOptions& options, const ParamCopySink& sink,
                 OptimizerStepReport& report);
  // The sub-groups a step updates: all but those a commit made current.
  [[nodiscard]] std::vector<size_t> step_order() const;
  uint64_t run_optimizer(const SubGroup& group, void* const* arrays, void* param_copy,
                         const OptimizerStepOptions& options);
  // Closes the sets' queues (draining them), then frees every extent of the sub-groups.
  void free_extents() noexcept;
  // Device kNvme: the set whose buffers hold sub-group `sub_group`, or nullptr.
  BufferSet* holder(size_t sub_group) noexcept;
  // Every sub-group has a set of its own: the grads are kept in the sets only.
  [[nodiscard]] bool grads_in_sets() const noexcept;
  // After an I/O error: close every queue (draining it) and forget what the sets hold.
  void drop_sets() noexcept;
  // Shows sub-group `sub_group`'s arrays (one per kind) to observer_.
  void show(size_t sub_group, void* const* arrays) const noexcept;
  // A new I/O queue for a buffer set, with state_pool_'s buffers registered (until one
  // handle refuses them).
  std::unique_ptr<NvmeStore::Queue> make_queue();

  const OptimizerSwapperConfig config_;
  optimizer_cpu::Optimizer& optimizer_;
  NvmeStore* const store_;
  std::vector<OptimizerState> kinds_;  // the arrays kept, kParams first
  std::vector<SubGroup> sub_groups_;
  uint64_t numel_ = 0;    // the partition
  uint64_t largest_ = 0;  // elements of the largest sub-group: the buffers' size
  // One per kind: device kCpu every array; kNvme with grads_in_memory the grads only.
  std::vector<std::vector<std::byte>> memory_;
  std::vector<std::vector<std::byte>> undo_;  // device kCpu with speculate: per kind
  std::unique_ptr<PinnedBufferPool> state_pool_;
  std::unique_ptr<PinnedBufferPool> copy_pool_;
  bool register_pool_ = true;  // false once a handle refused the pool (one warning in all)
  // After the pools: the sets' queues, which have state_pool_'s buffers registered, go first.
  // A set's queue is null after a failed step closed it; the next step makes a fresh one.
  std::vector<std::unique_ptr<BufferSet>> sets_;
  StepObserver* observer_ = nullptr;
  Counters counters_;
};

}  // namespace zinf::offload
