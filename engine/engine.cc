#include "engine/engine.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include "aio/pinned_budget.h"
#include "aio/pinned_buffer.h"
#include "engine/compute_memory.h"
#include "engine/cuda_compute.h"
#include "offload/cpu_accelerator.h"
#include "offload/cuda_accelerator.h"
#include "offload/strict_accelerator.h"
#include "offload/sub_groups.h"
#include "optimizer_cpu/adagrad.h"
#include "optimizer_cpu/adam.h"
#include "optimizer_cpu/lion.h"
#include "zero/comm/make_communicator.h"
#include "zero/comm/strict_communicator.h"
#include "zero/device_tensor.h"
#include "zero/host_collectives.h"

namespace zinf::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::unique_ptr<optimizer_cpu::Optimizer> make_optimizer(const OptimizerSettings& s) {
  using optimizer_cpu::OptimizerKind;
  try {
    switch (s.type) {
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW: {
        optimizer_cpu::AdamConfig c;
        c.lr = static_cast<float>(s.lr);
        c.beta1 = static_cast<float>(s.beta1);
        c.beta2 = static_cast<float>(s.beta2);
        c.eps = static_cast<float>(s.eps);
        c.weight_decay = static_cast<float>(s.weight_decay);
        c.bias_correction = s.bias_correction;
        // DeepSpeed: "AdamW" always decouples the decay; "Adam" does when adam_w_mode.
        c.adamw_mode = s.type == OptimizerKind::kAdamW || s.adam_w_mode;
        return std::make_unique<optimizer_cpu::AdamOptimizer>(c);
      }
      case OptimizerKind::kAdagrad: {
        optimizer_cpu::AdagradConfig c;
        c.lr = static_cast<float>(s.lr);
        c.eps = static_cast<float>(s.eps);
        c.weight_decay = static_cast<float>(s.weight_decay);
        return std::make_unique<optimizer_cpu::AdagradOptimizer>(c);
      }
      case OptimizerKind::kLion: {
        optimizer_cpu::LionConfig c;
        c.lr = static_cast<float>(s.lr);
        c.beta1 = static_cast<float>(s.beta1);
        c.beta2 = static_cast<float>(s.beta2);
        c.weight_decay = static_cast<float>(s.weight_decay);
        return std::make_unique<optimizer_cpu::LionOptimizer>(c);
      }
    }
  } catch (const std::invalid_argument& e) {
    throw EngineError(fmt::format("optimizer.params: {}", e.what()));
  }
  throw EngineError(fmt::format("optimizer.type {} is not one of Adam, AdamW, Adagrad, Lion",
                                static_cast<int>(s.type)));
}

}  // namespace

std::vector<PlanParam> describe_parameters(torch::nn::Module& root) {
  const zero::ModelDescription d = zero::describe_model(root);
  std::vector<PlanParam> params;
  for (const auto& p : d.params) {
    params.push_back({static_cast<uint64_t>(p.tensor.numel()), p.tensor.requires_grad(),
                      !p.blocks.empty(), p.outside_use, p.tied_outside()});
  }
  return params;
}

std::string MemoryReport::table() const {
  std::string out = fmt::format("{:<8} {:>12} {:>12}\n", "tier", "planned", "measured");
  out += fmt::format("{:<8} {:>12} {:>12}  (peak of zinf's device allocations)\n", "device",
                     format_bytes(plan.device_total() - plan.device_activations),
                     format_bytes(device_peak));
  out += fmt::format(
      "{:<8} {:>12} {:>12}  (LibTorch's on the device: activations, a layer's "
      "recomputation, the loss)\n",
      "compute", format_bytes(plan.device_activations),
      compute.measured ? format_bytes(compute.peak_bytes) : "not measured");
  out += fmt::format("{:<8} {:>12} {:>12}\n", "pinned", format_bytes(plan.pinned),
                     format_bytes(pinned));
  out += fmt::format("{:<8} {:>12} {:>12}\n", "host", format_bytes(plan.host), format_bytes(host));
  out += fmt::format("{:<8} {:>12} {:>12}\n", "nvme", format_bytes(plan.nvme), format_bytes(nvme));
  out += fmt::format("peak RSS {}\n", format_bytes(peak_rss));
  return out;
}

