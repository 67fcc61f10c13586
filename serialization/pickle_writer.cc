#include "serialization/pickle_writer.h"

#include <bit>
#include <cstring>
#include <limits>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "serialization/pickle_opcodes.h"
#include "serialization/serialization_error.h"

namespace zinf::serialization {

namespace {

using Kind = PickleValue::Kind;
namespace op = pickle_op;

// Deepest nesting written; a cycle in the tree ends here too.
constexpr size_t kMaxDepth = 1000;
// Items per APPENDS/SETITEMS batch, as CPython writes them.
constexpr size_t kBatch = 1000;

// Minimal little-endian two's complement bytes of `value` (empty for 0, as CPython writes).
std::string encode_long(int64_t value) {
  if (value == 0) return {};
  std::string bytes(8, '\0');
  for (size_t i = 0; i < 8; ++i) {
    bytes[i] = static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff);
  }
  bytes.resize(minimal_int_length(bytes));
  return bytes;
}

// The UTF-8 text whose code points are the bytes of `data` (protocol 2 pickles bytes so).
std::string utf8_from_latin1(std::string_view data) {
  std::string out;
  out.reserve(data.size());
  for (char c : data) {
    const auto byte = static_cast<uint8_t>(c);
    if (byte < 0x80) {
      out.push_back(c);
    } else {
      out.push_back(static_cast<char>(0xc0 | (byte >> 6)));
      out.push_back(static_cast<char>(0x80 | (byte & 0x3f)));
    }
  }
  return out;
}

class Writer {
 public:
  explicit Writer(const std::string& destination) : destination_(destination) {}

  std::vector<uint8_t> run(const PickleValue& root) {
    out_.push_back(op::kProto);
    out_.push_back(2);
    save(root, 0);
    out_.push_back(op::kStop);
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw SerializationError(destination_, kNoOffset, "cannot write a pickle: " + what);
  }

  // ---- Output primitives. ----
  void put(uint8_t byte) { out_.push_back(byte); }
  void put_le(uint64_t value, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) out_.push_back(static_cast<uint8_t>(value >> (8 * i)));
  }
  void put_raw(std::string_view data) { out_.insert(out_.end(), data.begin(), data.end()); }
  void put_int(int64_t value) {
    if (value >= 0 && value <= 0xff) {
      put(op::kBinInt1);
      put_le(static_cast<uint64_t>(value), 1);
    } else if (value >= 0 && value <= 0xffff) {
      put(op::kBinInt2);
      put_le(static_cast<uint64_t>(value), 2);
    } else if (value >= std::numeric_limits<int32_t>::min() &&
               value <= std::numeric_limits<int32_t>::max()) {
      put(op::kBinInt);
      put_le(static_cast<uint32_t>(static_cast<int32_t>(value)), 4);
    } else {
      put_long_bytes(encode_long(value));
    }
  }
  void put_long_bytes(std::string_view bytes) {
    if (bytes.size() < 256) {
      put(op::kLong1);
      put_le(bytes.size(), 1);
    } else {
      if (bytes.size() > 0x7fffffffu) fail("an int of more than 2^31 bytes");
      put(op::kLong4);
      put_le(bytes.size(), 4);
    }
    put_raw(bytes);
  }
  void put_str(std::string_view text) {
    if (text.size() > 0xffffffffu) fail("a str of more than 4 GiB (protocol 2 limit)");
    put(op::kBinUnicode);
    put_le(text.size(), 4);
    put_raw(text);
  }
  void put_global(std::string_view module, std::string_view name) {
    // Protocol 2 names Python 3's modules by their Python 2 names (as fix_imports does).
    if (module == "builtins") module = "__builtin__";
    if (module == "copyreg") module = "copy_reg";
    if (module.find('\n') != std::string_view::npos || name.find('\n') != std::string_view::npos) {
      fail("a global name with a newline");
    }
    std::string key(module);
    key += '\n';
    key += name;
    if (auto it = global_memo_.find(key); it != global_memo_.end()) {
      put_get(it->second);
      return;
    }
    put(op::kGlobal);
    put_raw(key);
    put('\n');
    global_memo_.emplace(std::move(key), put_memo());
  }
  // Stores the top of the stack in the next memo slot and returns the slot.
  uint32_t put_memo() {
    const uint32_t index = next_memo_++;
    if (index < 256) {
      put(op::kBinPut);
      put_le(index, 1);
    } else {
      put(op::kLongBinPut);
      put_le(index, 4);
    }
    return index;
  }
  void put_get(uint32_t index) {
    if (index < 256) {
      put(op::kBinGet);
      put_le(index, 1);
    } else {
      put(op::kLongBinGet);
      put_le(index, 4);
    }
  }
  // Closes a tuple of `count` elements just written (after a MARK when count > 3).
  void put_tuple_end(size_t count) {
    static constexpr uint8_t kSmall[] = {op::kEmptyTuple, op::kTuple1, op::kTuple2, op::kTuple3};
    put(count <= 3 ? kSmall[count] : op::kTuple);
  }
  // bytes at protocol 2: _codecs.encode(latin-1 text, 'latin1'), or bytes() when empty.
  void put_bytes(std::string_view data) {
    if (data.empty()) {
      put_global("__builtin__", "bytes");
      put(op::kEmptyTuple);
    } else {
      put_global("_codecs", "encode");
      put_str(utf8_from_latin1(data));
      put_str("latin1");
      put(op::kTuple2);
    }
    put(op::kReduce);
  }
  void remember(const PickleValue& value) { memo_[&value] = put_memo(); }
  // OrderedDict(): also the empty backward-hooks argument of torch's rebuild functions.
  void put_empty_ordered_dict() {
    put_global("collections", "OrderedDict");
    put(op::kEmptyTuple);
    put(op::kReduce);
  }

