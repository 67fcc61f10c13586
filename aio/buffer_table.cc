// BufferTable construction (see aio/buffer_table.h).
#include "aio/buffer_table.h"

namespace zinf::aio::internal {

std::shared_ptr<const BufferTable> make_buffer_table(
    uint64_t generation, const std::vector<std::pair<uintptr_t, size_t>>& ranges) {
  auto table = std::make_shared<BufferTable>();
  table->generation = generation;
  for (const auto& [begin, bytes] : ranges) {
    for (uint64_t at = 0; at < bytes; at += kMaxFixedBufferBytes) {
      const uint64_t piece = std::min<uint64_t>(bytes - at, kMaxFixedBufferBytes);
      table->by_address.push_back(
          BufferTable::Range{.begin = begin + at,
                             .end = begin + at + piece,
                             .index = static_cast<int>(table->iovecs.size())});
      table->iovecs.push_back(
          iovec{reinterpret_cast<void*>(begin + at), static_cast<size_t>(piece)});
    }
  }
  std::sort(
      table->by_address.begin(), table->by_address.end(),
      [](const BufferTable::Range& a, const BufferTable::Range& b) { return a.begin < b.begin; });
  return table;
}

}  // namespace zinf::aio::internal
