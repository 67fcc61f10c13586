#include "serialization/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "serialization/serialization_error.h"

namespace zinf::serialization {
namespace {

using nlohmann::json;

constexpr uint64_t kLengthBytes = 8;  // the header-length prefix
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr size_t kMaxDims = 1024;  // far beyond any real tensor; bounds a shape's memory

struct DtypeRow {
  Dtype dtype;
  std::string_view name;
  uint64_t bytes;
};
constexpr DtypeRow kDtypes[] = {
    {Dtype::kF64, "F64", 8},   {Dtype::kF32, "F32", 4}, {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2}, {Dtype::kI64, "I64", 8}, {Dtype::kI32, "I32", 4},
    {Dtype::kI16, "I16", 2},   {Dtype::kI8, "I8", 1},   {Dtype::kU8, "U8", 1},
    {Dtype::kBool, "BOOL", 1},
};

const DtypeRow& row(Dtype dtype) {
  for (const DtypeRow& r : kDtypes) {
    if (r.dtype == dtype) return r;
  }
  return kDtypes[0];  // unreachable for a valid enumerator
}

// Reads a non-negative integer that fits 64 bits, or returns false.
bool as_u64(const json& value, uint64_t& out) {
  if (!value.is_number_unsigned()) return false;
  out = value.get<uint64_t>();
  return true;
}

// Builds the tensor list straight from the header's JSON events, so memory stays
// proportional to what is kept (names, shapes), never to the header's nesting or length;
// anything that is not the safetensors shape is an error at once.
class HeaderParser : public nlohmann::json_sax<json> {
 public:
  HeaderParser(const std::string& file, std::vector<TensorInfo>& tensors,
               std::map<std::string, std::string>& metadata)
      : file_(file), tensors_(tensors), metadata_(metadata) {}

  bool null() override { return scalar("null"); }
  bool boolean(bool value) override { return scalar(value ? "true" : "false"); }
  bool number_integer(number_integer_t value) override { return scalar(std::to_string(value)); }
  bool number_unsigned(number_unsigned_t value) override {
    if (depth_ == 3 && (field_ == Field::kShape || field_ == Field::kOffsets)) {
      if (field_ == Field::kShape) {
        if (tensors_.back().shape.size() == kMaxDims) {
          return fail(where() + "shape has more than " + std::to_string(kMaxDims) + " dimensions");
        }
        tensors_.back().shape.push_back(value);
      } else if (offsets_seen_ < 2) {
        (offsets_seen_++ == 0 ? tensors_.back().begin : tensors_.back().end) = value;
      } else {
        return fail("data_offsets has more than two entries");
      }
      return true;
    }
    return scalar(std::to_string(value));
  }
  bool number_float(number_float_t, const string_t& text) override { return scalar(text); }
  bool string(string_t& value) override {
    if (depth_ == 2 && in_metadata_) {
      metadata_[key_] = value;
      return true;
    }
    if (depth_ == 2 && field_ == Field::kDtype) {
      const std::optional<Dtype> dtype = parse_dtype(value);
      if (!dtype) return fail("unknown dtype \"" + value + "\"");
      tensors_.back().dtype = *dtype;
      return true;
    }
    return scalar("\"" + value + "\"");
  }
  bool binary(binary_t&) override { return scalar("binary"); }

