// ExtentSpans: the first-fit allocator behind NvmeStore's extents, in bytes of one logical
// address space [0, end()).
//
// take() hands out the lowest free span that is large enough (what is left of it stays free)
// and otherwise grows end(); give_back() merges the span with its free neighbours, and a
// free span that reaches end() is not kept: end() drops to its start instead, so the store
// can shrink its file. Free spans thus always lie below end(), and two never touch. Sizes are
// whatever the caller passes: NvmeStore passes multiples of 4096, so every offset is one.
//
// Thread safety: none. The owner serializes every call (NvmeStore holds it under mutex_).
#pragma once

#include <cstdint>
#include <map>

namespace zinf::offload {

class ExtentSpans {
 public:
  ExtentSpans() = default;
  ExtentSpans(const ExtentSpans&) = delete;
  ExtentSpans& operator=(const ExtentSpans&) = delete;

  // Takes `capacity` bytes (> 0) and returns their offset: the start of the lowest free span
  // of at least `capacity` bytes, else end() (which then grows by `capacity`).
  [[nodiscard]] uint64_t take(uint64_t capacity);

  // Gives back [offset, offset + capacity), which the caller took and has not given back
  // since. Returns true when the span (merged with its free neighbours) was the tail: end()
  // has dropped to its start. Otherwise it is kept free for take() and end() is unchanged.
  [[nodiscard]] bool give_back(uint64_t offset, uint64_t capacity);

  // The end of the taken span, in bytes: nothing at or above it is taken.
  [[nodiscard]] uint64_t end() const noexcept { return end_; }

 private:
  std::map<uint64_t, uint64_t> free_spans_;  // offset -> capacity, bytes; all below end_
  uint64_t end_ = 0;                         // bytes
};

}  // namespace zinf::offload