std::string cuda_compute_unavailable_reason() {
  if (!at::hasCUDA()) {
    return "this build's LibTorch cannot compute on CUDA (a CPU build, or no usable device)";
  }
  if (offload::cuda_device_count() == 0) {
    return offload::cuda_unavailable_reason();
  }
  return {};
}

Engine::Engine(std::shared_ptr<torch::nn::Module> model, EngineOptions options,
               const zero::ZeroModel::Initializer& initializer)
    : options_(std::move(options)), module_(std::move(model)) {
  if (!module_) {
    throw EngineError("engine: no model");
  }
  if (options_.micro_batch_size < 1) {
    throw EngineError(fmt::format("train_micro_batch_size_per_gpu must be >= 1, not {}",
                                  options_.micro_batch_size));
  }
  if (options_.threads > 0) {
    at::set_num_threads(options_.threads);
  }
  options_.comm.timeout = options_.zero.comm_timeout;
  // On CUDA the gradients and gathered parameters are device memory: NCCL reduces them
  // ("auto"); Gloo stays for CPU ranks.
  if (options_.accelerator == "cuda" && options_.comm.backend == "auto" &&
      options_.launch.world_size > 1) {
    options_.comm.backend = "nccl";
  }
  comm_ = zero::make_communicator(options_.launch, options_.comm);

  if (options_.accelerator == "cpu") {
    accelerator_ = std::make_unique<offload::CpuAccelerator>(options_.memory_budget);
  } else if (options_.accelerator == "strict") {
    accelerator_ = std::make_unique<offload::StrictAccelerator>(options_.memory_budget);
    // Collectives on device memory only, as NCCL would (world size 1 too: the single
    // communicator's copies would read device memory from the host).
    zero::DeviceMemoryMap map;
    map.alias = [](const void* ptr, size_t bytes) { return offload::strict_alias(ptr, bytes); };
    map.describe = [](const void* ptr) { return offload::describe_strict_pointer(ptr); };
    comm_ = zero::make_strict_communicator(std::move(comm_), std::move(map));
  } else if (options_.accelerator == "cuda") {
    if (const std::string why = cuda_compute_unavailable_reason(); !why.empty()) {
      throw EngineError("zinf.accelerator.type \"cuda\" cannot be used: " + why);
    }
    const int device =
        options_.comm.cuda_device >= 0 ? options_.comm.cuda_device : options_.launch.local_rank;
    accelerator_ = std::make_unique<offload::CudaAccelerator>(device, options_.memory_budget);
  } else {
    throw EngineError(
        fmt::format("zinf.accelerator.type \"{}\" is not one of \"cpu\", \"cuda\", \"strict\"",
                    options_.accelerator));
  }
  device_ = zero::compute_device(*accelerator_);
  track_compute_memory();
  // Every pinned buffer made from here on (pools, staging, aio's bounce buffers) is registered
  // with the device, so its copies run at pinned speed (cudaHostRegister on a GPU).
  aio::set_pin_hooks(accelerator_->pin_hooks());
  optimizer_ = make_optimizer(options_.optimizer);

  PlanInputs in;
  in.params = describe_parameters(*module_);
  in.zero = options_.zero;
  in.world_size = comm_->world_size();
  in.optimizer_states = optimizer_->state_arrays();
  in.activations = options_.activations;
  in.host_reads_device_memory = accelerator_->host_reads_device_memory();
  plan_ = plan_memory(in);
  {
    // The defaults that stand back where their costs do not fit this machine.
    FitLimits fit;
    fit.host_available = host_memory_available_bytes();
    fit.swap_free = swap_free_bytes(options_.zero);
    fit.device_is_host_memory = accelerator_->name() != "cuda";
    fit.ranks_on_node = std::max(1, options_.launch.local_world_size);
    for (const std::string& line : fit_defaults(in, plan_, fit)) log(line);
    options_.zero = in.zero;
  }
  PlanLimits limits;
  limits.device_budget = accelerator_->memory_stats().budget_bytes;
  limits.pinned_limit = options_.zero.pinned_memory_limit;
  check_memory_plan(plan_, limits);
  log(fmt::format("memory plan (rank {} of {}):\n{}{}; this run plans {}", comm_->rank(),
                  comm_->world_size(), plan_.table(), aio::describe_pinned_memory(),
                  format_bytes(plan_.pinned)));

  model_ = std::make_unique<zero::ZeroModel>(*module_, options_.zero, *accelerator_, *comm_,
                                             *optimizer_, initializer);
  if (options_.zero.precision == zero::Precision::kFloat16) {
    scaler_ = zero::LossScaler(options_.zero.loss_scale);
  }
  // The compute peak covers what the run computes, not the model's initial tensors, which
  // partitioning has just replaced.
  reset_compute_peak(device_);
}

