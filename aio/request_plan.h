// Request planning: how the file range of a transfer becomes parts and requests (internal to
// aio/). Pure functions of the range, the file and the configuration; nothing here performs
// I/O or allocates on the hot path.
//
// A transfer is cut into one Part per worker (split_into_parts), part boundaries on 4096-byte
// file offsets, so any length works, including one not divisible by the worker count.
//
// How a part's bytes become requests (plan_request; file offsets; B = 4096):
//   - buffered file (O_DIRECT refused): block_size requests straight from user memory;
//   - head/tail that does not cover a whole aligned block: reads fetch the aligned block
//     into the slot's bounce memory and copy the wanted bytes out; writes go through the
//     file's buffered descriptor with exactly the user's bytes (the page cache merges them,
//     so the file size stays exact and neighbouring unaligned writes cannot undo each other
//     as a read-modify-write of a shared block could);
//   - whole blocks: straight from user memory when it is congruent to the file offset
//     modulo B, otherwise through the slot's staging memory.
//
// Coherence of the two descriptors of a direct file: the kernel writes back dirty page-cache
// pages of the range before an O_DIRECT read or write and invalidates them after an O_DIRECT
// write, so a read right after an unaligned (buffered) write sees it, on every backend
// (tests: handle_test.cc, MixedDirectAndPartialBlockWritesStayCoherent). Concurrent
// transfers never put a direct and a buffered write on one block unless their ranges overlap.
//
// Thread safety: the functions are pure (split_into_parts writes only the transfer it is
// given, before its parts are enqueued).
#pragma once

#include <cstddef>
#include <cstdint>

#include "aio/backend.h"
#include "aio/file_cache.h"
#include "aio/transfer.h"

namespace zinf::aio::internal {

// Cuts [transfer.offset, transfer.offset + transfer.bytes), whose first byte is at `buffer`,
// into at most `worker_count` parts (the i-th for worker i; empty shares are left out), and
// sets parts_left and done (an empty transfer is done at once). Throws std::bad_alloc.
void split_into_parts(Transfer& transfer, std::byte* buffer, size_t worker_count);

// The shape of one request.
struct RequestPlan {
  int fd = -1;           // the direct or the buffered descriptor of the file
  bool direct = false;   // fd is O_DIRECT: continuations stay block aligned
  bool staged = false;   // through the slot's bounce/staging memory, not user memory
  uint64_t offset = 0;   // file offset of the request
  uint64_t length = 0;   // bytes of the request
  uint64_t covered = 0;  // user bytes it carries, starting at part.cursor
};

// The next request of `part` (from part.cursor; the part must have bytes left). Requests
// straight from user memory are at most `request_bytes` long, staged whole-block requests
// at most `slot_bytes` (a multiple of 4096).
RequestPlan plan_request(Op op, const FileEntry& file, const Part& part, uint64_t request_bytes,
                         uint64_t slot_bytes) noexcept;

}  // namespace zinf::aio::internal
