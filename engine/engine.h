// Engine: trains a LibTorch model under ZeRO from a DeepSpeed-style configuration — the
// accelerator, the communicator, the CPU optimizer, the ZeroModel, the LR schedule, the fp16
// loss scale, logging and the per-tier memory plan, behind DeepSpeed's loop:
//
//   Engine engine(model, options, initializer);
//   for (...) {
//     torch::Tensor loss = engine.forward([&] { return model->loss(x, y); });
//     engine.backward(loss);
//     engine.step();   // applies the update after gradient_accumulation_steps micro-batches
//   }
//
// or engine.train_batch(fn) for one whole optimizer step. forward() opens the micro-batch
// (stage 3 fetches blocks as the model runs), backward() scales the loss by the loss scale
// and 1 / gradient_accumulation_steps and closes the micro-batch (gradients reduced to their
// owners), step() at the boundary combines the ranks' gradient norms, skips or applies the
// update, advances the LR schedule and the loss scale, and logs.
//
// Before anything is allocated the memory plan (engine/memory_plan.h) is computed and
// checked against the accelerator's budget; a plan that cannot fit fails at once with the
// table. Reported loss: the mean over the global batch (all micro-batches, averaged over the
// ranks), not rank 0's alone.
//
// Thread safety: one driving thread. The constructor and step() are collective: every rank
// must call them in the same order.
#pragma once

#include <torch/nn/module.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/compute_memory.h"
#include "engine/engine_error.h"
#include "engine/memory_plan.h"
#include "offload/accelerator.h"
#include "optimizer_cpu/optimizer.h"
#include "zero/comm/comm_options.h"
#include "zero/comm/communicator.h"
#include "zero/comm/launch_env.h"
#include "zero/loss_scaler.h"
#include "zero/zero_model.h"

namespace zinf::engine {

// What check_memory_plan holds a plan to.
struct PlanLimits {
  uint64_t device_budget = 0;            // the accelerator's budget; 0: none
  std::optional<uint64_t> pinned_limit;  // zinf.pinned_memory_limit (set as the process's limit)
  // Host memory: when set, the plan's host and pinned bytes, its start-up transient and
  // `host_held_bytes` (what the caller holds besides, such as the model built in full before
  // it is partitioned), times `ranks_on_node`, must fit in the memory available now
  // (MemAvailable).
  bool check_host = false;
  uint64_t host_held_bytes = 0;
  int ranks_on_node = 1;
};

// Checks `plan` against `limits` before anything is allocated; throws PlanError naming the
// tier, what the run needs, what it may have, the knobs that change either, and the plan's
// table. Sets the process's pinned-memory limit when `limits.pinned_limit` is given.
void check_memory_plan(const MemoryPlan& plan, const PlanLimits& limits);

// The host memory available for new allocations now (/proc/meminfo's MemAvailable; physical
// memory where that cannot be read).
[[nodiscard]] uint64_t host_memory_available_bytes();

// The free space of the distinct filesystems under the config's swap folders; nullopt when
// none of them exists yet (the stores check theirs when they make them).
[[nodiscard]] std::optional<uint64_t> swap_free_bytes(const zero::ZeroConfig& zero);

// What fit_defaults holds the defaults that stand back to.
struct FitLimits {
  uint64_t host_available = 0;         // host memory available now (for the node's ranks)
  int ranks_on_node = 1;               // ranks sharing it
  uint64_t host_held_bytes = 0;        // per rank, besides the plan (see PlanLimits)
  std::optional<uint64_t> swap_free;   // the swap folders' free space, when measured
  bool device_is_host_memory = false;  // the plan's device bytes are host memory too
};

// The defaults that cost memory or disk where they apply, and stand back where that is not
// there, in this order: zinf.overlap_optimizer (its spare extents on the swap folders, its
// held params in host memory), then zinf.grad_offload "cpu" (the optimizer's fp32 grads in host
// memory). A key the config gave is never changed. Updates `in.zero` and re-plans `plan`;
// returns one line per default turned off, saying why.
std::vector<std::string> fit_defaults(PlanInputs& in, MemoryPlan& plan, const FitLimits& limits);

struct OptimizerSettings {
  optimizer_cpu::OptimizerKind type = optimizer_cpu::OptimizerKind::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool adam_w_mode = true;  // "adam" with adam_w_mode true is AdamW (DeepSpeed's rule)
};

// One value the engine reports: a csv_monitor event ("Train/Samples/train_loss"), its value
// and the global sample count.
struct MonitorEvent {
  std::string name;
  double value = 0.0;
  int64_t samples = 0;
};

struct EngineOptions {
  zero::ZeroConfig zero;
  OptimizerSettings optimizer;
  // lr for an applied step number (1-based); empty: optimizer.lr throughout.
  std::function<double(int64_t step)> lr_schedule;
  // beta1 for a step (OneCycle's momentum cycling); empty: optimizer.beta1.
  std::function<double(int64_t step)> beta1_schedule;