Engine::~Engine() = default;

int Engine::rank() const noexcept { return comm_->rank(); }
int Engine::world_size() const noexcept { return comm_->world_size(); }
int Engine::gradient_accumulation_steps() const noexcept {
  return options_.zero.gradient_accumulation_steps;
}

uint64_t host_memory_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;  // kB
  }
  return aio::physical_memory_bytes();
}

std::optional<uint64_t> swap_free_bytes(const zero::ZeroConfig& zero) {
  // Free space over the distinct filesystems of the swap folders (a folder not made yet is
  // left to the stores, which check it themselves).
  uint64_t free_bytes = 0;
  std::vector<dev_t> seen;  // the filesystems counted (two drives of one size are two)
  bool measured = false;
  std::vector<std::string> folders = zero.nvme_paths;
  for (const std::string* folder :
       {&zero.param_nvme_path, &zero.optimizer_nvme_path, &zero.activation_nvme_path}) {
    if (!folder->empty()) folders.push_back(*folder);
  }
  for (const std::string& folder : folders) {
    std::error_code ec;
    const std::filesystem::space_info space = std::filesystem::space(folder, ec);
    struct stat st {};
    if (ec || ::stat(folder.c_str(), &st) != 0) continue;
    measured = true;
    if (std::find(seen.begin(), seen.end(), st.st_dev) != seen.end()) continue;
    seen.push_back(st.st_dev);
    free_bytes += space.available;
  }
  if (!measured) return std::nullopt;
  return free_bytes;
}

std::vector<std::string> fit_defaults(PlanInputs& in, MemoryPlan& plan, const FitLimits& limits) {
  std::vector<std::string> lines;
  zero::ZeroConfig& z = in.zero;
  const auto ranks = static_cast<uint64_t>(std::max(1, limits.ranks_on_node));
  auto host_need = [&] {
    const uint64_t per_rank = limits.host_held_bytes + plan.host + plan.pinned +
                              plan.host_peak_init +
                              (limits.device_is_host_memory ? plan.device_total() : 0);
    return per_rank * ranks;
  };
  auto host_short = [&]() -> std::string {
    const uint64_t need = host_need();
    if (need <= limits.host_available) return {};
    return fmt::format("the run would need {} of host memory{} and {} is available",
                       format_bytes(need),
                       ranks > 1 ? fmt::format(" for {} ranks on this node", ranks) : "",
                       format_bytes(limits.host_available));
  };
  // Why the overlap as planned does not fit, or "".
  auto overlap_short = [&]() -> std::string {
    if (limits.swap_free && plan.nvme * ranks > *limits.swap_free) {
      return fmt::format(
          "its spare extents bring the swap files to {}{}, and the swap folders have {} free",
          format_bytes(plan.nvme * ranks), ranks > 1 ? " for this node's ranks" : "",
          format_bytes(*limits.swap_free));
    }
    if (const std::string short_of = host_short(); !short_of.empty()) {
      return "with the speculated params it holds, " + short_of;
    }
    return {};
  };
  if (z.overlap_optimizer && !z.overlap_optimizer_given &&
      z.offload_optimizer == zero::OffloadTarget::kNvme) {
    if (const std::string why = overlap_short(); !why.empty()) {
      // The largest window of last sub-groups whose spare extents and held params fit (both
      // grow with the window), found by bisection; none: the overlap goes.
      const size_t n = static_cast<size_t>(
          offload::cut_sub_groups(plan.partition_numel, z.sub_group_size).count);
      size_t fits = 0;
      for (size_t lo = 1, hi = n > 0 ? n - 1 : 0; lo <= hi;) {
        const size_t mid = lo + (hi - lo) / 2;
        z.overlap_sub_groups = mid;
        plan = plan_memory(in);
        if (overlap_short().empty()) {
          fits = mid;
          lo = mid + 1;
        } else {
          hi = mid - 1;
        }
      }
      if (fits > 0) {
        z.overlap_sub_groups = fits;
        lines.push_back(fmt::format(
            "zinf.overlap_optimizer for the last {} of {} sub-groups only (its default): for all "
            "of them {}; set the key true to insist on all, false to silence this",
            fits, n, why));
      } else {
        z.overlap_optimizer = false;
        z.overlap_sub_groups = 0;
        lines.push_back(fmt::format(
            "zinf.overlap_optimizer off for this run (its default): {}; set the key true to "
            "insist, false to silence this",
            why));
      }
      plan = plan_memory(in);
    }
  }
  if (z.host_grads && !z.host_grads_given) {
    if (const std::string short_of = host_short(); !short_of.empty()) {
      z.host_grads = false;
      plan = plan_memory(in);
      // On the swap files the grads need space there too; where that is short as well, the
      // stores refuse the run at start-up with their numbers: say it here first.
      const std::string disk =
          limits.swap_free && plan.nvme * ranks > *limits.swap_free
              ? fmt::format(
                    " (with them the swap files need {} and the swap folders have {} "
                    "free: this run fits neither)",
                    format_bytes(plan.nvme * ranks), format_bytes(*limits.swap_free))
              : std::string();
      lines.push_back(fmt::format(
          "zinf.grad_offload \"nvme\" for this run (its default is \"cpu\"): with the "
          "optimizer's fp32 grads in host memory {}; the grads go to the swap files{}, written "
          "and read once per micro-batch; set the key to insist or to silence this",
          short_of, disk));
    }
  }
  return lines;
}

