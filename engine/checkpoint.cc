// Engine::save_checkpoint / Engine::load_checkpoint: see engine/checkpoint.h for the layout
// and the crash-safety protocol.

#include "engine/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <thread>

#include "aio/handle.h"
#include "engine/engine.h"
#include "engine/serialization/atomic_file.h"
#include "engine/serialization/file_system.h"
#include "engine/serialization/serialization_error.h"
#include "engine/serialization/torch_archive.h"
#include "engine/serialization/zip_reader.h"
#include "zero/comm/torch_dtype.h"
#include "zero/host_collectives.h"

namespace zinf::engine {
namespace {

namespace fs = std::filesystem;
namespace ser = zinf::serialization;
using offload::OptimizerState;
using ser::PickleDocument;
using ser::PickleValue;
using Clock = std::chrono::steady_clock;

// ---- the kill seam ---------------------------------------------------------------------------

std::atomic<int64_t> g_crash_points{0};

void crash_point() {
  static const long kill_at = [] {
    const char* v = std::getenv(kCheckpointKillAtVariable);
    return v != nullptr ? std::strtol(v, nullptr, 10) : 0L;
  }();
  const int64_t passed = ++g_crash_points;
  if (kill_at > 0 && passed == kill_at) {
    std::raise(SIGKILL);
  }
}

// ---- small helpers -----------------------------------------------------------------------------

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Every change a save makes to the disk goes through the serialization layer's FileSystem
// (the system calls, or a test's power-loss fake).
ser::FileSystem& file_system() { return ser::default_file_system(); }

void fsync_dir(const fs::path& dir) {
  if (const int rc = ser::sync_directory(file_system(), dir.string()); rc != 0) {
    throw EngineError(fmt::format("checkpoint: fsync {}: {}", dir.string(), std::strerror(-rc)));
  }
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (const int rc = file_system().rename(from.string(), to.string()); rc != 0) {
    throw EngineError(fmt::format("checkpoint: rename {} -> {}: {}", from.string(), to.string(),
                                  std::strerror(-rc)));
  }
}

// Removes a replaced checkpoint folder: its checkpoint files, then the folder if nothing else
// is left in it. Returns what was left (files that appeared since the save checked).
std::vector<std::string> remove_checkpoint_folder(const fs::path& folder) {
  std::error_code ec;
  fs::directory_iterator it(folder, ec);
  if (ec) return {};
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file(ec) && is_checkpoint_file(name)) {
      // A file that stays keeps the folder, which the next save removes as a leftover.
      (void)file_system().unlink(e.path().string());
    }
  }
  std::vector<std::string> left = foreign_checkpoint_entries(folder);
  if (left.empty()) (void)file_system().rmdir(folder.string());
  return left;
}

// The N of a "global_step<N>" tag, or -1.
int64_t tag_step(const std::string& tag) {
  static const std::regex kStep(R"(global_step(\d{1,18}))");
  std::smatch m;
  return std::regex_match(tag, m, kStep) ? std::stoll(m[1]) : -1;
}

// Puts the complete `staging` folder at `target`. An existing `target` is exchanged with it
// atomically (renameat2 RENAME_EXCHANGE) and removed only afterwards; where the filesystem
// cannot exchange, it is moved aside to `aside` first (load falls back to `aside` if a crash
// leaves `target` missing). Of the replaced checkpoint, only the files a save writes are
// removed; a folder still holding anything else is kept (returned, with what it holds).
std::string publish(const fs::path& root, const fs::path& staging, const fs::path& target,
                    const fs::path& aside) {
  fsync_dir(staging);
  crash_point();
  std::error_code ec;
  fs::path replaced;
  if (!fs::exists(target, ec)) {
    rename_or_throw(staging, target);
  } else if (const int rc = file_system().exchange(staging.string(), target.string()); rc == 0) {
    fsync_dir(root);
    crash_point();
    replaced = staging;  // the previous checkpoint of this tag
  } else if (rc == -EINVAL || rc == -ENOSYS || rc == -ENOTSUP) {
    (void)remove_checkpoint_folder(aside);
    rename_or_throw(target, aside);
    crash_point();
    rename_or_throw(staging, target);
    fsync_dir(root);
    replaced = aside;
  } else {
    throw EngineError(fmt::format("checkpoint: exchange {} and {}: {}", staging.string(),
                                  target.string(), std::strerror(-rc)));
  }
  std::string kept;
  if (!replaced.empty()) {
    const std::vector<std::string> left = remove_checkpoint_folder(replaced);
    if (!left.empty()) {
      // Out of the staging name, which the next save empties.
      fs::path keep = target.string() + ".kept";
      for (int i = 2; fs::exists(keep, ec); ++i)
        keep = fmt::format("{}.kept{}", target.string(), i);
      rename_or_throw(replaced, keep);
      kept = fmt::format(
          "checkpoint {}: the replaced checkpoint's folder is kept as {}: it "
          "holds {} that zinf did not write ({})",
          target.string(), keep.string(), left.size(), fmt::join(left, ", "));
    }
  }
  fsync_dir(root);
  crash_point();
  return kept;
}

// Rank 0: an empty `staging` folder under `root` (what an interrupted save left is removed).
// `root` is made where missing, and its parent synced: a `root` made just before, by this
// save or by whoever made it without syncing its parent (zinf train makes the --save folder
// at start-up), would otherwise vanish in a power loss with every checkpoint in it.
void make_staging(const fs::path& root, const fs::path& staging) {
  ser::FileSystem& files = file_system();
  std::string at;
  if (const int rc = ser::create_directories(files, root.string(), &at); rc != 0) {
    throw EngineError(fmt::format("checkpoint: cannot create {}: {}", at, std::strerror(-rc)));
  }
  std::error_code ec;
  fs::path absolute = fs::absolute(root, ec).lexically_normal();
  if (!absolute.has_filename()) absolute = absolute.parent_path();  // "dir/"
  const fs::path parent = absolute.parent_path();
  // A parent this process may not read cannot be opened to sync: it is left as it is.
  if (const int rc = ser::sync_directory(files, parent.string());
      rc != 0 && rc != -EACCES && rc != -EPERM) {
    throw EngineError(fmt::format("checkpoint: fsync {}: {}", parent.string(), std::strerror(-rc)));
  }
  if (const int rc = ser::remove_all(files, staging.string(), &at); rc != 0) {
    throw EngineError(fmt::format("checkpoint: cannot remove {} (left by an interrupted save): {}",
                                  at, std::strerror(-rc)));
  }
  if (const int rc = files.mkdir(staging.string(), 0777); rc != 0) {
    throw EngineError(
        fmt::format("checkpoint: cannot create {}: {}", staging.string(), std::strerror(-rc)));
  }
}

void check_tag(const std::string& tag) {
  if (tag.empty() || tag == "." || tag == ".." || tag.front() == '.' ||
      tag.find('/') != std::string::npos || tag.find('\0') != std::string::npos) {
    throw EngineError(fmt::format(
        "checkpoint tag \"{}\" is not a plain folder name (no '/', not starting with '.')", tag));
  }
}

std::string read_latest(const fs::path& root) {
  const fs::path path = root / "latest";
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    throw EngineError(fmt::format("checkpoint: cannot read {}: {} (no checkpoint saved there?)",
                                  path.string(), std::strerror(errno)));
  }
  std::string tag(256, '\0');
  const size_t n = std::fread(tag.data(), 1, tag.size(), f);
  std::fclose(f);
  tag.resize(n);
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ')) {
    tag.pop_back();
  }
  if (tag.empty()) {
    throw EngineError(fmt::format("checkpoint: {} is empty", path.string()));
  }
  return tag;
}

// torch dtypes and the storage dtypes of the files, one table for both directions.
constexpr std::pair<at::ScalarType, ser::TensorDType> kDTypes[] = {
    {at::kFloat, ser::TensorDType::kFloat32},     {at::kDouble, ser::TensorDType::kFloat64},
    {at::kBFloat16, ser::TensorDType::kBFloat16}, {at::kHalf, ser::TensorDType::kFloat16},
    {at::kLong, ser::TensorDType::kInt64},        {at::kInt, ser::TensorDType::kInt32},
    {at::kShort, ser::TensorDType::kInt16},       {at::kChar, ser::TensorDType::kInt8},
    {at::kByte, ser::TensorDType::kUInt8},        {at::kBool, ser::TensorDType::kBool},
};

