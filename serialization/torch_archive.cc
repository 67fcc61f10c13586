#include "serialization/torch_archive.h"

#include <utility>
#include <vector>

#include "serialization/pickle_reader.h"
#include "serialization/pickle_writer.h"
#include "serialization/serialization_error.h"

namespace zinf::serialization {

namespace {

constexpr std::string_view kPickleRecord = "data.pkl";

// Bytes a storage holds: numel * element size, refused when unknown or overflowing.
uint64_t storage_size_bytes(const StorageRef& storage, const std::string& source) {
  const uint64_t element = dtype_size_bytes(storage.dtype);
  if (element == 0) {
    throw SerializationError(
        source, kNoOffset,
        "storage '" + storage.key + "' has the unsupported type " + storage.storage_type);
  }
  const auto numel = static_cast<uint64_t>(storage.numel);
  if (numel > UINT64_MAX / element) {
    throw SerializationError(source, kNoOffset, "storage '" + storage.key + "' is too large");
  }
  return numel * element;
}

}  // namespace

TorchArchive TorchArchive::open(const std::string& path) {
  ZipReader zip = ZipReader::open(path);
  const ZipEntry* pickle = nullptr;
  std::string prefix;
  for (const ZipEntry& entry : zip.entries()) {
    const size_t slash = entry.name.find('/');
    if (slash == std::string::npos ||
        std::string_view(entry.name).substr(slash + 1) != kPickleRecord) {
      continue;
    }
    if (pickle != nullptr) {
      throw SerializationError(path, entry.local_header_offset,
                               "two pickle records: " + pickle->name + " and " + entry.name);
    }
    pickle = &entry;
    prefix = entry.name.substr(0, slash + 1);
  }
  if (pickle == nullptr) {
    throw SerializationError(path, kNoOffset, "no <top>/data.pkl record: not a torch.save file");
  }
  PickleDocument document = read_pickle(zip.data(*pickle), path + ":" + pickle->name);
  return TorchArchive(std::move(zip), std::move(prefix), std::move(document));
}

std::span<const uint8_t> TorchArchive::storage_bytes(const StorageRef& storage) const {
  const std::string record = prefix_ + "data/" + storage.key;
  const ZipEntry* entry = zip_.find(record);
  if (entry == nullptr) {
    throw SerializationError(zip_.name(), kNoOffset, "storage record " + record + " is missing");
  }
  const uint64_t needed = storage_size_bytes(storage, zip_.name());
  if (entry->size < needed) {
    throw SerializationError(zip_.name(), entry->data_offset,
                             "storage record " + record + " holds " + std::to_string(entry->size) +
                                 " bytes; its " + std::to_string(storage.numel) + " " +
                                 std::string(dtype_name(storage.dtype)) + " elements need " +
                                 std::to_string(needed));
  }
  return zip_.data(*entry).first(static_cast<size_t>(needed));
}

TorchArchive::StorageRecord TorchArchive::storage_record(const StorageRef& storage) const {
  (void)storage_bytes(storage);  // present and large enough
  StorageRecord r;
  r.name = prefix_ + "data/" + storage.key;
  const ZipEntry* entry = zip_.find(r.name);
  r.bytes = zip_.data(*entry);
  r.crc32 = entry->crc32;
  r.data_offset = entry->data_offset;
  return r;
}

std::span<const uint8_t> TorchArchive::tensor_bytes(const TensorRef& tensor) const {
  if (!tensor.is_contiguous()) {
    throw SerializationError(zip_.name(), kNoOffset,
                             "tensor on storage '" + tensor.storage.key + "' is not contiguous");
  }
  const std::span<const uint8_t> storage = storage_bytes(tensor.storage);
  const size_t element = dtype_size_bytes(tensor.storage.dtype);
  // The pickle reader checked that the view lies inside the storage's numel.
  return storage.subspan(static_cast<size_t>(tensor.storage_offset) * element,
                         static_cast<size_t>(tensor.numel()) * element);
}

// ---------------------------------------------------------------------------------------------

TorchArchiveWriter::TorchArchiveWriter(std::string path, std::string top)
    : path_(path), top_(std::move(top)), zip_(std::move(path)) {}

void TorchArchiveWriter::fail(const std::string& what) const {
  throw SerializationError(path_, kNoOffset, what);
}

void TorchArchiveWriter::write_pickle(const PickleValue& root) {
  if (pickle_written_) fail("data.pkl written twice");
  const std::vector<uint8_t> bytes = serialization::write_pickle(root, path_);
  // The storages the pickle names (walk of the tree; write_pickle refused cycles already).
  std::vector<const PickleValue*> stack = {&root};
  std::vector<const PickleValue*> seen;
  while (!stack.empty()) {
    const PickleValue* value = stack.back();
    stack.pop_back();
    const StorageRef* storage = nullptr;
    if (value->is(PickleValue::Kind::kTensor)) storage = &value->tensor().storage;
    if (value->is(PickleValue::Kind::kStorage)) storage = &value->storage();
    if (storage != nullptr) {
      StorageRef typed = *storage;
      if (typed.dtype == TensorDType::kUnknown) {
        typed.dtype = dtype_from_storage_type(typed.storage_type);
      }
      const uint64_t size = storage_size_bytes(typed, path_);
      auto [it, inserted] = needed_bytes_.try_emplace(typed.key, size);
      if (!inserted && it->second != size) {
        fail("storage '" + typed.key + "' is named with two sizes: " + std::to_string(it->second) +
             " and " + std::to_string(size) + " bytes");
      }
    }
    switch (value->kind()) {
      case PickleValue::Kind::kList:
      case PickleValue::Kind::kTuple:
      case PickleValue::Kind::kSet:
      case PickleValue::Kind::kFrozenSet:
        for (const PickleValue* item : value->items()) stack.push_back(item);
        break;
      case PickleValue::Kind::kDict:
      case PickleValue::Kind::kOrderedDict:
        for (const PickleEntry& entry : value->entries()) stack.push_back(entry.value);
        break;
      case PickleValue::Kind::kObject:
        stack.push_back(&value->args());
        for (const PickleValue* item : value->items()) stack.push_back(item);
        for (const PickleEntry& entry : value->entries()) stack.push_back(entry.value);
        if (value->state() != nullptr) stack.push_back(value->state());
        break;
      default:
        break;
    }
  }
  zip_.add_record(top_ + "/" + std::string(kPickleRecord), bytes);
  pickle_written_ = true;
}

void TorchArchiveWriter::add_storage(std::string_view key, std::span<const uint8_t> bytes) {
  begin_storage(key, bytes.size());
  write(bytes);
}

void TorchArchiveWriter::begin_storage(std::string_view key, uint64_t size_bytes,
                                       uint64_t alignment) {
  if (!written_bytes_.try_emplace(std::string(key), size_bytes).second) {
    fail("storage '" + std::string(key) + "' written twice");
  }
  zip_.begin_record(top_ + "/data/" + std::string(key), size_bytes, alignment);
}

void TorchArchiveWriter::write(std::span<const uint8_t> chunk) { zip_.write(chunk); }

void TorchArchiveWriter::write(std::span<const uint8_t> chunk, uint32_t chunk_crc) {
  zip_.write(chunk, chunk_crc);
}

void TorchArchiveWriter::write_stable(std::span<const uint8_t> chunk, uint32_t chunk_crc) {
  zip_.write_stable(chunk, chunk_crc);
}

void TorchArchiveWriter::finish() {
  if (!pickle_written_) fail("finish() before write_pickle()");
  for (const auto& [key, needed] : needed_bytes_) {
    auto it = written_bytes_.find(key);
    if (it == written_bytes_.end()) fail("storage '" + key + "' was never written");
    if (it->second < needed) {
      fail("storage '" + key + "' has " + std::to_string(it->second) + " bytes; the pickle needs " +
           std::to_string(needed));
    }
  }
  static constexpr uint8_t kVersion[] = {'3', '\n'};
  zip_.add_record(top_ + "/version", kVersion);
  zip_.finish();
}

}  // namespace zinf::serialization
