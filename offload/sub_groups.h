// The one rule that cuts an optimizer partition into sub-groups: a partition of `numel`
// elements and zero_optimization.sub_group_size `size` gives consecutive sub-groups of `size`
// elements, the last one shorter when `size` does not divide `numel` (none when `numel` is 0).
// The partition layout (zero/partition.h) cuts with it, the OptimizerSwapper takes the cut it
// is handed, and the memory plan sizes the swap extents from it.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace zinf::offload {

// Sub-group sizes in partition order; std::invalid_argument naming sub_group_size for 0.
[[nodiscard]] inline std::vector<uint64_t> cut_sub_groups(uint64_t numel, uint64_t size) {
  if (size == 0) {
    throw std::invalid_argument("zero_optimization.sub_group_size must be > 0");
  }
  std::vector<uint64_t> sizes;
  sizes.reserve(static_cast<size_t>((numel + size - 1) / size));
  for (uint64_t offset = 0; offset < numel; offset += size) {
    sizes.push_back(numel - offset < size ? numel - offset : size);
  }
  return sizes;
}

}  // namespace zinf::offload
