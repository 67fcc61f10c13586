// The pinned-memory budget: one process-wide account of every page-locked host byte.
//
// Every aio::PinnedBuffer (the pools of the offload tier, aio's staging memory, `zinf io`'s
// ring, the optimizer's staging buffers) charges its capacity here when it is made and
// refunds it when it is freed, so the pinned memory of a run is one number that can be
// printed, checked against a limit before any work starts, and never silently exceeded.
// Pinned memory cannot be paged out: too much of it takes the host down (the OOM killer,
// or a stalled kernel), which is why it has a limit of its own.
//
// The limit: by default half of physical RAM (kDefaultPinnedFraction); the engine sets it
// from `zinf.pinned_memory_limit`. A charge that would take the total past the limit throws
// PinnedMemoryLimitError naming the request, what is already pinned and the limit; nothing
// is allocated then. The limit is independent of RLIMIT_MEMLOCK: mlock() beyond that
// rlimit is refused unless the process has CAP_IPC_LOCK, and PinnedBuffer then keeps the
// memory usable but unlocked (one warning). describe_pinned_memory() says so whenever the
// limit lies above what the kernel will lock for this process.
//
// Thread safety: every function may be called from any thread (atomics and one mutex).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace zinf::aio {

// Fraction of physical RAM the default limit allows.
inline constexpr double kDefaultPinnedFraction = 0.5;

class PinnedMemoryLimitError : public std::runtime_error {
 public:
  PinnedMemoryLimitError(uint64_t requested, uint64_t in_use, uint64_t limit);
  uint64_t requested() const noexcept { return requested_; }
  uint64_t in_use() const noexcept { return in_use_; }
  uint64_t limit() const noexcept { return limit_; }

 private:
  uint64_t requested_;
  uint64_t in_use_;
  uint64_t limit_;
};

struct PinnedMemoryUsage {
  uint64_t in_use = 0;  // bytes charged now
  uint64_t peak = 0;    // highest in_use since start (or the last reset_pinned_peak())
  uint64_t limit = 0;   // bytes
  bool limit_is_default = true;
  // What mlock() will lock for this process: RLIMIT_MEMLOCK's soft limit, or UINT64_MAX
  // when it is unlimited or the process has CAP_IPC_LOCK.
  uint64_t lockable = 0;
};

// Physical RAM in bytes (sysconf), and the default limit derived from it.
[[nodiscard]] uint64_t physical_memory_bytes();
[[nodiscard]] uint64_t default_pinned_memory_limit();

// The high-water mark of this process's resident memory (/proc/self/status VmHWM); 0 when it
// cannot be read. Unlike getrusage's ru_maxrss, which keeps the resident size of the process
// this one was forked from (a Python launcher's hundreds of MiB), it counts this program only.
[[nodiscard]] uint64_t peak_rss_bytes();

// Sets the limit (bytes > 0). Lowering it below what is already pinned is allowed: later
// charges fail until enough is freed. Throws std::invalid_argument for 0.
void set_pinned_memory_limit(uint64_t bytes);
// Back to the default limit.
void reset_pinned_memory_limit();

[[nodiscard]] PinnedMemoryUsage pinned_memory_usage();
// Starts a new peak from what is pinned now.
void reset_pinned_peak();

// One line for start-up output, e.g. "pinned memory: 1.25 GiB in use, limit 11.7 GiB (half
// of 23.4 GiB RAM)" plus, when the limit lies above what the kernel locks for this process,
// "; RLIMIT_MEMLOCK is 8.00 MiB: pages beyond it stay unlocked (ulimit -l)".
[[nodiscard]] std::string describe_pinned_memory();

// Throws PinnedMemoryLimitError when `bytes` more would exceed the limit; otherwise
// counts them. Used by PinnedBuffer; callers that pin memory by other means use it too.
void charge_pinned(uint64_t bytes);
// Gives back bytes charged earlier. Never throws.
void refund_pinned(uint64_t bytes) noexcept;

}  // namespace zinf::aio