void check_memory_plan(const MemoryPlan& plan, const PlanLimits& limits) {
  if (limits.device_budget > 0 && plan.device_total() > limits.device_budget) {
    throw PlanError(fmt::format(
        "the run needs {} of accelerator memory but the budget (zinf.accelerator.memory_budget) "
        "is {}:\n{}Lower stage3_max_live_parameters or the micro-batch, offload parameters or "
        "optimizer states (offload_param / offload_optimizer), or raise the budget (zinf train: "
        "--memory-budget).",
        format_bytes(plan.device_total()), format_bytes(limits.device_budget), plan.table()));
  }
  // Pinned memory: the limit is the process's (aio/pinned_budget.h); the plan must fit in
  // what is left of it before any pool is made.
  if (limits.pinned_limit) aio::set_pinned_memory_limit(*limits.pinned_limit);
  const aio::PinnedMemoryUsage pinned = aio::pinned_memory_usage();
  const uint64_t pinned_free = pinned.limit - std::min(pinned.in_use, pinned.limit);
  if (plan.pinned > pinned_free) {
    throw PlanError(fmt::format(
        "the run needs {} of pinned host memory but zinf.pinned_memory_limit allows {} ({} "
        "already pinned{}):\n{}Lower offload_param.buffer_count / buffer_size or "
        "sub_group_size, or raise zinf.pinned_memory_limit.",
        format_bytes(plan.pinned), format_bytes(pinned.limit), format_bytes(pinned.in_use),
        pinned.limit_is_default ? "; the default is half of physical RAM" : "", plan.table()));
  }
  if (limits.check_host) {
    const auto ranks = static_cast<uint64_t>(std::max(1, limits.ranks_on_node));
    const uint64_t per_rank =
        limits.host_held_bytes + plan.host + plan.pinned + plan.host_peak_init;
    const uint64_t available = host_memory_available_bytes();
    if (per_rank > available / ranks) {
      throw PlanError(fmt::format(
          "the run needs {} of host memory{} (the model built in full before partitioning {}, "
          "plus the plan's host {}, pinned {} and start-up {}) but {} {} available:\n{}Choose a "
          "smaller model (or a smaller vocabulary), or offload to NVMe (offload_param / "
          "offload_optimizer device \"nvme\").",
          format_bytes(per_rank * ranks),
          ranks > 1 ? fmt::format(" for {} ranks on this node", ranks) : std::string(),
          format_bytes(limits.host_held_bytes), format_bytes(plan.host), format_bytes(plan.pinned),
          format_bytes(plan.host_peak_init), format_bytes(available), "is", plan.table()));
    }
  }
}

