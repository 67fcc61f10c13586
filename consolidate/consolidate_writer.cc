#include "consolidate/consolidate_writer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <thread>

#include "serialization/atomic_file.h"
#include "serialization/safetensors.h"
#include "serialization/serialization_error.h"
#include "serialization/torch_archive.h"
#include "serialization/zip_reader.h"

namespace zinf::consolidate {

using serialization::PickleDocument;
using serialization::PickleValue;
using serialization::SerializationError;
namespace fs = std::filesystem;

namespace {

std::string errno_text(int error) { return std::strerror(error); }

uint64_t tensor_bytes(const PlannedTensor& tensor, const WriteOptions& options) {
  return tensor.numel * output_dtype_bytes(options.dtype);
}

std::string shard_name(OutputFormat format, size_t index, size_t count) {
  const char* stem = format == OutputFormat::kTorchBin ? "pytorch_model" : "model";
  const char* ext = format == OutputFormat::kTorchBin ? "bin" : "safetensors";
  if (count == 1) return fmt::format("{}.{}", stem, ext);
  return fmt::format("{}-{:05}-of-{:05}.{}", stem, index + 1, count, ext);
}

std::string aliases_json(const CheckpointPlan& plan) {
  nlohmann::json aliases = nlohmann::json::object();
  for (const Alias& alias : plan.aliases) aliases[alias.name] = alias.target;
  return aliases.dump();
}

// madvise over the whole pages inside [data, data + bytes); advice is only a hint, so its
// result is not an error (a range the kernel refuses is simply not advised).
void advise(const uint8_t* data, uint64_t bytes, int advice) {
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end > begin) {
    (void)::madvise(reinterpret_cast<void*>(begin), end - begin, advice);
  }
}

// One tensor's bytes inside a chunk and their CRC-32 (crc32_update(0, bytes)): the workers
// compute them for the zip format, so the writing thread only writes.
struct Segment {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Input bytes a worker read for a chunk: [offset, offset + bytes) of plan.records[record], and
// their CRC-32 (crc32_update(0, those bytes)).
struct RecordSpan {
  size_t record = kNoRecord;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Checks the CRC-32 of every storage record of the plan from the spans the workers read, fed in
// output order on the writing thread. Output order reads each record front to back (see
// checkpoint_plan.h), so a record's CRC is the spans' CRCs combined, with the bytes between
// and after them (padding no tensor holds) read here; a record read in any other order (a
// span that starts before the end of the last) is read again whole by finish(). The bytes
// read here are read with pread, not through the mapping: a fault there maps a whole large
// folio around them, pages the workers already dropped, which would then stay resident (a
// 486 MB stage-3 checkpoint peaked 46 MiB higher so).
class RecordVerifier {
 public:
  explicit RecordVerifier(const std::vector<SourceRecord>& records)
      : records_(records), states_(records.size()) {}
  ~RecordVerifier() {
    for (const auto& [file, fd] : fds_) ::close(fd);
  }
  RecordVerifier(const RecordVerifier&) = delete;
  RecordVerifier& operator=(const RecordVerifier&) = delete;

  void add(const RecordSpan& span) {
    if (span.record == kNoRecord || span.bytes == 0) return;
    State& state = states_[span.record];
    if (state.checked || !state.in_order) return;
    if (span.offset < state.next) {
      state.in_order = false;
      return;
    }
    const SourceRecord& record = records_[span.record];
    if (span.offset > state.next) {
      state.crc = crc_of_file(state.crc, record, state.next, span.offset - state.next);
    }
    state.crc = static_cast<uint32_t>(
        ::crc32_combine(state.crc, span.crc, static_cast<z_off_t>(span.bytes)));
    state.next = span.offset + span.bytes;
    if (state.next == record.bytes.size()) check(span.record, state.crc);
  }

  // Checks every record not checked yet (reading what no span covered); returns how many
  // records were checked in all.
  uint64_t finish() {
    for (size_t r = 0; r < records_.size(); ++r) {
      const State& state = states_[r];
      if (state.checked) continue;
      const SourceRecord& record = records_[r];
      check(r, state.in_order
                   ? crc_of_file(state.crc, record, state.next, record.bytes.size() - state.next)
                   : crc_of_file(0, record, 0, record.bytes.size()));
    }
    return records_.size();
  }

 private:
  struct State {
    uint64_t next = 0;  // bytes of the record combined into crc so far
    uint32_t crc = 0;
    bool in_order = true;
    bool checked = false;
  };

