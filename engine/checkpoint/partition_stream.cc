// The rank's partition in a checkpoint (partition_stream.h): its units and arrays, where a
// checkpoint's units hold this rank's elements, and the sub-group streams between the
// OptimizerSwapper and a torch archive.

#include "engine/checkpoint/partition_stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <new>

#include "engine/checkpoint/folder.h"
#include "serialization/serialization_error.h"
#include "serialization/zip_reader.h"

namespace zinf::engine::checkpoint {
namespace {

namespace ser = zinf::serialization;
using offload::OptimizerState;

// The partition's arrays as the checkpoint names them: the optimizer's states in torch's
// names (the fp32 params come first, outside this list).
std::vector<StateName> optimizer_states(offload::OptimizerSwapper& sw,
                                        const optimizer_cpu::StateArrays& names) {
  std::vector<StateName> out;
  if (sw.has_state(OptimizerState::kExpAvg)) {
    out.push_back({OptimizerState::kExpAvg, names.exp_avg_name.data()});  // literals: terminated
  }
  if (sw.has_state(OptimizerState::kExpAvgSq)) {
    out.push_back({OptimizerState::kExpAvgSq, names.exp_avg_sq_name.data()});
  }
  return out;
}

// Waits for a task that uses memory of the frame it lives in, so that no exception leaves the
// frame while the task runs.
struct WaitOnExit {
  std::future<void>& task;
  ~WaitOnExit() {
    if (task.valid()) task.wait();
  }
};

// Calls fn(source, pos, n) for each piece of sub-group `g` that one source covers: partition
// elements [pos, pos + n), in order.
template <typename Fn>
void for_each_source(const zero::SubGroupRange& g, const std::vector<Source>& sources, Fn&& fn) {
  const uint64_t end = g.offset + g.numel;
  auto s = std::upper_bound(sources.begin(), sources.end(), g.offset,
                            [](uint64_t at, const Source& x) { return at < x.pos + x.n; });
  for (uint64_t pos = g.offset; pos < end && s != sources.end(); ++s) {
    const uint64_t n = std::min(end, s->pos + s->n) - pos;
    fn(*s, pos, n);
    pos += n;
  }
}

// The sources of a partition read or written in this run's own layout: each unit where it is.
std::vector<Source> unit_sources(const std::vector<Unit>& units) {
  std::vector<Source> out;
  for (size_t u = 0; u < units.size(); ++u) out.push_back({units[u].offset, units[u].numel, u, 0});
  return out;
}

}  // namespace

std::vector<Unit> partition_units(const zero::PartitionLayout& layout, int stage) {
  std::vector<Unit> units;
  if (stage == 3) {
    for (const zero::SubGroupRange& g : layout.sub_groups())
      units.push_back({g.offset, g.numel, g.numel});
  } else {
    for (size_t p = 0; p < layout.param_count(); ++p) {
      const zero::ParamSlice& s = layout.slice(p);
      units.push_back({s.partition_offset, s.slice_numel, s.valid_numel});
    }
  }
  return units;
}

PartitionView::PartitionView(zero::ZeroModel& model, const optimizer_cpu::StateArrays& state_names)
    : layout(model.layout()),
      swapper(model.optimizer().swapper()),
      states(optimizer_states(swapper, state_names)),
      units(partition_units(layout, model.stage())),
      trainable(layout.param_count()) {
  for (const auto& p : model.params()) {
    if (p.trainable) trainable[static_cast<size_t>(p.layout_index)] = &p;
  }
}

float* AlignedFloats::resize(uint64_t numel) {
  if (numel > capacity_) {
    const uint64_t bytes = (numel * sizeof(float) + 4095) / 4096 * 4096;
    data_.reset(static_cast<float*>(std::aligned_alloc(4096, static_cast<size_t>(bytes))));
    if (data_ == nullptr) throw std::bad_alloc();
    capacity_ = bytes / sizeof(float);
  }
  return data_.get();
}

void AlignedFloats::Free::operator()(float* p) const noexcept { std::free(p); }

std::vector<Source> map_sources(const zero::PartitionLayout& mine,
                                const std::vector<size_t>& saved_index,
                                const zero::PartitionLayout& saved,
                                const std::vector<Unit>& saved_units) {
  std::vector<Source> out;
  for (size_t p = 0; p < mine.param_count(); ++p) {
    const zero::ParamSlice& s = mine.slice(p);
    uint64_t pos = s.partition_offset;
    uint64_t from = saved.slice(saved_index[p]).partition_offset;
    uint64_t left = s.slice_numel;
    while (left > 0) {
      auto u = std::upper_bound(saved_units.begin(), saved_units.end(), from,
                                [](uint64_t at, const Unit& x) { return at < x.offset + x.numel; });
      if (u == saved_units.end()) break;  // checked by the caller: the units cover the slices
      const uint64_t n = std::min(left, u->offset + u->numel - from);
      const auto unit = static_cast<size_t>(u - saved_units.begin());
      Source next{pos, n, unit, from - u->offset};
      if (!out.empty() && out.back().unit == unit && out.back().at + out.back().n == next.at &&
          out.back().pos + out.back().n == pos) {
        out.back().n += n;  // contiguous in both: one piece
      } else {
        out.push_back(next);
      }
      pos += n;
      from += n;
      left -= n;
    }
  }
  return out;
}

uint64_t stream_out(offload::OptimizerSwapper& sw, OptimizerState state,
                    const zero::PartitionLayout& layout, const std::vector<Unit>& units,
                    const std::vector<std::string>& keys, ser::TorchArchiveWriter& writer,
                    AlignedFloats (&buffers)[2]) {
  const auto& groups = layout.sub_groups();
  // A sub-group's pieces, one per unit it overlaps, with their CRC-32 (the zip records need
  // it): taken on the reading thread, so the writing thread only copies.
  struct Piece {
    uint64_t pos = 0;  // partition offset
    uint64_t numel = 0;
    uint32_t crc = 0;
  };
  const std::vector<Source> pieces_of_units = unit_sources(units);
  const float* data[2] = {nullptr, nullptr};
  std::vector<Piece> pieces[2];
  // A sub-group the swapper holds in memory is written from there; any other is read.
  auto read = [&](size_t g) {
    const float*& d = data[g % 2];
    d = static_cast<const float*>(sw.held(state, g));
    if (d == nullptr) {
      float* b = buffers[g % 2].resize(groups[g].numel);
      sw.read_sub_group(state, g, b);
      d = b;
    }
    std::vector<Piece>& list = pieces[g % 2];
    list.clear();
    for_each_source(groups[g], pieces_of_units, [&](const Source&, uint64_t pos, uint64_t n) {
      const auto* bytes = reinterpret_cast<const uint8_t*>(d + (pos - groups[g].offset));
      list.push_back(
          {pos, n, ser::crc32_update(0, {bytes, static_cast<size_t>(n * sizeof(float))})});
    });
  };
  std::future<void> next;
  const WaitOnExit drain{next};  // the reader uses buffers of this frame
  size_t u = 0;
  uint64_t done = 0;  // of unit u
  uint64_t bytes = 0;
  writer.sync();  // no write reads the buffers any more (an earlier array's)
  if (!groups.empty()) read(0);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (next.valid()) next.get();
    writer.sync();  // sub-group g - 1's buffer is free for g + 1
    if (g + 1 < groups.size()) next = std::async(std::launch::async, read, g + 1);
    for (const Piece& piece : pieces[g % 2]) {
      if (done == 0) writer.begin_storage(keys[u], units[u].numel * sizeof(float), 4096);
      writer.write_stable(
          {reinterpret_cast<const uint8_t*>(data[g % 2] + (piece.pos - groups[g].offset)),
           static_cast<size_t>(piece.numel * sizeof(float))},
          piece.crc);
      done += piece.numel;
      bytes += piece.numel * sizeof(float);
      if (done == units[u].numel) {
        ++u;
        done = 0;
      }
    }
    crash_point();
  }
  return bytes;
}

