#include "zero/param_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "zero/dtype_convert.h"
#include "zero/error.h"

namespace zinf::zero {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Whether the pieces (offset, numel) cover [0, slice_numel). Sorts them.
bool covers_slice(std::vector<std::pair<uint64_t, uint64_t>>& pieces, uint64_t slice_numel) {
  std::sort(pieces.begin(), pieces.end());
  uint64_t covered = 0;
  for (const auto& [offset, numel] : pieces) {
    if (offset > covered) {
      return false;
    }
    covered = std::max(covered, offset + numel);
  }
  return covered >= slice_numel;
}

}  // namespace

ParamStore::ParamStore(const Options& options, const PartitionLayout& layout,
                       std::vector<size_t> layout_params, offload::Accelerator& accelerator,
                       Communicator& comm, offload::ParamSwapper* swapper)
    : options_(options),
      element_bytes_(dtype_size(options.dtype)),
      layout_(layout),
      accelerator_(accelerator),
      comm_(comm),
      swapper_(options.tier == OffloadTarget::kNvme ? swapper : nullptr) {
  if (options_.tier == OffloadTarget::kNvme && swapper_ == nullptr) {
    throw ZeroError("offload_param.device is nvme but no param swapper was made");
  }
  if (swapper_ != nullptr && swapper_->config().element_bytes != element_bytes_) {
    throw ZeroError(fmt::format("param swapper holds {}-byte elements, the store {}-byte ones",
                                swapper_->config().element_bytes, element_bytes_));
  }
  h2d_ = accelerator_.create_stream();
  params_.resize(layout_params.size());
  size_t max_chunks = 0;
  uint64_t max_slice = 0;
  for (size_t m = 0; m < params_.size(); ++m) {
    const ParamSlice& s = layout_.slice(layout_params[m]);
    params_[m].layout_index = layout_params[m];
    params_[m].numel = s.numel;
    params_[m].slice_numel = s.slice_numel;
    max_chunks = std::max(max_chunks, chunks_of(params_[m]));
    max_slice = std::max(max_slice, s.slice_numel);
  }
  if (swapper_ != nullptr) {
    const size_t count = swapper_->config().buffer_count;
    if (max_chunks > count) {
      throw ZeroError(fmt::format(
          "offload_param: the largest parameter slice ({} elements) needs {} pinned buffers of "
          "offload_param.buffer_size = {} elements, but offload_param.buffer_count is {}: "
          "raise buffer_count to {} or buffer_size to {}",
          max_slice, max_chunks, swapper_->config().buffer_size, count, max_chunks,
          (max_slice + count - 1) / count));
    }
    read_ahead_buffers_ = count > max_chunks ? count - max_chunks : 0;
  }
}

ParamStore::~ParamStore() {
  for (size_t m = 0; m < params_.size(); ++m) {
    try {
      release(m);
    } catch (...) {
      // Teardown after a failure: what could not be waited for was reported already.
    }
  }
  try {
    h2d_->synchronize();
  } catch (...) {
  }
}

size_t ParamStore::chunks_of(const Param& p) const noexcept {
  if (swapper_ == nullptr) {
    return 0;
  }
  const uint64_t buffer = swapper_->config().buffer_size;
  return static_cast<size_t>((p.slice_numel + buffer - 1) / buffer);
}

const std::byte* ParamStore::host_slice(const Param& p) const noexcept {
  return p.plain_slice ? p.plain_slice.get() : p.host_slice.data();
}

uint64_t ParamStore::host_bytes() const noexcept {
  uint64_t bytes = 0;
  for (const Param& p : params_) {
    if (p.plain_slice) {
      bytes += slice_bytes(p);
    }
  }
  return bytes;
}

uint64_t ParamStore::pinned_bytes() const {
  uint64_t bytes = 0;
  for (const Param& p : params_) {
    if (p.host_slice.data() != nullptr) {
      bytes += p.host_slice.capacity();
    } else if (swapper_ != nullptr && swapper_->in_cpu(p.swap_id)) {
      bytes += (slice_bytes(p) + aio::kPinAlignment - 1) / aio::kPinAlignment * aio::kPinAlignment;
    }
  }
  return bytes;
}

void ParamStore::set_slice(size_t m, const void* slice) {
  Param& p = params_.at(m);
  const uint64_t bytes = slice_bytes(p);
  switch (options_.tier) {
    case OffloadTarget::kNone:
      p.device_slice = accelerator_.allocate(bytes, "parameter slice");
      accelerator_.copy_to_device(p.device_slice.data(), slice, bytes, *h2d_);
      h2d_->synchronize();
      break;
    case OffloadTarget::kCpu:
      if (options_.pin_memory) {
        p.host_slice = aio::PinnedBuffer(bytes);
      } else {
        p.plain_slice = std::make_unique<std::byte[]>(bytes);
      }
      std::memcpy(const_cast<std::byte*>(host_slice(p)), slice, bytes);
      break;
    case OffloadTarget::kNvme:
      p.swap_id = swapper_->add(p.slice_numel, slice);
      break;
  }
}