  // `crc` continued over bytes [offset, offset + count) of the record, read from its file.
  uint32_t crc_of_file(uint32_t crc, const SourceRecord& record, uint64_t offset, uint64_t count) {
    auto [it, added] = fds_.try_emplace(record.file, -1);
    if (added) {
      it->second = ::open(record.file.c_str(), O_RDONLY | O_CLOEXEC);
      if (it->second < 0) {
        const int error = errno;
        fds_.erase(it);
        throw SerializationError(record.file, serialization::kNoOffset,
                                 "cannot open to check a record's CRC-32: " + errno_text(error));
      }
    }
    buffer_.resize(std::min<uint64_t>(count, kReadBytes));
    for (uint64_t at = record.data_offset + offset; count > 0;) {
      const ssize_t got = ::pread(it->second, buffer_.data(), std::min<uint64_t>(count, kReadBytes),
                                  static_cast<off_t>(at));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        throw SerializationError(
            record.file, at,
            "reading record " + record.name + " to check its CRC-32: " +
                (got < 0 ? errno_text(errno) : std::string("the file ended (it shrank)")));
      }
      crc = serialization::crc32_update(crc, {buffer_.data(), static_cast<size_t>(got)});
      at += static_cast<uint64_t>(got);
      count -= static_cast<uint64_t>(got);
    }
    return crc;
  }

  void check(size_t r, uint32_t crc) {
    states_[r].checked = true;
    const SourceRecord& record = records_[r];
    if (crc != record.crc32) {
      throw SerializationError(
          record.file, record.data_offset,
          fmt::format("record {} fails its CRC-32 (recorded {:08x}, data {:08x}): the file is "
                      "corrupt",
                      record.name, record.crc32, crc));
    }
  }

  static constexpr uint64_t kReadBytes = 1 << 20;

  const std::vector<SourceRecord>& records_;
  std::vector<State> states_;
  std::map<std::string, int> fds_;  // checkpoint file -> descriptor (closed on destruction)
  std::vector<uint8_t> buffer_;     // pread's
};

// Where a shard's data goes: the format's writer, fed the shard's bytes in order.
class ShardSink {
 public:
  virtual ~ShardSink() = default;
  // `segments` cut `chunk` at tensor boundaries, with each piece's CRC-32; empty when the
  // sink's format needs no CRC (WriteOptions::format decides which the workers compute).
  virtual void write(std::span<const uint8_t> chunk, std::span<const Segment> segments) = 0;
  virtual void finish() = 0;
};

class SafetensorsSink final : public ShardSink {
 public:
  SafetensorsSink(const std::string& path, const CheckpointPlan& plan, const ShardPlan& shard,
                  const WriteOptions& options) {
    std::vector<serialization::TensorSpec> specs;
    for (const size_t index : shard.tensors) {
      const PlannedTensor& tensor = plan.tensors[index];
      specs.push_back({tensor.name, output_safetensors_dtype(options.dtype),
                       std::vector<uint64_t>(tensor.shape.begin(), tensor.shape.end())});
    }
    std::map<std::string, std::string> metadata = {{"format", "pt"}};
    if (!plan.aliases.empty()) metadata["aliases"] = aliases_json(plan);
    writer_ = std::make_unique<serialization::SafetensorsWriter>(path, std::move(specs),
                                                                 std::move(metadata));
  }
  void write(std::span<const uint8_t> chunk, std::span<const Segment> /*segments*/) override {
    writer_->write(chunk);
  }
  void finish() override { writer_->finish(); }