void Engine::log(const std::string& line) const {
  if (comm_->rank() == 0 && options_.log) {
    options_.log(line);
  }
}

void Engine::emit(const std::string& event, double value) const {
  if (comm_->rank() == 0 && options_.monitor) {
    options_.monitor({event, value, global_samples_});
  }
}

torch::Tensor Engine::forward(const std::function<torch::Tensor()>& compute) {
  if (in_micro_batch_) {
    throw EngineError("forward() called twice without backward()");
  }
  if (!step_started_) {
    step_start_ = Clock::now();
    step_started_ = true;
    forward_seconds_ = backward_seconds_ = step_seconds_ = 0.0;
  }
  if (micro_batch_ + 1 == gradient_accumulation_steps()) {
    arm_overlap();
  }
  model_->begin_micro_batch(micro_batch_);
  in_micro_batch_ = true;
  const auto start = Clock::now();
  torch::Tensor loss;
  try {
    loss = compute();
  } catch (...) {
    in_micro_batch_ = false;
    throw;
  }
  forward_seconds_ += seconds_since(start);
  if (!loss.defined() || loss.numel() != 1) {
    throw EngineError("the forward function must return the scalar loss");
  }
  return loss;
}

void Engine::backward(const torch::Tensor& loss) {
  if (!in_micro_batch_) {
    throw EngineError("backward() without forward()");
  }
  const auto start = Clock::now();
  loss_sum_ += loss.detach().to(at::kDouble).item<double>();
  const double factor = scaler_.scale() / gradient_accumulation_steps();
  model_->backward(loss * factor);
  model_->end_micro_batch();
  in_micro_batch_ = false;
  backward_seconds_ += seconds_since(start);
}

bool Engine::step() {
  if (in_micro_batch_) {
    throw EngineError("step() before backward()");
  }
  ++micro_batch_;
  global_samples_ += options_.micro_batch_size * comm_->world_size();
  if (micro_batch_ < gradient_accumulation_steps()) {
    return false;
  }
  apply_step();
  micro_batch_ = 0;
  return true;
}

void Engine::abandon_step() {
  if (in_micro_batch_) {
    throw EngineError("abandon_step() inside a micro-batch: call it between micro-batches");
  }
  global_samples_ -=
      static_cast<int64_t>(micro_batch_) * options_.micro_batch_size * comm_->world_size();
  micro_batch_ = 0;
  loss_sum_ = 0.0;
  step_started_ = false;
}

// One optimizer step after the last micro-batch: the schedules' values for it, the update
// of the sub-groups (seen by a prepared save), the step counters and the loss scale, then the
// step's report.
void Engine::apply_step() {
  const auto start = Clock::now();
  const int64_t next = applied_steps_ + 1;
  const double lr = apply_schedules(next);
  const double scale = scaler_.scale();
  bool watched = false;
  const zero::OptimizerStepOutcome outcome = update_model(next, scale, watched);
  step_seconds_ = seconds_since(start);
  last_overlap_wait_seconds_ = outcome.overlap_wait_seconds;
  count_step(outcome, scale, watched);
  report_step(outcome, lr, scale);
}

// zinf.overlap_optimizer: the last micro-batch's backward updates final sub-groups as it goes,
// with the step's schedules and loss scale as they stand now (a skipped or clipped step
// redoes them in update_model). Not while a prepared save waits to see every sub-group.
void Engine::arm_overlap() {
  if (!options_.zero.overlap_optimizer || save_prepared()) {
    return;
  }
  const int64_t next = applied_steps_ + 1;
  (void)apply_schedules(next);
  model_->speculate_step(next, scaler_.scale());
}