  bool start_object(std::size_t) override {
    if (depth_ == 0) {
      ++depth_;
      return true;
    }
    if (depth_ == 1) {
      ++depth_;
      in_metadata_ = key_ == "__metadata__";
      if (!in_metadata_) {
        tensors_.push_back(TensorInfo{});
        tensors_.back().name = key_;
        seen_ = 0;
      }
      return true;
    }
    return scalar("an object");
  }
  bool key(string_t& key) override {
    if (depth_ == 1) {
      if (!keys_.insert(key).second) return fail("key '" + key + "' appears twice");
    } else if (depth_ == 2 && !in_metadata_) {
      const auto it = kFields.find(key);
      if (it == kFields.end()) return fail(where() + "unknown field '" + key + "'");
      field_ = it->second;
      const unsigned bit = 1u << static_cast<unsigned>(field_);
      if ((seen_ & bit) != 0) return fail(where() + "field '" + key + "' appears twice");
      seen_ |= bit;
      return true;
    } else if (depth_ == 2 && metadata_.contains(key)) {
      return fail("__metadata__ key '" + key + "' appears twice");
    }
    key_ = key;
    return true;
  }
  bool end_object() override {
    if (depth_ == 2 && !in_metadata_ && seen_ != 0b111) {
      return fail(where() + "needs dtype, shape and data_offsets");
    }
    --depth_;
    field_ = Field::kNone;
    return true;
  }
  bool start_array(std::size_t) override {
    if (depth_ == 2 && !in_metadata_ && field_ != Field::kDtype) {
      ++depth_;
      offsets_seen_ = 0;
      return true;
    }
    return scalar("an array");
  }
  bool end_array() override {
    if (field_ == Field::kOffsets && offsets_seen_ != 2) {
      return fail(where() + "data_offsets does not have two entries");
    }
    --depth_;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    error_position_ = position > 0 ? position - 1 : 0;
    error_ = e.what();
    return false;
  }

  uint64_t error_position() const { return error_position_; }
  const std::string& error() const { return error_; }

 private:
  enum class Field { kDtype = 0, kShape = 1, kOffsets = 2, kNone = 3 };
  inline static const std::map<std::string, Field, std::less<>> kFields = {
      {"dtype", Field::kDtype}, {"shape", Field::kShape}, {"data_offsets", Field::kOffsets}};

  std::string where() const { return "tensor '" + tensors_.back().name + "': "; }
  [[noreturn]] bool fail(const std::string& what) const {
    throw SerializationError(file_, kLengthBytes, what);
  }
  // A value where the format has none of its kind.
  bool scalar(const std::string& what) const {
    if (depth_ == 0) return fail("header is not a JSON object");
    if (depth_ == 1) {
      return fail(key_ == "__metadata__" ? "__metadata__ is not an object"
                                         : "tensor '" + key_ + "': entry is not an object");
    }
    if (in_metadata_) return fail("__metadata__ value of '" + key_ + "' is not a string");
    switch (field_) {
      case Field::kDtype:
        return fail(where() + "unknown dtype " + what);
      case Field::kShape:
        return fail(where() + "shape entry " + what + " is not a non-negative integer");
      case Field::kOffsets:
        return fail(where() + "data_offsets entry " + what + " is not a non-negative integer");
      case Field::kNone:
        break;
    }
    return fail(where() + "unexpected " + what);
  }

