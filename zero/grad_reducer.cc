#include "zero/grad_reducer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "zero/comm/torch_dtype.h"
#include "zero/device_tensor.h"
#include "zero/dtype_convert.h"
#include "zero/error.h"

namespace zinf::zero {
namespace {

DType parse_comm_dtype(const std::string& name, DType grad_dtype) {
  if (name.empty()) return grad_dtype;
  if (name == "fp32" || name == "float32" || name == "float") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "half") return DType::kFloat16;
  throw ZeroError(fmt::format(
      "communication_data_type \"{}\" is not one of \"fp32\", \"fp16\", \"bf16\"", name));
}

// A bucket holds whole padded parameters: reduce_bucket_size elements, or the largest
// parameter when it is larger, and never more than all of them.
uint64_t bucket_capacity(const ZeroConfig& config, uint64_t largest, uint64_t total) {
  const uint64_t bucket = std::max<uint64_t>(config.reduce_bucket_size, 1);
  return std::max(largest, std::min(bucket, total));
}

// Buckets filled while others reduce: one, or two with overlap_comm.
size_t bucket_slots(const ZeroConfig& config) { return config.overlap_comm ? 2 : 1; }

}  // namespace

offload::Footprint GradReducer::footprint(const ZeroConfig& config, int world,
                                          const std::vector<uint64_t>& numels,
                                          bool host_reads_device) {
  offload::Footprint f;
  const auto w = static_cast<uint64_t>(std::max(world, 1));
  uint64_t largest = 0;
  uint64_t total = 0;
  for (const uint64_t n : numels) {
    const uint64_t padded = w == 1 || config.stage == 0 ? n : (n + w - 1) / w * w;
    largest = std::max(largest, padded);
    total += padded;
  }
  if (w == 1) {  // each gradient goes to the host whole
    if (!host_reads_device) f.pinned = offload::pinned_allocation(largest * sizeof(float));
    return f;
  }
  const bool stage0 = config.stage == 0;
  const uint64_t capacity = bucket_capacity(config, largest, total);
  const uint64_t element =
      dtype_size(parse_comm_dtype(config.communication_data_type, compute_dtype(config.precision)));
  const uint64_t slots = bucket_slots(config);
  f.device = capacity * element + slots * capacity * element;
  if (!stage0 && config.reduce_scatter) f.device += slots * (capacity / w) * element;
  if (!host_reads_device) {
    f.pinned = offload::pinned_allocation((stage0 ? capacity : capacity / w) * element);
  }
  return f;
}

GradReducer::GradReducer(const PartitionLayout& layout, const ZeroConfig& config,
                         Communicator& comm, DType grad_dtype, PartitionedOptimizer& optimizer,
                         offload::Accelerator& accelerator)
    : layout_(layout),
      config_(config),
      comm_(comm),
      grad_dtype_(grad_dtype),
      comm_dtype_(parse_comm_dtype(config.communication_data_type, grad_dtype)),
      optimizer_(optimizer),
      accelerator_(accelerator),
      host_reads_device_(accelerator.host_reads_device_memory()),
      world_(comm.world_size()),
      stage0_(layout.world_size() == 1 && comm.world_size() > 1) {
  if (!stage0_ && layout.world_size() != comm.world_size()) {
    throw ZeroError(fmt::format("gradient reducer: a layout for {} ranks with {} ranks running",
                                layout.world_size(), comm.world_size()));
  }
  contributions_.assign(layout_.param_count(), 1);
  received_.assign(layout_.param_count(), 0);
  pending_.resize(layout_.param_count());
  if (!host_reads_device_) {
    stream_ = accelerator_.create_stream();
  }
  uint64_t largest = 0;
  uint64_t total = 0;
  if (world_ == 1) {
    // No buckets: each gradient goes to the host whole, through the staging buffer.
    if (!host_reads_device_) {
      for (size_t p = 0; p < layout_.param_count(); ++p) {
        largest = std::max(largest, layout_.slice(p).numel);
      }
      staging_ = aio::PinnedBuffer(largest * sizeof(float));
    }
    return;
  }
  for (size_t p = 0; p < layout_.param_count(); ++p) {
    const uint64_t padded = stage0_ ? layout_.slice(p).numel
                                    : layout_.slice(p).slice_numel * static_cast<uint64_t>(world_);
    largest = std::max(largest, padded);
    total += padded;
  }
  capacity_ = bucket_capacity(config_, largest, total);
  const size_t element = dtype_size(comm_dtype_);
  fill_ = accelerator_.allocate(capacity_ * element, "gradient bucket (filling)");
  fill_view_ = view(fill_, comm_dtype_);
  const size_t slots = bucket_slots(config_);
  for (size_t s = 0; s < slots; ++s) {
    send_[s] = accelerator_.allocate(capacity_ * element, "gradient bucket (reducing)");
    send_view_[s] = view(send_[s], comm_dtype_);
    if (!stage0_ && config_.reduce_scatter) {
      // A bucket's region is at most capacity / world elements (a bucket holds whole
      // padded parameters, each a multiple of the world size).
      recv_[s] = accelerator_.allocate(capacity_ / static_cast<uint64_t>(world_) * element,
                                       "gradient bucket (this rank's region)");
    }
  }
  if (!host_reads_device_) {
    // What host code reads of a bucket: all of it at stage 0, this rank's region otherwise.
    staging_ = aio::PinnedBuffer((stage0_ ? capacity_ : capacity_ / static_cast<uint64_t>(world_)) *
                                 element);
  }
}

