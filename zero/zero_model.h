// ZeroModel: runs a LibTorch model under ZeRO stage 0, 1, 2 or 3 — the parameters
// partitioned over the ranks (zero/partition.h), the optimizer's share of each rank on its
// tier (zero/partitioned_optimizer.h), gradients reduced to their owners while backward
// runs (zero/grad_reducer.h) and, at stage 3, every block's parameters gathered only while
// it needs them (zero/param_coordinator.h, zero/param_store.h).
//
// The model wraps its heavy modules in ZeroBlocks (zero/zero_block.h). Attaching walks the
// model's parameters in `named_parameters()` order (tied parameters — one tensor under two
// names — count once; the later names are its aliases) and decides where each lives:
//   managed   stage 3, used only inside blocks: its full tensor exists only while gathered
//             (an empty tensor otherwise), its 16-bit slice on offload_param's tier;
//   resident  every parameter at stages 0–2, and at stage 3 those used outside any block:
//             the full tensor stays in device memory (padded to a multiple of the world
//             size) and is refreshed from the ranks' updated slices after each step.
// Frozen parameters (requires_grad false) are left as they are and not trained.
// Initial values: rank 0's are broadcast, so every rank starts from the same model; an
// Initializer, when given, fills each parameter's full fp32 values just before it is
// partitioned (so a model larger than memory need never exist whole).
// Stage 1 keeps gradients partitioned like stage 2 (the same results with less memory).
//
// A training step: for each micro-batch begin_micro_batch(i); forward; loss.backward()
// (scaled by the loss scale and 1 / gradient_accumulation_steps); end_micro_batch(i); then
// step(). Block parameter gradients reach the reducer from the blocks' backward; those of
// parameters used outside blocks from a tensor hook as autograd produces them. At stage 3
// the parameters a backward uses last may stay gathered into the next micro-batch, whose
// forward starts with them (zero/param_coordinator.h, keep_across_passes); step() and
// refresh_from_master() release them before the slices change.
//
// Thread safety: one driving thread calls everything and runs forward and backward.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "offload/accelerator.h"
#include "offload/counters.h"
#include "offload/nvme_store.h"
#include "offload/param_swapper.h"
#include "optimizer_cpu/optimizer.h"
#include "zero/activation_offload.h"
#include "zero/comm/communicator.h"
#include "zero/grad_reducer.h"
#include "zero/param_coordinator.h"
#include "zero/param_store.h"
#include "zero/partition.h"
#include "zero/partitioned_optimizer.h"
#include "zero/tied_grads.h"
#include "zero/zero_block.h"
#include "zero/zero_config.h"

namespace zinf::zero {

// What a model holds, as ZeroModel sees it: its blocks and its distinct parameters.
struct ModelDescription {
  struct Parameter {
    std::string name;                  // first name in named_parameters() order
    std::vector<std::string> aliases;  // later names of the same tensor
    torch::Tensor tensor;
    std::vector<size_t> blocks;  // indices into `blocks`
    bool outside_use = false;    // registered under a module outside every block
    int outside_names = 0;       // of its names, those outside every block
    // Shared by two or more modules outside the blocks (a tied embedding and head): its
    // gradient is routed between uses (zero/tied_grads.h), and the plan counts the buffer.
    [[nodiscard]] bool tied_outside() const noexcept { return outside_names >= 2; }
  };
  std::vector<ZeroBlockImpl*> blocks;
  std::vector<std::string> block_paths;
  std::vector<Parameter> params;
};

// Walks `root`: its ZeroBlocks (in named_modules() order) and its parameters. Throws
// ZeroError for nested blocks, a block already attached elsewhere, or a trainable
// parameter without elements.
[[nodiscard]] ModelDescription describe_model(torch::nn::Module& root);

struct ZeroModelStats {
  CoordinatorStats coordinator;  // stage 3
  ParamStoreStats params;        // stage 3
  GradReducerStats reducer;
  offload::OffloadCounters param_swap;      // offload_param nvme
  offload::OffloadCounters optimizer_swap;  // the optimizer tier
  offload::NvmeStoreStats param_nvme;       // offload_param nvme: the swap files' I/O
  offload::AcceleratorMemoryStats device;
  ActivationOffloadStats activations;  // zinf.activation_offload cpu or nvme
  TiedGradStats tied;                  // gradients of tied parameters parked between uses
  OverlapStats overlap;                // zinf.overlap_optimizer
  uint64_t resident_bytes = 0;         // device bytes of resident parameters
  uint64_t pinned_bytes = 0;           // pools and staging buffers
  uint64_t host_bytes = 0;             // CPU-tier slices and in-memory optimizer arrays
  uint64_t nvme_bytes = 0;             // swap files
  double allgather_seconds = 0.0;      // after-step gathers of resident parameters
  // Stage 3: most elements (bytes: in the compute precision) of full parameters gathered
  // at once, persistent ones and prefetches in flight included — from the issue of each
  // all-gather, when its memory is taken, to its release.
  uint64_t gathered_high_water_elements = 0;
  uint64_t gathered_high_water_bytes = 0;
};

class ZeroModel {
 public:
  // Fills `full` (fp32, the parameter's shape) with the initial values of parameter `name`.
  using Initializer = std::function<void(const std::string& name, torch::Tensor& full)>;