 private:
  std::unique_ptr<serialization::SafetensorsWriter> writer_;
};

// torch.save layout: data.pkl is an OrderedDict name -> tensor, one storage per tensor (key
// "0", "1", ...); an alias is the same tensor node again, so it shares the storage.
class TorchBinSink final : public ShardSink {
 public:
  TorchBinSink(const std::string& path, const CheckpointPlan& plan, const ShardPlan& shard,
               const WriteOptions& options)
      : writer_(path, std::filesystem::path(path).stem().string()) {
    PickleDocument document(path);
    PickleValue* root = document.dict(/*ordered=*/true);
    std::map<std::string, PickleValue*> nodes;
    const serialization::TensorDType dtype = output_storage_dtype(options.dtype);
    for (const size_t index : shard.tensors) {
      const PlannedTensor& tensor = plan.tensors[index];
      serialization::TensorRef ref;
      ref.storage.key = std::to_string(sizes_.size());
      ref.storage.storage_type = std::string(serialization::storage_type_of(dtype));
      ref.storage.dtype = dtype;
      ref.storage.location = "cpu";
      ref.storage.numel = static_cast<int64_t>(tensor.numel);
      ref.shape = tensor.shape;
      ref.stride.assign(tensor.shape.size(), 1);
      for (size_t d = tensor.shape.size(); d-- > 1;) {
        ref.stride[d - 1] = ref.stride[d] * std::max<int64_t>(tensor.shape[d], 1);
      }
      PickleValue* node = document.tensor(std::move(ref));
      document.set_item(root, document.string(tensor.name), node);
      nodes[tensor.name] = node;
      sizes_.push_back(tensor_bytes(tensor, options));
    }
    for (const size_t index : shard.aliases) {
      const Alias& alias = plan.aliases[index];
      document.set_item(root, document.string(alias.name), nodes.at(alias.target));
    }
    document.set_root(root);
    writer_.write_pickle(document.root());
  }

  // Each segment is one tensor's bytes, so it lies inside one storage record.
  void write(std::span<const uint8_t> chunk, std::span<const Segment> segments) override {
    for (const Segment& segment : segments) {
      begin_next();
      if (segment.bytes > remaining_ || segment.bytes > chunk.size()) {
        throw std::logic_error(fmt::format(
            "consolidate: a chunk segment of {} bytes crosses a storage boundary ({} left)",
            segment.bytes, remaining_));
      }
      const auto bytes = static_cast<size_t>(segment.bytes);
      writer_.write(chunk.first(bytes), segment.crc);
      remaining_ -= bytes;
      chunk = chunk.subspan(bytes);
    }
    if (!chunk.empty()) {
      throw std::logic_error(
          fmt::format("consolidate: {} chunk bytes without a CRC segment", chunk.size()));
    }
  }
  void finish() override {
    begin_next();
    writer_.finish();
  }

 private:
  // Starts the storages of the next tensors while the current one is complete (zero-size
  // tensors start and end at once).
  void begin_next() {
    while (remaining_ == 0 && next_ < sizes_.size()) {
      writer_.begin_storage(std::to_string(next_), sizes_[next_]);
      remaining_ = sizes_[next_];
      ++next_;
    }
  }