  int64_t micro_batch_size = 1;   // samples per rank per micro-batch
  int64_t tokens_per_sample = 0;  // for tokens/s (0: not reported)
  int steps_per_print = 10;
  bool wall_clock_breakdown = false;

  std::string accelerator = "cpu";      // "cpu", "strict" or "cuda"
  uint64_t memory_budget = 8ull << 30;  // cpu and strict accelerator budget (bytes)
  ActivationEstimate activations;       // the model's estimate, for the plan
  zero::CommOptions comm;
  zero::LaunchEnv launch;  // detect_launch_env() by default
  int threads = 0;         // compute threads; 0: keep LibTorch's setting

  // zero_optimization.stage3_gather_16bit_weights_on_model_save: save_checkpoint also writes
  // the whole model's compute-precision weights as pytorch_model.bin.
  bool gather_16bit_weights_on_model_save = false;

  std::function<void(const MonitorEvent&)> monitor;  // rank 0 only
  std::function<void(const std::string&)> log;       // every printed line (rank 0)
};

// Figures of the last applied or skipped optimizer step.
struct StepReport {
  int64_t global_step = 0;  // optimizer steps taken (applied + skipped)
  int64_t global_samples = 0;
  double loss = 0.0;  // mean over the global batch
  double lr = 0.0;
  double loss_scale = 1.0;
  double grad_norm = 0.0;
  bool skipped = false;
  double seconds = 0.0;  // wall time of the whole step (all micro-batches)
  // Of it, the optimizer step after the last backward: the time the trainer waited for the
  // optimizer (with zinf.overlap_optimizer, what the overlap did not hide).
  double optimizer_seconds = 0.0;
  double samples_per_second = 0.0;
  double tokens_per_second = 0.0;
};

// Peak usage measured during the run, beside the plan.
struct MemoryReport {
  MemoryPlan plan;
  uint64_t device_peak = 0;  // accelerator allocations (gathered params, buckets, slices)
  uint64_t pinned = 0;
  uint64_t host = 0;
  uint64_t nvme = 0;
  uint64_t peak_rss = 0;  // the process's high-water resident set
  ComputeMemory compute;  // LibTorch's own allocations on the compute device
  zero::ActivationOffloadStats activations;
  std::string table() const;
};

class Engine {
 public:
  Engine(std::shared_ptr<torch::nn::Module> model, EngineOptions options,
         const zero::ZeroModel::Initializer& initializer = {});
  ~Engine();

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // ---- DeepSpeed's loop --------------------------------------------------------------------
  // Opens a micro-batch and runs `compute` (the model's forward and loss, the mean over this
  // rank's micro-batch); returns its loss.
  torch::Tensor forward(const std::function<torch::Tensor()>& compute);
  // Backward of the loss forward() returned; closes the micro-batch.
  void backward(const torch::Tensor& loss);
  // Counts the micro-batch; at the accumulation boundary runs the optimizer step and returns
  // true (report() then describes it).
  bool step();
  // Drops the micro-batches of the optimizer step in progress, between two of them: their
  // gradients are discarded (the next step's first micro-batch starts the sums anew) and the
  // engine is back at the boundary of the last applied step, so a checkpoint saved now holds
  // that step's state. Collective in effect: every rank must abandon the same step. Throws
  // EngineError inside a micro-batch.
  void abandon_step();
  // All micro-batches of one optimizer step: compute(i) for i in [0, accumulation).
  StepReport train_batch(const std::function<torch::Tensor(int micro_batch)>& compute);
  // Forward without backward (evaluation): stage 3 fetches on demand.
  torch::Tensor evaluate(const std::function<torch::Tensor()>& compute);

  // ---- checkpoints (engine/checkpoint.h) ----------------------------------------------------
  // Collective, at a step boundary: writes the checkpoint `tag` (default
  // "global_step<global_steps()>") under `dir` and points `dir`/latest at it.
  CheckpointReport save_checkpoint(const std::string& dir, const std::string& tag = {},
                                   const ClientState& client_state = {});
  // Collective, at a step boundary, before the optimizer step that save_checkpoint(dir, tag)
  // will follow (`tag` default: "global_step<global_steps() + 1>", the default tag after one
  // more step): that step writes each sub-group's master params and optimizer states into
  // the checkpoint as it updates them, behind the optimizer (records in the step's order,
  // from its own buffers), so the save reads nothing back from the swap files and writes only
  // the small rest. Applies at stage 3 with offload_optimizer on NVMe (returns true); other
  // runs gain nothing over streaming and return false. The save streams as usual when no
  // optimizer step ran in between (an fp16 overflow skipped it), another step did, it names
  // another dir or tag, or the early write failed (logged); the early file goes to
  // `<dir>/.<tag>.partial`, so `latest` and the checkpoints there stay as they were until
  // the save publishes.
  bool prepare_checkpoint(const std::string& dir, const std::string& tag = {});
  // Collective, at a step boundary: restores the checkpoint `tag` (default: `dir`/latest) —
  // weights, optimizer states, LR schedule position, loss scale, step counters, RNG state —
  // and returns its client state; a DeepSpeed stage-3 checkpoint too (engine/checkpoint.h).
  // Parameters are matched by name. Refuses a checkpoint of another world size, stage, model
  // or optimizer (EngineError naming the file and the difference). Checks the CRC-32 of
  // every partition record as it restores it: a corrupt one fails the load naming the file,
  // record and offset, with the states restored so far left in place (load another
  // checkpoint before training on).
  CheckpointReport load_checkpoint(const std::string& dir, const std::string& tag = {});