  const std::string& file_;
  std::vector<TensorInfo>& tensors_;
  std::map<std::string, std::string>& metadata_;
  int depth_ = 0;    // 1: the root object, 2: an entry, 3: an array inside a tensor entry
  std::string key_;  // the last key at depth 1 or in __metadata__
  std::set<std::string, std::less<>> keys_;
  bool in_metadata_ = false;
  Field field_ = Field::kNone;
  unsigned seen_ = 0;  // fields of the current tensor, one bit per Field
  int offsets_seen_ = 0;
  uint64_t error_position_ = 0;
  std::string error_;
};

}  // namespace

std::string_view dtype_name(Dtype dtype) { return row(dtype).name; }
uint64_t dtype_bytes(Dtype dtype) { return row(dtype).bytes; }
std::optional<Dtype> parse_dtype(std::string_view name) {
  for (const DtypeRow& r : kDtypes) {
    if (r.name == name) return r.dtype;
  }
  return std::nullopt;
}

uint64_t tensor_bytes(const std::string& file, const std::string& tensor, Dtype dtype,
                      const std::vector<uint64_t>& shape) {
  uint64_t bytes = dtype_bytes(dtype);
  for (uint64_t dim : shape) {
    if (dim != 0 && bytes > UINT64_MAX / dim) {
      throw SerializationError(file, kNoOffset,
                               "tensor '" + tensor + "': shape overflows 64-bit byte counts");
    }
    bytes *= dim;
  }
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// Reader

SafetensorsReader SafetensorsReader::open(const std::string& path) {
  MappedFile file = MappedFile::open(path);
  const std::span<const uint8_t> bytes = file.bytes();
  SafetensorsReader reader(std::move(file), bytes, path);
  reader.parse();
  return reader;
}

SafetensorsReader SafetensorsReader::from_bytes(std::span<const uint8_t> bytes, std::string name) {
  SafetensorsReader reader(MappedFile(), bytes, std::move(name));
  reader.parse();
  return reader;
}

void SafetensorsReader::parse() {
  static_assert(std::endian::native == std::endian::little, "the length is read in place");
  auto fail = [&](uint64_t offset, const std::string& what) -> void {
    throw SerializationError(name_, offset, what);
  };
  const uint64_t file_bytes = bytes_.size();
  if (file_bytes < kLengthBytes) {
    fail(0, "file of " + std::to_string(file_bytes) +
                " bytes is too small for a safetensors header length");
  }
  uint64_t header_bytes;
  std::memcpy(&header_bytes, bytes_.data(), sizeof(header_bytes));
  if (header_bytes > kMaxHeaderBytes) {
    fail(0, "header length " + std::to_string(header_bytes) + " exceeds the limit of " +
                std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (header_bytes > file_bytes - kLengthBytes) {
    fail(0, "header length " + std::to_string(header_bytes) + " runs past the end of the file (" +
                std::to_string(file_bytes) + " bytes)");
  }
  if (header_bytes < 2 || bytes_[kLengthBytes] != '{') {
    fail(kLengthBytes, "header is not a JSON object");
  }
  data_offset_ = kLengthBytes + header_bytes;
  const uint64_t buffer_bytes = file_bytes - data_offset_;
  const auto* text = reinterpret_cast<const char*>(bytes_.data() + kLengthBytes);
  HeaderParser parser(name_, tensors_, metadata_);
  bool parsed = false;
  try {
    parsed = json::sax_parse(text, text + header_bytes, &parser);
  } catch (const json::exception& e) {
    fail(kLengthBytes, std::string("header JSON: ") + e.what());
  }
  if (!parsed) {
    fail(kLengthBytes + parser.error_position(), "header JSON: " + parser.error());
  }
  for (const TensorInfo& tensor : tensors_) {
    const std::string where = "tensor '" + tensor.name + "': ";
    if (tensor.begin > tensor.end) {
      fail(kLengthBytes, where + "data_offsets begin " + std::to_string(tensor.begin) +
                             " is after end " + std::to_string(tensor.end));
    }
    const uint64_t expected = tensor_bytes(name_, tensor.name, tensor.dtype, tensor.shape);
    if (expected != tensor.end - tensor.begin) {
      fail(kLengthBytes, where + "data_offsets span " + std::to_string(tensor.end - tensor.begin) +
                             " bytes but shape x dtype needs " + std::to_string(expected));
    }
  }
  // The tensors must tile the buffer exactly.
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const TensorInfo& tensor : tensors_) {
    if (tensor.begin != covered) {
      fail(
          data_offset_ + std::min(tensor.begin, buffer_bytes),
          "tensor '" + tensor.name + "' begins at buffer offset " + std::to_string(tensor.begin) +
              (tensor.begin < covered ? ", overlapping the tensor before it"
                                      : ", leaving a gap after offset " + std::to_string(covered)));
    }
    covered = tensor.end;
    if (covered > buffer_bytes) {
      fail(data_offset_ + tensor.begin, "tensor '" + tensor.name + "' ends at buffer offset " +
                                            std::to_string(covered) + ", past the buffer's " +
                                            std::to_string(buffer_bytes) + " bytes");
    }
  }
  if (covered != buffer_bytes) {
    fail(data_offset_ + covered, "the tensors cover " + std::to_string(covered) +
                                     " bytes of a data buffer of " + std::to_string(buffer_bytes));
  }
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

const TensorInfo* SafetensorsReader::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> SafetensorsReader::data(const TensorInfo& tensor) const {
  return bytes_.subspan(static_cast<size_t>(data_offset_ + tensor.begin),
                        static_cast<size_t>(tensor.size_bytes()));
}

std::span<const uint8_t> SafetensorsReader::read(std::string_view name) const {
  const TensorInfo* tensor = find(name);
  if (tensor == nullptr) {
    throw SerializationError(name_, kNoOffset, "no tensor named '" + std::string(name) + "'");
  }
  return data(*tensor);
}

// ---------------------------------------------------------------------------------------------
// Writer

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorSpec> tensors,
                                     std::map<std::string, std::string> metadata)
    : file_(std::move(path)), specs_(std::move(tensors)) {
  json header = json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  begins_.reserve(specs_.size());
  ends_.reserve(specs_.size());
  for (const TensorSpec& spec : specs_) {
    if (spec.name == kMetadataKey || header.contains(spec.name)) {
      fail("tensor name '" + spec.name + "' is reserved or given twice");
    }
    const uint64_t bytes = tensor_bytes(file_.temp_path(), spec.name, spec.dtype, spec.shape);
    header[spec.name] = {{"dtype", dtype_name(spec.dtype)},
                         {"shape", spec.shape},
                         {"data_offsets", {data_bytes_, data_bytes_ + bytes}}};
    begins_.push_back(data_bytes_);
    data_bytes_ += bytes;
    ends_.push_back(data_bytes_);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // names or metadata that are not valid UTF-8
    fail(std::string("header JSON: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the buffer starts 8-byte aligned
  uint8_t length[kLengthBytes];
  for (size_t i = 0; i < kLengthBytes; ++i)
    length[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  file_.append(length);
  file_.append(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

void SafetensorsWriter::fail(const std::string& what) {
  failed_ = true;
  throw SerializationError(file_.temp_path(), kNoOffset, what);
}

void SafetensorsWriter::write(std::span<const uint8_t> chunk) {
  if (failed_) fail("safetensors writer failed earlier");
  if (chunk.size() > data_bytes_ - written_) {
    fail("writing " + std::to_string(chunk.size()) + " bytes after " + std::to_string(written_) +
         " exceeds the declared " + std::to_string(data_bytes_));
  }
  file_.append(chunk);
  written_ += chunk.size();
}

void SafetensorsWriter::write_tensor(std::string_view name, std::span<const uint8_t> bytes) {
  // The next tensor is one whose range starts at written_ (several when some are empty).
  const auto first = std::lower_bound(begins_.begin(), begins_.end(), written_);
  for (auto it = first; it != begins_.end() && *it == written_; ++it) {
    const size_t i = static_cast<size_t>(it - begins_.begin());
    if (specs_[i].name == name) {
      if (bytes.size() != ends_[i] - begins_[i]) {
        fail("tensor '" + std::string(name) + "' declared " +
             std::to_string(ends_[i] - begins_[i]) + " bytes; given " +
             std::to_string(bytes.size()));
      }
      write(bytes);
      return;
    }
  }
  fail("tensor '" + std::string(name) + "' is not the next declared tensor");
}

void SafetensorsWriter::finish() {
  if (failed_) fail("safetensors writer failed earlier");
  if (written_ != data_bytes_) {
    fail("finish after " + std::to_string(written_) + " of " + std::to_string(data_bytes_) +
         " declared data bytes");
  }
  file_.commit();
}

// ---------------------------------------------------------------------------------------------
// Sharded form

SafetensorsIndex read_safetensors_index(const std::string& path) {
  const MappedFile file = MappedFile::open(path);
  const auto* text = reinterpret_cast<const char*>(file.data());
  json root;
  try {
    root = json::parse(text, text + file.size());
  } catch (const json::parse_error& e) {
    throw SerializationError(path, e.byte > 0 ? e.byte - 1 : 0, e.what());
  } catch (const json::exception& e) {
    throw SerializationError(path, kNoOffset, e.what());
  }
  auto fail = [&](const std::string& what) { throw SerializationError(path, kNoOffset, what); };
  SafetensorsIndex index;
  if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object()) {
    fail("not a safetensors index: needs an object with a weight_map object");
  }
  if (!root.contains("metadata") || !root["metadata"].is_object() ||
      !root["metadata"].contains("total_size") ||
      !as_u64(root["metadata"]["total_size"], index.total_size)) {
    fail("metadata.total_size is missing or not a non-negative integer");
  }
  for (const auto& [tensor, shard] : root["weight_map"].items()) {
    if (!shard.is_string()) fail("weight_map entry '" + tensor + "' is not a string");
    const std::string name = shard.get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos) {
      fail("weight_map entry '" + tensor + "' names '" + name +
           "', which is not a plain file name");
    }
    index.weight_map.emplace(tensor, name);
  }
  return index;
}

ShardedSafetensorsReader ShardedSafetensorsReader::open(const std::string& index_path) {
  ShardedSafetensorsReader reader;
  reader.index_path_ = index_path;
  reader.index_ = read_safetensors_index(index_path);
  const std::filesystem::path directory = std::filesystem::path(index_path).parent_path();
  for (const auto& [tensor, shard] : reader.index_.weight_map) {
    if (!reader.shards_.contains(shard)) {
      reader.shards_.emplace(shard, SafetensorsReader::open((directory / shard).string()));
    }
  }
  uint64_t total = 0;
  for (const auto& [shard, shard_reader] : reader.shards_) {
    for (const TensorInfo& tensor : shard_reader.tensors()) {
      const auto it = reader.index_.weight_map.find(tensor.name);
      if (it == reader.index_.weight_map.end() || it->second != shard) {
        throw SerializationError(index_path, kNoOffset,
                                 "shard '" + shard + "' holds tensor '" + tensor.name +
                                     "', which the weight_map places elsewhere or omits");
      }
      total += tensor.size_bytes();
    }
  }
  for (const auto& [tensor, shard] : reader.index_.weight_map) {
    if (reader.shards_.at(shard).find(tensor) == nullptr) {
      throw SerializationError(index_path, kNoOffset,
                               "tensor '" + tensor + "' is not in its shard '" + shard + "'");
    }
  }
  if (total != reader.index_.total_size) {
    throw SerializationError(index_path, kNoOffset,
                             "metadata.total_size " + std::to_string(reader.index_.total_size) +
                                 " differs from the shards' " + std::to_string(total) +
                                 " bytes of tensors");
  }
  return reader;
}

std::pair<const SafetensorsReader*, const TensorInfo*> ShardedSafetensorsReader::find(
    std::string_view name) const {
  const auto it = index_.weight_map.find(std::string(name));
  if (it == index_.weight_map.end()) return {nullptr, nullptr};
  const SafetensorsReader& shard = shards_.at(it->second);
  return {&shard, shard.find(name)};
}

std::span<const uint8_t> ShardedSafetensorsReader::read(std::string_view name) const {
  const auto [shard, tensor] = find(name);
  if (tensor == nullptr) {
    throw SerializationError(index_path_, kNoOffset, "no tensor named '" + std::string(name) + "'");
  }
  return shard->data(*tensor);
}

ShardedSafetensorsWriter::ShardedSafetensorsWriter(std::string directory,
                                                   std::vector<TensorSpec> tensors,
                                                   uint64_t max_shard_bytes, std::string prefix,
                                                   std::map<std::string, std::string> metadata)
    : directory_(std::move(directory)), prefix_(std::move(prefix)), metadata_(std::move(metadata)) {
  if (max_shard_bytes == 0) {
    throw SerializationError(directory_, kNoOffset, "max shard size must be positive");
  }
  // Greedy in declaration order, so shards are written one after another as data streams in:
  // a tensor that does not fit the current shard starts the next; a tensor larger than the
  // limit gets a shard of its own.
  for (TensorSpec& spec : tensors) {
    const uint64_t bytes = tensor_bytes(directory_, spec.name, spec.dtype, spec.shape);
    if (shards_.empty() ||
        (!shards_.back().empty() &&
         bytes > max_shard_bytes - std::min(max_shard_bytes, shard_bytes_.back()))) {
      shards_.emplace_back();
      shard_bytes_.push_back(0);
    }
    index_.total_size += bytes;
    shard_bytes_.back() += bytes;
    shards_.back().push_back(std::move(spec));
  }
  if (shards_.empty()) {
    shards_.emplace_back();
    shard_bytes_.push_back(0);
  }
  const size_t count = shards_.size();
  char name[64];
  for (size_t i = 0; i < count; ++i) {
    if (count == 1) {
      shard_names_.push_back(prefix_ + ".safetensors");
    } else {
      std::snprintf(name, sizeof(name), "-%05zu-of-%05zu.safetensors", i + 1, count);
      shard_names_.push_back(prefix_ + name);
    }
    for (const TensorSpec& spec : shards_[i]) {
      if (!index_.weight_map.emplace(spec.name, shard_names_.back()).second) {
        throw SerializationError(directory_, kNoOffset,
                                 "tensor name '" + spec.name + "' is given twice");
      }
    }
  }
  open_shard(0);
}

void ShardedSafetensorsWriter::open_shard(size_t shard) {
  writer_ = std::make_unique<SafetensorsWriter>(directory_ + "/" + shard_names_[shard],
                                                shards_[shard], metadata_);
  current_ = shard;
  current_written_ = 0;
}

void ShardedSafetensorsWriter::write(std::span<const uint8_t> chunk) {
  while (!chunk.empty()) {
    if (current_written_ == shard_bytes_[current_]) {
      if (current_ + 1 == shards_.size()) {
        throw SerializationError(directory_, kNoOffset, "more tensor bytes written than declared");
      }
      writer_->finish();
      open_shard(current_ + 1);
    }
    const uint64_t n = std::min<uint64_t>(chunk.size(), shard_bytes_[current_] - current_written_);
    writer_->write(chunk.first(static_cast<size_t>(n)));
    current_written_ += n;
    chunk = chunk.subspan(static_cast<size_t>(n));
  }
}

void ShardedSafetensorsWriter::write_tensor(std::string_view name, std::span<const uint8_t> bytes) {
  const auto it = index_.weight_map.find(std::string(name));
  if (it == index_.weight_map.end()) {
    throw SerializationError(directory_, kNoOffset,
                             "tensor '" + std::string(name) + "' was not declared");
  }
  // Move on to the tensor's shard when the current one is complete.
  while (it->second != shard_names_[current_] && current_written_ == shard_bytes_[current_] &&
         current_ + 1 < shards_.size()) {
    writer_->finish();
    open_shard(current_ + 1);
  }
  writer_->write_tensor(name, bytes);
  current_written_ += bytes.size();
}

void ShardedSafetensorsWriter::finish() {
  while (true) {
    writer_->finish();  // throws when the shard is incomplete
    if (current_ + 1 == shards_.size()) break;
    open_shard(current_ + 1);
  }
  writer_.reset();
  if (shards_.size() == 1) return;
  json root;
  root["metadata"] = {{"total_size", index_.total_size}};
  root["weight_map"] = index_.weight_map;
  AtomicFile index(directory_ + "/" + prefix_ + ".safetensors.index.json");
  std::string text;
  try {
    text = root.dump(2) + "\n";
  } catch (const json::exception& e) {  // unreachable: the names passed the shards' dump()
    throw SerializationError(index.temp_path(), kNoOffset, std::string("index JSON: ") + e.what());
  }
  index.append(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  index.commit();
}

}  // namespace zinf::serialization
