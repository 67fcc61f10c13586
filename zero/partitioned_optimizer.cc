#include "zero/partitioned_optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "zero/dtype_convert.h"
#include "zero/error.h"
#include "zero/host_collectives.h"

namespace zinf::zero {
namespace {

using offload::OptimizerState;

optimizer_cpu::DType copy_dtype(Precision precision) {
  switch (precision) {
    case Precision::kBFloat16:
      return optimizer_cpu::DType::kBFloat16;
    case Precision::kFloat16:
      return optimizer_cpu::DType::kFloat16;
    case Precision::kFloat32:
      break;
  }
  return optimizer_cpu::DType::kFloat32;
}

constexpr OptimizerState kMomentStates[] = {OptimizerState::kGrads, OptimizerState::kExpAvg,
                                            OptimizerState::kExpAvgSq};

}  // namespace

PartitionedOptimizer::PartitionedOptimizer(const PartitionLayout& layout, const ZeroConfig& config,
                                           optimizer_cpu::Optimizer& optimizer,
                                           offload::NvmeStore* store,
                                           offload::Accelerator* accelerator, Communicator& comm,
                                           bool norm_is_global)
    : layout_(layout),
      config_(config),
      comm_(comm),
      accelerator_(accelerator),
      norm_is_global_(norm_is_global) {
  if (layout_.partition_numel() == 0) {
    throw ZeroError("the model has no trainable parameters to optimize");
  }
  nvme_ = config_.offload_optimizer == OffloadTarget::kNvme;
  std::vector<uint64_t> sub_groups;
  for (const SubGroupRange& g : layout_.sub_groups()) {
    sub_groups.push_back(g.numel);  // the layout's cut, the only one
  }
  swapper_ = std::make_unique<offload::OptimizerSwapper>(
      swapper_config(config_, std::move(sub_groups)), optimizer, store, accelerator);
  const size_t groups = layout_.sub_groups().size();
  sumsq_.assign(groups, 0.0);
  nonfinite_.assign(groups, 0);
  on_disk_.assign(groups, false);
  touched_.assign(groups, false);
  remaining_.assign(groups, 0);
  copies_.resize(groups);
  speculated_.assign(groups, 0);
  worker_ = std::make_unique<TaskThread>();
  host_grads_ = swapper_->memory(OptimizerState::kGrads) != nullptr;
  if (!host_grads_) {
    const uint64_t largest = layout_.sub_groups().front().numel;
    staging_[0] = aio::PinnedBuffer(largest * sizeof(float));
    staging_[1] = aio::PinnedBuffer(largest * sizeof(float));
  }
}

offload::OptimizerSwapperConfig PartitionedOptimizer::swapper_config(
    const ZeroConfig& config, std::vector<uint64_t> sub_groups) {
  offload::OptimizerSwapperConfig sc;
  sc.device = config.offload_optimizer == OffloadTarget::kNvme ? offload::OffloadDevice::kNvme
                                                               : offload::OffloadDevice::kCpu;
  sc.sub_groups = std::move(sub_groups);
  sc.buffer_count = config.optimizer_buffer_count;
  sc.pipeline_read = config.pipeline_read;
  sc.pipeline_write = config.pipeline_write;
  sc.grad_dtype = optimizer_cpu::DType::kFloat32;
  sc.param_copy_dtype = copy_dtype(config.precision);
  sc.speculate = config.overlap_optimizer;
  sc.speculate_window = config.overlap_sub_groups;
  sc.grads_in_memory = config.host_grads;
  return sc;
}

offload::Footprint PartitionedOptimizer::footprint(const ZeroConfig& config,
                                                   std::vector<uint64_t> sub_groups,
                                                   optimizer_cpu::StateArrays states) {
  const uint64_t largest = sub_groups.empty() ? 0 : sub_groups.front();  // the cut's first
  offload::Footprint f =
      offload::OptimizerSwapper::footprint(swapper_config(config, std::move(sub_groups)), states);
  if (config.offload_optimizer == OffloadTarget::kNvme && !config.host_grads) {
    f.pinned += 2 * offload::pinned_allocation(largest * sizeof(float));  // staging_
  }
  return f;
}

uint64_t PartitionedOptimizer::overlap_host_bytes(const ZeroConfig& config,
                                                  const std::vector<uint64_t>& sub_groups) {
  const size_t n = sub_groups.size();
  if (!config.overlap_optimizer || n < 2) {
    return 0;
  }
  const size_t window = config.overlap_sub_groups;
  const size_t first = window == 0 || window >= n ? 1 : std::max<size_t>(1, n - window);
  uint64_t numel = 0;
  for (size_t g = first; g < n; ++g) numel += sub_groups[g];
  return numel * dtype_size(compute_dtype(config.precision));
}

PartitionedOptimizer::~PartitionedOptimizer() {
  worker_.reset();  // lets its tasks end before the buffers they use go
}

uint64_t PartitionedOptimizer::pinned_bytes() const noexcept {
  return swapper_->pinned_bytes() + staging_[0].capacity() + staging_[1].capacity();
}

// ---- initial master weights ----------------------------------------------------------

void PartitionedOptimizer::append_master(const float* data, uint64_t numel) {
  if (appended_ + numel > layout_.partition_numel()) {
    throw ZeroError(fmt::format("optimizer init: {} elements appended to a partition of {}",
                                appended_ + numel, layout_.partition_numel()));
  }
  if (!nvme_) {
    auto* params = static_cast<float*>(swapper_->memory(OptimizerState::kParams));
    std::memcpy(params + appended_, data, numel * sizeof(float));
    appended_ += numel;
    return;
  }
  // Fill one sub-group at a time, write each when it is complete.
  const auto& groups = layout_.sub_groups();
  while (numel > 0) {
    size_t g = 0;
    while (g + 1 < groups.size() && groups[g + 1].offset <= appended_) ++g;
    const SubGroupRange& sg = groups[g];
    if (init_buffer_.size() < sg.numel) {
      init_buffer_.resize(sg.numel);
    }
    const uint64_t within = appended_ - sg.offset;
    const uint64_t take = std::min(numel, sg.numel - within);
    std::memcpy(init_buffer_.data() + within, data, take * sizeof(float));
    appended_ += take;
    data += take;
    numel -= take;
    if (within + take == sg.numel) {
      swapper_->write_sub_group(OptimizerState::kParams, g, init_buffer_.data());
    }
  }
}

void PartitionedOptimizer::finish_master() {
  if (appended_ != layout_.partition_numel()) {
    throw ZeroError(fmt::format("optimizer init: {} of {} partition elements were given", appended_,
                                layout_.partition_numel()));
  }
  for (OptimizerState state : kMomentStates) {
    if (!swapper_->has_state(state)) {
      continue;
    }
    if (void* memory = swapper_->memory(state)) {
      std::memset(memory, 0, layout_.partition_numel() * sizeof(float));
      continue;
    }
    std::fill(init_buffer_.begin(), init_buffer_.end(), 0.0f);
    for (size_t g = 0; g < layout_.sub_groups().size(); ++g) {
      swapper_->write_sub_group(state, g, init_buffer_.data());
    }
  }
  init_buffer_.clear();
  init_buffer_.shrink_to_fit();
  std::fill(on_disk_.begin(), on_disk_.end(), true);  // the grads are written zeros
}

// ---- gradients ---------------------------------------------------------------------

void PartitionedOptimizer::begin_micro_batch(int micro_batch) {
  if (micro_batch < 0 || micro_batch >= config_.gradient_accumulation_steps) {
    throw ZeroError(fmt::format("micro-batch {} outside gradient_accumulation_steps {}",
                                micro_batch, config_.gradient_accumulation_steps));
  }
  if (spec_.active) {
    abandon_speculation();  // a step left without step(): its updates are undone
  }
  micro_batch_ = micro_batch;
  last_micro_batch_ = micro_batch + 1 == config_.gradient_accumulation_steps;
  std::fill(touched_.begin(), touched_.end(), false);
  if (micro_batch == 0) {
    staged_ = -1;  // sums of an unfinished step (none after a complete one) are dropped
    std::fill(sumsq_.begin(), sumsq_.end(), 0.0);
    std::fill(nonfinite_.begin(), nonfinite_.end(), 0);
    std::fill(on_disk_.begin(), on_disk_.end(), false);
    if (host_grads_) {
      std::memset(swapper_->memory(OptimizerState::kGrads), 0,
                  layout_.partition_numel() * sizeof(float));
    }
  }
  if (last_micro_batch_ && spec_.armed && config_.overlap_optimizer) {
    spec_.active = true;
    spec_.stopped = spec_.last_clipped;  // it will most likely clip again
    spec_.keep_grads = config_.gradient_clipping > 0.0;
    spec_.final_sumsq = 0.0;
    for (size_t g = 0; g < remaining_.size(); ++g) {
      remaining_[g] = layout_.sub_groups()[g].numel;
    }
    ++overlap_.steps;
  }
}

void PartitionedOptimizer::speculate_step(int64_t step, double loss_scale) {
  spec_.armed = true;
  spec_.options = offload::OptimizerStepOptions{};
  spec_.options.step = step;
  spec_.options.loss_scale = static_cast<float>(loss_scale > 0.0 ? loss_scale : 1.0);
  spec_.options.clip_coefficient = 1.0f;
  spec_.options.copy_params = true;
}

bool PartitionedOptimizer::arrived(size_t sub_group, uint64_t numel) {
  uint64_t& left = remaining_[sub_group];
  left -= std::min(left, numel);
  return left == 0;
}

bool PartitionedOptimizer::should_speculate(size_t sub_group) {
  if (spec_.stopped) {
    return false;
  }
  // Seen already: a NaN/Inf skips the step; this rank's norm alone above the clipping norm
  // makes it clip (the global norm is at least that).
  spec_.final_sumsq += sumsq_[sub_group];
  const double partial = std::sqrt(spec_.final_sumsq) / spec_.options.loss_scale;
  if (nonfinite_[sub_group] > 0 ||
      (config_.gradient_clipping > 0.0 && partial + 1e-6 > config_.gradient_clipping)) {
    spec_.stopped = true;
    return false;
  }
  return swapper_->can_speculate(sub_group);  // (outside the window: updated by step())
}

void PartitionedOptimizer::post_speculation(size_t sub_group, int slot) {
  const uint64_t numel = layout_.sub_groups()[sub_group].numel;
  copies_[sub_group].resize(numel * dtype_size(compute_dtype(config_.precision)));
  speculated_[sub_group] = 1;
  ++overlap_.speculated;
  auto taken = std::make_shared<std::promise<void>>();
  std::future<void> released = taken->get_future();
  const void* grads = slot >= 0 ? staging_[slot].data() : nullptr;
  worker_->post([this, sub_group, grads, taken] {
    bool told = false;
    try {
      (void)swapper_->speculate(sub_group, grads, spec_.options, copies_[sub_group].data(),
                                spec_.keep_grads, [&] {
                                  told = true;
                                  taken->set_value();
                                });
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!spec_error_) spec_error_ = std::current_exception();
    }
    if (!told) taken->set_value();  // the step fails at step(); the buffer is free
  });
  if (slot >= 0) {
    slot_busy_[slot] = std::move(released);
  }
}

