// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of UTF-8 JSON, then the data buffer. The header maps each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the buffer)
// and may hold a "__metadata__" map of strings. Also the sharded form Hugging Face writes:
// model-00001-of-0000N.safetensors files and model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {tensor: file}}).
//
// SafetensorsReader maps the file and hands out tensor data as zero-copy spans. It validates
// the whole header before use: the header length bounded (kMaxHeaderBytes and the file's
// size), JSON well-formed UTF-8, every entry with a known dtype, a shape of at most 1024
// non-negative integers and offsets begin <= end, byte sizes equal to numel x dtype size
// (overflow checked), the tensors covering the buffer exactly (contiguous, no gaps, no
// overlaps, ending at the end of the file), no unknown or repeated keys, metadata strings
// only. The JSON is read as a stream of events (no document tree), so memory follows what is
// kept — names and shapes — and nesting deeper than the format's is refused where it starts.
// Violations throw SerializationError naming the file, the offset (in the file) and what was
// wrong.
//
// SafetensorsWriter streams: every tensor is declared up front (the header precedes the
// data), then each tensor's bytes are written in declaration order, in chunks of any size.
// It writes through AtomicFile (temporary file, fsync, rename at finish()). The header is
// padded with spaces so the data buffer starts at a multiple of 8, as the reference writer
// does. ShardedSafetensorsWriter splits tensors into shards of at most max_shard_bytes of
// data (a larger tensor gets a shard of its own), as Hugging Face's writer does.
//
// Thread safety: readers are immutable after open and may be shared between threads; writers
// are used by one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "serialization/atomic_file.h"
#include "serialization/mapped_file.h"

namespace zinf::serialization {

enum class Dtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// "F64", "F32", ... "BOOL".
std::string_view dtype_name(Dtype dtype);
// Bytes per element (BOOL: 1).
uint64_t dtype_bytes(Dtype dtype);
// The dtype named `name`, or nullopt.
std::optional<Dtype> parse_dtype(std::string_view name);

// One tensor of a safetensors file.
struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // byte offsets in the data buffer: [begin, end)
  uint64_t end = 0;

  uint64_t size_bytes() const { return end - begin; }
};

// Headers longer than this are refused (the reference implementation's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

class SafetensorsReader {
 public:
  // Maps `path` and validates its header. Throws SerializationError.
  [[nodiscard]] static SafetensorsReader open(const std::string& path);
  // Parses a file held in caller memory, which must outlive the reader; `name` is used in
  // errors.
  [[nodiscard]] static SafetensorsReader from_bytes(std::span<const uint8_t> bytes,
                                                    std::string name);

  SafetensorsReader(SafetensorsReader&&) noexcept = default;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept = default;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  // The tensors in data order.
  const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  const TensorInfo* find(std::string_view name) const;
  // The bytes of `tensor` (an element of tensors()).
  std::span<const uint8_t> data(const TensorInfo& tensor) const;
  // The bytes of the tensor named `name`; throws SerializationError when there is none.
  std::span<const uint8_t> read(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  const std::string& name() const noexcept { return name_; }
  // Offset of the data buffer in the file.
  uint64_t data_offset() const noexcept { return data_offset_; }

 private:
  SafetensorsReader(MappedFile file, std::span<const uint8_t> bytes, std::string name)
      : file_(std::move(file)), bytes_(bytes), name_(std::move(name)) {}
  void parse();

  MappedFile file_;  // empty for from_bytes
  std::span<const uint8_t> bytes_;
  std::string name_;
  uint64_t data_offset_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// What a writer is told about a tensor before its data.
struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<uint64_t> shape;
};

// Bytes of a tensor of `shape` and `dtype`; throws SerializationError (naming `file`) when
// the product overflows 64 bits.
uint64_t tensor_bytes(const std::string& file, const std::string& tensor, Dtype dtype,
                      const std::vector<uint64_t>& shape);

class SafetensorsWriter {
 public:
  // Writes the header for `tensors` (names unique, not "__metadata__"; names and metadata
  // valid UTF-8) to a temporary file beside `path`. Throws SerializationError.
  SafetensorsWriter(std::string path, std::vector<TensorSpec> tensors,
                    std::map<std::string, std::string> metadata = {});
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends bytes of the declared tensors, in declaration order; a chunk may end inside a
  // tensor or span several.
  void write(std::span<const uint8_t> chunk);
  // Writes the whole of the next tensor, which must be named `name` and be `bytes` long.
  void write_tensor(std::string_view name, std::span<const uint8_t> bytes);
  // Checks every declared byte was written, then fsyncs and renames onto the path.
  void finish();

