#include "offload/strict_accelerator.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>

#include "offload/error.h"

namespace zinf::offload {
namespace {

// ---- the fault handler's view of the allocations ------------------------------------------
// A fixed table the handler can scan without locks or allocation. A slot is published by
// storing `handed` last (release) and retired by clearing it first.
constexpr size_t kSlots = size_t{1} << 15;
constexpr size_t kLabelBytes = 48;

struct Slot {
  std::atomic<uintptr_t> handed{0};
  std::atomic<size_t> mapped{0};
  std::atomic<size_t> requested{0};
  std::atomic<uint64_t> id{0};
  char what[kLabelBytes] = {};
};

Slot g_slots[kSlots];

// ---- the copies' view (under a lock) -------------------------------------------------------
struct Allocation {
  uintptr_t handed = 0;
  uintptr_t alias = 0;
  size_t mapped = 0;     // whole pages
  size_t requested = 0;  // what allocate() asked for
  uint64_t id = 0;
  std::string what;
  size_t slot = 0;
};

struct Registry {
  std::shared_mutex mutex;
  std::map<uintptr_t, Allocation> by_handed;  // guarded by mutex
  std::map<uintptr_t, uintptr_t> by_alias;    // guarded by mutex: alias -> handed
  size_t next_slot = 0;                       // guarded by mutex: where to look first
  std::atomic<uint64_t> next_id{1};
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: buffers may outlive statics
  return *r;
}

// The allocation in `map` (keyed by start) whose pages hold `address`; nullptr if none.
template <typename Map>
const typename Map::mapped_type* containing(const Map& map, uintptr_t address, uintptr_t* start) {
  auto it = map.upper_bound(address);
  if (it == map.begin()) {
    return nullptr;
  }
  --it;
  *start = it->first;
  return &it->second;
}

const Allocation* find_handed(const Registry& r, uintptr_t address) {
  uintptr_t start = 0;
  const Allocation* a = containing(r.by_handed, address, &start);
  return a != nullptr && address < a->handed + a->mapped ? a : nullptr;
}

const Allocation* find_alias(const Registry& r, uintptr_t address) {
  uintptr_t start = 0;
  const uintptr_t* handed = containing(r.by_alias, address, &start);
  if (handed == nullptr) {
    return nullptr;
  }
  const Allocation* a = find_handed(r, *handed);
  return a != nullptr && address < a->alias + a->mapped ? a : nullptr;
}

std::string describe(const Allocation& a, uintptr_t address, uintptr_t base) {
  std::string out = fmt::format("allocation #{}", a.id);
  if (!a.what.empty()) {
    out += fmt::format(" \"{}\"", a.what);
  }
  out += fmt::format(" ({} bytes), byte {}", a.requested, address - base);
  return out;
}

// ---- the fault handler ---------------------------------------------------------------------
struct sigaction g_previous_segv;
struct sigaction g_previous_bus;

// Async-signal-safe formatting into a fixed buffer.
struct Line {
  char text[512];
  size_t size = 0;
  void add(const char* s) {
    while (*s != '\0' && size + 1 < sizeof(text)) {
      text[size++] = *s++;
    }
  }
  void add_unsigned(uint64_t v, unsigned base) {
    char digits[32];
    size_t n = 0;
    do {
      const unsigned d = static_cast<unsigned>(v % base);
      digits[n++] = static_cast<char>(d < 10 ? '0' + d : 'a' + d - 10);
      v /= base;
    } while (v != 0 && n < sizeof(digits));
    while (n > 0 && size + 1 < sizeof(text)) {
      text[size++] = digits[--n];
    }
  }
};

void on_fault(int signal, siginfo_t* info, void* /*context*/) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Slot& slot : g_slots) {
    const uintptr_t handed = slot.handed.load(std::memory_order_acquire);
    if (handed == 0 || address < handed ||
        address >= handed + slot.mapped.load(std::memory_order_relaxed)) {
      continue;
    }
    Line line;
    line.add("zinf strict device: host code touched device memory at 0x");
    line.add_unsigned(address, 16);
    line.add(": allocation #");
    line.add_unsigned(slot.id.load(std::memory_order_relaxed), 10);
    if (slot.what[0] != '\0') {
      line.add(" \"");
      line.add(slot.what);
      line.add("\"");
    }
    line.add(" (");
    line.add_unsigned(slot.requested.load(std::memory_order_relaxed), 10);
    line.add(" bytes), byte ");
    line.add_unsigned(address - handed, 10);
    line.add(
        ". Device memory is reached only through the accelerator's copies and compute "
        "views.\n");
    ssize_t ignored = ::write(STDERR_FILENO, line.text, line.size);
    (void)ignored;
    break;
  }
  // Hand the fault back: the instruction runs again under the handler we replaced (by
  // default, death by SIGSEGV).
  sigaction(signal, signal == SIGBUS ? &g_previous_bus : &g_previous_segv, nullptr);
}