void PartitionedOptimizer::accumulate(uint64_t offset, const void* grads, DType dtype,
                                      uint64_t numel, float scale) {
  if (offset > layout_.partition_numel() || numel > layout_.partition_numel() - offset) {
    throw ZeroError(fmt::format("gradient of {} elements at {} exceeds the partition of {}", numel,
                                offset, layout_.partition_numel()));
  }
  const size_t element = dtype_size(dtype);
  const auto* src = static_cast<const std::byte*>(grads);
  const auto& groups = layout_.sub_groups();
  const uint64_t group_size = groups.front().numel;
  const auto first = static_cast<size_t>(offset / group_size);
  const auto last = static_cast<size_t>((offset + numel - 1) / group_size);
  if (host_grads_) {
    auto* dst = static_cast<float*>(swapper_->memory(OptimizerState::kGrads));
    accumulate_scaled(dst + offset, src, dtype, numel, scale);
    if (!spec_.active) {
      return;
    }
    for (size_t g = last + 1; g-- > first;) {
      const uint64_t begin = std::max(offset, groups[g].offset);
      const uint64_t end = std::min(offset + numel, groups[g].offset + groups[g].numel);
      if (arrived(g, end - begin)) {
        measure(g, dst + groups[g].offset, groups[g].numel);
        if (should_speculate(g)) post_speculation(g, -1);
      }
    }
    return;
  }
  // A gradient across sub-groups goes in piece by piece, last first (the backward delivers
  // gradients from the end of the partition to its start, so the staged sub-group is the
  // last piece's, or none): a sub-group is finished before the next is staged, never written
  // out and read back in the middle of the gradient. First first only when the staged
  // sub-group is the first piece's (gradients delivered in partition order).
  const bool descending = staged_ != static_cast<long>(first);
  for (size_t k = 0; k <= last - first; ++k) {
    const size_t g = descending ? last - k : first + k;
    const uint64_t begin = std::max(offset, groups[g].offset);
    const uint64_t end = std::min(offset + numel, groups[g].offset + groups[g].numel);
    stage(g);
    accumulate_scaled(staging_[staged_slot_].as<float>() + (begin - groups[g].offset),
                      src + (begin - offset) * element, dtype, end - begin, scale);
    if (spec_.active && arrived(g, end - begin)) {
      flush_staged();  // final: its update (or its write) starts now
    }
  }
}

