#include "offload/param_swapper.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

#include "offload/error.h"

namespace zinf::offload {

ParamSwapper::ParamSwapper(const ParamSwapperConfig& config, NvmeStore& store,
                           Accelerator* accelerator)
    : config_(config), store_(store) {
  if (config_.buffer_count == 0 || config_.buffer_size == 0 || config_.element_bytes == 0) {
    throw OffloadError(ErrorKind::kConfig,
                       "offload_param: buffer_count (" + std::to_string(config_.buffer_count) +
                           "), buffer_size (" + std::to_string(config_.buffer_size) +
                           ") and the element size must be positive");
  }
  pool_ = std::make_unique<PinnedBufferPool>(config_.buffer_count,
                                             config_.buffer_size * config_.element_bytes,
                                             accelerator, "param pool (offload_param)");
  queue_ = store_.make_queue();
}

ParamSwapper::~ParamSwapper() {
  try {
    queue_->wait();  // no read may land in a buffer after it went back to the pool
  } catch (const std::exception&) {
    // The swapper is going away: nobody is left to read the partition.
  }
}

ParamSwapper::Partition& ParamSwapper::get(ParamId id) {
  if (id >= partitions_.size()) {
    throw OffloadError(ErrorKind::kUsage, "unknown param partition id " + std::to_string(id));
  }
  return partitions_[id];
}

const ParamSwapper::Partition& ParamSwapper::get(ParamId id) const {
  if (id >= partitions_.size()) {
    throw OffloadError(ErrorKind::kUsage, "unknown param partition id " + std::to_string(id));
  }
  return partitions_[id];
}

uint64_t ParamSwapper::chunk_numel(const Partition& p, size_t chunk) const {
  return std::min(config_.buffer_size, p.numel - chunk * config_.buffer_size);
}

ParamId ParamSwapper::add(uint64_t numel, const void* initial) {
  if (numel == 0) {
    throw OffloadError(ErrorKind::kUsage, "param partition of 0 elements");
  }
  Partition p;
  p.numel = numel;
  const uint64_t bytes = numel * config_.element_bytes;
  if (numel <= config_.max_in_cpu - cpu_elements_) {
    p.cpu = std::make_unique<aio::PinnedBuffer>(bytes);
    std::memcpy(p.cpu->data(), initial, bytes);
    cpu_elements_ += numel;
    counters_.add_cpu_written(bytes);
  } else {
    const uint64_t chunks = (numel + config_.buffer_size - 1) / config_.buffer_size;
    for (uint64_t c = 0; c < chunks; ++c) {
      p.chunks.push_back(store_.allocate(chunk_numel(p, c) * config_.element_bytes));
    }
    const auto* src = static_cast<const std::byte*>(initial);
    for (uint64_t c = 0; c < chunks; ++c) {
      queue_->async_write(p.chunks[c], src + c * config_.buffer_size * config_.element_bytes);
    }
    ScopedTime time(counters_, Counters::Clock::kIoWait);
    queue_->wait();
    counters_.add_nvme_written(bytes);
  }
  partitions_.push_back(std::move(p));
  return static_cast<ParamId>(partitions_.size() - 1);
}

bool ParamSwapper::in_cpu(ParamId id) const { return get(id).cpu != nullptr; }

uint64_t ParamSwapper::numel(ParamId id) const { return get(id).numel; }

bool ParamSwapper::resident(ParamId id) const {
  const Partition& p = get(id);
  return p.cpu != nullptr || !p.buffers.empty();
}

void ParamSwapper::queue_reads(Partition& p) {
  for (size_t c = 0; c < p.chunks.size(); ++c) {
    queue_->async_read(p.chunks[c], p.buffers[c].data());
  }
  p.reading = true;
}

void ParamSwapper::wait_reads() {
  std::vector<Partition*> reading;
  for (Partition& p : partitions_) {
    if (p.reading) {
      reading.push_back(&p);
    }
  }
  if (reading.empty()) {
    return;
  }
  try {
    ScopedTime time(counters_, Counters::Clock::kIoWait);
    queue_->wait();
  } catch (...) {
    // What those buffers hold is unknown: drop them, so a later swap_in reads again.
    for (Partition* p : reading) {
      p->reading = false;
      p->buffers.clear();
    }
    throw;
  }
  for (Partition* p : reading) {
    p->reading = false;
    counters_.add_nvme_read(p->numel * config_.element_bytes);
  }
}

size_t ParamSwapper::prefetch(std::span<const ParamId> ids) {
  size_t queued = 0;
  for (ParamId id : ids) {
    Partition& p = get(id);
    if (p.cpu != nullptr || !p.buffers.empty()) {
      continue;  // resident or already on its way
    }
    if (p.chunks.size() > pool_->buffer_count()) {
      break;  // could never be swapped in; swap_in reports it
    }
    std::vector<PinnedBufferPool::Lease> buffers = pool_->try_acquire(p.chunks.size());
    if (buffers.empty()) {
      break;  // the pool is busy: prefetch no further than it allows
    }
    p.buffers = std::move(buffers);
    queue_reads(p);
    ++queued;
  }
  return queued;
}

ParamView ParamSwapper::swap_in(ParamId id) {
  Partition& p = get(id);
  ParamView view;
  view.numel = p.numel;
  if (p.cpu != nullptr) {
    view.in_cpu = true;
    view.chunks.push_back({p.cpu->data(), p.numel});
    counters_.add_cpu_read(p.numel * config_.element_bytes);
    return view;
  }
  if (p.buffers.empty()) {
    if (p.chunks.size() > pool_->buffer_count()) {
      throw OffloadError(ErrorKind::kPool,
                         "param partition " + std::to_string(id) + " of " +
                             std::to_string(p.numel) + " elements needs " +
                             std::to_string(p.chunks.size()) + " buffers of " +
                             std::to_string(config_.buffer_size) +
                             " elements, but offload_param.buffer_count is " +
                             std::to_string(pool_->buffer_count()) +
                             " (raise buffer_count or buffer_size, or use read())");
    }
    p.buffers = pool_->acquire(p.chunks.size());
    queue_reads(p);
  }
  if (p.reading) {
    wait_reads();
  }
  for (size_t c = 0; c < p.chunks.size(); ++c) {
    view.chunks.push_back({p.buffers[c].data(), chunk_numel(p, c)});
  }
  return view;
}

void ParamSwapper::release(ParamId id) {
  Partition& p = get(id);
  if (p.reading) {
    wait_reads();  // the kernel may still be writing into the buffers
  }
  p.buffers.clear();
}

void ParamSwapper::write_back(ParamId id, const void* data) {
  write_back_range(id, 0, data, get(id).numel);
}

void ParamSwapper::write_back_range(ParamId id, uint64_t offset, const void* data, uint64_t numel) {
  Partition& p = get(id);
  if (offset > p.numel || numel > p.numel - offset) {
    throw OffloadError(ErrorKind::kUsage, "write_back of " + std::to_string(numel) +
                                              " elements at " + std::to_string(offset) +
                                              " exceeds param partition " + std::to_string(id) +
                                              " of " + std::to_string(p.numel));
  }
  const size_t eb = config_.element_bytes;
  const auto* src = static_cast<const std::byte*>(data);
  if (p.cpu != nullptr) {
    std::memcpy(p.cpu->data() + offset * eb, src, numel * eb);
    counters_.add_cpu_written(numel * eb);
    return;
  }
  if (p.reading) {
    wait_reads();
  }
  const uint64_t end = offset + numel;
  for (size_t c = 0; c < p.chunks.size(); ++c) {
    const uint64_t chunk_begin = c * config_.buffer_size;
    const uint64_t begin = std::max(offset, chunk_begin);
    const uint64_t stop = std::min(end, chunk_begin + chunk_numel(p, c));
    if (begin >= stop) {
      continue;
    }
    const std::byte* part = src + (begin - offset) * eb;
    store_.write_range(p.chunks[c], (begin - chunk_begin) * eb, part, (stop - begin) * eb);
    if (!p.buffers.empty()) {  // keep a resident view in step with the stored values
      std::memcpy(p.buffers[c].data() + (begin - chunk_begin) * eb, part, (stop - begin) * eb);
    }
  }
  counters_.add_nvme_written(numel * eb);
}

void ParamSwapper::read(ParamId id, void* dst) {
  Partition& p = get(id);
  const size_t eb = config_.element_bytes;
  auto* out = static_cast<std::byte*>(dst);
  if (p.cpu != nullptr) {
    std::memcpy(out, p.cpu->data(), p.numel * eb);
    counters_.add_cpu_read(p.numel * eb);
    return;
  }
  if (p.reading) {
    wait_reads();
  }
  for (size_t c = 0; c < p.chunks.size(); ++c) {
    store_.read(p.chunks[c], out + c * config_.buffer_size * eb);
  }
  counters_.add_nvme_read(p.numel * eb);
}

uint64_t ParamSwapper::pinned_bytes() const noexcept { return pool_->stats().pinned_bytes; }

OffloadCounters ParamSwapper::counters() const {
  OffloadCounters c = counters_.snapshot();
  const PinnedPoolStats stats = pool_->stats();
  c.pool_buffers = stats.buffer_count;
  c.pool_high_water = stats.high_water;
  c.pinned_bytes = stats.pinned_bytes;
  return c;
}

}  // namespace zinf::offload
