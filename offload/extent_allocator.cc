#include "offload/extent_allocator.h"

#include <iterator>

namespace zinf::offload {

uint64_t ExtentSpans::take(uint64_t capacity) {
  uint64_t offset = end_;
  for (auto it = free_spans_.begin(); it != free_spans_.end(); ++it) {
    if (it->second >= capacity) {
      offset = it->first;
      const uint64_t rest = it->second - capacity;
      free_spans_.erase(it);
      if (rest > 0) {
        free_spans_.emplace(offset + capacity, rest);
      }
      break;
    }
  }
  if (offset == end_) {
    end_ += capacity;
  }
  return offset;
}

bool ExtentSpans::give_back(uint64_t offset, uint64_t capacity) {
  // Merge with the neighbouring free spans.
  auto next = free_spans_.lower_bound(offset);
  if (next != free_spans_.end() && next->first == offset + capacity) {
    capacity += next->second;
    next = free_spans_.erase(next);
  }
  if (next != free_spans_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      capacity += prev->second;
      free_spans_.erase(prev);
    }
  }
  if (offset + capacity < end_) {
    free_spans_.emplace(offset, capacity);
    return false;
  }
  end_ = offset;  // the tail: the taken span now ends before it
  return true;
}

}  // namespace zinf::offload
