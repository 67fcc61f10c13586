// StagingMemory (see aio/bounce.h).
#include "aio/bounce.h"

#include <algorithm>
#include <cstdlib>

#include "aio/transfer.h"

namespace zinf::aio::internal {

uint64_t staging_slot_bytes(uint64_t request_bytes, unsigned slots) noexcept {
  return std::max(kBlock, std::min(request_bytes, align_down(kStagingLimitBytes / slots)));
}

StagingMemory::StagingMemory(unsigned slots, uint64_t slot_bytes) noexcept
    : slots_(slots), slot_bytes_(slot_bytes) {}

void StagingMemory::FreeDeleter::operator()(std::byte* p) const noexcept { std::free(p); }

std::byte* StagingMemory::slot(unsigned index) noexcept {
  if (!memory_) {
    memory_.reset(static_cast<std::byte*>(
        std::aligned_alloc(kBlock, static_cast<size_t>(slot_bytes_) * slots_)));
    if (!memory_) return nullptr;
  }
  return memory_.get() + static_cast<size_t>(index) * slot_bytes_;
}

}  // namespace zinf::aio::internal