  serialization::TorchArchiveWriter writer_;
  std::vector<uint64_t> sizes_;  // bytes of each storage, in order
  size_t next_ = 0;              // the next storage to begin
  uint64_t remaining_ = 0;       // bytes the current storage still needs
};

// A run of output bytes of one shard: [begin, end) of its data stream.
struct Chunk {
  size_t shard = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

class Pipeline {
 public:
  Pipeline(const CheckpointPlan& plan, const std::vector<ShardPlan>& shards,
           const WriteOptions& options)
      : plan_(plan),
        shards_(shards),
        options_(options),
        element_(output_dtype_bytes(options.dtype)),
        with_crc_(options.format == OutputFormat::kTorchBin),
        verifier_(plan.records) {
    uint64_t chunk_bytes = std::max<uint64_t>(options.chunk_bytes / 16 * 16, 16);
    for (size_t s = 0; s < shards.size(); ++s) {
      std::vector<uint64_t> starts;
      uint64_t offset = 0;
      for (const size_t index : shards[s].tensors) {
        starts.push_back(offset);
        offset += tensor_bytes(plan.tensors[index], options);
      }
      starts_.push_back(std::move(starts));
      for (uint64_t begin = 0; begin < offset; begin += chunk_bytes) {
        chunks_.push_back(Chunk{s, begin, std::min(offset, begin + chunk_bytes)});
      }
      total_bytes_ += offset;
    }
    // Buffers no larger than the output; left uninitialized, so untouched pages cost nothing.
    const uint64_t buffer_bytes = std::max<uint64_t>(std::min(chunk_bytes, total_bytes_), 1);
    const size_t slots = static_cast<size_t>(options.threads) + 2;
    // Inputs are requested kReadaheadBytes of output (at least the ring) ahead of the chunk
    // being claimed, so a cold page cache is filled while earlier chunks are converted.
    constexpr uint64_t kReadaheadBytes = 128ULL << 20;
    lookahead_ = std::max<size_t>(slots, kReadaheadBytes / buffer_bytes);
    for (size_t i = 0; i < slots; ++i) {
      buffers_.emplace_back(new uint8_t[buffer_bytes]);
      segments_.emplace_back();
      spans_.emplace_back();
      ready_.push_back(kNone);
    }
  }

  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Runs the workers and writes every shard through `open_sink`; returns when all is written.
  void run(const std::function<std::unique_ptr<ShardSink>(size_t shard)>& open_sink) {
    for (size_t c = 0; c < std::min(lookahead_, chunks_.size()); ++c) {
      fill(chunks_[c], nullptr, nullptr, nullptr);
    }
    std::vector<std::thread> workers;
    for (int i = 0; i < options_.threads; ++i) workers.emplace_back([this] { work(); });
    try {
      write_all(open_sink);
    } catch (...) {
      stop(std::current_exception());
    }
    for (std::thread& worker : workers) worker.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  // Output bytes converted before their CRC-32 is computed: small enough to stay in L2.
  static constexpr uint64_t kCrcBlockBytes = 256 << 10;

  void stop(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::move(error);
    stopped_ = true;
    changed_.notify_all();
  }

  void work() {
    try {
      for (;;) {
        const size_t c = next_chunk_.fetch_add(1);
        if (c >= chunks_.size()) return;
        if (c + lookahead_ < chunks_.size()) {
          fill(chunks_[c + lookahead_], nullptr, nullptr, nullptr);
        }
        const size_t slot = c % buffers_.size();
        {
          std::unique_lock<std::mutex> lock(mutex_);
          changed_.wait(lock, [&] { return stopped_ || c < written_ + buffers_.size(); });
          if (stopped_) return;
        }
        fill(chunks_[c], buffers_[slot].get(), with_crc_ ? &segments_[slot] : nullptr,
             options_.verify_crc ? &spans_[slot] : nullptr);
        std::lock_guard<std::mutex> lock(mutex_);
        ready_[slot] = c;
        changed_.notify_all();
      }
    } catch (...) {
      stop(std::current_exception());
    }
  }

  void write_all(const std::function<std::unique_ptr<ShardSink>(size_t shard)>& open_sink) {
    size_t c = 0;
    uint64_t done = 0;
    for (size_t s = 0; s < shards_.size(); ++s) {
      std::unique_ptr<ShardSink> sink = open_sink(s);
      for (; c < chunks_.size() && chunks_[c].shard == s; ++c) {
        const size_t slot = c % buffers_.size();
        {
          std::unique_lock<std::mutex> lock(mutex_);
          changed_.wait(lock, [&] { return stopped_ || ready_[slot] == c; });
          if (stopped_) return;
        }
        const Chunk& chunk = chunks_[c];
        sink->write({buffers_[slot].get(), static_cast<size_t>(chunk.end - chunk.begin)},
                    segments_[slot]);
        for (const RecordSpan& span : spans_[slot]) verifier_.add(span);
        done += chunk.end - chunk.begin;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          ready_[slot] = kNone;
          ++written_;
          changed_.notify_all();
        }
        if (options_.progress) options_.progress(done, total_bytes_);
      }
      const auto start = std::chrono::steady_clock::now();
      sink->finish();
      finish_seconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (options_.verify_crc) verified_records_ = verifier_.finish();
  }

  // Gathers and converts the chunk's output bytes into `out`, and with `segments` given, sets
  // them to the chunk's non-empty tensor pieces with their CRC-32s; with `spans` given, sets
  // them to the input bytes read, with theirs. With `out` null, only starts the readahead of
  // the chunk's inputs (MADV_WILLNEED returns once the reads are queued).
  void fill(const Chunk& chunk, uint8_t* out, std::vector<Segment>* segments,
            std::vector<RecordSpan>* spans) const {
    if (segments != nullptr) segments->clear();
    if (spans != nullptr) spans->clear();
    const ShardPlan& shard = shards_[chunk.shard];
    const std::vector<uint64_t>& starts = starts_[chunk.shard];
    size_t t = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), chunk.begin) -
                                   starts.begin()) -
               1;
    for (uint64_t at = chunk.begin; at < chunk.end; ++t) {
      const PlannedTensor& tensor = plan_.tensors[shard.tensors[t]];
      const uint64_t tensor_end = starts[t] + tensor.numel * element_;
      const uint64_t first = (at - starts[t]) / element_;  // elements of the tensor
      const uint64_t last = (std::min(chunk.end, tensor_end) - starts[t]) / element_;
      const uint64_t end = std::min(chunk.end, tensor_end);
      uint32_t crc = 0;
      gather(tensor, first, last, out == nullptr ? nullptr : out + (at - chunk.begin),
             segments == nullptr ? nullptr : &crc, spans);
      if (segments != nullptr && end > at) segments->push_back(Segment{end - at, crc});
      at = end;
    }
  }