  const std::string& path() const noexcept { return file_.path(); }
  // Bytes of tensor data declared (the file is this plus 8 plus the padded header).
  uint64_t data_bytes() const noexcept { return data_bytes_; }

 private:
  [[noreturn]] void fail(const std::string& what);

  AtomicFile file_;
  std::vector<TensorSpec> specs_;
  std::vector<uint64_t> begins_;  // [begin, end) of each tensor in the data buffer
  std::vector<uint64_t> ends_;
  uint64_t data_bytes_ = 0;
  uint64_t written_ = 0;  // data bytes written so far
  bool failed_ = false;
};

// The sharded index (model.safetensors.index.json).
struct SafetensorsIndex {
  uint64_t total_size = 0;                        // metadata.total_size: data bytes
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
};

// Reads and validates an index: JSON object with metadata.total_size (a non-negative integer)
// and weight_map (tensor -> plain file name: no '/', not "." or ".."). Throws
// SerializationError.
[[nodiscard]] SafetensorsIndex read_safetensors_index(const std::string& path);

// A sharded checkpoint opened through its index: every shard mapped, every tensor of the
// weight map found in the shard the index names, and total_size checked against the tensors.
class ShardedSafetensorsReader {
 public:
  [[nodiscard]] static ShardedSafetensorsReader open(const std::string& index_path);

  // The tensor named `name` and the shard holding it; {nullptr, nullptr} when absent.
  std::pair<const SafetensorsReader*, const TensorInfo*> find(std::string_view name) const;
  std::span<const uint8_t> read(std::string_view name) const;
  const SafetensorsIndex& index() const noexcept { return index_; }
  // Shard file name -> reader.
  const std::map<std::string, SafetensorsReader>& shards() const noexcept { return shards_; }

 private:
  std::string index_path_;
  SafetensorsIndex index_;
  std::map<std::string, SafetensorsReader> shards_;
};

// Writes `tensors` as `prefix`.safetensors when they fit one shard of max_shard_bytes, else
// as `prefix`-0000i-of-0000N.safetensors plus `prefix`.safetensors.index.json (sorted keys,
// indent 2, final newline), all in `directory`. Tensors are declared up front and their bytes
// written in order; each shard (and the index) becomes visible only when complete, the index
// last. `metadata` goes into every shard's __metadata__.
class ShardedSafetensorsWriter {
 public:
  ShardedSafetensorsWriter(std::string directory, std::vector<TensorSpec> tensors,
                           uint64_t max_shard_bytes, std::string prefix = "model",
                           std::map<std::string, std::string> metadata = {});
  ShardedSafetensorsWriter(const ShardedSafetensorsWriter&) = delete;
  ShardedSafetensorsWriter& operator=(const ShardedSafetensorsWriter&) = delete;

  // Writes the whole of the next tensor, which must be named `name`.
  void write_tensor(std::string_view name, std::span<const uint8_t> bytes);
  // Appends bytes of the declared tensors in order (chunks may span tensors and shards).
  void write(std::span<const uint8_t> chunk);
  void finish();

  // The file names, in order; one name without an index when everything fits one shard.
  const std::vector<std::string>& shard_names() const noexcept { return shard_names_; }

 private:
  void open_shard(size_t shard);

  std::string directory_;
  std::string prefix_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::vector<TensorSpec>> shards_;  // the tensors of each shard
  std::vector<std::string> shard_names_;
  std::vector<uint64_t> shard_bytes_;  // data bytes of each shard
  size_t current_ = 0;                 // the shard being written
  uint64_t current_written_ = 0;       // its data bytes written so far
  std::unique_ptr<SafetensorsWriter> writer_;
  SafetensorsIndex index_;
};

}  // namespace zinf::serialization
