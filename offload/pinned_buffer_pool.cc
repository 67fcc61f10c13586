#include "offload/pinned_buffer_pool.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "aio/pinned_buffer.h"
#include "offload/accelerator.h"
#include "offload/error.h"

namespace zinf::offload {

// The buffers and the free list, shared by the pool and its leases.
struct PinnedBufferPool::Shared {
  Shared(size_t count, size_t bytes, Accelerator* accel) : accelerator(accel) {
    buffers.reserve(count);
    try {
      for (size_t i = 0; i < count; ++i) {
        buffers.emplace_back(bytes);
        if (accelerator != nullptr) {
          accelerator->register_host(buffers.back().data(), buffers.back().capacity());
          ++registered;
        }
        free_list.push_back(i);
        holder.emplace_back();
      }
    } catch (...) {
      // No destructor runs: undo the registrations made so far (an allocation or a
      // registration failed), then the buffers free themselves.
      unregister_all();
      throw;
    }
  }
  ~Shared() { unregister_all(); }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;

  void unregister_all() noexcept {
    for (size_t i = 0; i < registered; ++i) {
      accelerator->unregister_host(buffers[i].data(), buffers[i].capacity());
    }
    registered = 0;
  }

  // Hands out `count` free buffers to the calling thread. Caller holds `mutex`.
  std::vector<size_t> take(size_t count) {
    std::vector<size_t> taken(free_list.end() - static_cast<std::ptrdiff_t>(count),
                              free_list.end());
    free_list.resize(free_list.size() - count);
    const std::thread::id me = std::this_thread::get_id();
    for (size_t index : taken) {
      holder[index] = me;
    }
    held[me] += count;
    in_use += count;
    acquired += count;
    high_water = std::max(high_water, in_use);
    return taken;
  }

  void give_back(size_t index) noexcept {
    {
      std::lock_guard lock(mutex);
      const auto it = held.find(holder[index]);
      if (it != held.end() && --it->second == 0) {
        held.erase(it);
      }
      holder[index] = std::thread::id();
      free_list.push_back(index);
      --in_use;
    }
    changed.notify_all();
  }

  size_t held_by_caller() const {
    const auto it = held.find(std::this_thread::get_id());
    return it == held.end() ? 0 : it->second;
  }

