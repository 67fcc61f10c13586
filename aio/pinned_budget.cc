// The process-wide pinned-memory account behind PinnedBuffer.
#include "aio/pinned_budget.h"

#include <fmt/format.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>

namespace zinf::aio {
namespace {

std::mutex g_mutex;
uint64_t g_in_use = 0;  // guarded by g_mutex
uint64_t g_peak = 0;    // guarded by g_mutex
uint64_t g_limit = 0;   // guarded by g_mutex; 0 = the default, computed on first use

std::string format_binary(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

// Whether the process may lock memory beyond RLIMIT_MEMLOCK (CAP_IPC_LOCK, effective).
bool has_ipc_lock_capability() {
  __user_cap_header_struct header{};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  header.pid = 0;
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3]{};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  return (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) != 0;
}

uint64_t lockable_bytes() {
  if (has_ipc_lock_capability()) return UINT64_MAX;
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return UINT64_MAX;
  }
  return limit.rlim_cur;
}

uint64_t effective_limit_locked() { return g_limit != 0 ? g_limit : default_pinned_memory_limit(); }

}  // namespace

PinnedMemoryLimitError::PinnedMemoryLimitError(uint64_t requested, uint64_t in_use, uint64_t limit)
    : std::runtime_error(fmt::format(
          "pinned memory limit exceeded: {} more requested, {} already pinned, limit {} "
          "(zinf.pinned_memory_limit; default: {:.0f}% of RAM)",
          format_binary(requested), format_binary(in_use), format_binary(limit),
          kDefaultPinnedFraction * 100)),
      requested_(requested),
      in_use_(in_use),
      limit_(limit) {}

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

uint64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;  // "VmHWM:   12345 kB"
    }
  }
  return 0;
}

uint64_t default_pinned_memory_limit() {
  const uint64_t ram = physical_memory_bytes();
  // A host whose RAM cannot be read gets no default cap rather than a wrong one.
  if (ram == 0) return UINT64_MAX;
  return static_cast<uint64_t>(static_cast<double>(ram) * kDefaultPinnedFraction);
}

void set_pinned_memory_limit(uint64_t bytes) {
  if (bytes == 0) throw std::invalid_argument("pinned memory limit must be > 0 bytes");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_limit = bytes;
}

void reset_pinned_memory_limit() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_limit = 0;
}

PinnedMemoryUsage pinned_memory_usage() {
  PinnedMemoryUsage usage;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    usage.in_use = g_in_use;
    usage.peak = g_peak;
    usage.limit = effective_limit_locked();
    usage.limit_is_default = g_limit == 0;
  }
  usage.lockable = lockable_bytes();
  return usage;
}

void reset_pinned_peak() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_peak = g_in_use;
}

std::string describe_pinned_memory() {
  const PinnedMemoryUsage u = pinned_memory_usage();
  std::string out = fmt::format("pinned memory: {} in use, limit {}", format_binary(u.in_use),
                                format_binary(u.limit));
  if (u.limit_is_default) {
    out += fmt::format(" ({:.0f}% of {} RAM; zinf.pinned_memory_limit sets it)",
                       kDefaultPinnedFraction * 100, format_binary(physical_memory_bytes()));
  }
  if (u.lockable != UINT64_MAX && u.limit > u.lockable) {
    out += fmt::format("; RLIMIT_MEMLOCK is {}: pages beyond it stay unlocked (ulimit -l)",
                       format_binary(u.lockable));
  }
  return out;
}

void charge_pinned(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const uint64_t limit = effective_limit_locked();
  if (bytes > limit || g_in_use > limit - bytes) {
    throw PinnedMemoryLimitError(bytes, g_in_use, limit);
  }
  g_in_use += bytes;
  if (g_in_use > g_peak) g_peak = g_in_use;
}

void refund_pinned(uint64_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_in_use = bytes > g_in_use ? 0 : g_in_use - bytes;
}

}  // namespace zinf::aio