  // Elements [first, last) of `tensor` to `out`; with `crc` given, continues it over the
  // bytes written, and with `spans` given, appends the input bytes read with their CRC-32,
  // block by block while each block is still in the cache.
  void gather(const PlannedTensor& tensor, uint64_t first, uint64_t last, uint8_t* out,
              uint32_t* crc, std::vector<RecordSpan>* spans) const {
    uint64_t piece_start = 0;
    for (const Piece& piece : tensor.pieces) {
      const uint64_t piece_end = piece_start + piece.numel;
      const uint64_t lo = std::max(first, piece_start);
      const uint64_t hi = std::min(last, piece_end);
      if (lo < hi) {
        const uint64_t in = serialization::dtype_size_bytes(piece.dtype);
        const uint8_t* source = piece.data + (lo - piece_start) * in;
        if (out == nullptr) {
          advise(source, (hi - lo) * in, MADV_WILLNEED);
        } else {
          const bool verify = spans != nullptr && piece.record != kNoRecord;
          const uint64_t block = crc == nullptr && !verify
                                     ? hi - lo
                                     : kCrcBlockBytes / std::max<uint64_t>(element_, in);
          // A copy (the output dtype is the input's): the output bytes are the input's, so one
          // CRC serves both, taken over the bytes written.
          const bool one_crc =
              verify && crc != nullptr && piece.dtype == output_storage_dtype(options_.dtype);
          uint32_t in_crc = 0;
          for (uint64_t done = 0; done < hi - lo;) {
            const uint64_t count = std::min(block, hi - lo - done);
            convert(source + done * in, piece.dtype, count, out, options_.dtype);
            if (one_crc) {
              in_crc =
                  serialization::crc32_update(in_crc, {out, static_cast<size_t>(count * element_)});
            } else {
              if (verify) {
                in_crc = serialization::crc32_update(
                    in_crc, {source + done * in, static_cast<size_t>(count * in)});
              }
              if (crc != nullptr) {
                *crc =
                    serialization::crc32_update(*crc, {out, static_cast<size_t>(count * element_)});
              }
            }
            out += count * element_;
            done += count;
          }
          if (one_crc) {
            *crc = static_cast<uint32_t>(
                ::crc32_combine(*crc, in_crc, static_cast<z_off_t>((hi - lo) * element_)));
          }
          if (verify) {
            const SourceRecord& record = plan_.records[piece.record];
            spans->push_back(RecordSpan{piece.record,
                                        static_cast<uint64_t>(source - record.bytes.data()),
                                        (hi - lo) * in, in_crc});
          }
          advise(source, (hi - lo) * in, MADV_DONTNEED);
        }
      }
      piece_start = piece_end;
      if (piece_start >= last) break;
    }
  }

 public:
  uint64_t total_bytes() const { return total_bytes_; }
  double finish_seconds() const { return finish_seconds_; }
  uint64_t verified_records() const { return verified_records_; }