  Accelerator* const accelerator;
  std::vector<aio::PinnedBuffer> buffers;  // fixed after construction
  size_t registered = 0;                   // buffers[0, registered) are registered

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<size_t> free_list;           // guarded by mutex
  std::vector<std::thread::id> holder;     // guarded by mutex: acquirer of each buffer
  std::map<std::thread::id, size_t> held;  // guarded by mutex: buffers per thread
  uint64_t next_ticket = 0;                // guarded by mutex: FIFO order of waiters
  uint64_t serving = 0;                    // guarded by mutex: ticket allowed to take
  size_t in_use = 0;                       // guarded by mutex
  size_t high_water = 0;                   // guarded by mutex
  uint64_t acquired = 0;                   // guarded by mutex
  uint64_t waits = 0;                      // guarded by mutex
  double wait_seconds = 0.0;               // guarded by mutex
};

PinnedBufferPool::Lease::Lease(std::shared_ptr<Shared> shared, size_t index, std::byte* data,
                               size_t size) noexcept
    : shared_(std::move(shared)), index_(index), data_(data), size_(size) {}

PinnedBufferPool::Lease::Lease(Lease&& other) noexcept
    : shared_(std::move(other.shared_)),
      index_(other.index_),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PinnedBufferPool::Lease& PinnedBufferPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    shared_ = std::move(other.shared_);
    index_ = other.index_;
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void PinnedBufferPool::Lease::release() noexcept {
  if (shared_ != nullptr) {
    shared_->give_back(index_);
    shared_.reset();
  }
  data_ = nullptr;
  size_ = 0;
}

PinnedBufferPool::PinnedBufferPool(size_t buffer_count, size_t buffer_bytes,
                                   Accelerator* accelerator, std::string name)
    : buffer_count_(buffer_count), buffer_bytes_(buffer_bytes), name_(std::move(name)) {
  if (buffer_count == 0 || buffer_bytes == 0) {
    throw OffloadError(ErrorKind::kConfig,
                       name_ + ": buffer_count (" + std::to_string(buffer_count) +
                           ") and buffer size (" + std::to_string(buffer_bytes) +
                           " bytes) must both be positive");
  }
  shared_ = std::make_shared<Shared>(buffer_count, buffer_bytes, accelerator);
}

PinnedBufferPool::~PinnedBufferPool() = default;

void PinnedBufferPool::check_satisfiable(size_t count, size_t held_by_caller, size_t in_use) const {
  if (count > buffer_count_ || held_by_caller > buffer_count_ - count) {
    throw OffloadError(
        ErrorKind::kPool,
        name_ + ": a request for " + std::to_string(count) + " buffers of " +
            std::to_string(buffer_bytes_) + " bytes can never be satisfied: the pool has " +
            std::to_string(buffer_count_) + " buffers, " + std::to_string(in_use) + " in use, " +
            std::to_string(held_by_caller) +
            " of them held by the requesting thread (raise buffer_count or buffer_size)");
  }
}

PinnedBufferPool::Lease PinnedBufferPool::acquire() {
  std::vector<Lease> leases = acquire(1);
  return std::move(leases.front());
}

std::vector<PinnedBufferPool::Lease> PinnedBufferPool::acquire(size_t count) {
  if (count == 0) {
    return {};
  }
  Shared& s = *shared_;
  std::vector<size_t> taken;
  {
    std::unique_lock lock(s.mutex);
    check_satisfiable(count, s.held_by_caller(), s.in_use);
    const uint64_t ticket = s.next_ticket++;
    auto ready = [&] { return s.serving == ticket && s.free_list.size() >= count; };
    if (!ready()) {
      const auto start = std::chrono::steady_clock::now();
      s.changed.wait(lock, ready);
      ++s.waits;
      s.wait_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    taken = s.take(count);
    ++s.serving;
  }
  s.changed.notify_all();  // the next ticket may be servable now
  std::vector<Lease> leases;
  leases.reserve(count);
  for (size_t index : taken) {
    leases.push_back(Lease(shared_, index, s.buffers[index].data(), buffer_bytes_));
  }
  return leases;
}

std::vector<PinnedBufferPool::Lease> PinnedBufferPool::acquire_bytes(uint64_t bytes) {
  const uint64_t count = bytes == 0 ? 1 : (bytes + buffer_bytes_ - 1) / buffer_bytes_;
  if (count > buffer_count_) {
    throw OffloadError(ErrorKind::kPool,
                       name_ + ": " + std::to_string(bytes) + " bytes need " +
                           std::to_string(count) + " buffers of " + std::to_string(buffer_bytes_) +
                           " bytes, but the pool has " + std::to_string(buffer_count_) +
                           " (raise buffer_count or buffer_size, or read it directly)");
  }
  return acquire(static_cast<size_t>(count));
}

std::optional<PinnedBufferPool::Lease> PinnedBufferPool::try_acquire() {
  std::vector<Lease> leases = try_acquire(1);
  if (leases.empty()) {
    return std::nullopt;
  }
  return std::move(leases.front());
}

std::vector<PinnedBufferPool::Lease> PinnedBufferPool::try_acquire(size_t count) {
  if (count == 0) {
    return {};
  }
  Shared& s = *shared_;
  std::vector<size_t> taken;
  {
    std::lock_guard lock(s.mutex);
    if (s.serving != s.next_ticket || s.free_list.size() < count) {
      return {};  // someone is waiting, or not enough free: do not jump the queue
    }
    taken = s.take(count);
  }
  std::vector<Lease> leases;
  leases.reserve(count);
  for (size_t index : taken) {
    leases.push_back(Lease(shared_, index, s.buffers[index].data(), buffer_bytes_));
  }
  return leases;
}

PinnedPoolStats PinnedBufferPool::stats() const {
  Shared& s = *shared_;
  PinnedPoolStats stats;
  stats.buffer_count = buffer_count_;
  stats.buffer_bytes = buffer_bytes_;
  stats.locked = true;
  for (const auto& buffer : s.buffers) {
    stats.pinned_bytes += buffer.capacity();
    stats.locked = stats.locked && buffer.locked();
  }
  std::lock_guard lock(s.mutex);
  stats.in_use = s.in_use;
  stats.high_water = s.high_water;
  stats.acquired = s.acquired;
  stats.waits = s.waits;
  stats.wait_seconds = s.wait_seconds;
  return stats;
}

std::vector<std::pair<void*, size_t>> PinnedBufferPool::ranges() const {
  std::vector<std::pair<void*, size_t>> result;
  result.reserve(shared_->buffers.size());
  for (const aio::PinnedBuffer& buffer : shared_->buffers) {
    result.emplace_back(buffer.data(), buffer.capacity());
  }
  return result;
}

}  // namespace zinf::offload
