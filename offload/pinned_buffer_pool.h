// PinnedBufferPool: a fixed set of `buffer_count` equal, 4096-aligned, page-locked host
// buffers (aio::PinnedBuffer), optionally registered with an Accelerator, handed out as
// RAII leases. Every pinned byte of the param and optimizer tiers comes from a pool, so the
// peak pinned memory of a run is buffer_count x buffer_bytes per pool, fixed at start-up.
//
// Back-pressure: acquire() waits while the buffers are out (e.g. held by in-flight I/O) and
// serves waiters first come, first served, so a request for several buffers is not starved
// by single ones.
//
// Deadlock check, and its limits: a request that can never be satisfied fails at once with
// OffloadError(kPool) and the numbers instead of hanging: more buffers than the pool has,
// more bytes than fit in it, or more than the pool has minus the buffers the calling thread
// holds (those can only come back through the caller itself). That is all it sees. It
// counts leases against the thread that acquired them until they are released, from
// whichever thread, so a thread that hands its leases to another (which releases them
// later) may be refused a request that would in fact be met. And it knows nothing of
// cycles between threads: thread A holding buffers while it waits for buffers held by B,
// which waits for A's, hangs both — and because waiters are served in order, a thread that
// holds buffers and asks for more also hangs when an earlier waiter needs the buffers it
// holds. Code that acquires while it holds must therefore be the pool's only acquirer (as
// the swappers are: one driving thread per pool), or take all it needs in one acquire().
//
// Thread safety: every method may be called from any thread. A Lease is not synchronized
// (one owner) but may be moved to and released from another thread. Leases keep the
// pool's memory alive: destroying the pool while leases are out is allowed, the memory
// goes when the last lease does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zinf::offload {

class Accelerator;

struct PinnedPoolStats {
  size_t buffer_count = 0;
  size_t buffer_bytes = 0;    // usable bytes per buffer
  uint64_t pinned_bytes = 0;  // buffer_count x the rounded buffer size
  size_t in_use = 0;          // buffers leased now
  size_t high_water = 0;      // most buffers leased at once
  uint64_t acquired = 0;      // buffers handed out in total
  uint64_t waits = 0;         // requests that had to wait
  double wait_seconds = 0.0;  // total time requests waited
  bool locked = false;        // mlock succeeded for every buffer
};

class PinnedBufferPool {
  struct Shared;

 public:
  // One leased buffer; returns to the pool when destroyed or release()d.
  class Lease {
   public:
    Lease() = default;
    ~Lease() { release(); }
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    std::byte* data() const noexcept { return data_; }
    size_t size() const noexcept { return size_; }  // the pool's buffer_bytes
    size_t index() const noexcept { return index_; }
    explicit operator bool() const noexcept { return data_ != nullptr; }
    template <typename T>
    T* as() const noexcept {
      return reinterpret_cast<T*>(data_);
    }

    void release() noexcept;

   private:
    friend class PinnedBufferPool;
    Lease(std::shared_ptr<Shared> shared, size_t index, std::byte* data, size_t size) noexcept;

    std::shared_ptr<Shared> shared_;
    size_t index_ = 0;
    std::byte* data_ = nullptr;
    size_t size_ = 0;
  };

  // Allocates and locks all buffers now (std::bad_alloc when memory cannot be had), and
  // registers each with `accelerator` when given (it must outlive the pool and its
  // leases). Throws OffloadError(kConfig) for a zero count or size. `name` appears in
  // error messages ("param pool", ...).
  PinnedBufferPool(size_t buffer_count, size_t buffer_bytes, Accelerator* accelerator = nullptr,
                   std::string name = "pinned pool");
  ~PinnedBufferPool();

  PinnedBufferPool(const PinnedBufferPool&) = delete;
  PinnedBufferPool& operator=(const PinnedBufferPool&) = delete;

  // Blocks until one buffer is free. Throws OffloadError(kPool) at once if the calling
  // thread already holds every buffer (see the deadlock check's limits above).
  [[nodiscard]] Lease acquire();
  // Blocks until `count` buffers are free and takes them together (never a partial set, so
  // two callers cannot each hold half of what both need). Throws OffloadError(kPool) at once
  // when count > buffer_count, or count plus the buffers this thread holds > buffer_count;
  // other deadlocks are the caller's to avoid (see above).
  [[nodiscard]] std::vector<Lease> acquire(size_t count);
  // The buffers needed to hold `bytes` bytes (ceil(bytes / buffer_bytes), at least one).
  [[nodiscard]] std::vector<Lease> acquire_bytes(uint64_t bytes);
  // Non-blocking: the buffers if they are free now and nobody is waiting, else nothing.
  [[nodiscard]] std::optional<Lease> try_acquire();
  [[nodiscard]] std::vector<Lease> try_acquire(size_t count);

  [[nodiscard]] size_t buffer_count() const noexcept { return buffer_count_; }
  [[nodiscard]] size_t buffer_bytes() const noexcept { return buffer_bytes_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] PinnedPoolStats stats() const;
  // The whole memory of every buffer as {data, bytes} (bytes: the rounded, 4096-multiple
  // allocation), in index order: what to hand to aio::AioHandle::register_buffers(). The
  // ranges stay mapped while the pool or any of its leases lives; whoever registers them
  // must drop the registration (or the handle) before the last of those goes.
  [[nodiscard]] std::vector<std::pair<void*, size_t>> ranges() const;

 private:
  // Checks that `count` can ever be had by the calling thread; throws otherwise.
  void check_satisfiable(size_t count, size_t held_by_caller, size_t in_use) const;

  const size_t buffer_count_;
  const size_t buffer_bytes_;
  const std::string name_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace zinf::offload