ser::TensorDType tensor_dtype(at::ScalarType t) {
  for (const auto& [scalar, stored] : kDTypes) {
    if (scalar == t) return stored;
  }
  throw EngineError(fmt::format("checkpoint: tensors of {} cannot be saved", c10::toString(t)));
}

at::ScalarType scalar_of(ser::TensorDType d, const std::string& file) {
  for (const auto& [scalar, stored] : kDTypes) {
    if (stored == d) return scalar;
  }
  throw EngineError(
      fmt::format("{}: a tensor of {}, which this engine does not load", file, ser::dtype_name(d)));
}

zero::DType comm_dtype(at::ScalarType t, const std::string& file) {
  switch (t) {
    case at::kFloat:
      return zero::DType::kFloat32;
    case at::kBFloat16:
      return zero::DType::kBFloat16;
    case at::kHalf:
      return zero::DType::kFloat16;
    case at::kDouble:
      return zero::DType::kFloat64;
    case at::kLong:
      return zero::DType::kInt64;
    default:
      throw EngineError(
          fmt::format("{}: a frozen parameter of {} cannot be gathered", file, c10::toString(t)));
  }
}

std::vector<int64_t> row_major_stride(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) {
    stride[i - 1] = stride[i] * std::max<int64_t>(shape[i], 1);
  }
  return stride;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// ---- building a file's pickle -------------------------------------------------------------------

// One torch.save file being built: the pickle tree, the tensors whose bytes follow it whole,
// and the keys of the storages streamed afterwards.
class FileBuilder {
 public:
  explicit FileBuilder(std::string source) : doc_(std::move(source)) {}

  PickleDocument& doc() noexcept { return doc_; }
  PickleValue* str(std::string s) { return doc_.string(std::move(s)); }
  PickleValue* integer(int64_t v) { return doc_.integer(v); }
  PickleValue* real(double v) { return doc_.floating(v); }
  PickleValue* boolean(bool v) { return doc_.boolean(v); }
  PickleValue* none() { return doc_.none(); }
  PickleValue* dict(bool ordered = false) { return doc_.dict(ordered); }
  PickleValue* list() { return doc_.list(); }
  PickleValue* size(const std::vector<int64_t>& dims) { return doc_.torch_size(dims); }
  void put(PickleValue* d, std::string_view key, PickleValue* value) {
    doc_.set_item(d, doc_.string(std::string(key)), value);
  }

  // A tensor written whole after the pickle (a contiguous CPU copy is kept until then).
  PickleValue* tensor(const at::Tensor& t) {
    at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
    const std::string key = next_key();
    const ser::TensorDType dt = tensor_dtype(cpu.scalar_type());
    ser::TensorRef ref;
    ref.storage = {key, std::string(ser::storage_type_of(dt)), dt, "cpu", cpu.numel()};
    ref.shape = cpu.sizes().vec();
    ref.stride = row_major_stride(ref.shape);
    whole_.emplace_back(key, std::move(cpu));
    return doc_.tensor(std::move(ref));
  }

  // A 1-D fp32 tensor viewing the first `view_numel` of a `storage_numel`-element storage
  // streamed later under *key.
  PickleValue* streamed(uint64_t storage_numel, uint64_t view_numel, std::string* key) {
    *key = next_key();
    ser::TensorRef ref;
    ref.storage = {*key, "FloatStorage", ser::TensorDType::kFloat32, "cpu",
                   static_cast<int64_t>(storage_numel)};
    ref.shape = {static_cast<int64_t>(view_numel)};
    ref.stride = {1};
    return doc_.tensor(std::move(ref));
  }

  // Writes data.pkl and the whole tensors.
  void write_head(ser::TorchArchiveWriter& writer, PickleValue* root) {
    doc_.set_root(root);
    writer.write_pickle(doc_.root());
    for (const auto& [key, t] : whole_) {
      writer.add_storage(
          key, {static_cast<const uint8_t*>(t.data_ptr()), static_cast<size_t>(t.nbytes())});
    }
    whole_.clear();
    crash_point();
  }

 private:
  std::string next_key() { return std::to_string(keys_++); }

  PickleDocument doc_;
  int64_t keys_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> whole_;
};

// ---- the partition's units -------------------------------------------------------------------

// What one saved tensor of the partition covers: a sub-group (stage 3) or a parameter's slice
// (stages 0-2). `valid` elements are viewed; the storage holds all `numel` (padding included).
struct Unit {
  uint64_t offset = 0;
  uint64_t numel = 0;
  uint64_t valid = 0;
};

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

// The partition's arrays as the checkpoint names them: the fp32 params, then the optimizer's
// states in torch's names.
struct StateName {
  OptimizerState state;
  const char* name;
};

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

// "adam", "adamw", "adagrad", "lion": how checkpoints name the optimizer in zinf's own fields.
std::string lower_name(optimizer_cpu::OptimizerKind kind) {
  return lower(std::string(optimizer_cpu::to_string(kind)));
}

// What save and load both walk: the rank's partition, its arrays and units, and the
// trainable parameters in layout order.
struct PartitionView {
  PartitionView(zero::ZeroModel& model, const optimizer_cpu::StateArrays& state_names)
      : layout(model.layout()),
        swapper(model.optimizer().swapper()),
        states(optimizer_states(swapper, state_names)),
        units(partition_units(layout, model.stage())),
        trainable(layout.param_count()) {
    for (const auto& p : model.params()) {
      if (p.trainable) trainable[static_cast<size_t>(p.layout_index)] = &p;
    }
  }
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
  float* resize(uint64_t numel) {
    if (numel > capacity_) {
      const uint64_t bytes = (numel * sizeof(float) + 4095) / 4096 * 4096;
      data_.reset(static_cast<float*>(std::aligned_alloc(4096, static_cast<size_t>(bytes))));
      if (data_ == nullptr) throw std::bad_alloc();
      capacity_ = bytes / sizeof(float);
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  uint64_t capacity_ = 0;
};

// Waits for a task that uses memory of the frame it lives in, so that no exception leaves the
// frame while the task runs.
struct WaitOnExit {
  std::future<void>& task;
  ~WaitOnExit() {
    if (task.valid()) task.wait();
  }
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
// rank; `saved_units` its unit tensors (offsets into the saved partition, tiling it).
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

// Streams partition array `state` into the archive, sub-group by sub-group: unit u's storage
// under keys[u]. The next sub-group is read (on another thread; the swapper sees one call at
// a time) while this one is written, so the save runs at the slower of the two rates rather
// than their sum. A sub-group the swapper holds in memory (its CPU arrays, or a buffer set
// that still holds it after the last step) is written from there, not read: up to two
// sub-group buffers are needed for the rest. Storages start at 4 KiB in the file and every
// sub-group's memory is page-aligned, so the writer writes them in place; a read buffer is
// reused only after writer.sync(). Returns the bytes written.
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

// Fills partition array `state` from the archive's unit tensors, sub-group by sub-group,
// each piece from where `sources` finds it. The next sub-group is read from `file` through
// `io` (the run's aio settings: O_DIRECT, several requests in flight; a cold file's pages
// come much faster so than through the mapping's page faults) on another thread while this
// one is written to the swapper, so a load runs at the slower of reading and writing rather
// than their sum. Each record's CRC-32 is checked: as its bytes go by where the pieces of
// every unit arrive in order from its start (a checkpoint of this run's order), else the
// records are read once whole before the load. A record that fails it stops the load with an
// error naming the file, the record and its offset (the sub-groups before it are restored by
// then, so the engine's states are partly the checkpoint's: load another before training on).
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

// The storage keys the optimizer file's pickle gives the partition's tensors: FileBuilder
// numbers storages in the order optimizer_dict() asks for them — the params of every unit,
// then unit by unit its states. A step that writes the records before the pickle exists
// (Engine::prepare_checkpoint) names them with these; the save checks that they agree.
std::vector<std::vector<std::string>> partition_keys(size_t units, size_t states) {
  std::vector<std::vector<std::string>> keys(1 + states, std::vector<std::string>(units));
  for (size_t u = 0; u < units; ++u) {
    keys[0][u] = std::to_string(u);
    for (size_t a = 0; a < states; ++a) keys[1 + a][u] = std::to_string(units + u * states + a);
  }
  return keys;
}

}  // namespace

// ---- a save prepared before the step it follows -----------------------------------------------

// The optimizer file of a save that the step before it writes (Engine::prepare_checkpoint):
// the swapper shows it each sub-group's updated arrays (StepObserver); a thread of its own
// takes their CRC-32 and writes them as the sub-group's records (params, then the states),
// straight from the swapper's buffers (AtomicFile writes 4 KiB-aligned records in place),
// and tells the swapper when a sub-group's buffers are free again. The save then adds the
// pickle and finishes the file. An error stops the writing and is kept for the save, which
// then streams instead.
struct Engine::PreparedSave final : offload::StepObserver {
  PreparedSave(fs::path root_in, std::string tag_in, fs::path staging_in, const std::string& name,
               std::vector<StateName> states_in, size_t units)
      : root(std::move(root_in)),
        tag(std::move(tag_in)),
        staging(std::move(staging_in)),
        file((staging / name).string()),
        states(std::move(states_in)),
        keys(partition_keys(units, states.size())),
        writer(std::make_unique<ser::TorchArchiveWriter>(file)),
        thread([this] { run(); }) {}

  ~PreparedSave() override {
    stop();
    writer.reset();                    // removes its temporary file unless finished
    if (owns_staging && !published) {  // rank 0, and no save took it: leave no folder behind
      (void)ser::remove_all(file_system(), staging.string());  // the next save retries it
    }
  }

  void updated(size_t sub_group, uint64_t numel, const OptimizerState* kinds,
               const void* const* arrays, size_t count) noexcept override {
    Job job{sub_group, numel, std::vector<const float*>(1 + states.size(), nullptr)};
    for (size_t k = 0; k < count; ++k) {
      if (kinds[k] == OptimizerState::kParams) job.arrays[0] = static_cast<const float*>(arrays[k]);
      for (size_t a = 0; a < states.size(); ++a) {
        if (kinds[k] == states[a].state) job.arrays[1 + a] = static_cast<const float*>(arrays[k]);
      }
    }
    std::lock_guard<std::mutex> lock(mutex);
    jobs.push_back(std::move(job));
    changed.notify_all();
  }

  void release(size_t sub_group) noexcept override {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return jobs.empty() || jobs.front().sub_group > sub_group; });
  }

