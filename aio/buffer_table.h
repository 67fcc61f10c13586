// BufferTable: the memory ranges registered with an AioHandle, as one engine table of fixed
// buffers (io_uring READ_FIXED/WRITE_FIXED), and the lookup of the range holding a request's
// memory. Internal to aio/.
//
// Thread safety: a table is immutable once built and shared (shared_ptr<const>) between the
// handle and its workers; any thread may call find().
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace zinf::aio::internal {

// io_uring refuses fixed buffers larger than 1 GiB: longer ranges are registered in pieces.
inline constexpr uint64_t kMaxFixedBufferBytes = 1ull << 30;

// The registered ranges as one engine table: `iovecs` in registration order (the index is
// the fixed-buffer index), `by_address` sorted and disjoint for lookups. Immutable once built.
struct BufferTable {
  struct Range {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    int index = 0;
  };
  uint64_t generation = 0;
  std::vector<iovec> iovecs;
  std::vector<Range> by_address;

  // Index of the range holding all of [memory, memory + bytes), or -1.
  int find(const void* memory, uint64_t bytes) const noexcept {
    const auto begin = reinterpret_cast<uintptr_t>(memory);
    auto it = std::upper_bound(by_address.begin(), by_address.end(), begin,
                               [](uintptr_t value, const Range& r) { return value < r.begin; });
    if (it == by_address.begin()) return -1;
    --it;
    return begin < it->end && bytes <= it->end - begin ? it->index : -1;
  }
};

// The table of `ranges` ({begin, bytes}, disjoint), ranges longer than kMaxFixedBufferBytes
// cut into pieces. Throws std::bad_alloc.
std::shared_ptr<const BufferTable> make_buffer_table(
    uint64_t generation, const std::vector<std::pair<uintptr_t, size_t>>& ranges);

}  // namespace zinf::aio::internal
