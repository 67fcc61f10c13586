// Counters of the offload tier that a user can read: bytes moved per tier, time spent
// waiting for I/O versus computing, and the pinned pools' high-water marks.
//
// OffloadCounters is a plain snapshot. Counters is the live, lock-free accumulator behind
// it (one per swapper): times are kept as integer nanoseconds, so accumulation is exact.
// ScopedTime adds the lifetime of a scope to one of the two clocks.
//
// Thread safety: every Counters method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace zinf::offload {

struct OffloadCounters {
  // Bytes moved between pinned buffers and the swap files.
  uint64_t nvme_bytes_read = 0;
  uint64_t nvme_bytes_written = 0;
  // Bytes served from / stored to CPU memory (max_in_cpu params, device=cpu states).
  uint64_t cpu_bytes_read = 0;
  uint64_t cpu_bytes_written = 0;
  // Time the caller's thread spent blocked on I/O, and computing (optimizer kernels and
  // copies). In a fully overlapped step io_wait_seconds tends to 0.
  double io_wait_seconds = 0.0;
  double compute_seconds = 0.0;
  // The pools behind this component: buffers, most leased at once, pinned bytes.
  uint64_t pool_buffers = 0;
  uint64_t pool_high_water = 0;
  uint64_t pinned_bytes = 0;

  // One line, for logs: "nvme read 1.2 GB written ... io wait 0.3 s compute 1.1 s ...".
  [[nodiscard]] std::string to_string() const;
};

class Counters {
 public:
  enum class Clock { kIoWait, kCompute };

  void add_nvme_read(uint64_t bytes) noexcept { add(nvme_read_, bytes); }
  void add_nvme_written(uint64_t bytes) noexcept { add(nvme_written_, bytes); }
  void add_cpu_read(uint64_t bytes) noexcept { add(cpu_read_, bytes); }
  void add_cpu_written(uint64_t bytes) noexcept { add(cpu_written_, bytes); }
  void add_time(Clock clock, std::chrono::nanoseconds elapsed) noexcept {
    add(clock == Clock::kIoWait ? io_wait_ns_ : compute_ns_,
        static_cast<uint64_t>(elapsed.count()));
  }

  // Bytes and times; the pool fields are left for the owner to fill.
  [[nodiscard]] OffloadCounters snapshot() const noexcept;
  void reset() noexcept;

 private:
  static void add(std::atomic<uint64_t>& counter, uint64_t value) noexcept {
    counter.fetch_add(value, std::memory_order_relaxed);
  }

  std::atomic<uint64_t> nvme_read_{0};
  std::atomic<uint64_t> nvme_written_{0};
  std::atomic<uint64_t> cpu_read_{0};
  std::atomic<uint64_t> cpu_written_{0};
  std::atomic<uint64_t> io_wait_ns_{0};
  std::atomic<uint64_t> compute_ns_{0};
};

// Adds the time from construction to destruction to `clock`.
class ScopedTime {
 public:
  ScopedTime(Counters& counters, Counters::Clock clock) noexcept
      : counters_(counters), clock_(clock), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTime() { counters_.add_time(clock_, std::chrono::steady_clock::now() - start_); }
  ScopedTime(const ScopedTime&) = delete;
  ScopedTime& operator=(const ScopedTime&) = delete;

 private:
  Counters& counters_;
  const Counters::Clock clock_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace zinf::offload