at::Tensor GradReducer::view(const offload::DeviceBuffer& buffer, DType dtype) {
  return device_tensor(accelerator_, buffer.data(),
                       {static_cast<int64_t>(buffer.size() / dtype_size(dtype))}, dtype);
}

const void* GradReducer::to_host(const void* device, uint64_t count) {
  if (host_reads_device_) {
    return device;
  }
  const size_t bytes = count * dtype_size(comm_dtype_);
  accelerator_.copy_to_host(staging_.data(), device, bytes, *stream_);
  stream_->synchronize();
  return staging_.data();
}

GradReducer::~GradReducer() {
  for (InFlight& bucket : in_flight_) {
    try {
      bucket.work->wait();
    } catch (...) {
    }
  }
}

uint64_t GradReducer::bucket_bytes() const noexcept {
  return fill_.size() + send_[0].size() + send_[1].size() + recv_[0].size() + recv_[1].size();
}

void GradReducer::set_contributions(size_t param, int count) {
  if (param >= contributions_.size() || count < 1) {
    throw ZeroError(fmt::format("gradient reducer: {} contributions for parameter {} of {}", count,
                                param, contributions_.size()));
  }
  contributions_[param] = count;
}

void GradReducer::begin_micro_batch(int micro_batch) {
  std::fill(received_.begin(), received_.end(), 0);
  optimizer_.begin_micro_batch(micro_batch);
}

void GradReducer::add(size_t param, const at::Tensor& grad) {
  if (param >= contributions_.size()) {
    throw ZeroError(
        fmt::format("gradient reducer: parameter {} of {}", param, contributions_.size()));
  }
  const ParamSlice& s = layout_.slice(param);
  if (grad.defined() && static_cast<uint64_t>(grad.numel()) != s.numel) {
    throw ZeroError(
        fmt::format("gradient reducer: a gradient of {} elements for parameter {} "
                    "of {}",
                    grad.numel(), param, s.numel));
  }
  if (contributions_[param] > 1) {
    // Summed in fp32 on the device until the last contribution arrives.
    at::Tensor& sum = pending_[param];
    if (received_[param] == 0) {
      sum = grad.defined() ? grad.reshape({-1}).to(at::kFloat, /*non_blocking=*/false,
                                                   /*copy=*/true)
                           : at::Tensor();
    } else if (grad.defined()) {
      sum = sum.defined() ? sum.add_(grad.reshape({-1}))
                          : grad.reshape({-1}).to(at::kFloat, /*non_blocking=*/false,
                                                  /*copy=*/true);
    }
    if (++received_[param] < contributions_[param]) {
      return;
    }
    add_to_bucket(param, sum);
    sum = at::Tensor();
    return;
  }
  ++received_[param];
  add_to_bucket(param, grad);
}

void GradReducer::add_to_bucket(size_t param, const at::Tensor& grad) {
  const ParamSlice& s = layout_.slice(param);
  if (world_ == 1) {
    // One rank: the whole gradient is this rank's slice (no padding).
    at::Tensor flat;
    if (!grad.defined()) {
      // A zero contribution still goes in, as the optimizer stages its sub-groups by it.
      flat = at::zeros({static_cast<int64_t>(s.numel)}, at::kFloat);
    } else if (flat = grad.reshape({-1}); host_reads_device_) {
      flat = flat.contiguous();
    } else {
      flat = at::from_blob(staging_.data(), {flat.numel()}, flat.options().device(at::kCPU))
                 .copy_(flat);
    }
    optimizer_.accumulate(s.partition_offset, flat.data_ptr(), dtype_of(flat.scalar_type()),
                          s.numel, 1.0f);
    return;
  }
  const uint64_t padded = s.slice_numel * static_cast<uint64_t>(world_);
  const uint64_t need = stage0_ ? s.numel : padded;
  if (fill_used_ + need > capacity_) {
    issue_bucket();
  }
  const auto used = static_cast<int64_t>(fill_used_);
  at::Tensor dst = fill_view_.narrow(0, used, static_cast<int64_t>(s.numel));
  if (grad.defined()) {
    dst.copy_(grad.reshape({-1}));
  } else {
    dst.zero_();
  }
  if (need > s.numel) {
    fill_view_.narrow(0, used + static_cast<int64_t>(s.numel), static_cast<int64_t>(need - s.numel))
        .zero_();
  }
  fill_params_.push_back({param, fill_used_});
  fill_used_ += need;
  stats_.peak_bucket_elements = std::max(stats_.peak_bucket_elements, fill_used_);
}