  // Ends the writing thread (after the jobs queued so far).
  void stop() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
      changed.notify_all();
    }
    if (thread.joinable()) thread.join();
  }

  // Whether an early write failed.
  [[nodiscard]] bool failed() {
    std::lock_guard<std::mutex> lock(mutex);
    return !error.empty();
  }

  // Why the save cannot use this file, for the log ("" when it can).
  [[nodiscard]] std::string unusable(const fs::path& root_in, const std::string& tag_in,
                                     int64_t applied_steps, size_t sub_groups) {
    if (root_in != root || tag_in != tag) {
      return fmt::format("it was prepared for {}", (root / tag).string());
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (!error.empty()) return "writing it during the step failed: " + error;
    if (!step_applied) return "no optimizer step ran after it was prepared";
    if (step_count != applied_steps) return "another optimizer step ran after it";
    if (written != sub_groups) {
      return fmt::format("the step wrote {} of {} sub-groups", written, sub_groups);
    }
    return {};
  }

  const fs::path root;
  const std::string tag;
  const fs::path staging;
  const std::string file;
  const std::vector<StateName> states;
  const std::vector<std::vector<std::string>> keys;  // [array][unit], as the pickle names them
  std::unique_ptr<ser::TorchArchiveWriter> writer;
  bool owns_staging = false;  // rank 0 made the staging folder
  bool published = false;     // a save finished the file: the folder is the checkpoint's
  bool observed = false;      // shown to a step (at most one)
  bool step_applied = false;  // that step ran (not skipped)
  int64_t step_count = 0;     // the engine's applied steps after it
  uint64_t bytes = 0;         // record bytes written

 private:
  struct Job {
    size_t sub_group;
    uint64_t numel;
    std::vector<const float*> arrays;  // params, then states; unchanged until released
  };

  void run() noexcept {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return !jobs.empty() || stopping; });
        if (jobs.empty()) return;
        job = jobs.front();  // stays queued (unreleased) until written
      }
      std::string failure;
      uint64_t done = 0;
      if (error_seen.load(std::memory_order_relaxed) == false) {
        try {
          for (size_t a = 0; a < job.arrays.size(); ++a) {
            if (job.arrays[a] == nullptr) {
              throw std::logic_error(fmt::format("sub-group {} was shown without its {}",
                                                 job.sub_group,
                                                 a == 0 ? "params" : states[a - 1].name));
            }
            const std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(job.arrays[a]),
                                                static_cast<size_t>(job.numel * sizeof(float)));
            if (fail_at > 0 && ++records_seen == fail_at) {
              throw ser::SerializationError(
                  file, ser::kNoOffset,
                  std::string("write failed: injected by ") + kCheckpointFailEarlyWriteVariable);
            }
            const uint32_t crc = ser::crc32_update(0, data);
            writer->begin_storage(keys[a][job.sub_group], data.size(), 4096);
            writer->write_stable(data, crc);
            done += data.size();
            crash_point();
          }
          writer->sync();  // the writes no longer read the step's buffers
        } catch (const std::exception& e) {
          failure = e.what();
          error_seen.store(true, std::memory_order_relaxed);
          // The file is of no use now; dropping it waits for a write that may still read the
          // step's buffers, before they are released.
          writer.reset();
        }
      }
      std::lock_guard<std::mutex> lock(mutex);
      if (!failure.empty() && error.empty()) error = failure;
      if (failure.empty() && error.empty()) {
        ++written;
        bytes += done;
      }
      jobs.pop_front();
      changed.notify_all();
    }
  }

  // The test seam: the record to fail at (0: none), and the records begun so far.
  const long fail_at = [] {
    const char* v = std::getenv(kCheckpointFailEarlyWriteVariable);
    return v != nullptr ? std::strtol(v, nullptr, 10) : 0L;
  }();
  long records_seen = 0;
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Job> jobs;  // shown, not yet written; the front is being written
  size_t written = 0;    // sub-groups whose records are complete
  std::string error;
  std::atomic<bool> error_seen{false};
  bool stopping = false;
  std::thread thread;  // last: starts once the rest exists
};

void Engine::PreparedSaveDelete::operator()(PreparedSave* p) const noexcept { delete p; }

offload::StepObserver* Engine::prepared_observer() noexcept {
  if (!prepared_save_ || prepared_save_->observed) return nullptr;
  prepared_save_->observed = true;
  return prepared_save_.get();
}

void Engine::prepared_step_done(bool applied) noexcept {
  if (!prepared_save_) return;
  prepared_save_->step_applied = applied;
  prepared_save_->step_count = applied_steps_;
}

bool Engine::prepare_checkpoint(const std::string& dir, const std::string& tag_in) {
  if (in_micro_batch_ || micro_batch_ != 0) {
    throw EngineError("prepare_checkpoint() inside an optimizer step: call it at a step boundary");
  }
  prepared_save_.reset();  // an earlier one that no save took
  const PartitionView view(*model_, optimizer_->state_arrays());
  if (model_->stage() != 3 || view.swapper.config().device != offload::OffloadDevice::kNvme) {
    return false;
  }
  const std::string tag = tag_in.empty() ? fmt::format("global_step{}", global_steps_ + 1) : tag_in;
  check_tag(tag);
  const fs::path root(dir);
  const fs::path staging = root / ("." + tag + ".partial");
  if (comm_->rank() == 0) make_staging(root, staging);
  comm_->barrier()->wait();
  const bool bf16 = options_.zero.precision == zero::Precision::kBFloat16;
  prepared_save_.reset(new PreparedSave(root, tag, staging, optim_states_file(comm_->rank(), bf16),
                                        view.states, view.units.size()));
  prepared_save_->owns_staging = comm_->rank() == 0;
  if (view.units.size() != view.layout.sub_groups().size()) {
    prepared_save_.reset();
    throw std::logic_error("prepare_checkpoint: stage 3 units are not the sub-groups");
  }
  return true;
}