void ParamStore::write_slice(size_t m, uint64_t slice_offset, const void* data, uint64_t numel) {
  Param& p = params_.at(m);
  if (slice_offset > p.slice_numel || numel > p.slice_numel - slice_offset) {
    throw ZeroError(fmt::format("param store: write of {} elements at {} exceeds the slice of {}",
                                numel, slice_offset, p.slice_numel));
  }
  if (p.copy_started || p.gather || p.gathered || p.swapped_in) {
    throw ZeroError(
        fmt::format("param store: parameter {} is in use while its slice is written", m));
  }
  const uint64_t offset = slice_offset * element_bytes_;
  const uint64_t bytes = numel * element_bytes_;
  switch (options_.tier) {
    case OffloadTarget::kNone:
      accelerator_.copy_to_device(static_cast<std::byte*>(p.device_slice.data()) + offset, data,
                                  bytes, *h2d_);
      h2d_->synchronize();
      break;
    case OffloadTarget::kCpu:
      std::memcpy(const_cast<std::byte*>(host_slice(p)) + offset, data, bytes);
      break;
    case OffloadTarget::kNvme: {
      const bool whole = slice_offset == 0 && numel == p.slice_numel;
      if (swapper_->in_cpu(p.swap_id) || (whole && !p.pending)) {
        swapper_->write_back_range(p.swap_id, slice_offset, data, numel);
        break;
      }
      if (!p.pending) {
        p.pending = std::make_unique<PendingWrite>();
        p.pending->values = std::make_unique<std::byte[]>(slice_bytes(p));
      }
      PendingWrite& w = *p.pending;
      std::memcpy(w.values.get() + offset, data, bytes);
      w.pieces.emplace_back(slice_offset, numel);
      w.written_numel += numel;
      if (w.written_numel >= p.slice_numel && covers_slice(w.pieces, p.slice_numel)) {
        const std::unique_ptr<PendingWrite> done = std::move(p.pending);
        swapper_->write_back(p.swap_id, done->values.get());
      }
      break;
    }
  }
}

void ParamStore::flush_pending(Param& p) {
  if (!p.pending) {
    return;
  }
  const std::unique_ptr<PendingWrite> w = std::move(p.pending);
  for (const auto& [slice_offset, numel] : w->pieces) {
    swapper_->write_back_range(p.swap_id, slice_offset,
                               w->values.get() + slice_offset * element_bytes_, numel);
  }
}

void ParamStore::flush_writes() {
  for (Param& p : params_) {
    flush_pending(p);
  }
}

void ParamStore::read_slice(size_t m, void* dst) {
  Param& p = params_.at(m);
  flush_pending(p);
  switch (options_.tier) {
    case OffloadTarget::kNone:
      accelerator_.copy_to_host(dst, p.device_slice.data(), slice_bytes(p), *h2d_);
      h2d_->synchronize();
      break;
    case OffloadTarget::kCpu:
      std::memcpy(dst, host_slice(p), slice_bytes(p));
      break;
    case OffloadTarget::kNvme:
      swapper_->read(p.swap_id, dst);
      break;
  }
}

void* ParamStore::full_data(size_t m) const {
  const Param& p = params_.at(m);
  if (!p.gathered) {
    return nullptr;
  }
  return comm_.world_size() == 1 ? p.device_slice.data() : p.full.data();
}

void ParamStore::set_callbacks(std::function<void(size_t, void*)> on_gathered,
                               std::function<void(size_t)> on_released) {
  on_gathered_ = std::move(on_gathered);
  on_released_ = std::move(on_released);
}

bool ParamStore::start_read(size_t m) {
  Param& p = params_.at(m);
  if (p.read_started) {
    return true;
  }
  flush_pending(p);
  if (swapper_ == nullptr || swapper_->in_cpu(p.swap_id)) {
    p.read_started = true;
    return true;
  }
  const size_t chunks = chunks_of(p);
  if (held_buffers_ + chunks > read_ahead_buffers_) {
    return false;
  }
  const offload::ParamId id = p.swap_id;
  if (swapper_->prefetch({&id, 1}) != 1) {
    return false;
  }
  p.swapped_in = true;
  held_buffers_ += chunks;
  p.read_started = true;
  return true;
}

void ParamStore::drop_swap(Param& p) {
  if (!p.swapped_in) {
    return;
  }
  p.swapped_in = false;
  held_buffers_ -= chunks_of(p);
  // The store only reads the view: its buffers may serve the next fetch of this slice.
  swapper_->release_cached(p.swap_id);
}

