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
  if (nvme_) {
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
  return sc;
}

offload::Footprint PartitionedOptimizer::footprint(const ZeroConfig& config,
                                                   std::vector<uint64_t> sub_groups,
                                                   optimizer_cpu::StateArrays states) {
  const uint64_t largest = sub_groups.empty() ? 0 : sub_groups.front();  // the cut's first
  offload::Footprint f =
      offload::OptimizerSwapper::footprint(swapper_config(config, std::move(sub_groups)), states);
  if (config.offload_optimizer == OffloadTarget::kNvme) {
    f.pinned += 2 * offload::pinned_allocation(largest * sizeof(float));  // staging_
  }
  return f;
}

PartitionedOptimizer::~PartitionedOptimizer() {
  if (write_.valid()) {
    write_.wait();
  }
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
    if (!nvme_) {
      std::memset(swapper_->memory(state), 0, layout_.partition_numel() * sizeof(float));
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
  micro_batch_ = micro_batch;
  last_micro_batch_ = micro_batch + 1 == config_.gradient_accumulation_steps;
  std::fill(touched_.begin(), touched_.end(), false);
  if (micro_batch == 0) {
    staged_ = -1;  // sums of an unfinished step (none after a complete one) are dropped
    std::fill(sumsq_.begin(), sumsq_.end(), 0.0);
    std::fill(nonfinite_.begin(), nonfinite_.end(), 0);
    std::fill(on_disk_.begin(), on_disk_.end(), false);
    if (!nvme_) {
      std::memset(swapper_->memory(OptimizerState::kGrads), 0,
                  layout_.partition_numel() * sizeof(float));
    }
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
  if (!nvme_) {
    auto* dst = static_cast<float*>(swapper_->memory(OptimizerState::kGrads));
    accumulate_scaled(dst + offset, src, dtype, numel, scale);
    return;
  }
  const auto& groups = layout_.sub_groups();
  const uint64_t group_size = groups.front().numel;
  const auto first = static_cast<size_t>(offset / group_size);
  const auto last = static_cast<size_t>((offset + numel - 1) / group_size);
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
  }
}

void PartitionedOptimizer::wait_write() {
  if (write_.valid()) {
    write_.get();  // rethrows the writer's error
  }
}

void PartitionedOptimizer::stage(size_t sub_group) {
  touched_[sub_group] = true;
  if (staged_ == static_cast<long>(sub_group)) {
    return;
  }
  if (staged_ >= 0) {
    flush_staged();
  }
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
  wait_write();
  on_disk_[g] = true;
  offload::OptimizerSwapper* swapper = swapper_.get();
  write_ = std::async(std::launch::async, [swapper, g, buffer] {
    swapper->write_sub_group(OptimizerState::kGrads, g, buffer);
  });
  staged_slot_ ^= 1;
  staged_ = -1;
}

void PartitionedOptimizer::end_micro_batch() {
  const auto& groups = layout_.sub_groups();
  if (!nvme_) {
    if (last_micro_batch_) {
      const auto* grads = static_cast<const float*>(swapper_->memory(OptimizerState::kGrads));
      for (size_t g = 0; g < groups.size(); ++g) {
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
  wait_write();
}

// ---- the update --------------------------------------------------------------------------

OptimizerStepOutcome PartitionedOptimizer::step(int64_t step, double loss_scale,
                                                const offload::ParamCopySink& sink) {
  OptimizerStepOutcome outcome;
  double totals[2] = {0.0, 0.0};  // sum of squares, NaN/Inf count
  for (size_t g = 0; g < sumsq_.size(); ++g) {
    totals[0] += sumsq_[g];
    totals[1] += static_cast<double>(nonfinite_[g]);
  }
  if (!norm_is_global_ && comm_.world_size() > 1) {
    if (accelerator_ != nullptr) {
      host_all_reduce(comm_, *accelerator_, totals, 2, DType::kFloat64, ReduceOp::kSum);
    } else {
      comm_.all_reduce(totals, 2, DType::kFloat64, ReduceOp::kSum)->wait();
    }
  }
  outcome.nonfinite = static_cast<uint64_t>(totals[1]);
  const double scale = loss_scale > 0.0 ? loss_scale : 1.0;
  outcome.grad_norm = std::sqrt(totals[0]) / scale;
  if (outcome.nonfinite > 0 || !std::isfinite(outcome.grad_norm)) {
    outcome.skipped = true;
    outcome.grad_norm = std::numeric_limits<double>::infinity();
    return outcome;
  }
  if (config_.gradient_clipping > 0.0) {
    const double coefficient = config_.gradient_clipping / (outcome.grad_norm + 1e-6);
    if (coefficient < 1.0) {
      outcome.clip_coefficient = coefficient;
    }
  }
  offload::OptimizerStepOptions options;
  options.step = step;
  options.loss_scale = static_cast<float>(scale);
  options.clip_coefficient = static_cast<float>(outcome.clip_coefficient);
  options.copy_params = true;
  const offload::OptimizerStepReport report = swapper_->step(options, sink);
  outcome.seconds = report.seconds;
  return outcome;
}

}  // namespace zinf::zero