namespace {

// ---- reading a file's pickle ------------------------------------------------------------------

std::vector<int64_t> saved_shape(const PickleValue& size) { return size.as_int_list(); }

// (name, shape) pairs of an OrderedDict name -> torch.Size, or of a list of them.
void collect_shapes(const PickleValue& v,
                    std::vector<std::pair<std::string, std::vector<int64_t>>>& out) {
  if (v.is_none()) return;
  if (v.is(PickleValue::Kind::kList) || v.is(PickleValue::Kind::kTuple)) {
    for (const PickleValue* item : v.items()) collect_shapes(*item, out);
    return;
  }
  for (const ser::PickleEntry& e : v.entries()) {
    out.emplace_back(e.key->as_string(), saved_shape(*e.value));
  }
}

// The tensor at state[index][name] of a torch optimizer state dict.
const ser::TensorRef& state_tensor(const PickleValue& state, int64_t index, const char* name,
                                   const std::string& file) {
  for (const ser::PickleEntry& e : state.entries()) {
    if (e.key->is(PickleValue::Kind::kInt) && e.key->as_int() == index) {
      return e.value->at(name).tensor();
    }
  }
  throw EngineError(fmt::format("{}: the optimizer state has no entry {}", file, index));
}

// Checks that every unit tensor is fp32, starts at 0, and has the unit's storage size.
void check_units(const std::vector<const ser::TensorRef*>& refs, const std::vector<Unit>& units,
                 const std::string& file, const char* what) {
  if (refs.size() != units.size()) {
    throw EngineError(fmt::format("{}: {} holds {} tensors, this run's partition has {}", file,
                                  what, refs.size(), units.size()));
  }
  for (size_t u = 0; u < units.size(); ++u) {
    const ser::TensorRef& r = *refs[u];
    if (r.storage.dtype != ser::TensorDType::kFloat32 || r.storage_offset != 0 ||
        static_cast<uint64_t>(r.storage.numel) != units[u].numel) {
      throw EngineError(fmt::format(
          "{}: {}[{}] is a {} storage of {} elements at offset {}; this run's partition needs "
          "float32 storage of {} elements",
          file, what, u, ser::dtype_name(r.storage.dtype), r.storage.numel, r.storage_offset,
          units[u].numel));
    }
  }
}

ClientValue client_value(const PickleValue& v) {
  switch (v.kind()) {
    case PickleValue::Kind::kInt:
      return v.as_int();
    case PickleValue::Kind::kBool:
      return static_cast<int64_t>(v.as_bool());
    case PickleValue::Kind::kFloat:
      return v.as_float();
    case PickleValue::Kind::kString:
      return v.as_string();
    default:
      return std::string(v.kind_name());
  }
}

const std::set<std::string>& reserved_keys() {
  static const std::set<std::string> keys = {"module",
                                             "buffer_names",
                                             "param_shapes",
                                             "frozen_param_shapes",
                                             "frozen_param_fragments",
                                             "shared_params",
                                             "optimizer",
                                             "lr_scheduler",
                                             "data_sampler",
                                             "random_ltd",
                                             "sparse_tensor_module_names",
                                             "skipped_steps",
                                             "global_steps",
                                             "global_samples",
                                             "dp_world_size",
                                             "mp_world_size",
                                             "ds_config",
                                             "ds_version",
                                             "zinf"};
  return keys;
}

constexpr const char* kVersion = "0.0.0+zinf";

}  // namespace

bool is_checkpoint_file(const std::string& name) {
  static const std::regex kNames(
      R"((mp_rank_\d+_model_states\.pt|zero_pp_rank_\d+_mp_rank_\d+_model_states\.pt|)"
      R"((bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt|pytorch_model\.bin))");
  return std::regex_match(name, kNames);
}

std::vector<std::string> foreign_checkpoint_entries(const std::string& folder) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::directory_iterator it(folder, ec);
  if (ec) return out;
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file(ec) || !is_checkpoint_file(name)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string model_states_file(int stage, int rank) {
  return stage == 3 ? fmt::format("zero_pp_rank_{}_mp_rank_00_model_states.pt", rank)
                    : std::string("mp_rank_00_model_states.pt");
}

std::string optim_states_file(int rank, bool bf16) {
  return fmt::format("{}zero_pp_rank_{}_mp_rank_00_optim_states.pt", bf16 ? "bf16_" : "", rank);
}

int64_t checkpoint_crash_points_passed() noexcept { return g_crash_points; }

// ---- save ---------------------------------------------------------------------------------------