void GradReducer::issue_bucket() {
  if (fill_params_.empty()) {
    return;
  }
  const size_t slots = config_.overlap_comm ? 2 : 1;
  if (in_flight_.size() >= slots) {
    finish_oldest();
  }
  InFlight bucket;
  bucket.slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % slots;
  const size_t element = dtype_size(comm_dtype_);
  auto* send = static_cast<std::byte*>(send_[bucket.slot].data());
  at::Tensor& send_view = send_view_[bucket.slot];
  const auto used = static_cast<int64_t>(fill_used_);
  if (stage0_) {
    send_view.narrow(0, 0, used).copy_(fill_view_.narrow(0, 0, used));
    wait_for_compute(send_view.device());
    bucket.count = fill_used_;
    bucket.params = std::move(fill_params_);
    bucket.work = comm_.all_reduce(send, fill_used_, comm_dtype_, ReduceOp::kSum);
  } else {
    // Rank-major: region r holds slice r of every parameter, in bucket order.
    const uint64_t count = fill_used_ / static_cast<uint64_t>(world_);
    uint64_t region_offset = 0;
    for (const auto& [param, fill_offset] : fill_params_) {
      const uint64_t slice = layout_.slice(param).slice_numel;
      for (int r = 0; r < world_; ++r) {
        send_view
            .narrow(0, static_cast<int64_t>(static_cast<uint64_t>(r) * count + region_offset),
                    static_cast<int64_t>(slice))
            .copy_(fill_view_.narrow(
                0, static_cast<int64_t>(fill_offset + static_cast<uint64_t>(r) * slice),
                static_cast<int64_t>(slice)));
      }
      bucket.params.push_back({param, region_offset});
      region_offset += slice;
    }
    wait_for_compute(send_view.device());
    bucket.count = count;
    if (config_.reduce_scatter) {
      bucket.work =
          comm_.reduce_scatter(send, recv_[bucket.slot].data(), count, comm_dtype_, ReduceOp::kSum);
    } else {
      bucket.work = comm_.all_reduce(send, count * static_cast<uint64_t>(world_), comm_dtype_,
                                     ReduceOp::kSum);
    }
  }
  ++stats_.buckets;
  stats_.bytes_sent += fill_used_ * element;
  fill_params_.clear();
  fill_used_ = 0;
  in_flight_.push_back(std::move(bucket));
  if (!config_.overlap_comm) {
    finish_oldest();
  }
}

void GradReducer::finish_oldest() {
  InFlight bucket = std::move(in_flight_.front());
  in_flight_.pop_front();
  const auto start = std::chrono::steady_clock::now();
  bucket.work->wait();
  stats_.wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  process(bucket);
}

void GradReducer::process(InFlight& bucket) {
  const size_t element = dtype_size(comm_dtype_);
  const float scale = 1.0f / static_cast<float>(world_);
  if (stage0_) {
    const auto* data =
        static_cast<const std::byte*>(to_host(send_[bucket.slot].data(), bucket.count));
    for (const auto& [param, offset] : bucket.params) {
      const ParamSlice& s = layout_.slice(param);
      optimizer_.accumulate(s.partition_offset, data + offset * element, comm_dtype_, s.numel,
                            scale);
    }
    return;
  }
  const void* region = config_.reduce_scatter
                           ? recv_[bucket.slot].data()
                           : static_cast<const std::byte*>(send_[bucket.slot].data()) +
                                 static_cast<uint64_t>(comm_.rank()) * bucket.count * element;
  const auto* mine = static_cast<const std::byte*>(to_host(region, bucket.count));
  for (const auto& [param, offset] : bucket.params) {
    const ParamSlice& s = layout_.slice(param);
    optimizer_.accumulate(s.partition_offset, mine + offset * element, comm_dtype_, s.slice_numel,
                          scale);
  }
}

void GradReducer::end_micro_batch() {
  for (size_t p = 0; p < pending_.size(); ++p) {
    if (contributions_[p] > 1 && received_[p] > 0 && received_[p] < contributions_[p]) {
      add_to_bucket(p, pending_[p]);
      pending_[p] = at::Tensor();
    }
  }
  issue_bucket();
  while (!in_flight_.empty()) {
    finish_oldest();
  }
  optimizer_.end_micro_batch();
}

}  // namespace zinf::zero
