// PinnedBuffer: aligned allocation, mlock with a single warning, accelerator hooks.
#include "aio/pinned_buffer.h"

#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>

#include "aio/pinned_budget.h"

namespace zinf::aio {
namespace {

std::mutex g_hooks_mutex;
PinHooks g_hooks;  // guarded by g_hooks_mutex
std::atomic<bool> g_mlock_warned{false};

int lock_with_mlock(void* ptr, size_t bytes) { return mlock(ptr, bytes) == 0 ? 0 : errno; }

std::atomic<MemoryLocker> g_locker{&lock_with_mlock};

PinHooks current_hooks() {
  std::lock_guard<std::mutex> lock(g_hooks_mutex);
  return g_hooks;
}

}  // namespace

MemoryLocker set_memory_locker(MemoryLocker locker) {
  return g_locker.exchange(locker != nullptr ? locker : &lock_with_mlock);
}

void set_pin_hooks(PinHooks hooks) {
  std::lock_guard<std::mutex> lock(g_hooks_mutex);
  g_hooks = std::move(hooks);
}

PinnedBuffer::PinnedBuffer(size_t bytes) {
  if (bytes == 0) return;
  if (bytes > SIZE_MAX - kPinAlignment) throw std::bad_alloc();
  const size_t capacity = (bytes + kPinAlignment - 1) / kPinAlignment * kPinAlignment;
  charge_pinned(capacity);  // throws PinnedMemoryLimitError before anything is allocated
  void* ptr = std::aligned_alloc(kPinAlignment, capacity);
  if (ptr == nullptr) {
    refund_pinned(capacity);
    throw std::bad_alloc();
  }
  data_ = static_cast<std::byte*>(ptr);
  size_ = bytes;
  capacity_ = capacity;
  if (const int error = g_locker.load()(ptr, capacity); error == 0) {
    locked_ = true;
  } else {
    if (!g_mlock_warned.exchange(true)) {
      spdlog::warn(
          "aio: mlock of {} bytes failed ({}); pinned buffers stay usable but unlocked "
          "(raise RLIMIT_MEMLOCK, e.g. `ulimit -l unlimited`); this is reported once",
          capacity, std::strerror(error));
    }
  }
  PinHooks hooks = current_hooks();
  if (hooks.on_pin) {
    try {
      hooks.on_pin(ptr, capacity);
    } catch (...) {
      release();
      throw;
    }
  }
  on_unpin_ = std::move(hooks.on_unpin);
}

PinnedBuffer::~PinnedBuffer() { release(); }

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      locked_(std::exchange(other.locked_, false)),
      on_unpin_(std::move(other.on_unpin_)) {
  other.on_unpin_ = nullptr;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    locked_ = std::exchange(other.locked_, false);
    on_unpin_ = std::move(other.on_unpin_);
    other.on_unpin_ = nullptr;
  }
  return *this;
}

void PinnedBuffer::release() noexcept {
  if (data_ == nullptr) return;
  if (on_unpin_) on_unpin_(data_, capacity_);
  if (locked_) munlock(data_, capacity_);
  std::free(data_);
  refund_pinned(capacity_);
  data_ = nullptr;
  size_ = 0;
  capacity_ = 0;
  locked_ = false;
  on_unpin_ = nullptr;
}

}  // namespace zinf::aio