// The LR schedule's value for `step` (and the momentum schedule's, for an optimizer that
// takes one); returns the LR.
double Engine::apply_schedules(int64_t step) {
  const double lr = options_.lr_schedule ? options_.lr_schedule(step) : options_.optimizer.lr;
  optimizer_->set_lr(static_cast<float>(lr));
  if (options_.beta1_schedule) {
    (void)optimizer_->set_beta1(static_cast<float>(options_.beta1_schedule(step)));
  }
  return lr;
}

// The model's optimizer step. A save prepared for after this step sees the sub-groups as the
// step updates them (`watched`).
zero::OptimizerStepOutcome Engine::update_model(int64_t step, double scale, bool& watched) {
  offload::OptimizerSwapper* swapper = nullptr;
  if (offload::StepObserver* observer = prepared_observer()) {
    swapper = &model_->optimizer().swapper();
    swapper->set_step_observer(observer);
  }
  struct Detach {
    offload::OptimizerSwapper* swapper;
    ~Detach() {
      if (swapper != nullptr) swapper->set_step_observer(nullptr);
    }
  } detach{swapper};
  watched = swapper != nullptr;
  return model_->step(step, scale);
}

// The step counters, the prepared save's verdict and the loss scale.
void Engine::count_step(const zero::OptimizerStepOutcome& outcome, double scale, bool watched) {
  ++global_steps_;
  if (outcome.skipped) {
    ++skipped_steps_;
  } else {
    ++applied_steps_;
  }
  if (watched) prepared_step_done(!outcome.skipped);
  scaler_.update(outcome.skipped);
  if (outcome.skipped) {
    log(fmt::format(
        "step {} skipped: {} NaN/Inf gradient elements{}", global_steps_, outcome.nonfinite,
        scaler_.dynamic() ? fmt::format(" (loss scale {} -> {})", scale, scaler_.scale())
                          : std::string()));
  }
}

// The step's report: the global batch's loss (this rank's micro-batch mean, averaged over the
// ranks), the monitors' events and the printed line.
void Engine::report_step(const zero::OptimizerStepOutcome& outcome, double lr, double scale) {
  double loss = loss_sum_ / gradient_accumulation_steps();
  if (comm_->world_size() > 1) {
    zero::host_all_reduce(*comm_, *accelerator_, &loss, 1, zero::DType::kFloat64,
                          zero::ReduceOp::kSum);
    loss /= comm_->world_size();
  }
  loss_sum_ = 0.0;
  step_started_ = false;

  const double seconds = seconds_since(step_start_);
  const double samples = static_cast<double>(options_.micro_batch_size) * comm_->world_size() *
                         gradient_accumulation_steps();
  report_.global_step = global_steps_;
  report_.global_samples = global_samples_;
  report_.loss = loss;
  report_.lr = lr;
  report_.loss_scale = scale;
  report_.grad_norm = outcome.grad_norm;
  report_.skipped = outcome.skipped;
  report_.seconds = seconds;
  report_.optimizer_seconds = step_seconds_;
  report_.samples_per_second = seconds > 0 ? samples / seconds : 0.0;
  report_.tokens_per_second =
      report_.samples_per_second * static_cast<double>(options_.tokens_per_sample);

  emit("Train/Samples/train_loss", loss);
  emit("Train/Samples/lr", lr);
  if (options_.zero.precision == zero::Precision::kFloat16) {
    emit("Train/Samples/loss_scale", scale);
  }
  if (options_.wall_clock_breakdown) {
    emit("Train/Samples/elapsed_time_ms_forward", forward_seconds_ * 1e3);
    emit("Train/Samples/elapsed_time_ms_backward", backward_seconds_ * 1e3);
    emit("Train/Samples/elapsed_time_ms_backward_inner", backward_seconds_ * 1e3);
    emit("Train/Samples/elapsed_time_ms_backward_allreduce",
         model_->stats().reducer.wait_seconds * 1e3);
    emit("Train/Samples/elapsed_time_ms_step", step_seconds_ * 1e3);
    if (options_.zero.overlap_optimizer) {
      emit("Train/Samples/elapsed_time_ms_optimizer_wait", last_overlap_wait_seconds_ * 1e3);
    }
  }
  if (options_.steps_per_print > 0 && global_steps_ % options_.steps_per_print == 0) {
    std::string line = fmt::format(
        "step {} | loss {:.4f} | lr {:.3e} | loss scale {:g} | skipped {} | {:.2f} samples/s",
        global_steps_, loss, lr, scale, skipped_steps_, report_.samples_per_second);
    if (options_.tokens_per_sample > 0) {
      const double tps = report_.tokens_per_second;  // decimals only where they mean something
      line += fmt::format(" | {:.{}f} tokens/s", tps, tps < 10 ? 2 : tps < 100 ? 1 : 0);
    }
    log(line);
    if (options_.wall_clock_breakdown) {
      log(breakdown());
    }
  }
  last_stats_ = model_->stats();
}

