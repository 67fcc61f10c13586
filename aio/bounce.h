// StagingMemory: one worker's bounce and staging memory (internal to aio/).
//
// Requests whose user memory cannot go to the file directly (a partial block read with
// O_DIRECT, or whole blocks from memory not congruent to the file offset modulo 4096) use a
// 4096-aligned area of `slot_bytes` per queue slot instead; the worker copies user bytes in
// before a write and out after a read. The memory is allocated on first use, all slots at
// once, and freed with the worker: never while a request may still use it (the worker drains
// its engine first, see aio/worker.h).
//
// Thread safety: none; owned by one worker thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace zinf::aio::internal {

// Upper bound of one worker's staging memory (all its slots).
inline constexpr uint64_t kStagingLimitBytes = 64ull << 20;

// Staging bytes per slot for `slots` slots and requests of up to `request_bytes`: at least
// one 4096-byte block, at most request_bytes, all slots within kStagingLimitBytes.
uint64_t staging_slot_bytes(uint64_t request_bytes, unsigned slots) noexcept;

class StagingMemory {
 public:
  StagingMemory(unsigned slots, uint64_t slot_bytes) noexcept;

  StagingMemory(const StagingMemory&) = delete;
  StagingMemory& operator=(const StagingMemory&) = delete;

  uint64_t slot_bytes() const noexcept { return slot_bytes_; }

  // The slot_bytes() of slot `index` (< slots), 4096-aligned; nullptr when the first-use
  // allocation fails (a later call tries again).
  std::byte* slot(unsigned index) noexcept;

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const noexcept;
  };

  const unsigned slots_;
  const uint64_t slot_bytes_;
  std::unique_ptr<std::byte, FreeDeleter> memory_;  // null until first use
};

}  // namespace zinf::aio::internal