  // ---- Values. ----
  void save(const PickleValue& value, size_t depth);
  void save_fresh(const PickleValue& value, size_t depth);
  void save_items(std::span<const PickleValue* const> items, size_t depth);
  void save_entries(std::span<const PickleEntry> entries, size_t depth);
  void save_tuple(std::span<const PickleValue* const> items, size_t depth);
  void save_storage(const StorageRef& storage);
  void save_tensor(const TensorRef& tensor);
  void save_int_tuple(std::span<const int64_t> values);

  const std::string& destination_;
  std::vector<uint8_t> out_;
  std::unordered_map<const PickleValue*, uint32_t> memo_;
  std::unordered_map<std::string, uint32_t> global_memo_;
  std::unordered_set<const PickleValue*> open_;
  uint32_t next_memo_ = 0;
};

void Writer::save_items(std::span<const PickleValue* const> items, size_t depth) {
  for (size_t begin = 0; begin < items.size(); begin += kBatch) {
    const size_t end = std::min(items.size(), begin + kBatch);
    if (end - begin == 1) {
      save(*items[begin], depth + 1);
      put(op::kAppend);
      continue;
    }
    put(op::kMark);
    for (size_t i = begin; i < end; ++i) save(*items[i], depth + 1);
    put(op::kAppends);
  }
}

void Writer::save_entries(std::span<const PickleEntry> entries, size_t depth) {
  for (size_t begin = 0; begin < entries.size(); begin += kBatch) {
    const size_t end = std::min(entries.size(), begin + kBatch);
    if (end - begin == 1) {
      save(*entries[begin].key, depth + 1);
      save(*entries[begin].value, depth + 1);
      put(op::kSetItem);
      continue;
    }
    put(op::kMark);
    for (size_t i = begin; i < end; ++i) {
      save(*entries[i].key, depth + 1);
      save(*entries[i].value, depth + 1);
    }
    put(op::kSetItems);
  }
}

void Writer::save_tuple(std::span<const PickleValue* const> items, size_t depth) {
  if (items.size() > 3) put(op::kMark);
  for (const PickleValue* item : items) save(*item, depth + 1);
  put_tuple_end(items.size());
}

void Writer::save_int_tuple(std::span<const int64_t> values) {
  if (values.size() > 3) put(op::kMark);
  for (int64_t v : values) put_int(v);
  put_tuple_end(values.size());
}

void Writer::save_storage(const StorageRef& storage) {
  if (storage.storage_type.empty()) fail("a storage without a type");
  put(op::kMark);
  put_str("storage");
  put_global("torch", storage.storage_type);
  put_str(storage.key);
  put_str(storage.location);
  put_int(storage.numel);
  put(op::kTuple);
  put(op::kBinPersId);
}