void install_fault_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &g_previous_segv);
    sigaction(SIGBUS, &action, &g_previous_bus);
  });
}

// ---- checks used by the copies -------------------------------------------------------------
void* device_or_throw(const void* ptr, size_t bytes, const char* op, const char* role) {
  if (bytes == 0) {
    return const_cast<void*>(ptr);
  }
  if (void* alias = strict_alias(ptr, bytes); alias != nullptr) {
    return alias;
  }
  const std::string where = describe_strict_pointer(ptr);
  throw OffloadError(
      ErrorKind::kUsage,
      fmt::format("strict accelerator: {}: the {} {} ({} bytes) is not device memory{}", op, role,
                  ptr, bytes,
                  where.empty() ? std::string(" (host memory; a GPU copy would fail the same way)")
                                : " (it runs past the end of " + where + ")"));
}

void host_or_throw(const void* ptr, size_t bytes, const char* op, const char* role) {
  if (bytes == 0) {
    return;
  }
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  const auto first = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t last = first + bytes - 1;
  // Any allocation starting before `last` and ending after `first` overlaps.
  auto overlaps = [&](const Allocation* a, uintptr_t base) {
    return a != nullptr && base <= last && base + a->mapped > first;
  };
  uintptr_t start = 0;
  if (const Allocation* a = containing(r.by_handed, last, &start); overlaps(a, a ? a->handed : 0)) {
    throw OffloadError(
        ErrorKind::kUsage,
        fmt::format("strict accelerator: {}: the {} {} ({} bytes) is device memory "
                    "({}), not host memory",
                    op, role, ptr, bytes, describe(*a, std::max(first, a->handed), a->handed)));
  }
  if (const uintptr_t* handed = containing(r.by_alias, last, &start); handed != nullptr) {
    const Allocation* a = find_handed(r, *handed);
    if (overlaps(a, a ? a->alias : 0)) {
      throw OffloadError(
          ErrorKind::kUsage,
          fmt::format("strict accelerator: {}: the {} {} ({} bytes) is a compute "
                      "view of device memory ({}), not host memory",
                      op, role, ptr, bytes, describe(*a, std::max(first, a->alias), a->alias)));
    }
  }
}

}  // namespace

void* strict_alias(const void* ptr, size_t bytes) noexcept {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  const Allocation* a = find_handed(r, address);
  if (a == nullptr || bytes > a->handed + a->mapped - address) {
    return nullptr;
  }
  return reinterpret_cast<void*>(a->alias + (address - a->handed));
}

std::string describe_strict_pointer(const void* ptr) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  if (const Allocation* a = find_handed(r, address); a != nullptr) {
    return describe(*a, address, a->handed);
  }
  if (const Allocation* a = find_alias(r, address); a != nullptr) {
    return "the compute view of " + describe(*a, address, a->alias);
  }
  return {};
}

StrictAccelerator::StrictAccelerator(uint64_t memory_budget_bytes)
    : CpuAccelerator(memory_budget_bytes) {
  install_fault_handler();
}

StrictAccelerator::~StrictAccelerator() = default;

void StrictAccelerator::copy_to_device(void* device_dst, const void* host_src, size_t bytes,
                                       Stream& stream) {
  host_or_throw(host_src, bytes, "copy_to_device", "source");
  CpuAccelerator::copy_to_device(
      device_or_throw(device_dst, bytes, "copy_to_device", "destination"), host_src, bytes, stream);
}

void StrictAccelerator::copy_to_host(void* host_dst, const void* device_src, size_t bytes,
                                     Stream& stream) {
  host_or_throw(host_dst, bytes, "copy_to_host", "destination");
  CpuAccelerator::copy_to_host(
      host_dst, device_or_throw(device_src, bytes, "copy_to_host", "source"), bytes, stream);
}