CheckpointReport Engine::save_checkpoint(const std::string& dir, const std::string& tag_in,
                                         const ClientState& client_state) {
  if (in_micro_batch_ || micro_batch_ != 0) {
    throw EngineError("save_checkpoint() inside an optimizer step: call it at a step boundary");
  }
  for (const auto& [key, value] : client_state) {
    if (reserved_keys().count(key) != 0) {
      throw EngineError(
          fmt::format("checkpoint client state key \"{}\" is one of DeepSpeed's", key));
    }
  }
  const Clock::time_point start = Clock::now();
  const std::string tag = tag_in.empty() ? fmt::format("global_step{}", global_steps_) : tag_in;
  check_tag(tag);
  const fs::path root(dir);
  const fs::path target = root / tag;
  const fs::path staging = root / ("." + tag + ".partial");
  const int rank = comm_->rank();
  const int world = comm_->world_size();
  const int stage = model_->stage();
  const bool bf16 = options_.zero.precision == zero::Precision::kBFloat16;
  const at::ScalarType dtype = zero::detail::scalar_type(model_->compute_dtype());
  const auto& params = model_->params();
  const PartitionView view(*model_, optimizer_->state_arrays());
  const zero::PartitionLayout& layout = view.layout;
  offload::OptimizerSwapper& sw = view.swapper;
  const std::vector<StateName>& states = view.states;
  const std::vector<Unit>& units = view.units;
  const std::vector<const zero::ZeroModel::Param*>& trainable = view.trainable;
  // The last step's final writes may still be in flight (write-behind): a failure in them
  // fails this save before anything is written, rather than a later step.
  model_->flush_io();

  // A save the step before wrote the partition of (prepare_checkpoint): every rank's must be
  // usable, or every rank streams.
  // This save consumes the preparation, whatever happens to it.
  std::unique_ptr<PreparedSave, PreparedSaveDelete> prepared = std::move(prepared_save_);
  uint64_t step_written = 0;
  {
    std::string why = "not prepared";
    if (prepared) {
      why = prepared->unusable(root, tag, applied_steps_, layout.sub_groups().size());
      prepared->stop();
      if (!why.empty()) {
        const std::string line =
            fmt::format("checkpoint {}: streaming the optimizer states: {}", tag, why);
        if (prepared->failed()) {
          spdlog::warn("zinf: rank {}: {}", rank, line);  // every rank's, log or not
        } else {
          log(line);
        }
      }
    }
    int64_t unusable = why.empty() ? 0 : 1;
    if (world > 1) {
      zero::host_all_reduce(*comm_, *accelerator_, &unusable, 1, zero::DType::kInt64,
                            zero::ReduceOp::kSum);
    }
    if (unusable != 0) {
      prepared.reset();  // rank 0 removes its folder
    } else {
      step_written = prepared->bytes;
    }
  }
  // A tag folder holding files a save does not write is not replaced (zinf never deletes a
  // file it did not write): every rank fails before anything is written.
  {
    std::vector<std::string> foreign;
    if (rank == 0) foreign = foreign_checkpoint_entries(target);
    int64_t refused = foreign.empty() ? 0 : 1;
    if (world > 1) {
      zero::host_all_reduce(*comm_, *accelerator_, &refused, 1, zero::DType::kInt64,
                            zero::ReduceOp::kMax);
    }
    if (refused != 0) {
      throw EngineError(
          rank == 0 ? fmt::format("checkpoint {}: not replaced: it holds {} that zinf did not "
                                  "write ({}); move {} away or save under another tag",
                                  target.string(), foreign.size() == 1 ? "an entry" : "entries",
                                  fmt::join(foreign, ", "), foreign.size() == 1 ? "it" : "them")
                    : fmt::format("checkpoint {}: not replaced (rank 0 found files zinf did not "
                                  "write in it)",
                                  target.string()));
    }
  }
  if (rank == 0 && !prepared) make_staging(root, staging);
  comm_->barrier()->wait();

  // ---- shared pieces -----------------------------------------------------------------------
  auto ds_config = [&](FileBuilder& b) {
    PickleValue* c = b.dict();
    b.put(c, "train_micro_batch_size_per_gpu", b.integer(options_.micro_batch_size));
    b.put(c, "gradient_accumulation_steps", b.integer(gradient_accumulation_steps()));
    PickleValue* z = b.dict();
    b.put(z, "stage", b.integer(stage));
    b.put(z, "sub_group_size", b.integer(static_cast<int64_t>(options_.zero.sub_group_size)));
    b.put(c, "zero_optimization", z);
    PickleValue* o = b.dict();
    b.put(o, "type", b.str(std::string(optimizer_cpu::to_string(options_.optimizer.type))));
    b.put(c, "optimizer", o);
    PickleValue* bf = b.dict();
    b.put(bf, "enabled", b.boolean(bf16));
    b.put(c, "bf16", bf);
    PickleValue* fp = b.dict();
    b.put(fp, "enabled", b.boolean(options_.zero.precision == zero::Precision::kFloat16));
    b.put(c, "fp16", fp);
    return c;
  };
  // DeepSpeed's loss scaler object (deepspeed.runtime.fp16.loss_scaler's LossScaler, or
  // DynamicLossScaler when dynamic) with its attributes as BUILD's state, as DeepSpeed pickles
  // it: DeepSpeed's load_checkpoint puts what it finds here in place of its scaler and calls
  // its methods (a plain dict broke its next backward: "'dict' object has no attribute
  // 'scale_loss'"). The iteration, last overflow and hysteresis left are written for a
  // static scale too (zinf reads them back; Python keeps extra attributes).
  auto loss_scaler = [&](FileBuilder& b) {
    const zero::LossScaler::State s = scaler_.state();
    const bool dynamic = scaler_.dynamic();
    PickleValue* d = b.dict();
    b.put(d, "cur_scale", b.real(s.scale));
    b.put(d, "dynamic", b.boolean(dynamic));
    b.put(d, "cur_iter", b.integer(s.iteration));
    b.put(d, "last_overflow_iter", b.integer(s.last_overflow_iteration));
    b.put(d, "cur_hysteresis", b.integer(s.hysteresis_left));
    if (dynamic) {
      b.put(d, "scale_factor", b.real(2.0));
      b.put(d, "scale_window", b.integer(scaler_.window()));
      b.put(d, "min_scale", b.real(scaler_.min_scale()));
      b.put(d, "delayed_shift", b.integer(scaler_.hysteresis()));
      b.put(d, "consecutive_hysteresis", b.boolean(scaler_.consecutive_hysteresis()));
      b.put(d, "raise_error_at_min_scale", b.boolean(true));
      b.put(d, "dtype", b.doc().global("torch", "float16"));
    }
    PickleValue* scaler =
        b.doc().object("deepspeed.runtime.fp16.loss_scaler",
                       dynamic ? "DynamicLossScaler" : "LossScaler", b.doc().tuple({}), true);
    b.doc().set_state(scaler, d);
    return scaler;
  };
  // The partition's tensors (unit tensors per array) and the inner optimizer dict, DeepSpeed's
  // stage 1/2 or 3 form. keys[a][u]: storage of array a (0: params, then states) for unit u.
  std::vector<std::vector<std::string>> keys(1 + states.size(),
                                             std::vector<std::string>(units.size()));
  auto optimizer_dict = [&](FileBuilder& b) {
    PickleValue* flat = b.list();
    for (size_t u = 0; u < units.size(); ++u) {
      b.doc().append(flat, b.streamed(units[u].numel, units[u].valid, &keys[0][u]));
    }
    PickleValue* torch_state = b.dict();
    PickleValue* st = b.dict();
    for (size_t u = 0; u < units.size(); ++u) {
      PickleValue* entry = b.dict();
      b.put(entry, "step", b.integer(applied_steps_));
      for (size_t a = 0; a < states.size(); ++a) {
        b.put(entry, states[a].name, b.streamed(units[u].numel, units[u].valid, &keys[1 + a][u]));
      }
      b.doc().set_item(st, b.integer(static_cast<int64_t>(u)), entry);
    }
    b.put(torch_state, "state", st);
    PickleValue* groups = b.list();
    PickleValue* group = b.dict();
    b.put(group, "lr", b.real(report_.lr > 0 ? report_.lr : options_.optimizer.lr));
    b.put(group, "betas",
          b.doc().tuple({b.real(options_.optimizer.beta1), b.real(options_.optimizer.beta2)}));
    b.put(group, "eps", b.real(options_.optimizer.eps));
    b.put(group, "weight_decay", b.real(options_.optimizer.weight_decay));
    b.put(group, "bias_correction", b.boolean(options_.optimizer.bias_correction));
    b.put(group, "amsgrad", b.boolean(false));
    b.put(group, "zinf_optimizer", b.str(lower_name(options_.optimizer.type)));
    PickleValue* ids = b.list();
    for (size_t u = 0; u < units.size(); ++u)
      b.doc().append(ids, b.integer(static_cast<int64_t>(u)));
    b.put(group, "params", ids);
    b.doc().append(groups, group);
    b.put(torch_state, "param_groups", groups);

    PickleValue* d = b.dict();
    b.put(d, "zero_stage", b.integer(stage));
    b.put(d, "loss_scaler", loss_scaler(b));
    b.put(d, "dynamic_loss_scale", b.boolean(scaler_.dynamic()));
    b.put(d, "overflow", b.boolean(false));
    if (stage == 3) {
      b.put(d, "partition_count", b.integer(world));
      b.put(d, "optimizer_state_dict", torch_state);
      b.put(d, "fp32_flat_groups", flat);
    } else {
      b.put(d, "clip_grad", b.real(options_.zero.gradient_clipping));
      b.put(d, "base_optimizer_state", torch_state);
      b.put(d, "single_partition_of_fp32_groups", flat);
      PickleValue* paddings = b.list();
      PickleValue* counts = b.list();
      PickleValue* mappings = b.list();
      for (size_t u = 0; u < units.size(); ++u) {
        b.doc().append(paddings, b.integer(static_cast<int64_t>(units[u].numel - units[u].valid)));
        b.doc().append(counts, b.integer(layout.world_size()));
        PickleValue* m = b.dict(true);
        PickleValue* frag = b.dict();
        b.put(frag, "start", b.integer(static_cast<int64_t>(layout.slice(u).slice_begin)));
        b.put(frag, "numel", b.integer(static_cast<int64_t>(units[u].valid)));
        b.put(m, trainable[u]->name, frag);
        b.doc().append(mappings, m);
      }
      b.put(d, "group_paddings", paddings);
      b.put(d, "partition_count", counts);
      b.put(d, "param_slice_mappings", mappings);
    }
    return d;
  };
  // Declared before every writer: a writer's destructor waits for its last write, which may
  // still read these buffers when an error unwinds the save.
  AlignedFloats buffers[2];
  auto stream_partition = [&](ser::TorchArchiveWriter& writer) {
    stream_out(sw, OptimizerState::kParams, layout, units, keys[0], writer, buffers);
    for (size_t a = 0; a < states.size(); ++a) {
      stream_out(sw, states[a].state, layout, units, keys[1 + a], writer, buffers);
    }
  };

  // ---- model states ---------------------------------------------------------------------------
  std::vector<std::string> written;
  if (stage == 3 || rank == 0) {
    const std::string name = model_states_file(stage, rank);
    FileBuilder b((staging / name).string());
    PickleValue* root_dict = b.dict();
    PickleValue* module = b.dict(true);
    PickleValue* shared = b.dict();
    PickleValue* frozen_shapes = b.dict(true);
    PickleValue* frozen_fragments = b.dict(true);
    bool any_frozen = false;
    for (const auto& p : params) {
      PickleValue* t = stage == 3
                           ? b.tensor(at::empty({0}, at::TensorOptions().dtype(dtype)))
                           : b.tensor(p.var.detach().to(at::kCPU));  // a device's values: copied
      b.put(module, p.name, t);
      for (const std::string& alias : p.aliases) {
        b.put(module, alias, t);
        if (stage != 3 || rank == 0) b.put(shared, alias, b.str(p.name));
      }
      if (!p.trainable) {
        any_frozen = true;
        b.put(frozen_shapes, p.name, b.size(p.shape));
        at::Tensor flat = p.var.detach().to(at::kCPU).reshape({-1});
        if (stage == 3) {
          const int64_t slice = (static_cast<int64_t>(p.numel) + world - 1) / world;
          at::Tensor frag = at::zeros({slice}, flat.options());
          const int64_t begin = std::min<int64_t>(slice * rank, flat.numel());
          const int64_t n = std::min<int64_t>(slice, flat.numel() - begin);
          if (n > 0) frag.narrow(0, 0, n).copy_(flat.narrow(0, begin, n));
          flat = frag;
        } else {
          flat = p.var.detach().to(at::kCPU);
        }
        b.put(frozen_fragments, p.name, b.tensor(flat));
      }
    }
    PickleValue* buffer_names = b.list();
    for (const auto& item : module_->named_buffers()) {
      b.put(module, item.key(), b.tensor(item.value().to(at::kCPU)));
      b.doc().append(buffer_names, b.str(item.key()));
    }
    b.put(root_dict, "module", module);
    b.put(root_dict, "buffer_names", buffer_names);
    PickleValue* param_shapes = b.list();
    if (stage == 3) {
      // Per sub-group: the parameters whose slice starts in it, in flattening order.
      const auto& groups = layout.sub_groups();
      size_t lp = 0;
      for (const auto& g : groups) {
        PickleValue* d = b.dict(true);
        while (lp < trainable.size() && layout.slice(lp).partition_offset < g.offset + g.numel) {
          b.put(d, trainable[lp]->name, b.size(trainable[lp]->shape));
          ++lp;
        }
        b.doc().append(param_shapes, d);
      }
    } else {
      for (const auto* p : trainable) {
        PickleValue* d = b.dict(true);
        b.put(d, p->name, b.size(p->shape));
        b.doc().append(param_shapes, d);
      }
    }
    b.put(root_dict, "param_shapes", param_shapes);
    b.put(root_dict, "frozen_param_shapes", any_frozen ? frozen_shapes : b.none());
    b.put(root_dict, "frozen_param_fragments", any_frozen ? frozen_fragments : b.none());
    b.put(root_dict, "shared_params", shared);
    b.put(root_dict, "optimizer", stage == 0 ? optimizer_dict(b) : b.none());
    PickleValue* sched = b.dict();
    b.put(sched, "last_batch_iteration", b.integer(applied_steps_ - 1));
    b.put(root_dict, "lr_scheduler", sched);
    b.put(root_dict, "data_sampler", b.none());
    b.put(root_dict, "random_ltd", b.none());
    b.put(root_dict, "sparse_tensor_module_names", b.doc().set());
    b.put(root_dict, "skipped_steps", b.integer(skipped_steps_));
    b.put(root_dict, "global_steps", b.integer(global_steps_));
    b.put(root_dict, "global_samples", b.integer(global_samples_));
    b.put(root_dict, "dp_world_size", b.integer(world));
    b.put(root_dict, "mp_world_size", b.integer(1));
    b.put(root_dict, "ds_config", ds_config(b));
    b.put(root_dict, "ds_version", b.str(kVersion));
    PickleValue* z = b.dict();
    b.put(z, "zero_stage", b.integer(stage));
    b.put(z, "optimizer", b.str(lower_name(options_.optimizer.type)));
    b.put(z, "precision",
          b.str(bf16                                                   ? "bf16"
                : options_.zero.precision == zero::Precision::kFloat16 ? "fp16"
                                                                       : "fp32"));
    b.put(z, "applied_steps", b.integer(applied_steps_));
    {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      b.put(z, "rng_state", b.tensor(generator.get_state()));
    }
    if (!device_.is_cpu()) {  // the device's generator too (a GPU's)
      at::Generator generator = at::globalContext().defaultGenerator(device_);
      std::lock_guard<std::mutex> lock(generator.mutex());
      b.put(z, "device_rng_state", b.tensor(generator.get_state().to(at::kCPU)));
    }
    b.put(root_dict, "zinf", z);
    for (const auto& [key, value] : client_state) {
      std::visit(
          [&](const auto& v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, int64_t>) {
              b.put(root_dict, key, b.integer(v));
            } else if constexpr (std::is_same_v<T, double>) {
              b.put(root_dict, key, b.real(v));
            } else {
              b.put(root_dict, key, b.str(v));
            }
          },
          value);
    }
    ser::TorchArchiveWriter writer((staging / name).string());
    b.write_head(writer, root_dict);
    if (stage == 0) stream_partition(writer);
    writer.finish();
    crash_point();
    written.push_back(name);
  }

  // ---- optimizer states -----------------------------------------------------------------------
  if (stage >= 1) {
    const std::string name = optim_states_file(rank, bf16);
    FileBuilder b((staging / name).string());
    PickleValue* root_dict = b.dict();
    b.put(root_dict, "optimizer_state_dict", optimizer_dict(b));
    b.put(root_dict, "ds_config", ds_config(b));
    b.put(root_dict, "ds_version", b.str(kVersion));
    if (prepared) {
      // The records are in the file already: add the pickle, which names them.
      if (keys != prepared->keys) {
        throw std::logic_error("checkpoint: the prepared records' keys differ from the pickle's");
      }
      b.write_head(*prepared->writer, root_dict);
      prepared->writer->finish();
    } else {
      ser::TorchArchiveWriter writer((staging / name).string());
      b.write_head(writer, root_dict);
      stream_partition(writer);
      writer.finish();
    }
    crash_point();
    written.push_back(name);
  }

  // ---- consolidated 16-bit weights ------------------------------------------------------------
  if (options_.gather_16bit_weights_on_model_save) {
    std::vector<at::Tensor> master;
    if (stage == 3) master = model_->gather_master();  // collective
    if (rank == 0) {
      const std::string name = "pytorch_model.bin";
      FileBuilder b((staging / name).string());
      PickleValue* sd = b.dict(true);
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& p = params[i];
        PickleValue* t =
            b.tensor(stage == 3 && p.trainable ? master[i].to(dtype) : p.var.detach().to(at::kCPU));
        b.put(sd, p.name, t);
        for (const std::string& alias : p.aliases) b.put(sd, alias, t);
      }
      for (const auto& item : module_->named_buffers())
        b.put(sd, item.key(), b.tensor(item.value().to(at::kCPU)));
      ser::TorchArchiveWriter writer((staging / name).string());
      b.write_head(writer, sd);
      writer.finish();
      crash_point();
      written.push_back(name);
    }
  }

  int64_t bytes = 0;
  for (const std::string& name : written) {
    bytes += static_cast<int64_t>(fs::file_size(staging / name));
  }
  if (world > 1) {
    zero::host_all_reduce(*comm_, *accelerator_, &bytes, 1, zero::DType::kInt64,
                          zero::ReduceOp::kSum);
  }
  comm_->barrier()->wait();  // every rank's files are complete and durable

  if (prepared) prepared->published = true;  // the folder is published next, not removed
  if (rank == 0) {
    const std::string kept = publish(root, staging, target, root / ("." + tag + ".old"));
    if (!kept.empty()) log(kept);
    std::error_code ec;
    if (fs::exists(root / "latest", ec)) {
      std::string previous;
      try {
        previous = read_latest(root);
      } catch (const EngineError&) {
        previous.clear();  // an unreadable latest is replaced as before
      }
      if (tag_step(previous) > tag_step(tag) && tag_step(tag) >= 0) {
        log(fmt::format("checkpoint: {} moves back from {} to {} (this run saved an older step)",
                        (root / "latest").string(), previous, tag));
      }
    }
    serialization::AtomicFile latest((root / "latest").string());
    latest.append({reinterpret_cast<const uint8_t*>(tag.data()), tag.size()});
    latest.commit();
    crash_point();
  }
  comm_->barrier()->wait();

  CheckpointReport report;
  report.path = target.string();
  report.tag = tag;
  report.bytes = static_cast<uint64_t>(bytes);
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report.client_state = client_state;
  report.step_written_bytes = step_written;
  return report;
}

