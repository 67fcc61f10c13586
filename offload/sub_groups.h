// The one rule that cuts an optimizer partition into sub-groups: a partition of `numel`
// elements and zero_optimization.sub_group_size `size` gives consecutive sub-groups of `size`
// elements, the last one shorter when `size` does not divide `numel` (none when `numel` is 0).
// The partition layout (zero/partition.h) cuts with it and hands the OptimizerSwapper its
// sub-groups; the memory plan sizes the swap extents from it without listing them (a tiny
// sub_group_size must not make `zinf estimate` build a list of billions).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace zinf::offload {

struct SubGroupCut {
  uint64_t size = 0;   // elements of each sub-group but the last
  uint64_t count = 0;  // sub-groups
  uint64_t last = 0;   // elements of the last one (`size` when it divides the partition)

  [[nodiscard]] uint64_t numel(uint64_t i) const noexcept { return i + 1 == count ? last : size; }
  [[nodiscard]] uint64_t largest() const noexcept {
    return count == 0 ? 0 : count == 1 ? last : size;
  }
  // Every sub-group's size, in order.
  [[nodiscard]] std::vector<uint64_t> sizes() const {
    std::vector<uint64_t> out(static_cast<size_t>(count), size);
    if (count > 0) out.back() = last;
    return out;
  }
};

// std::invalid_argument naming sub_group_size for 0.
[[nodiscard]] inline SubGroupCut cut_sub_groups(uint64_t numel, uint64_t size) {
  if (size == 0) {
    throw std::invalid_argument("zero_optimization.sub_group_size must be > 0");
  }
  SubGroupCut cut;
  cut.size = size;
  cut.count = (numel + size - 1) / size;
  cut.last = cut.count == 0 ? 0 : numel - (cut.count - 1) * size;
  return cut;
}

}  // namespace zinf::offload