StepReport Engine::train_batch(const std::function<torch::Tensor(int micro_batch)>& compute) {
  for (int mb = 0; mb < gradient_accumulation_steps(); ++mb) {
    torch::Tensor loss = forward([&] { return compute(mb); });
    backward(loss);
    step();
  }
  return report_;
}

torch::Tensor Engine::evaluate(const std::function<torch::Tensor()>& compute) {
  if (in_micro_batch_) {
    throw EngineError("evaluate() inside a micro-batch");
  }
  at::NoGradGuard no_grad;
  model_->begin_eval();
  torch::Tensor out;
  try {
    out = compute();
  } catch (...) {
    model_->end_eval();
    throw;
  }
  model_->end_eval();
  return out;
}

std::string Engine::breakdown() const {
  const zero::ZeroModelStats s = model_->stats();
  return fmt::format(
      "  time: forward {:.3f} s | backward {:.3f} s | step {:.3f} s | blocked on: param fetch "
      "{:.3f} s (prefetch misses {:.3f} s, all-gather {:.3f} s), gradient reduction {:.3f} s, "
      "optimizer I/O {:.3f} s, param swap I/O {:.3f} s{}",
      forward_seconds_, backward_seconds_, step_seconds_,
      s.params.wait_seconds - last_stats_.params.wait_seconds,
      s.coordinator.block_wait_seconds - last_stats_.coordinator.block_wait_seconds,
      s.params.gather_wait_seconds - last_stats_.params.gather_wait_seconds,
      s.reducer.wait_seconds - last_stats_.reducer.wait_seconds,
      s.optimizer_swap.io_wait_seconds - last_stats_.optimizer_swap.io_wait_seconds,
      s.param_swap.io_wait_seconds - last_stats_.param_swap.io_wait_seconds,
      options_.zero.overlap_optimizer
          ? fmt::format(" | overlap: waited for the optimizer {:.3f} s after the backward "
                        "(the backward {:.3f} s for its staging buffers), {} sub-groups updated "
                        "behind it, {} rolled back",
                        s.overlap.wait_seconds - last_stats_.overlap.wait_seconds,
                        s.overlap.backward_wait_seconds - last_stats_.overlap.backward_wait_seconds,
                        s.overlap.committed - last_stats_.overlap.committed,
                        s.overlap.rolled_back - last_stats_.overlap.rolled_back)
          : std::string());
}

std::string Engine::counters_line() const {
  const zero::ZeroModelStats s = model_->stats();
  return fmt::format(
      "device peak {} (gathered params high-water {}) | nvme read {} written {} | all-gathers "
      "{} ({}) | reduction buckets {} ({})",
      format_bytes(s.device.peak_bytes), format_bytes(s.gathered_high_water_bytes),
      format_bytes(s.optimizer_swap.nvme_bytes_read + s.param_swap.nvme_bytes_read),
      format_bytes(s.optimizer_swap.nvme_bytes_written + s.param_swap.nvme_bytes_written),
      s.params.gathers, format_bytes(s.params.gathered_bytes), s.reducer.buckets,
      format_bytes(s.reducer.bytes_sent));
}

MemoryReport Engine::memory_report() const {
  const zero::ZeroModelStats s = model_->stats();
  MemoryReport r;
  r.plan = plan_;
  r.device_peak = s.device.peak_bytes;
  r.pinned = s.pinned_bytes;
  r.host = s.host_bytes;
  r.nvme = s.nvme_bytes;
  r.peak_rss = aio::peak_rss_bytes();
  r.compute = compute_memory(device_);
  r.activations = s.activations;
  return r;
}

}  // namespace zinf::engine