// ---- load ---------------------------------------------------------------------------------------

CheckpointReport Engine::load_checkpoint(const std::string& dir, const std::string& tag_in) {
  if (in_micro_batch_ || micro_batch_ != 0) {
    throw EngineError("load_checkpoint() inside an optimizer step: call it at a step boundary");
  }
  const Clock::time_point start = Clock::now();
  const fs::path root(dir);
  const std::string tag = tag_in.empty() ? read_latest(root) : tag_in;
  check_tag(tag);
  fs::path folder = root / tag;
  std::error_code ec;
  if (!fs::is_directory(folder, ec) && fs::is_directory(root / ("." + tag + ".old"), ec)) {
    folder = root / ("." + tag + ".old");  // a save that could not exchange was cut short
  }
  if (!fs::is_directory(folder, ec)) {
    throw EngineError(fmt::format("checkpoint {}: no such folder", folder.string()));
  }
  const int rank = comm_->rank();
  const int world = comm_->world_size();
  const int stage = model_->stage();
  const bool bf16 = options_.zero.precision == zero::Precision::kBFloat16;
  const auto& params = model_->params();
  const PartitionView view(*model_, optimizer_->state_arrays());
  const zero::PartitionLayout& layout = view.layout;
  offload::OptimizerSwapper& sw = view.swapper;
  const std::vector<StateName>& states = view.states;
  const std::vector<const zero::ZeroModel::Param*>& trainable = view.trainable;

  // ---- the model-states file: does the checkpoint fit this run? ------------------------------
  const fs::path model_path = folder / model_states_file(stage, rank);
  if (!fs::exists(model_path, ec)) {
    const fs::path other = folder / model_states_file(stage == 3 ? 0 : 3, 0);
    if (fs::exists(other, ec)) {
      throw EngineError(fmt::format(
          "checkpoint {}: {} is missing but {} exists: it was saved at ZeRO stage {}, this run "
          "is stage {}",
          folder.string(), model_path.filename().string(), other.filename().string(),
          stage == 3 ? "0-2" : "3", stage));
    }
    throw EngineError(fmt::format("checkpoint {}: {} is missing", folder.string(),
                                  model_path.filename().string()));
  }
  const std::string model_file = model_path.string();
  const ser::TorchArchive model_archive = ser::TorchArchive::open(model_file);
  const PickleValue& m = model_archive.root();
  if (m.find("buffer_names") == nullptr) {
    throw EngineError(fmt::format("{}: not a model-states file (no buffer_names)", model_file));
  }
  const int64_t saved_world = m.at("dp_world_size").as_int();
  if (saved_world != world) {
    throw EngineError(fmt::format(
        "{}: saved with world size {} (dp_world_size), this run has {}; loading into another "
        "world size is not supported (consolidate with zinf zero-to-fp32 instead)",
        model_file, saved_world, world));
  }
  // zinf's files carry a `zinf` record (stage, optimizer, applied steps, RNG states). A
  // checkpoint DeepSpeed wrote has none: its stage is in the optimizer-states file (as its
  // ZeroStageEnum), its optimizer in ds_config, and it has no RNG state of zinf's.
  const PickleValue* z = m.find("zinf");
  const bool deepspeed = z == nullptr;
  if (deepspeed) {
    const PickleValue* version = m.find("ds_version");
    if (version == nullptr) {
      throw EngineError(fmt::format(
          "{}: neither zinf's nor DeepSpeed's model-states file (no zinf record, no ds_version)",
          model_file));
    }
    if (stage != 3) {
      throw EngineError(fmt::format(
          "{}: written by DeepSpeed {}, whose checkpoints zinf loads at ZeRO stage 3 only (its "
          "stages 0-2 cut the partitions from the flattened groups, zinf's per parameter); this "
          "run is stage {}: consolidate it with zinf zero-to-fp32 and start from that with "
          "--init-from (the optimizer's states are then not carried over)",
          model_file, version->is(PickleValue::Kind::kString) ? version->as_string() : "?", stage));
    }
    const PickleValue* ds_config = m.find("ds_config");
    const PickleValue* optimizer = ds_config != nullptr && ds_config->is(PickleValue::Kind::kDict)
                                       ? ds_config->find("optimizer")
                                       : nullptr;
    const PickleValue* type = optimizer != nullptr && optimizer->is(PickleValue::Kind::kDict)
                                  ? optimizer->find("type")
                                  : nullptr;
    if (type == nullptr || !type->is(PickleValue::Kind::kString)) {
      throw EngineError(fmt::format(
          "{}: its ds_config names no optimizer (ds_config.optimizer.type): zinf cannot tell "
          "whether its states are this run's {}",
          model_file, lower_name(options_.optimizer.type)));
    }
    if (lower(type->as_string()) != lower_name(options_.optimizer.type)) {
      throw EngineError(fmt::format("{}: saved with optimizer {} (ds_config), this run uses {}",
                                    model_file, lower(type->as_string()),
                                    lower_name(options_.optimizer.type)));
    }
  } else {
    const int64_t saved_stage = z->at("zero_stage").as_int();
    if (saved_stage != stage) {
      throw EngineError(fmt::format("{}: saved at ZeRO stage {}, this run is stage {}", model_file,
                                    saved_stage, stage));
    }
    const std::string saved_optimizer = z->at("optimizer").as_string();
    if (saved_optimizer != lower_name(options_.optimizer.type)) {
      throw EngineError(fmt::format("{}: saved with optimizer {}, this run uses {}", model_file,
                                    saved_optimizer, lower_name(options_.optimizer.type)));
    }
  }
  // The checkpoint's trainable parameters, matched to this run's by name: saved_index[p] is
  // where this run's parameter p (layout order) is in param_shapes.
  std::vector<std::pair<std::string, std::vector<int64_t>>> saved_shapes;
  std::vector<size_t> saved_index(trainable.size());
  {
    collect_shapes(m.at("param_shapes"), saved_shapes);
    std::vector<std::pair<std::string, std::vector<int64_t>>> frozen_saved;
    if (const PickleValue* f = m.find("frozen_param_shapes")) collect_shapes(*f, frozen_saved);
    std::vector<std::pair<std::string, std::vector<int64_t>>> mine, frozen_mine;
    for (const auto* p : trainable) mine.emplace_back(p->name, p->shape);
    for (const auto& p : params) {
      if (!p.trainable) frozen_mine.emplace_back(p.name, p.shape);
    }
    // Index of each name of `a` in `b`, or an error naming what is missing or differs.
    auto match = [&](const auto& a, const auto& b, const char* what) {
      std::map<std::string, size_t> at;
      for (size_t i = 0; i < b.size(); ++i) {
        if (!at.emplace(b[i].first, i).second) {
          throw EngineError(fmt::format("{}: the checkpoint names {} parameter \"{}\" twice",
                                        model_file, what, b[i].first));
        }
      }
      std::vector<size_t> index;
      for (const auto& [name, shape] : a) {
        const auto it = at.find(name);
        if (it == at.end()) {
          throw EngineError(
              fmt::format("{}: the model's {} parameter \"{}\" is not in the checkpoint",
                          model_file, what, name));
        }
        if (b[it->second].second != shape) {
          throw EngineError(
              fmt::format("{}: parameter \"{}\" has shape {} in the checkpoint, {} in the model",
                          model_file, name, shape_text(b[it->second].second), shape_text(shape)));
        }
        index.push_back(it->second);
      }
      if (b.size() > a.size()) {
        std::vector<bool> used(b.size(), false);
        for (size_t i : index) used[i] = true;
        const auto spare = std::find(used.begin(), used.end(), false) - used.begin();
        throw EngineError(
            fmt::format("{}: the checkpoint's {} parameter \"{}\" is not in the model", model_file,
                        what, b[static_cast<size_t>(spare)].first));
      }
      return index;
    };
    saved_index = match(mine, saved_shapes, "trainable");
    (void)match(frozen_mine, frozen_saved, "frozen");
  }

  // ---- the optimizer states --------------------------------------------------------------------
  std::optional<ser::TorchArchive> optim_archive;
  std::string optim_file = model_file;
  const PickleValue* inner = nullptr;
  if (stage == 0) {
    inner = &m.at("optimizer");
  } else {
    fs::path path = folder / optim_states_file(rank, bf16);
    if (deepspeed && !fs::exists(path, ec)) {
      path = folder / optim_states_file(rank, !bf16);  // DeepSpeed's stage 3 has no bf16_ names
    }
    optim_file = path.string();
    if (!fs::exists(path, ec)) {
      throw EngineError(fmt::format("checkpoint {}: {} is missing{}", folder.string(),
                                    path.filename().string(),
                                    fs::exists(folder / optim_states_file(rank, !bf16), ec)
                                        ? " (the checkpoint's precision differs from this run's)"
                                        : ""));
    }
    optim_archive.emplace(ser::TorchArchive::open(optim_file));
    inner = &optim_archive->root().at("optimizer_state_dict");
  }
  const ser::TorchArchive& archive = stage == 0 ? model_archive : *optim_archive;
  // An int, or DeepSpeed's ZeroStageEnum(n).
  const PickleValue& saved_zero_stage = inner->at("zero_stage");
  const int64_t inner_stage =
      saved_zero_stage.is(PickleValue::Kind::kObject) && saved_zero_stage.args().size() == 1
          ? saved_zero_stage.args().items()[0]->as_int()
          : saved_zero_stage.as_int();
  if (inner_stage != stage) {
    throw EngineError(
        fmt::format("{}: zero_stage {}, this run is stage {}", optim_file, inner_stage, stage));
  }
  const PickleValue& torch_state =
      inner->at(stage == 3 ? "optimizer_state_dict" : "base_optimizer_state");
  const PickleValue& groups = torch_state.at("param_groups");
  if (!deepspeed && (groups.size() < 1 || groups.items()[0]->at("zinf_optimizer").as_string() !=
                                              lower_name(options_.optimizer.type))) {
    throw EngineError(fmt::format("{}: the optimizer state is not of this run's optimizer {}",
                                  optim_file, lower_name(options_.optimizer.type)));
  }
  std::vector<std::vector<const ser::TensorRef*>> refs(1 + states.size());
  const char* flat_name = stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
  for (const PickleValue* t : inner->at(flat_name).items()) refs[0].push_back(&t->tensor());
  // The checkpoint's partition of this rank: its parameters in param_shapes order, and its
  // unit tensors — at stage 3 the sub-groups it was cut into (their sizes are the file's),
  // below it one per parameter slice.
  std::vector<uint64_t> saved_numels;
  for (const auto& [name, shape] : saved_shapes) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    saved_numels.push_back(n);
  }
  const zero::PartitionLayout saved_layout(saved_numels, layout.world_size(), layout.rank(),
                                           layout.partition_numel() + 1);
  std::vector<Unit> saved_units;
  if (stage == 3) {
    uint64_t offset = 0;
    for (const ser::TensorRef* r : refs[0]) {
      const auto numel = static_cast<uint64_t>(std::max<int64_t>(r->storage.numel, 0));
      saved_units.push_back({offset, numel, numel});
      offset += numel;
    }
    if (offset < saved_layout.partition_numel()) {
      throw EngineError(
          fmt::format("{}: {} holds {} elements; the parameters of param_shapes need {} on rank {}",
                      optim_file, flat_name, offset, saved_layout.partition_numel(), rank));
    }
  } else {
    saved_units = partition_units(saved_layout, stage);
  }
  check_units(refs[0], saved_units, optim_file, flat_name);
  const PickleValue& st = torch_state.at("state");
  for (size_t a = 0; a < states.size(); ++a) {
    for (size_t u = 0; u < saved_units.size(); ++u) {
      refs[1 + a].push_back(&state_tensor(st, static_cast<int64_t>(u), states[a].name, optim_file));
    }
    check_units(refs[1 + a], saved_units, optim_file, states[a].name);
  }
  const std::vector<Source> sources = map_sources(layout, saved_index, saved_layout, saved_units);

  // ---- restore ----------------------------------------------------------------------------------
  AlignedFloats buffers[2];
  const std::string& archive_file = stage == 0 ? model_file : optim_file;
  aio::AioHandle io(options_.zero.aio);
  stream_in(sw, OptimizerState::kParams, layout, sources, refs[0], archive, archive_file, io,
            buffers);
  for (size_t a = 0; a < states.size(); ++a) {
    stream_in(sw, states[a].state, layout, sources, refs[1 + a], archive, archive_file, io,
              buffers);
  }
  model_->refresh_from_master();

  // Frozen parameters: whole at stages 0-2, this rank's fragment at stage 3.
  if (const PickleValue* found = m.find("frozen_param_fragments");
      found != nullptr && !found->is_none()) {
    const PickleValue& fragments = *found;
    torch::NoGradGuard no_grad;
    for (const auto& p : params) {
      if (p.trainable) continue;
      const ser::TensorRef& ref = fragments.at(p.name).tensor();
      const auto bytes = model_archive.tensor_bytes(ref);
      at::Tensor saved =
          at::from_blob(const_cast<uint8_t*>(bytes.data()), {ref.numel()},
                        at::TensorOptions().dtype(scalar_of(ref.storage.dtype, model_file)))
              .clone();
      at::Tensor full = saved;
      if (stage == 3 && world > 1) {
        full = at::empty({saved.numel() * world}, saved.options());
        zero::host_all_gather(*comm_, *accelerator_, saved.data_ptr(), full.data_ptr(),
                              static_cast<size_t>(saved.numel()),
                              comm_dtype(saved.scalar_type(), model_file));
      }
      if (full.numel() < static_cast<int64_t>(p.numel)) {
        throw EngineError(fmt::format("{}: frozen parameter \"{}\" holds {} elements, not {}",
                                      model_file, p.name, full.numel(), p.numel));
      }
      p.var.copy_(full.narrow(0, 0, static_cast<int64_t>(p.numel)).view(p.shape));
    }
  }

  global_steps_ = m.at("global_steps").as_int();
  global_samples_ = m.at("global_samples").as_int();
  skipped_steps_ = m.at("skipped_steps").as_int();
  // DeepSpeed counts the steps its optimizer skipped (fp16 overflows) among global_steps.
  applied_steps_ = deepspeed ? global_steps_ - skipped_steps_ : z->at("applied_steps").as_int();
  {
    // DeepSpeed's scaler object (its attributes in BUILD's state; a static LossScaler has
    // only cur_scale and dynamic), or the dict zinf wrote before it wrote that object.
    const PickleValue& saved = inner->at("loss_scaler");
    const PickleValue& ls =
        saved.is(PickleValue::Kind::kObject) && saved.state() != nullptr ? *saved.state() : saved;
    auto int_or = [&](std::string_view key, int64_t fallback) {
      const PickleValue* v = ls.find(key);
      return v != nullptr && !v->is(PickleValue::Kind::kNone) ? v->as_int() : fallback;
    };
    zero::LossScaler::State s;
    s.scale = ls.at("cur_scale").as_float();
    s.iteration = int_or("cur_iter", 0);
    s.last_overflow_iteration = int_or("last_overflow_iter", -1);
    s.hysteresis_left = static_cast<int>(int_or("cur_hysteresis", 1));
    scaler_.restore(s);
  }
  if (!deepspeed) {  // DeepSpeed's files hold no RNG state: the generator goes on as it is
    const ser::TensorRef& ref = z->at("rng_state").tensor();
    const auto bytes = model_archive.tensor_bytes(ref);
    at::Tensor state = at::from_blob(const_cast<uint8_t*>(bytes.data()), {ref.numel()},
                                     at::TensorOptions().dtype(at::kByte))
                           .clone();
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
  if (const ser::PickleValue* device_rng = deepspeed ? nullptr : z->find("device_rng_state");
      device_rng != nullptr && !device_.is_cpu()) {
    const ser::TensorRef& ref = device_rng->tensor();
    const auto bytes = model_archive.tensor_bytes(ref);
    at::Tensor state = at::from_blob(const_cast<uint8_t*>(bytes.data()), {ref.numel()},
                                     at::TensorOptions().dtype(at::kByte))
                           .clone();
    at::Generator generator = at::globalContext().defaultGenerator(device_);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }

  CheckpointReport report;
  for (const ser::PickleEntry& e : m.entries()) {
    if (e.key->is(PickleValue::Kind::kString) && reserved_keys().count(e.key->as_string()) == 0) {
      report.client_state[e.key->as_string()] = client_value(*e.value);
    }
  }
  // Files counted once: below stage 3 every rank reads rank 0's model-states file.
  int64_t bytes = stage == 3 || rank == 0 ? static_cast<int64_t>(fs::file_size(model_path)) : 0;
  if (stage >= 1) bytes += static_cast<int64_t>(fs::file_size(optim_file));
  if (world > 1) {
    zero::host_all_reduce(*comm_, *accelerator_, &bytes, 1, zero::DType::kInt64,
                          zero::ReduceOp::kSum);
  }
  report.path = folder.string();
  report.tag = tag;
  report.bytes = static_cast<uint64_t>(bytes);
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

}  // namespace zinf::engine