void PartitionedOptimizer::wait_slot(int slot) {
  if (!slot_busy_[slot].valid()) {
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  std::future<void> busy = std::move(slot_busy_[slot]);
  busy.get();  // rethrows a gradient write's error
  if (spec_.active) {
    overlap_.backward_wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
}

void PartitionedOptimizer::wait_write() {
  worker_->wait_idle();
  wait_slot(0);
  wait_slot(1);
}

void PartitionedOptimizer::stage(size_t sub_group) {
  touched_[sub_group] = true;
  if (staged_ == static_cast<long>(sub_group)) {
    return;
  }
  if (staged_ >= 0) {
    flush_staged();
  }
  wait_slot(staged_slot_);
  float* buffer = staging_[staged_slot_].as<float>();
  const uint64_t numel = layout_.sub_groups()[sub_group].numel;
  if (on_disk_[sub_group]) {
    wait_write();  // one caller of the swapper at a time
    swapper_->read_sub_group(OptimizerState::kGrads, sub_group, buffer);
  } else {
    std::memset(buffer, 0, numel * sizeof(float));
  }
  touched_[sub_group] = true;
  staged_ = static_cast<long>(sub_group);
}

void PartitionedOptimizer::measure(size_t sub_group, const float* grads, uint64_t numel) {
  const NormPart part = norm_part(grads, numel);
  sumsq_[sub_group] = part.sumsq;
  nonfinite_[sub_group] = part.nonfinite;
}

void PartitionedOptimizer::flush_staged() {
  const auto g = static_cast<size_t>(staged_);
  const int slot = staged_slot_;
  const float* buffer = staging_[slot].as<float>();
  if (last_micro_batch_) {
    measure(g, buffer, layout_.sub_groups()[g].numel);
  }
  if (spec_.active && remaining_[g] == 0 && should_speculate(g)) {
    post_speculation(g, slot);
  } else {
    on_disk_[g] = true;
    offload::OptimizerSwapper* swapper = swapper_.get();
    slot_busy_[slot] = worker_->post(
        [swapper, g, buffer] { swapper->write_sub_group(OptimizerState::kGrads, g, buffer); });
  }
  staged_slot_ ^= 1;
  staged_ = -1;
}

void PartitionedOptimizer::end_micro_batch() {
  const auto& groups = layout_.sub_groups();
  if (host_grads_) {
    if (last_micro_batch_) {
      const auto* grads = static_cast<const float*>(swapper_->memory(OptimizerState::kGrads));
      for (size_t g = 0; g < groups.size(); ++g) {
        if (spec_.active && remaining_[g] == 0) {
          continue;  // measured when it became final
        }
        measure(g, grads + groups[g].offset, groups[g].numel);
      }
    }
    return;
  }
  if (!last_micro_batch_) {
    // The staged sub-group keeps its sums for the next micro-batch (the first it touches,
    // after the backward's reverse order, is usually this one): not written and read back.
    wait_write();
    return;
  }
  if (staged_ >= 0) {
    flush_staged();
  }
  wait_write();
  // Sub-groups no gradient reached in the last micro-batch: their final values are what the
  // swap file holds (measure them), or zeros when nothing reached them in the whole step.
  for (size_t g = 0; g < groups.size(); ++g) {
    if (touched_[g]) {
      continue;
    }
    stage(g);
    flush_staged();
  }
  if (!spec_.active) {
    wait_write();  // (with overlap, step() waits: the updates run on behind the backward)
  }
}

// ---- the update --------------------------------------------------------------------------

OptimizerStepOutcome PartitionedOptimizer::step(int64_t step, double loss_scale,
                                                const offload::ParamCopySink& sink) {
  OptimizerStepOutcome outcome;
  if (spec_.active) {
    // The speculated updates still running behind the end of the backward.
    const auto start = std::chrono::steady_clock::now();
    try {
      wait_write();
    } catch (...) {
      abandon_speculation();
      throw;
    }
    outcome.overlap_wait_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    overlap_.wait_seconds += outcome.overlap_wait_seconds;
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(error_mutex_);
      std::swap(error, spec_error_);
    }
    if (error) {
      abandon_speculation();
      std::rethrow_exception(error);
    }
  }
  spec_.armed = false;
  double totals[2] = {0.0, 0.0};  // sum of squares, NaN/Inf count
  for (size_t g = 0; g < sumsq_.size(); ++g) {
    totals[0] += sumsq_[g];
    totals[1] += static_cast<double>(nonfinite_[g]);
  }
  if (!norm_is_global_ && comm_.world_size() > 1) {
    try {
      if (accelerator_ != nullptr) {
        host_all_reduce(comm_, *accelerator_, totals, 2, DType::kFloat64, ReduceOp::kSum);
      } else {
        comm_.all_reduce(totals, 2, DType::kFloat64, ReduceOp::kSum)->wait();
      }
    } catch (...) {
      abandon_speculation();
      throw;
    }
  }
  outcome.nonfinite = static_cast<uint64_t>(totals[1]);
  const double scale = loss_scale > 0.0 ? loss_scale : 1.0;
  outcome.grad_norm = std::sqrt(totals[0]) / scale;
  if (outcome.nonfinite > 0 || !std::isfinite(outcome.grad_norm)) {
    outcome.skipped = true;
    outcome.grad_norm = std::numeric_limits<double>::infinity();
    if (spec_.active) {
      outcome.rolled_back = swapper_->rollback_speculation();
      overlap_.rolled_back += outcome.rolled_back;
      abandon_speculation();
    }
    return outcome;
  }
  if (config_.gradient_clipping > 0.0) {
    const double coefficient = config_.gradient_clipping / (outcome.grad_norm + 1e-6);
    if (coefficient < 1.0) {
      outcome.clip_coefficient = coefficient;
    }
  }
  spec_.last_clipped = outcome.clip_coefficient < 1.0;
  offload::OptimizerStepOptions options;
  options.step = step;
  options.loss_scale = static_cast<float>(scale);
  options.clip_coefficient = static_cast<float>(outcome.clip_coefficient);
  options.copy_params = true;
  if (spec_.active) {
    end_speculation(outcome, sink, options);
  }
  const offload::OptimizerStepReport report = swapper_->step(options, sink);
  outcome.seconds = report.seconds;
  return outcome;
}

// ---- overlap ------------------------------------------------------------------------------

void PartitionedOptimizer::end_speculation(OptimizerStepOutcome& outcome,
                                           const offload::ParamCopySink& sink,
                                           const offload::OptimizerStepOptions& options) {
  const offload::OptimizerStepOptions& armed = spec_.options;
  // The speculated updates are the step's own when it runs with the armed scale: the same
  // step number and loss scale, no clipping; and no observer waits to see every sub-group.
  const bool keep = armed.step == options.step && armed.loss_scale == options.loss_scale &&
                    options.clip_coefficient == 1.0f && !swapper_->observed();
  size_t count = 0;
  for (const char s : speculated_) count += s != 0 ? 1 : 0;
  if (count > 0 && keep) {
    try {
      swapper_->commit_speculation();
    } catch (...) {
      abandon_speculation();
      throw;
    }
    const auto& groups = layout_.sub_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      if (speculated_[g] != 0 && sink) {
        sink(groups[g].offset, copies_[g].data(), groups[g].numel);
      }
    }
    outcome.overlapped = count;
    overlap_.committed += count;
  } else if (count > 0) {
    outcome.rolled_back = swapper_->rollback_speculation();
    overlap_.rolled_back += outcome.rolled_back;
  }
  abandon_speculation();  // (nothing left to undo: clears this step's records)
}

void PartitionedOptimizer::abandon_speculation() noexcept {
  try {
    worker_->wait_idle();
  } catch (...) {
  }
  for (std::future<void>& busy : slot_busy_) {
    if (busy.valid()) {
      try {
        busy.get();
      } catch (...) {
      }
    }
  }
  try {
    overlap_.rolled_back += swapper_->rollback_speculation();
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    spec_error_ = nullptr;
  }
  for (std::vector<std::byte>& copy : copies_) {
    std::vector<std::byte>().swap(copy);
  }
  std::fill(speculated_.begin(), speculated_.end(), 0);
  spec_.active = false;
  spec_.armed = false;
  spec_.stopped = false;
}

}  // namespace zinf::zero
