// Splitting transfers into parts and parts into requests (see aio/request_plan.h).
#include "aio/request_plan.h"

#include <algorithm>

namespace zinf::aio::internal {

void split_into_parts(Transfer& transfer, std::byte* buffer, size_t worker_count) {
  const uint64_t offset = transfer.offset;
  const uint64_t bytes = transfer.bytes;
  const uint64_t count = worker_count;
  const uint64_t end = offset + bytes;
  const bool congruent = (reinterpret_cast<uintptr_t>(buffer) - offset) % kBlock == 0;
  transfer.parts.reserve(count);
  uint64_t previous = offset;
  for (uint64_t i = 1; i <= count; ++i) {
    // offset + bytes * i / count, without overflowing 64 bits.
    const uint64_t share = bytes / count * i + bytes % count * i / count;
    const uint64_t boundary = i == count ? end : std::max(previous, align_down(offset + share));
    if (boundary > previous) {
      Part& part = transfer.parts.emplace_back();
      part.transfer = &transfer;
      part.worker = static_cast<size_t>(i - 1);
      part.begin = previous;
      part.end = boundary;
      part.memory = buffer + (previous - offset);
      part.congruent = congruent;
    }
    previous = boundary;
  }
  transfer.parts_left = transfer.parts.size();
  transfer.done = transfer.parts.empty();
}

RequestPlan plan_request(Op op, const FileEntry& file, const Part& part, uint64_t request_bytes,
                         uint64_t slot_bytes) noexcept {
  const uint64_t at = part.cursor;
  const uint64_t remaining = part.end - at;
  RequestPlan plan{.fd = file.fd.get(), .direct = file.direct, .offset = at};
  if (!file.direct) {
    plan.length = plan.covered = std::min(remaining, request_bytes);
  } else if (at % kBlock != 0 || remaining < kBlock) {
    plan.covered = std::min(part.end, align_down(at) + kBlock) - at;
    if (op == Op::kWrite) {
      plan.fd = file.buffered_fd.get();
      plan.direct = false;
      plan.length = plan.covered;
    } else {
      plan.offset = align_down(at);
      plan.length = kBlock;
      plan.staged = true;
    }
  } else {
    plan.length = plan.covered = std::min(align_down(remaining), request_bytes);
    if (!part.congruent) {
      plan.length = plan.covered = std::min(plan.length, slot_bytes);
      plan.staged = true;
    }
  }
  return plan;
}

}  // namespace zinf::aio::internal