void stream_in(offload::OptimizerSwapper& sw, OptimizerState state,
               const zero::PartitionLayout& layout, const std::vector<Source>& sources,
               const std::vector<const ser::TensorRef*>& refs, const ser::TorchArchive& archive,
               const std::string& file, aio::AioHandle& io, AlignedFloats (&buffers)[2]) {
  std::vector<ser::TorchArchive::StorageRecord> records(refs.size());
  for (size_t u = 0; u < refs.size(); ++u) records[u] = archive.storage_record(refs[u]->storage);
  auto corrupt = [&](const ser::TorchArchive::StorageRecord& r, uint32_t crc) {
    return ser::SerializationError(
        file, r.data_offset,
        fmt::format(
            "record {} fails its CRC-32 (recorded {:08x}, data {:08x}): the file is corrupt",
            r.name, r.crc32, crc));
  };
  // Where each unit's last piece ends, and whether every unit's pieces follow each other
  // from its first element in the order the load reads them.
  std::vector<uint64_t> last_end(refs.size(), 0);
  std::vector<uint64_t> next_at(refs.size(), 0);
  bool in_order = true;
  for (const Source& s : sources) {
    in_order = in_order && s.at == next_at[s.unit];
    next_at[s.unit] = s.at + s.n;
    last_end[s.unit] = std::max(last_end[s.unit], s.at + s.n);
  }
  for (size_t u = 0; u < refs.size(); ++u) in_order = in_order && last_end[u] > 0;
  if (!in_order) {
    for (const ser::TorchArchive::StorageRecord& r : records) {
      if (const uint32_t crc = ser::crc32_update(0, r.bytes); crc != r.crc32) throw corrupt(r, crc);
    }
  }
  std::vector<uint32_t> crc(refs.size(), 0);  // of each unit's bytes so far
  const auto& groups = layout.sub_groups();
  auto gather = [&](size_t g) {
    float* b = buffers[g % 2].resize(groups[g].numel);
    for_each_source(groups[g], sources, [&](const Source& s, uint64_t pos, uint64_t n) {
      (void)io.async_pread(b + (pos - groups[g].offset), n * sizeof(float), file,
                           records[s.unit].data_offset + (s.at + pos - s.pos) * sizeof(float));
    });
    io.wait();
    if (!in_order) return;
    for_each_source(groups[g], sources, [&](const Source& s, uint64_t pos, uint64_t n) {
      const float* got = b + (pos - groups[g].offset);
      const size_t u = s.unit;
      crc[u] = ser::crc32_update(
          crc[u], {reinterpret_cast<const uint8_t*>(got), static_cast<size_t>(n * sizeof(float))});
      const uint64_t end = s.at + pos - s.pos + n;
      if (end != last_end[u]) return;  // not the unit's last piece
      const ser::TorchArchive::StorageRecord& r = records[u];
      if (r.bytes.size() > end * sizeof(float)) {  // bytes past the pieces (padding)
        crc[u] = ser::crc32_update(crc[u], r.bytes.subspan(end * sizeof(float)));
      }
      if (crc[u] != r.crc32) throw corrupt(r, crc[u]);
    });
  };
  std::future<void> next;
  const WaitOnExit drain{next};  // the gatherer fills buffers the caller owns
  if (!groups.empty()) gather(0);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (next.valid()) next.get();
    if (g + 1 < groups.size()) next = std::async(std::launch::async, gather, g + 1);
    sw.write_sub_group(state, g, buffers[g % 2].resize(groups[g].numel));
  }
}

std::vector<std::vector<std::string>> partition_keys(size_t units, size_t states) {
  std::vector<std::vector<std::string>> keys(1 + states, std::vector<std::string>(units));
  for (size_t u = 0; u < units; ++u) {
    keys[0][u] = std::to_string(u);
    for (size_t a = 0; a < states; ++a) keys[1 + a][u] = std::to_string(units + u * states + a);
  }
  return keys;
}

}  // namespace zinf::engine::checkpoint
