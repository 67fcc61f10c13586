// PartitionLayout: which elements of every parameter this rank owns, and where they sit in
// the rank's flat partition — the layout every ZeRO stage shares.
//
// Each parameter's flattened elements are padded with zeros to a multiple of the world size
// W and cut into W equal slices of `slice_numel = ceil(numel / W)` elements; rank r owns
// elements [r * slice_numel, (r + 1) * slice_numel) of the padded parameter (so the last
// ranks' slices may be partly or wholly padding). The rank's slices are packed, in
// parameter order, into one flat partition of `partition_numel()` elements — the same
// length on every rank, padding included, which is what DeepSpeed's stage 3 stores as
// `fp32_flat_groups` (see reference/checkpoint-format.md).
//
// Sub-groups: the flat partition is cut into consecutive sub-groups of `sub_group_size`
// elements (the last may be shorter): the unit in which the optimizer's states move between
// NVMe and pinned memory. A sub-group boundary may fall inside a parameter's slice: the
// slice then belongs to both sub-groups, its first part to one and the rest to the next
// (for_each_overlap() hands out such pieces). Parameters are never reordered, so a
// sub-group's bytes never depend on the sub-group size.
//
// Stage 0 (plain data parallelism) uses a layout with world size 1: every rank owns
// everything.
//
// Thread safety: immutable after construction; every method may be called from any thread.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace zinf::zero {

struct ParamSlice {
  uint64_t numel = 0;             // elements of the whole parameter
  uint64_t slice_numel = 0;       // elements each rank owns: ceil(numel / world_size)
  uint64_t partition_offset = 0;  // where this rank's slice starts in the flat partition
  uint64_t valid_numel = 0;       // elements of this rank's slice that are not padding
  uint64_t slice_begin = 0;       // first element of the parameter this rank owns
};

struct SubGroupRange {
  uint64_t offset = 0;  // first element in the flat partition
  uint64_t numel = 0;
};

class PartitionLayout {
 public:
  // `numels`: elements of each parameter, in registration order (each > 0). Throws
  // ZeroError (zero/error.h) for a world size < 1, a rank outside [0, world_size), a zero
  // sub_group_size or a parameter with no elements (naming its index).
  PartitionLayout(const std::vector<uint64_t>& numels, int world_size, int rank,
                  uint64_t sub_group_size);

  [[nodiscard]] int world_size() const noexcept { return world_size_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] size_t param_count() const noexcept { return slices_.size(); }
  [[nodiscard]] const ParamSlice& slice(size_t param) const { return slices_.at(param); }
  // Elements of the flat partition (sum of slice_numel; identical on every rank).
  [[nodiscard]] uint64_t partition_numel() const noexcept { return partition_numel_; }
  // Elements of all parameters, unpadded.
  [[nodiscard]] uint64_t total_numel() const noexcept { return total_numel_; }
  [[nodiscard]] const std::vector<SubGroupRange>& sub_groups() const noexcept {
    return sub_groups_;
  }

  // Calls fn(param, slice_offset, partition_offset, numel) for every parameter slice piece
  // that intersects partition elements [offset, offset + numel), in partition order:
  // `slice_offset` counts from the start of the parameter's slice (so the parameter element
  // is slice_begin + slice_offset). Padding elements are included (the caller may skip
  // those at or beyond valid_numel).
  template <typename Fn>
  void for_each_overlap(uint64_t offset, uint64_t numel, Fn&& fn) const {
    const uint64_t end = offset + numel;
    size_t p = first_param_at(offset);
    for (; p < slices_.size(); ++p) {
      const ParamSlice& s = slices_[p];
      if (s.partition_offset >= end) {
        break;
      }
      const uint64_t begin = s.partition_offset > offset ? s.partition_offset : offset;
      const uint64_t stop =
          s.partition_offset + s.slice_numel < end ? s.partition_offset + s.slice_numel : end;
      if (begin < stop) {
        fn(p, begin - s.partition_offset, begin, stop - begin);
      }
    }
  }

 private:
  // Index of the parameter whose slice contains partition element `offset`.
  size_t first_param_at(uint64_t offset) const;

  int world_size_;
  int rank_;
  std::vector<ParamSlice> slices_;
  std::vector<SubGroupRange> sub_groups_;
  uint64_t partition_numel_ = 0;
  uint64_t total_numel_ = 0;
};

}  // namespace zinf::zero
