// The rank's partition in a checkpoint: the units it is saved as (a sub-group at stage 3, a
// parameter's slice at stages 0-2), the arrays saved (fp32 params, then the optimizer's
// states), where this rank's elements lie in a checkpoint's units (map_sources), and the
// streams that carry an array between the OptimizerSwapper and a torch archive sub-group by
// sub-group in both directions (stream_out, stream_in), so that nothing holds a whole
// partition in memory.
//
// Thread safety: stream_out and stream_in run a reader on a second thread of their own and
// return once it is done; the swapper sees one call at a time. The rest is plain data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "aio/handle.h"
#include "offload/optimizer_swapper.h"
#include "optimizer_cpu/optimizer.h"
#include "serialization/torch_archive.h"
#include "zero/partition.h"
#include "zero/zero_model.h"

namespace zinf::engine::checkpoint {

// What one saved tensor of the partition covers: a sub-group (stage 3) or a parameter's slice
// (stages 0-2). `valid` elements are viewed; the storage holds all `numel` (padding included).
struct Unit {
  uint64_t offset = 0;
  uint64_t numel = 0;
  uint64_t valid = 0;
};

// The units of `layout` at ZeRO stage `stage`, in partition order.
[[nodiscard]] std::vector<Unit> partition_units(const zero::PartitionLayout& layout, int stage);

// One of the partition's optimizer-state arrays and its name in torch's optimizer state.
struct StateName {
  offload::OptimizerState state;
  const char* name;
};

// What save and load both walk: the rank's partition, its arrays and units, and the
// trainable parameters in layout order.
struct PartitionView {
  PartitionView(zero::ZeroModel& model, const optimizer_cpu::StateArrays& state_names);
  const zero::PartitionLayout& layout;
  offload::OptimizerSwapper& swapper;
  std::vector<StateName> states;
  std::vector<Unit> units;
  std::vector<const zero::ZeroModel::Param*> trainable;
};

// A page-aligned float array that grows: what a sub-group read for a save lands in, so the
// archive writes it in place (O_DIRECT from this memory, no copy).
class AlignedFloats {
 public:
  float* resize(uint64_t numel);

 private:
  struct Free {
    void operator()(float* p) const noexcept;
  };
  std::unique_ptr<float, Free> data_;
  uint64_t capacity_ = 0;
};

// Where this rank's partition lies in a checkpoint's unit tensors: partition elements
// [pos, pos + n) are elements [at, at + n) of saved unit `unit`. Sorted by pos; the sources
// tile the partition. For a checkpoint of this run's own layout they are its units; for one
// whose parameters are in another order (zinf's Llama before it took transformers' order) or
// whose stage-3 sub-groups are cut elsewhere (DeepSpeed's, or another sub_group_size) each
// parameter's slice is found by its name.
struct Source {
  uint64_t pos = 0;
  uint64_t n = 0;
  size_t unit = 0;
  uint64_t at = 0;
};

// `saved_index[p]`: the position in the checkpoint's param_shapes of this run's trainable
// parameter p (layout order); `saved` the checkpoint's layout of those parameters, for this
// rank; `saved_units` its unit tensors (offsets into the saved partition, tiling it; the
// caller checks that they cover the slices).
[[nodiscard]] std::vector<Source> map_sources(const zero::PartitionLayout& mine,
                                              const std::vector<size_t>& saved_index,
                                              const zero::PartitionLayout& saved,
                                              const std::vector<Unit>& saved_units);

// Streams partition array `state` into the archive, sub-group by sub-group: unit u's storage
// under keys[u]. The next sub-group is read (on another thread; the swapper sees one call at
// a time) while this one is written, so the save runs at the slower of the two rates rather
// than their sum. A sub-group the swapper holds in memory (its CPU arrays, or a buffer set
// that still holds it after the last step) is written from there, not read: up to two
// sub-group buffers are needed for the rest. Storages start at 4 KiB in the file and every
// sub-group's memory is page-aligned, so the writer writes them in place; a read buffer is
// reused only after writer.sync(). `buffers` must outlive `writer`'s last write. Passes a
// crash point after each sub-group. Returns the bytes written.
uint64_t stream_out(offload::OptimizerSwapper& sw, offload::OptimizerState state,
                    const zero::PartitionLayout& layout, const std::vector<Unit>& units,
                    const std::vector<std::string>& keys, serialization::TorchArchiveWriter& writer,
                    AlignedFloats (&buffers)[2]);

// Fills partition array `state` from the archive's unit tensors, sub-group by sub-group,
// each piece from where `sources` finds it. The next sub-group is read from `file` through
// `io` (the run's aio settings: O_DIRECT, several requests in flight; a cold file's pages
// come much faster so than through the mapping's page faults) on another thread while this
// one is written to the swapper, so a load runs at the slower of reading and writing rather
// than their sum. Each record's CRC-32 is checked: as its bytes go by where the pieces of
// every unit arrive in order from its start (a checkpoint of this run's order), else the
// records are read once whole before the load. A record that fails it stops the load with a
// SerializationError naming the file, the record and its offset (the sub-groups before it are
// restored by then, so the engine's states are partly the checkpoint's: load another before
// training on).
void stream_in(offload::OptimizerSwapper& sw, offload::OptimizerState state,
               const zero::PartitionLayout& layout, const std::vector<Source>& sources,
               const std::vector<const serialization::TensorRef*>& refs,
               const serialization::TorchArchive& archive, const std::string& file,
               aio::AioHandle& io, AlignedFloats (&buffers)[2]);

// The storage keys the optimizer file's pickle gives the partition's tensors, [array][unit]
// (array 0: the params, then the states): FileBuilder numbers storages in the order
// optimizer_dict() (deepspeed_layout.h) asks for them — the params of every unit, then unit
// by unit its states. A step that writes the records before the pickle exists (a prepared
// save) names them with these; the save checks that they agree.
[[nodiscard]] std::vector<std::vector<std::string>> partition_keys(size_t units, size_t states);

}  // namespace zinf::engine::checkpoint