  struct Param {
    std::string name;
    std::vector<std::string> aliases;  // other names of a tied parameter
    std::vector<int64_t> shape;
    uint64_t numel = 0;
    bool trainable = true;
    std::vector<size_t> blocks;     // blocks that use it
    bool outside_use = false;       // used by a module outside every block
    bool tied_outside = false;      // two or more names outside the blocks (TiedGradRouter)
    long layout_index = -1;         // trainable: index in layout()
    long managed = -1;              // stage 3 managed: index in the param store
    torch::Tensor var;              // the model's parameter
    offload::DeviceBuffer storage;  // resident: padded full tensor
  };

  // Attaches to `root` (which must outlive this object) and partitions it. Throws ZeroError
  // (or OffloadError / CommError from the layers below) with the key and numbers when the
  // configuration cannot work.
  ZeroModel(torch::nn::Module& root, const ZeroConfig& config, offload::Accelerator& accelerator,
            Communicator& comm, optimizer_cpu::Optimizer& optimizer,
            const Initializer& initializer = {});
  ~ZeroModel();

  ZeroModel(const ZeroModel&) = delete;
  ZeroModel& operator=(const ZeroModel&) = delete;

  // ---- training ------------------------------------------------------------------------
  void begin_micro_batch(int micro_batch);
  // The backward of this micro-batch's loss `root` (already scaled). The uses of a tied
  // parameter outside the blocks are routed first (TiedGradRouter), so that the output
  // head's gradient leaves the device until the embedding's is added to it. A plain
  // root.backward() computes the same gradients, holding that one on the device.
  void backward(const torch::Tensor& root);
  void end_micro_batch();
  // zinf.overlap_optimizer: the coming step will be `step` with `loss_scale` (call before
  // its last micro-batch begins): sub-groups whose gradients are final are updated behind
  // the rest of that micro-batch's backward (zero/partitioned_optimizer.h). step() keeps
  // those updates when it runs with these figures and no clipping, and redoes them otherwise.
  void speculate_step(int64_t step, double loss_scale) {
    optimizer_->speculate_step(step, loss_scale);
  }
  // The optimizer step after the last micro-batch; `step` counts applied steps from 1.
  // The gradients are divided by `loss_scale` inside the update.
  [[nodiscard]] OptimizerStepOutcome step(int64_t step, double loss_scale);
  // Waits for the writes the last step left in flight (the params' write batch and the
  // optimizer swapper's last sub-group) and throws their error, if any: a checkpoint save
  // calls it first.
  void flush_io();

  // A forward without backward (evaluation): blocks are fetched on demand, the recorded
  // trace is left alone.
  void begin_eval();
  void end_eval();