void ParamStore::start_copy(size_t m) {
  Param& p = params_.at(m);
  if (p.copy_started) {
    return;
  }
  flush_pending(p);
  p.read_started = true;
  if (options_.tier == OffloadTarget::kNone) {
    p.copy_started = true;
    return;
  }
  const auto start = Clock::now();
  p.device_slice = accelerator_.allocate(slice_bytes(p), "parameter slice");
  if (!p.copied) {
    p.copied = accelerator_.create_event();
  }
  if (options_.tier == OffloadTarget::kCpu) {
    accelerator_.copy_to_device(p.device_slice.data(), host_slice(p), slice_bytes(p), *h2d_);
  } else {
    const bool in_cpu = swapper_->in_cpu(p.swap_id);
    if (!in_cpu && !p.swapped_in) {
      // The swap-in below must not wait for buffers only this thread can give back: first
      // let copies in flight finish (their buffers return), then drop reads ahead that
      // have not been copied yet (latest first).
      const size_t chunks = chunks_of(p);
      const size_t count = swapper_->config().buffer_count;
      for (size_t other = 0; other < params_.size() && held_buffers_ + chunks > count; ++other) {
        if (params_[other].swapped_in && params_[other].copy_started) {
          wait_copy(params_[other]);
        }
      }
      for (size_t other = params_.size(); other-- > 0 && held_buffers_ + chunks > count;) {
        if (params_[other].swapped_in && !params_[other].copy_started) {
          drop_swap(params_[other]);
          params_[other].read_started = false;
        }
      }
    }
    const offload::ParamView view = swapper_->swap_in(p.swap_id);
    if (!in_cpu && !p.swapped_in) {
      p.swapped_in = true;
      held_buffers_ += chunks_of(p);
    }
    uint64_t offset = 0;
    for (const offload::ParamView::Chunk& chunk : view.chunks) {
      const uint64_t bytes = chunk.numel * element_bytes_;
      accelerator_.copy_to_device(static_cast<std::byte*>(p.device_slice.data()) + offset,
                                  chunk.data, bytes, *h2d_);
      offset += bytes;
    }
  }
  accelerator_.record_event(*p.copied, *h2d_);
  p.copy_started = true;
  stats_.h2d_bytes += slice_bytes(p);
  stats_.wait_seconds += seconds_since(start);
}

void ParamStore::wait_copy(Param& p) {
  if (p.copied) {
    const auto start = Clock::now();
    p.copied->synchronize();
    stats_.wait_seconds += seconds_since(start);
  }
  drop_swap(p);
}

void ParamStore::start_gather(size_t m) {
  Param& p = params_.at(m);
  if (p.gather || p.gathered) {
    return;
  }
  start_copy(m);
  if (comm_.world_size() == 1) {
    return;
  }
  wait_copy(p);
  p.full = accelerator_.allocate(slice_bytes(p) * static_cast<uint64_t>(comm_.world_size()),
                                 "gathered parameter");
  p.gather = comm_.all_gather(p.device_slice.data(), p.full.data(), p.slice_numel, options_.dtype);
  ++stats_.gathers;
  stats_.gathered_bytes += p.full.size();
}

void ParamStore::wait_gathered(size_t m) {
  Param& p = params_.at(m);
  if (p.gathered) {
    return;
  }
  start_gather(m);
  if (comm_.world_size() == 1) {
    wait_copy(p);
  } else {
    const auto start = Clock::now();
    p.gather->wait();
    const double waited = seconds_since(start);
    stats_.wait_seconds += waited;
    stats_.gather_wait_seconds += waited;
    p.gather.reset();
    if (options_.tier != OffloadTarget::kNone) {
      p.device_slice = {};  // the full parameter holds it now
    }
  }
  p.gathered = true;
  if (on_gathered_) {
    on_gathered_(m, full_data(m));
  }
}

void ParamStore::release(size_t m) {
  Param& p = params_.at(m);
  if (p.gathered && on_released_) {
    on_released_(m);
  }
  p.gathered = false;
  if (p.gather) {
    WorkPtr work = std::move(p.gather);
    work->wait();
  }
  if (p.copy_started) {
    wait_copy(p);
  }
  drop_swap(p);
  p.full = {};
  if (options_.tier != OffloadTarget::kNone) {
    p.device_slice = {};
  }
  p.read_started = false;
  p.copy_started = false;
}

offload::ParamSwapperConfig param_swapper_config(const ZeroConfig& config) {
  offload::ParamSwapperConfig pc;
  pc.buffer_count = config.param_buffer_count;
  pc.buffer_size = config.param_buffer_size;
  pc.max_in_cpu = config.param_max_in_cpu;
  pc.element_bytes = dtype_size(compute_dtype(config.precision));
  return pc;
}

}  // namespace zinf::zero