void Writer::save_tensor(const TensorRef& tensor) {
  if (tensor.storage.dtype == TensorDType::kUnknown &&
      dtype_from_storage_type(tensor.storage.storage_type) == TensorDType::kUnknown) {
    fail("a tensor of unknown storage type '" + tensor.storage.storage_type + "'");
  }
  if (tensor.is_parameter) put_global("torch._utils", "_rebuild_parameter");
  put_global("torch._utils", "_rebuild_tensor_v2");
  put(op::kMark);
  StorageRef storage = tensor.storage;
  if (storage.storage_type.empty()) storage.storage_type = storage_type_of(storage.dtype);
  save_storage(storage);
  put_int(tensor.storage_offset);
  save_int_tuple(tensor.shape);
  save_int_tuple(tensor.stride);
  put(tensor.requires_grad ? op::kNewTrue : op::kNewFalse);
  put_empty_ordered_dict();
  put(op::kTuple);
  put(op::kReduce);
  if (tensor.is_parameter) {
    put(tensor.requires_grad ? op::kNewTrue : op::kNewFalse);
    put_empty_ordered_dict();
    put(op::kTuple3);
    put(op::kReduce);
  }
}

void Writer::save(const PickleValue& value, size_t depth) {
  if (depth >= kMaxDepth) {
    fail("values nested deeper than " + std::to_string(kMaxDepth) + " levels (or a cycle)");
  }
  if (open_.contains(&value)) {
    fail(std::string("a ") + std::string(value.kind_name()) + " that contains itself");
  }
  if (auto it = memo_.find(&value); it != memo_.end()) {
    put_get(it->second);
    return;
  }
  // Open while its contents are written: meeting it again there is a cycle, which the memo
  // would write and the reader refuses.
  open_.insert(&value);
  save_fresh(value, depth);
  open_.erase(&value);
}

void Writer::save_fresh(const PickleValue& value, size_t depth) {
  switch (value.kind()) {
    case Kind::kNone:
      put(op::kNone);
      return;
    case Kind::kBool:
      put(value.as_bool() ? op::kNewTrue : op::kNewFalse);
      return;
    case Kind::kInt:
      put_int(value.as_int());
      return;
    case Kind::kBigInt:
      put_long_bytes(value.big_int_bytes());
      return;
    case Kind::kFloat:
      put(op::kBinFloat);
      put_le(__builtin_bswap64(std::bit_cast<uint64_t>(value.as_float())), 8);
      return;
    case Kind::kString:
      put_str(value.as_string());
      return;
    case Kind::kBytes:
      put_bytes(value.as_string());
      remember(value);
      return;
    case Kind::kByteArray:  // bytearray(bytes)
      put_global("__builtin__", "bytearray");
      if (value.as_string().empty()) {
        put(op::kEmptyTuple);
      } else {
        put_bytes(value.as_string());
        put(op::kTuple1);
      }
      put(op::kReduce);
      remember(value);
      return;
    case Kind::kList:
      put(op::kEmptyList);
      remember(value);
      save_items(value.items(), depth);
      return;
    case Kind::kTuple:
      save_tuple(value.items(), depth);
      remember(value);
      return;
    case Kind::kDict:
      put(op::kEmptyDict);
      remember(value);
      save_entries(value.entries(), depth);
      return;
    case Kind::kOrderedDict:
      put_empty_ordered_dict();
      remember(value);
      save_entries(value.entries(), depth);
      if (value.state() != nullptr) {
        save(*value.state(), depth + 1);
        put(op::kBuild);
      }
      return;
    case Kind::kSet:
    case Kind::kFrozenSet:
      put_global("__builtin__", value.is(Kind::kSet) ? "set" : "frozenset");
      put(op::kEmptyList);
      save_items(value.items(), depth);
      put(op::kTuple1);
      put(op::kReduce);
      remember(value);
      return;
    case Kind::kTorchSize:
      put_global("torch", "Size");
      save_int_tuple(value.as_int_list());
      put(op::kTuple1);
      put(op::kReduce);
      remember(value);
      return;
    case Kind::kStorage:
      save_storage(value.storage());
      remember(value);
      return;
    case Kind::kTensor:
      save_tensor(value.tensor());
      remember(value);
      return;
    case Kind::kGlobal:
      put_global(value.module(), value.name());
      return;
    case Kind::kObject: {
      if (value.kwargs() != nullptr) fail("an object with keyword arguments (NEWOBJ_EX)");
      put_global(value.module(), value.name());
      save_tuple(value.args().items(), depth);
      put(value.made_by_newobj() ? op::kNewObj : op::kReduce);
      remember(value);
      save_items(value.items(), depth);
      save_entries(value.entries(), depth);
      if (value.state() != nullptr) {
        save(*value.state(), depth + 1);
        put(op::kBuild);
      }
      return;
    }
  }
}

}  // namespace

std::vector<uint8_t> write_pickle(const PickleValue& root, const std::string& destination) {
  return Writer(destination).run(root);
}

}  // namespace zinf::serialization
