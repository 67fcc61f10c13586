#include "offload/counters.h"

#include <cstdio>

namespace zinf::offload {
namespace {

double seconds(uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

}  // namespace

std::string OffloadCounters::to_string() const {
  char line[512];
  std::snprintf(
      line, sizeof(line),
      "nvme read %.3f GB written %.3f GB, cpu read %.3f GB written %.3f GB, io wait "
      "%.3f s, compute %.3f s, pool %llu/%llu buffers high-water, %.3f GB pinned",
      static_cast<double>(nvme_bytes_read) * 1e-9, static_cast<double>(nvme_bytes_written) * 1e-9,
      static_cast<double>(cpu_bytes_read) * 1e-9, static_cast<double>(cpu_bytes_written) * 1e-9,
      io_wait_seconds, compute_seconds, static_cast<unsigned long long>(pool_high_water),
      static_cast<unsigned long long>(pool_buffers), static_cast<double>(pinned_bytes) * 1e-9);
  return line;
}

OffloadCounters Counters::snapshot() const noexcept {
  OffloadCounters c;
  c.nvme_bytes_read = nvme_read_.load(std::memory_order_relaxed);
  c.nvme_bytes_written = nvme_written_.load(std::memory_order_relaxed);
  c.cpu_bytes_read = cpu_read_.load(std::memory_order_relaxed);
  c.cpu_bytes_written = cpu_written_.load(std::memory_order_relaxed);
  c.io_wait_seconds = seconds(io_wait_ns_.load(std::memory_order_relaxed));
  c.compute_seconds = seconds(compute_ns_.load(std::memory_order_relaxed));
  return c;
}

void Counters::reset() noexcept {
  for (auto* counter :
       {&nvme_read_, &nvme_written_, &cpu_read_, &cpu_written_, &io_wait_ns_, &compute_ns_}) {
    counter->store(0, std::memory_order_relaxed);
  }
}

}  // namespace zinf::offload