 private:
  const CheckpointPlan& plan_;
  const std::vector<ShardPlan>& shards_;
  const WriteOptions& options_;
  const uint64_t element_;
  const bool with_crc_;  // the workers compute each chunk's Segments (zip output needs CRCs)
  std::vector<std::vector<uint64_t>> starts_;  // per shard: byte offset of each tensor
  std::vector<Chunk> chunks_;
  uint64_t total_bytes_ = 0;
  double finish_seconds_ = 0;  // the writing thread's time in ShardSink::finish()
  RecordVerifier verifier_;    // used by the writing thread only
  uint64_t verified_records_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;  // the ring: chunk c fills slot c % size
  // Per slot, the Segments of the chunk it holds (filled with the buffer, before ready_).
  std::vector<std::vector<Segment>> segments_;
  // Per slot, the input RecordSpans of the chunk it holds (with verify_crc; as segments_).
  std::vector<std::vector<RecordSpan>> spans_;
  std::atomic<size_t> next_chunk_{0};
  size_t lookahead_ = 0;  // chunks between the one being claimed and the one prefetched

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<size_t> ready_;  // guarded by mutex_: the chunk each slot holds, or kNone
  size_t written_ = 0;         // guarded by mutex_: chunks written
  bool stopped_ = false;       // guarded by mutex_
  std::exception_ptr error_;   // guarded by mutex_
};

void write_index(const std::string& output_dir, const CheckpointPlan& plan,
                 const std::vector<ShardPlan>& shards, const std::string& index_name) {
  nlohmann::json index;
  uint64_t total = 0;
  index["weight_map"] = nlohmann::json::object();
  for (const ShardPlan& shard : shards) {
    total += shard.data_bytes;
    for (const size_t t : shard.tensors)
      index["weight_map"][plan.tensors[t].name] = shard.file_name;
    for (const size_t a : shard.aliases)
      index["weight_map"][plan.aliases[a].name] = shard.file_name;
  }
  index["metadata"]["total_size"] = total;
  const std::string text = index.dump(2) + "\n";
  serialization::AtomicFile file((std::filesystem::path(output_dir) / index_name).string());
  file.append({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  file.commit();
}

// "<digits>" at the start of `s`, consumed; false when there is none.
bool take_digits(std::string_view& s) {
  size_t n = 0;
  while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n;
  s.remove_prefix(n);
  return n > 0;
}

// "<stem>-<digits>-of-<digits>.<ext>"
bool is_shard_name(std::string_view name, std::string_view stem, std::string_view ext) {
  if (name.substr(0, stem.size()) != stem) return false;
  name.remove_prefix(stem.size());
  if (name.substr(0, 1) != "-") return false;
  name.remove_prefix(1);
  if (!take_digits(name) || name.substr(0, 4) != "-of-") return false;
  name.remove_prefix(4);
  return take_digits(name) && name.size() == ext.size() + 1 && name[0] == '.' &&
         name.substr(1) == ext;
}

// fsync of a folder, so that renames and removals in it are durable.
void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    throw SerializationError(folder, serialization::kNoOffset,
                             "cannot open the folder to sync it: " + errno_text(errno));
  }
  const int synced = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (synced != 0) {
    throw SerializationError(folder, serialization::kNoOffset, "fsync: " + errno_text(error));
  }
}

// The staging folder the export is written into (inside the output folder, so the files are
// renamed into place on the same filesystem). Removed with what is left in it on destruction:
// everything in it was written by this export.
class StagingFolder {
 public:
  explicit StagingFolder(const std::string& output_dir) {
    std::string pattern = (fs::path(output_dir) / ".zero-to-fp32-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw SerializationError(
          output_dir, serialization::kNoOffset,
          "cannot create a staging folder in the output folder: " + errno_text(errno));
    }
    path_ = pattern;
  }
  ~StagingFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);  // best effort: a destructor reports nothing
  }
  StagingFolder(const StagingFolder&) = delete;
  StagingFolder& operator=(const StagingFolder&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

EarlierExportError::EarlierExportError(const std::string& output_dir,
                                       std::vector<std::string> files)
    : std::invalid_argument(fmt::format("{}: the output folder holds an earlier export ({} file{})",
                                        output_dir, files.size(), files.size() == 1 ? "" : "s")),
      files_(std::move(files)) {}

bool is_export_file_name(std::string_view name) {
  return name == "pytorch_model.bin" || name == "pytorch_model.bin.index.json" ||
         name == "model.safetensors" || name == "model.safetensors.index.json" ||
         is_shard_name(name, "pytorch_model", "bin") || is_shard_name(name, "model", "safetensors");
}

std::vector<std::string> earlier_export_files(const std::string& output_dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(output_dir, ec)) {
    std::error_code type_ec;
    if (!entry.is_directory(type_ec) && is_export_file_name(entry.path().filename().string())) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<ShardPlan> plan_shards(const CheckpointPlan& plan, const WriteOptions& options) {
  std::vector<ShardPlan> shards;
  ShardPlan current;
  std::map<std::string, size_t> tensor_index;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const uint64_t bytes = tensor_bytes(plan.tensors[t], options);
    tensor_index[plan.tensors[t].name] = t;
    if (bytes > options.max_shard_bytes) {
      shards.push_back(ShardPlan{{}, {t}, {}, bytes});
      continue;
    }
    if (current.data_bytes + bytes > options.max_shard_bytes && !current.tensors.empty()) {
      shards.push_back(std::move(current));
      current = ShardPlan{};
    }
    current.tensors.push_back(t);
    current.data_bytes += bytes;
  }
  if (!current.tensors.empty() || shards.empty()) shards.push_back(std::move(current));
  for (size_t s = 0; s < shards.size(); ++s) {
    shards[s].file_name = shard_name(options.format, s, shards.size());
  }
  if (options.format == OutputFormat::kTorchBin) {
    for (size_t a = 0; a < plan.aliases.size(); ++a) {
      const size_t target = tensor_index.at(plan.aliases[a].target);
      for (ShardPlan& shard : shards) {
        if (std::find(shard.tensors.begin(), shard.tensors.end(), target) != shard.tensors.end()) {
          shard.aliases.push_back(a);
        }
      }
    }
  }
  return shards;
}

WriteSummary write_consolidated(const CheckpointPlan& plan, const std::string& output_dir,
                                const WriteOptions& options) {
  if (options.threads < 1) throw std::invalid_argument("threads must be at least 1");
  if (options.max_shard_bytes == 0) throw std::invalid_argument("max shard size must be > 0");
  std::error_code ec;
  const bool created = fs::create_directories(output_dir, ec);
  if (ec) {
    throw SerializationError(output_dir, serialization::kNoOffset,
                             "cannot create the output folder: " + ec.message());
  }
  // A failed export leaves no folder it created (the staging folder is gone by then).
  struct RemoveIfCreated {
    const std::string& folder;
    bool armed;
    ~RemoveIfCreated() {
      std::error_code ignored;
      if (armed) fs::remove(folder, ignored);  // only while empty
    }
  } remove_if_created{output_dir, created};
  const std::vector<std::string> earlier = earlier_export_files(output_dir);
  if (!earlier.empty() && !options.overwrite) throw EarlierExportError(output_dir, earlier);

  const StagingFolder staging(output_dir);
  const std::vector<ShardPlan> shards = plan_shards(plan, options);
  Pipeline pipeline(plan, shards, options);
  pipeline.run([&](size_t s) -> std::unique_ptr<ShardSink> {
    const std::string path = (fs::path(staging.path()) / shards[s].file_name).string();
    if (options.format == OutputFormat::kTorchBin) {
      return std::make_unique<TorchBinSink>(path, plan, shards[s], options);
    }
    return std::make_unique<SafetensorsSink>(path, plan, shards[s], options);
  });
  WriteSummary summary;
  for (const ShardPlan& shard : shards) summary.files.push_back(shard.file_name);
  if (shards.size() > 1) {
    const std::string index_name = options.format == OutputFormat::kTorchBin
                                       ? "pytorch_model.bin.index.json"
                                       : "model.safetensors.index.json";
    write_index(staging.path(), plan, shards, index_name);
    summary.files.push_back(index_name);
  }

  // Everything is written and verified: into place, shards first and the index last, then
  // the earlier export's other files go.
  const std::set<std::string> earlier_set(earlier.begin(), earlier.end());
  std::set<std::string> placed;
  for (const std::string& name : summary.files) {
    const std::string from = (fs::path(staging.path()) / name).string();
    const std::string to = (fs::path(output_dir) / name).string();
    if (::rename(from.c_str(), to.c_str()) != 0) {
      throw SerializationError(from, serialization::kNoOffset,
                               "cannot rename into place as " + to + ": " + errno_text(errno));
    }
    placed.insert(to);
    if (earlier_set.count(to) != 0) summary.replaced.push_back(to);
  }
  sync_folder(output_dir);
  for (const std::string& path : earlier) {
    if (placed.count(path) != 0) continue;
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      throw SerializationError(
          path, serialization::kNoOffset,
          "cannot remove this file of the earlier export: " + errno_text(errno));
    }
    summary.removed.push_back(path);
  }
  if (!summary.removed.empty()) sync_folder(output_dir);
  summary.tensors = plan.tensors.size();
  summary.aliases = plan.aliases.size();
  for (const PlannedTensor& tensor : plan.tensors) summary.elements += tensor.numel;
  summary.data_bytes = pipeline.total_bytes();
  remove_if_created.armed = false;
  summary.finish_seconds = pipeline.finish_seconds();
  summary.verified_records = pipeline.verified_records();
  return summary;
}

}  // namespace zinf::consolidate