void StrictAccelerator::copy_on_device(void* device_dst, const void* device_src, size_t bytes,
                                       Stream& stream) {
  void* dst = device_or_throw(device_dst, bytes, "copy_on_device", "destination");
  const void* src = device_or_throw(device_src, bytes, "copy_on_device", "source");
  CpuAccelerator::copy_on_device(dst, src, bytes, stream);
}

void StrictAccelerator::fill_zero(void* device_dst, size_t bytes, Stream& stream) {
  CpuAccelerator::fill_zero(device_or_throw(device_dst, bytes, "fill_zero", "destination"), bytes,
                            stream);
}

ComputeView StrictAccelerator::compute_view(void* device_ptr, size_t bytes) {
  return {device_or_throw(device_ptr, std::max<size_t>(bytes, 1), "compute_view", "range"),
          ComputeDevice::kCpu, -1};
}

void* StrictAccelerator::device_malloc(size_t bytes, std::string_view what) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = (bytes + page - 1) / page * page;
  const int fd = memfd_create("zinf-strict-device", MFD_CLOEXEC);
  if (fd < 0) {
    throw OffloadError(ErrorKind::kDevice,
                       fmt::format("strict accelerator: memfd_create: {}", std::strerror(errno)));
  }
  void* handed = MAP_FAILED;
  void* alias = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(mapped)) == 0) {
    handed = mmap(nullptr, mapped, PROT_NONE, MAP_SHARED, fd, 0);
    alias = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int error = errno;
  close(fd);
  if (handed == MAP_FAILED || alias == MAP_FAILED) {
    if (handed != MAP_FAILED) munmap(handed, mapped);
    if (alias != MAP_FAILED) munmap(alias, mapped);
    throw OffloadError(
        ErrorKind::kDevice,
        fmt::format("strict accelerator: mapping {} bytes{} twice: {} (each "
                    "allocation takes two of vm.max_map_count's maps)",
                    bytes, what.empty() ? "" : " for " + std::string(what), std::strerror(error)));
  }
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  size_t slot = kSlots;
  for (size_t k = 0; k < kSlots; ++k) {
    const size_t s = (r.next_slot + k) % kSlots;
    if (g_slots[s].handed.load(std::memory_order_relaxed) == 0) {
      slot = s;
      break;
    }
  }
  if (slot == kSlots) {
    lock.unlock();
    munmap(handed, mapped);
    munmap(alias, mapped);
    throw OffloadError(ErrorKind::kDevice,
                       fmt::format("strict accelerator: more than {} live allocations", kSlots));
  }
  r.next_slot = slot + 1;
  Allocation a;
  a.handed = reinterpret_cast<uintptr_t>(handed);
  a.alias = reinterpret_cast<uintptr_t>(alias);
  a.mapped = mapped;
  a.requested = bytes;
  a.id = r.next_id.fetch_add(1);
  a.what = std::string(what);
  a.slot = slot;
  Slot& s = g_slots[slot];
  const size_t label = std::min(what.size(), kLabelBytes - 1);
  std::memcpy(s.what, what.data(), label);
  s.what[label] = '\0';
  s.mapped.store(mapped, std::memory_order_relaxed);
  s.requested.store(bytes, std::memory_order_relaxed);
  s.id.store(a.id, std::memory_order_relaxed);
  s.handed.store(a.handed, std::memory_order_release);
  r.by_alias[a.alias] = a.handed;
  r.by_handed[a.handed] = std::move(a);
  return handed;
}

void StrictAccelerator::device_free(void* ptr, size_t /*bytes*/) noexcept {
  Registry& r = registry();
  Allocation a;
  {
    std::unique_lock lock(r.mutex);
    auto it = r.by_handed.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == r.by_handed.end()) {
      return;
    }
    a = std::move(it->second);
    r.by_handed.erase(it);
    r.by_alias.erase(a.alias);
    g_slots[a.slot].handed.store(0, std::memory_order_release);
  }
  munmap(reinterpret_cast<void*>(a.handed), a.mapped);
  munmap(reinterpret_cast<void*>(a.alias), a.mapped);
}

}  // namespace zinf::offload