  // ---- state ---------------------------------------------------------------------------------
  [[nodiscard]] const StepReport& report() const noexcept { return report_; }
  [[nodiscard]] int64_t global_steps() const noexcept { return global_steps_; }
  [[nodiscard]] int64_t global_samples() const noexcept { return global_samples_; }
  [[nodiscard]] int64_t skipped_steps() const noexcept { return skipped_steps_; }
  [[nodiscard]] int rank() const noexcept;
  [[nodiscard]] int world_size() const noexcept;
  [[nodiscard]] int gradient_accumulation_steps() const noexcept;
  [[nodiscard]] const MemoryPlan& plan() const noexcept { return plan_; }
  [[nodiscard]] MemoryReport memory_report() const;
  [[nodiscard]] zero::ZeroModel& zero_model() noexcept { return *model_; }
  [[nodiscard]] zero::Communicator& comm() noexcept { return *comm_; }
  [[nodiscard]] offload::Accelerator& accelerator() noexcept { return *accelerator_; }
  // The LibTorch device the model computes on: inputs go there.
  [[nodiscard]] c10::Device device() const noexcept { return device_; }
  [[nodiscard]] zero::LossScaler& loss_scaler() noexcept { return scaler_; }
  [[nodiscard]] const EngineOptions& options() const noexcept { return options_; }
  // Lines of the wall-clock breakdown of the last step (empty unless enabled).
  [[nodiscard]] std::string breakdown() const;
  // One line: device peak, gathered high-water, bytes per tier, time blocked per tier.
  [[nodiscard]] std::string counters_line() const;

 private:
  void log(const std::string& line) const;
  void emit(const std::string& event, double value) const;
  void apply_step();
  void arm_overlap();
  double apply_schedules(int64_t step);
  zero::OptimizerStepOutcome update_model(int64_t step, double scale, bool& watched);
  void count_step(const zero::OptimizerStepOutcome& outcome, double scale, bool watched);
  void report_step(const zero::OptimizerStepOutcome& outcome, double lr, double scale);
  // The prepared save to show the next optimizer step to, or nullptr (engine/checkpoint.cc).
  offload::StepObserver* prepared_observer() noexcept;
  // Whether a save is prepared for after the coming step (takes nothing).
  [[nodiscard]] bool save_prepared() const noexcept;
  void prepared_step_done(bool applied) noexcept;
  // The checkpoint calls' Checkpointer (engine/checkpoint/checkpointer.h), made at the first.
  checkpoint::Checkpointer& checkpointer();
  struct CheckpointerDelete {
    void operator()(checkpoint::Checkpointer* c) const noexcept;
  };

  EngineOptions options_;
  std::shared_ptr<torch::nn::Module> module_;
  std::unique_ptr<zero::Communicator> comm_;
  std::unique_ptr<offload::Accelerator> accelerator_;
  c10::Device device_{c10::DeviceType::CPU};
  std::unique_ptr<optimizer_cpu::Optimizer> optimizer_;
  MemoryPlan plan_;
  std::unique_ptr<zero::ZeroModel> model_;
  zero::LossScaler scaler_;

  int micro_batch_ = 0;  // within the current optimizer step
  bool in_micro_batch_ = false;
  double loss_sum_ = 0.0;  // this rank's micro-batch losses of the current step
  int64_t global_steps_ = 0;
  int64_t applied_steps_ = 0;
  int64_t global_samples_ = 0;
  int64_t skipped_steps_ = 0;
  std::chrono::steady_clock::time_point step_start_;
  bool step_started_ = false;
  double forward_seconds_ = 0.0, backward_seconds_ = 0.0, step_seconds_ = 0.0;
  double last_overlap_wait_seconds_ = 0.0;  // the last step's wait for overlapped updates
  StepReport report_;
  zero::ZeroModelStats last_stats_;  // at the previous step, for per-step deltas
  // Last: ends (a prepared save's writer thread joined) before the model it observes.
  std::unique_ptr<checkpoint::Checkpointer, CheckpointerDelete> checkpointer_;
};

// A description of `root`'s parameters for the memory plan (the same walk ZeroModel makes).
[[nodiscard]] std::vector<PlanParam> describe_parameters(torch::nn::Module& root);

}  // namespace zinf::engine
