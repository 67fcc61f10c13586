#include "zero/partition.h"

#include <algorithm>
#include <string>

#include "offload/sub_groups.h"
#include "zero/error.h"

namespace zinf::zero {

PartitionLayout::PartitionLayout(const std::vector<uint64_t>& numels, int world_size, int rank,
                                 uint64_t sub_group_size)
    : world_size_(world_size), rank_(rank) {
  if (world_size < 1) {
    throw ZeroError("partition: world size " + std::to_string(world_size) + " must be at least 1");
  }
  if (rank < 0 || rank >= world_size) {
    throw ZeroError("partition: rank " + std::to_string(rank) + " is outside [0, " +
                    std::to_string(world_size) + ")");
  }
  if (sub_group_size == 0) {
    throw ZeroError("partition: zero_optimization.sub_group_size must be > 0");
  }
  const auto w = static_cast<uint64_t>(world_size);
  const auto r = static_cast<uint64_t>(rank);
  slices_.reserve(numels.size());
  for (size_t i = 0; i < numels.size(); ++i) {
    const uint64_t n = numels[i];
    if (n == 0) {
      throw ZeroError("partition: parameter " + std::to_string(i) + " has no elements");
    }
    ParamSlice s;
    s.numel = n;
    s.slice_numel = (n + w - 1) / w;
    s.slice_begin = r * s.slice_numel;
    s.valid_numel = s.slice_begin >= n ? 0 : std::min(s.slice_numel, n - s.slice_begin);
    s.partition_offset = partition_numel_;
    partition_numel_ += s.slice_numel;
    total_numel_ += n;
    slices_.push_back(s);
  }
  const offload::SubGroupCut cut = offload::cut_sub_groups(partition_numel_, sub_group_size);
  for (uint64_t g = 0; g < cut.count; ++g) {
    sub_groups_.push_back({g * cut.size, cut.numel(g)});
  }
}

size_t PartitionLayout::first_param_at(uint64_t offset) const {
  // The last slice starting at or before `offset`.
  auto it = std::upper_bound(
      slices_.begin(), slices_.end(), offset,
      [](uint64_t value, const ParamSlice& s) { return value < s.partition_offset; });
  return it == slices_.begin() ? 0 : static_cast<size_t>(it - slices_.begin()) - 1;
}

}  // namespace zinf::zero