  // ---- called by ZeroBlock ---------------------------------------------------------------
  void enter_block(size_t block);
  void leave_block(size_t block);
  // The distinct parameters (model tensors) of a block, in a fixed order.
  [[nodiscard]] const std::vector<torch::Tensor>& block_tensors(size_t block) const;
  // The gradients of block_tensors(block), in the same order (undefined: zero).
  void block_grads(size_t block, const std::vector<torch::Tensor>& grads);
  // Where blocks keep their saved inputs (zinf.activation_offload); null: on the device.
  [[nodiscard]] ActivationOffload* activation_offload() noexcept {
    return activation_offload_.get();
  }

  // ---- introspection ----------------------------------------------------------------------
  [[nodiscard]] int stage() const noexcept { return config_.stage; }
  [[nodiscard]] const ZeroConfig& config() const noexcept { return config_; }
  [[nodiscard]] const std::vector<Param>& params() const noexcept { return params_; }
  [[nodiscard]] const PartitionLayout& layout() const noexcept { return *layout_; }
  [[nodiscard]] PartitionedOptimizer& optimizer() noexcept { return *optimizer_; }
  [[nodiscard]] Communicator& comm() noexcept { return comm_; }
  [[nodiscard]] size_t block_count() const noexcept { return blocks_.size(); }
  [[nodiscard]] DType compute_dtype() const noexcept { return dtype_; }
  // Collective: the full fp32 master values of every trainable parameter (index as params()),
  // undefined tensors for frozen ones. For tests and small models.
  [[nodiscard]] std::vector<torch::Tensor> gather_master();
  // Collective: after the fp32 master params were replaced through optimizer().swapper() (a
  // checkpoint loaded), rewrites every trainable parameter's compute-precision copy from
  // them, sub-group by sub-group: stage 3 slices in the param store, resident tensors
  // gathered from the ranks. Not inside a micro-batch or an evaluation.
  void refresh_from_master();
  [[nodiscard]] ZeroModelStats stats() const;

 private:
  struct Block {
    ZeroBlockImpl* module = nullptr;
    std::vector<size_t> params;  // indices into params_
    std::vector<torch::Tensor> tensors;
  };

  void collect(torch::nn::Module& root);
  void partition(const Initializer& initializer);
  void lay_out();
  void build_tiers();
  void place_initial_values(const Initializer& initializer);
  void build_coordinator();
  void route_gradients();
  void bind(Param& param, void* data);
  void unbind(Param& param);
  OptimizerStepOutcome update_sub_groups(int64_t step, double loss_scale);
  void write_updated(uint64_t offset, const void* data, uint64_t numel);
  void gather_resident();
  void add_grad(size_t param_index, const torch::Tensor& grad);

  const ZeroConfig config_;
  offload::Accelerator& accelerator_;
  Communicator& comm_;
  optimizer_cpu::Optimizer& cpu_optimizer_;
  const DType dtype_;
  std::vector<Param> params_;
  std::vector<Block> blocks_;
  std::vector<size_t> managed_;    // managed index -> params_ index
  std::vector<size_t> trainable_;  // layout index -> params_ index
  std::unique_ptr<PartitionLayout> layout_;
  std::unique_ptr<offload::NvmeStore> param_nvme_;
  std::unique_ptr<offload::NvmeStore> optimizer_nvme_;
  std::unique_ptr<offload::NvmeStore> activation_nvme_;
  std::unique_ptr<ActivationOffload> activation_offload_;  // goes before activation_nvme_
  std::unique_ptr<offload::ParamSwapper> param_swapper_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<ParamCoordinator> coordinator_;
  std::unique_ptr<PartitionedOptimizer> optimizer_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<TiedGradRouter> tied_router_;
  std::unique_ptr<offload::Stream> copy_stream_;
  bool in_micro_batch_ = false;
  bool in_eval_ = false;
  std::vector<bool> outside_grad_seen_;  // this micro-batch, per params_ index
  std::vector<size_t> outside_params_;   // trainable params_ used outside blocks
  double allgather_seconds_ = 0.0;
};

}  // namespace zinf::zero
