// Footprint: the bytes a component allocates, by where they live, known before it is built.
// Each component that allocates states its own (a static footprint() beside its constructor,
// computed from the sizes the constructor uses); the memory plan (engine/memory_plan.h) is
// their sum, so the plan and the allocation cannot drift apart.
//
// Thread safety: plain values and constexpr functions.
#pragma once

#include <cstdint>

#include "aio/pinned_buffer.h"

namespace zinf::offload {

struct Footprint {
  uint64_t device = 0;  // accelerator memory
  uint64_t pinned = 0;  // page-locked host memory (rounded as aio::PinnedBuffer rounds)
  uint64_t host = 0;    // plain host memory
  uint64_t nvme = 0;    // swap-file bytes (extents, rounded as NvmeStore rounds)

  Footprint& operator+=(const Footprint& other) noexcept {
    device += other.device;
    pinned += other.pinned;
    host += other.host;
    nvme += other.nvme;
    return *this;
  }
};

// What one pinned allocation of `bytes` takes (aio::PinnedBuffer rounds up to its alignment).
[[nodiscard]] constexpr uint64_t pinned_allocation(uint64_t bytes) noexcept {
  return (bytes + aio::kPinAlignment - 1) / aio::kPinAlignment * aio::kPinAlignment;
}

// NvmeStore's extents start and end on this boundary, so every transfer is O_DIRECT-ready.
inline constexpr uint64_t kSwapExtentAlignment = 4096;

// What one swap extent of `bytes` takes in the file.
[[nodiscard]] constexpr uint64_t swap_extent(uint64_t bytes) noexcept {
  return (bytes + kSwapExtentAlignment - 1) / kSwapExtentAlignment * kSwapExtentAlignment;
}

}  // namespace zinf::offload
