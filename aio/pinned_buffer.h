// Page-aligned, page-locked host memory for O_DIRECT transfers and device copies.
//
// A PinnedBuffer owns one allocation (aligned to 4096 bytes, size rounded up to a multiple
// of 4096). It is locked with mlock(); when the lock is refused (RLIMIT_MEMLOCK, EPERM) the
// buffer stays usable, unlocked, and one warning line is logged per process.
// Every buffer's capacity is charged to the process-wide pinned-memory budget
// (aio/pinned_budget.h) while it lives.
// The lock itself goes through a replaceable process-wide function (set_memory_locker), so
// tests can force a refusal where a real mlock never fails (root has CAP_IPC_LOCK, which
// ignores RLIMIT_MEMLOCK).
// A process-wide PinHooks pair lets an accelerator register the same memory with its driver
// (e.g. cudaHostRegister) right after allocation and unregister it before it is freed.
//
// Thread safety: a PinnedBuffer is not synchronized (one owner). set_pin_hooks() must be
// called before buffers are created from other threads; hooks must be thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace zinf::aio {

inline constexpr size_t kPinAlignment = 4096;

struct PinHooks {
  // Called after allocation+mlock with the whole (rounded) range. May throw: the allocation
  // is then released and the exception propagates from the PinnedBuffer constructor.
  std::function<void(void* ptr, size_t bytes)> on_pin;
  // Called before the memory is freed. Must not throw.
  std::function<void(void* ptr, size_t bytes)> on_unpin;
};

// Replaces the process-wide hooks (empty functions = none). Buffers keep the hooks that were
// current when they were created for their unpin call.
void set_pin_hooks(PinHooks hooks);

// Locks [ptr, ptr + bytes) in memory: returns 0, or a positive errno when refused.
using MemoryLocker = int (*)(void* ptr, size_t bytes);

// Replaces the function new buffers are locked with (nullptr: mlock(2), the default) and
// returns the previous one. A test seam; thread-safe, but buffers being created on other
// threads at the same moment may use either function. A buffer whose lock succeeded is
// unlocked with munlock(2).
MemoryLocker set_memory_locker(MemoryLocker locker);

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // Throws PinnedMemoryLimitError (nothing allocated) when the capacity would take the
  // process past its pinned-memory limit, std::bad_alloc when the memory cannot be had.
  // `bytes` may be 0 (empty buffer).
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();

  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  std::byte* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }          // bytes asked for
  size_t capacity() const noexcept { return capacity_; }  // rounded to kPinAlignment
  bool locked() const noexcept { return locked_; }        // mlock succeeded

  template <typename T>
  T* as() const noexcept {
    return reinterpret_cast<T*>(data_);
  }

 private:
  void release() noexcept;

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  bool locked_ = false;
  std::function<void(void*, size_t)> on_unpin_;
};

}  // namespace zinf::aio
