#include "offload/param_swapper.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

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
}

Footprint ParamSwapper::footprint(const ParamSwapperConfig& config,
                                  const std::vector<uint64_t>& numels) {
  Footprint f;
  f.pinned = config.buffer_count * pinned_allocation(config.buffer_size * config.element_bytes);
  CpuTierBudget cpu(config.max_in_cpu);  // as add() places them
  for (const uint64_t numel : numels) {
    if (cpu.place(numel)) {
      f.pinned += pinned_allocation(numel * config.element_bytes);
      continue;
    }
    for (uint64_t done = 0; done < numel; done += config.buffer_size) {  // add()'s chunks
      f.nvme += swap_extent(std::min(config.buffer_size, numel - done) * config.element_bytes);
    }
  }
  return f;
}

// Every extent goes back to the store, each once no read of it is in flight: a partition's
// queue drains its reads (its destructor waits) before its buffers and extents go.
ParamSwapper::~ParamSwapper() {
  // A write batch may still run (behind the forward that never came): its extents cannot be
  // freed while written. Its failure no longer matters: the values go with this object.
  try {
    end_write_batch();
  } catch (const std::exception&) {
    // Discarded with the rest.
  }
  for (Partition& p : partitions_) {
    p.reads.reset();
    drop_buffers(p);
    for (ExtentId extent : p.chunks) {
      try {
        store_.free(extent);
      } catch (const std::exception& e) {
        // Only an extent with a write in flight can refuse, and every write here is waited
        // for; the space is lost to this store until it is destroyed, nothing worse.
        spdlog::warn("zinf offload: param swapper could not return a swap extent: {}", e.what());
      }
    }
    p.chunks.clear();
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

ParamSwapper::QueuePtr ParamSwapper::take_queue() {
  if (idle_queues_.empty()) {
    QueuePtr queue = store_.make_queue();
    if (register_pool_) {
      const std::vector<std::pair<void*, size_t>> ranges = pool_->ranges();
      register_pool_ = queue->register_buffers(ranges);
    }
    return queue;
  }
  QueuePtr queue = std::move(idle_queues_.back());
  idle_queues_.pop_back();
  return queue;
}

void ParamSwapper::return_queue(QueuePtr queue) noexcept {
  if (queue == nullptr || queue->pending() != 0) {
    return;  // not drained: let its destructor wait rather than reuse it
  }
  // Only queues whose last wait() succeeded come here: one that saw an error may hold a
  // broken aio handle (an engine failure fails all its later transfers) and is destroyed.
  try {
    idle_queues_.push_back(std::move(queue));
  } catch (...) {
    // No room to keep it: it is simply closed.
  }
}

ParamId ParamSwapper::add(uint64_t numel, const void* initial) {
  if (numel == 0) {
    throw OffloadError(ErrorKind::kUsage, "param partition of 0 elements");
  }
  Partition p;
  p.numel = numel;
  const uint64_t bytes = numel * config_.element_bytes;
  if (cpu_budget_.fits(numel)) {
    p.cpu = std::make_unique<aio::PinnedBuffer>(bytes);
    std::memcpy(p.cpu->data(), initial, bytes);
    partitions_.push_back(std::move(p));
    cpu_budget_.take(numel);
    counters_.add_cpu_written(bytes);
    return static_cast<ParamId>(partitions_.size() - 1);
  }
  const uint64_t chunks = (numel + config_.buffer_size - 1) / config_.buffer_size;
  try {
    for (uint64_t c = 0; c < chunks; ++c) {
      p.chunks.push_back(store_.allocate(chunk_numel(p, c) * config_.element_bytes));
    }
    // A queue of its own: the writes must not wait for (or collect) reads in flight.
    QueuePtr queue = take_queue();
    const auto* src = static_cast<const std::byte*>(initial);
    for (uint64_t c = 0; c < chunks; ++c) {
      queue->async_write(p.chunks[c], src + c * config_.buffer_size * config_.element_bytes);
    }
    {
      ScopedTime time(counters_, Counters::Clock::kIoWait);
      // On failure `queue` is drained too, and closed (not reused) as it goes out of scope.
      queue->wait();
    }
    return_queue(std::move(queue));
    partitions_.push_back(std::move(p));
  } catch (...) {
    for (ExtentId extent : p.chunks) {
      try {
        store_.free(extent);
      } catch (...) {
        // Only an extent still being written can refuse; the queue above has drained.
      }
    }
    throw;
  }
  counters_.add_nvme_written(bytes);
  return static_cast<ParamId>(partitions_.size() - 1);
}

bool ParamSwapper::in_cpu(ParamId id) const { return get(id).cpu != nullptr; }

uint64_t ParamSwapper::numel(ParamId id) const { return get(id).numel; }

bool ParamSwapper::resident(ParamId id) const {
  const Partition& p = get(id);
  return p.cpu != nullptr || !p.buffers.empty();
}

void ParamSwapper::queue_reads(Partition& p) {
  QueuePtr queue;
  try {
    queue = take_queue();
    for (size_t c = 0; c < p.chunks.size(); ++c) {
      queue->async_read(p.chunks[c], p.buffers[c].data());
    }
  } catch (...) {
    // Chunks queued before the failure may still land in the buffers: drain, then drop
    // them, so the partition is not left "resident" with contents nobody read. The queue
    // saw an error: it is closed, not reused.
    if (queue != nullptr) {
      try {
        queue->wait();
      } catch (...) {
        // Their contents are discarded with the buffers anyway.
      }
      queue.reset();
    }
    drop_buffers(p);
    throw;
  }
  p.reads = std::move(queue);
}

void ParamSwapper::wait_reads(Partition& p) {
  if (p.reads == nullptr) {
    return;
  }
  try {
    ScopedTime time(counters_, Counters::Clock::kIoWait);
    p.reads->wait();
  } catch (...) {
    // What the buffers hold is unknown: drop them, so a later swap_in reads again. The
    // queue (drained by its wait) may have a broken handle: closed, never reused.
    p.reads.reset();
    drop_buffers(p);
    throw;
  }
  return_queue(std::move(p.reads));
  counters_.add_nvme_read(p.numel * config_.element_bytes);
}

size_t ParamSwapper::prefetch(std::span<const ParamId> ids) {
  size_t queued = 0;
  for (ParamId id : ids) {
    Partition& p = get(id);
    if (p.cached_at != 0) {
      take_cached(p);  // its values are in its buffers already
      ++queued;
      continue;
    }
    if (p.cpu != nullptr || !p.buffers.empty()) {
      continue;  // resident or already on its way
    }
    if (p.chunks.size() > pool_->buffer_count() || p.torn) {
      break;  // could never be swapped in (or is torn); swap_in reports it
    }
    evict_for(p.chunks.size());
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
  check_not_torn(id, p);
  if (p.cached_at != 0) {
    take_cached(p);
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
    evict_for(p.chunks.size());
    p.buffers = pool_->acquire(p.chunks.size());
    queue_reads(p);
  }
  wait_reads(p);
  for (size_t c = 0; c < p.chunks.size(); ++c) {
    view.chunks.push_back({p.buffers[c].data(), chunk_numel(p, c)});
  }
  return view;
}

void ParamSwapper::wait_batch() {
  if (batch_ == nullptr) {
    return;
  }
  QueuePtr queue = std::move(batch_);
  std::vector<ParamId> ids;
  ids.swap(batch_ids_);
  try {
    ScopedTime time(counters_, Counters::Clock::kIoWait);
    queue->wait();
  } catch (...) {
    // Which chunks took new values is unknown: every partition of the batch is torn, its
    // view dropped. The queue saw an error: closed, not reused.
    for (ParamId id : ids) {
      Partition& p = get(id);
      p.in_batch = false;
      p.torn = true;
      drop_buffers(p);
    }
    throw;
  }
  for (ParamId id : ids) {
    get(id).in_batch = false;
  }
  return_queue(std::move(queue));
}

void ParamSwapper::end_write_batch() {
  batching_ = false;
  wait_batch();
}

void ParamSwapper::close_write_batch() noexcept { batching_ = false; }

void ParamSwapper::release(ParamId id) {
  Partition& p = get(id);
  if (p.in_batch) {
    wait_batch();
  }
  try {
    wait_reads(p);  // the kernel may still be writing into the buffers
  } catch (const OffloadError&) {
    // The data is being discarded: a failed read of it changes nothing.
  }
  drop_buffers(p);
}

void ParamSwapper::release_cached(ParamId id) {
  Partition& p = get(id);
  if (p.cpu != nullptr || p.buffers.empty() || p.cached_at != 0) {
    return;
  }
  try {
    wait_reads(p);
  } catch (const OffloadError&) {
    return;  // wait_reads dropped the buffers: nothing to keep
  }
  p.cached_at = ++cache_clock_;
}

// Never called for a partition in the write batch: release(), read() and write_back_range()
// wait for the batch first, and evict_for() passes over its partitions.
void ParamSwapper::drop_buffers(Partition& p) noexcept {
  p.buffers.clear();
  p.cached_at = 0;
}

void ParamSwapper::take_cached(Partition& p) {
  p.cached_at = 0;
  cache_hits_.fetch_add(1);
  cache_bytes_saved_.fetch_add(p.numel * config_.element_bytes);
}

void ParamSwapper::evict_for(size_t count) {
  size_t leased = 0;
  for (const Partition& p : partitions_) {
    leased += p.buffers.size();
  }
  while (leased + count > pool_->buffer_count()) {
    Partition* oldest = nullptr;
    for (Partition& p : partitions_) {
      if (p.cached_at != 0 && !p.in_batch &&
          (oldest == nullptr || p.cached_at < oldest->cached_at)) {
        oldest = &p;
      }
    }
    if (oldest == nullptr) {
      if (batch_ != nullptr) {
        wait_batch();  // the cached partitions left are being written: after that they go
        continue;
      }
      return;
    }
    leased -= oldest->buffers.size();
    drop_buffers(*oldest);
  }
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
  try {
    wait_reads(p);  // a resident view is patched below: its reads must have landed
  } catch (const OffloadError&) {
    // The view was dropped; the write below goes to the store all the same, and the next
    // swap_in reads the stored values (reporting the error again if it persists).
  }
  const uint64_t end = offset + numel;
  if (batching_ && !p.buffers.empty() && !p.in_batch) {
    // Whole chunks only: a partial chunk's write reads the rest of it first.
    bool whole_chunks = true;
    for (size_t c = 0; c < p.chunks.size() && whole_chunks; ++c) {
      const uint64_t chunk_begin = c * config_.buffer_size;
      const uint64_t chunk_end = chunk_begin + chunk_numel(p, c);
      const bool touched = offset < chunk_end && end > chunk_begin;
      whole_chunks = !touched || (offset <= chunk_begin && end >= chunk_end);
    }
    if (whole_chunks) {
      if (batch_ == nullptr) {
        batch_ = take_queue();
      }
      p.in_batch = true;
      batch_ids_.push_back(id);
      try {
        for (size_t c = 0; c < p.chunks.size(); ++c) {
          const uint64_t chunk_begin = c * config_.buffer_size;
          if (offset > chunk_begin || end < chunk_begin + chunk_numel(p, c)) {
            continue;
          }
          std::memcpy(p.buffers[c].data(), src + (chunk_begin - offset) * eb,
                      chunk_numel(p, c) * eb);
          batch_->async_write(p.chunks[c], p.buffers[c].data());  // may throw kSpace
        }
      } catch (...) {
        // The view took new values a chunk further than the writes queued: let the queued
        // ones end, then drop the view and refuse the partition until a whole write_back.
        try {
          wait_batch();
        } catch (...) {
          // This call's error is the one to report.
        }
        p.torn = true;
        drop_buffers(p);
        throw;
      }
      if (offset == 0 && numel == p.numel) {
        p.torn = false;  // every value is being written anew (torn again if that fails)
      }
      counters_.add_nvme_written(numel * eb);
      return;
    }
  }
  if (p.in_batch || batch_ != nullptr) {
    wait_batch();  // the view and the store are updated below: the batch's writes first
  }
  size_t chunks_written = 0;
  try {
    for (size_t c = 0; c < p.chunks.size(); ++c) {
      const uint64_t chunk_begin = c * config_.buffer_size;
      const uint64_t begin = std::max(offset, chunk_begin);
      const uint64_t stop = std::min(end, chunk_begin + chunk_numel(p, c));
      if (begin >= stop) {
        continue;
      }
      const std::byte* part = src + (begin - offset) * eb;
      store_.write_range(p.chunks[c], (begin - chunk_begin) * eb, part, (stop - begin) * eb);
      ++chunks_written;
      if (!p.buffers.empty()) {  // keep a resident view in step with the stored values
        std::memcpy(p.buffers[c].data() + (begin - chunk_begin) * eb, part, (stop - begin) * eb);
      }
    }
  } catch (...) {
    // The view holds new values in the chunks written so far and old ones after: drop it.
    // If some chunk already took new values, the stored partition mixes old and new (each
    // extent may be valid, so the store cannot tell): refuse it until it is whole again.
    drop_buffers(p);
    if (chunks_written > 0) {
      p.torn = true;
    }
    throw;
  }
  if (offset == 0 && numel == p.numel) {
    p.torn = false;  // every value was written anew
  }
  counters_.add_nvme_written(numel * eb);
}

void ParamSwapper::check_not_torn(ParamId id, const Partition& p) const {
  if (p.torn) {
    throw OffloadError(ErrorKind::kCorrupt,
                       "param partition " + std::to_string(id) + " of " + std::to_string(p.numel) +
                           " elements in swap file " + store_.path() +
                           " is torn: a write_back of it failed after part of the new values "
                           "was stored; write_back the whole partition to use it again");
  }
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
  if (p.in_batch) {
    wait_batch();
  }
  check_not_torn(id, p);
  // No need to wait for reads in flight into the pool buffers: both only read the extents.
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
