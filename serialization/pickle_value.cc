#include "serialization/pickle_value.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "serialization/serialization_error.h"

namespace zinf::serialization {

namespace {

// Hashable values nested deeper than this (tuples of tuples ...) are refused as keys; it
// bounds the recursion of key interning.
constexpr int32_t kMaxKeyDepth = 1000;

struct DTypeInfo {
  TensorDType dtype;
  std::string_view storage_type;
  std::string_view name;
  size_t size_bytes;
};

constexpr DTypeInfo kDTypes[] = {
    {TensorDType::kFloat32, "FloatStorage", "float32", 4},
    {TensorDType::kFloat64, "DoubleStorage", "float64", 8},
    {TensorDType::kFloat16, "HalfStorage", "float16", 2},
    {TensorDType::kBFloat16, "BFloat16Storage", "bfloat16", 2},
    {TensorDType::kInt64, "LongStorage", "int64", 8},
    {TensorDType::kInt32, "IntStorage", "int32", 4},
    {TensorDType::kInt16, "ShortStorage", "int16", 2},
    {TensorDType::kInt8, "CharStorage", "int8", 1},
    {TensorDType::kUInt8, "ByteStorage", "uint8", 1},
    {TensorDType::kBool, "BoolStorage", "bool", 1},
    {TensorDType::kComplex64, "ComplexFloatStorage", "complex64", 8},
    {TensorDType::kComplex128, "ComplexDoubleStorage", "complex128", 16},
};

const DTypeInfo* find_dtype(TensorDType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

void append_u64(std::string& out, uint64_t value) {
  char bytes[8];
  std::memcpy(bytes, &value, sizeof(bytes));
  out.append(bytes, sizeof(bytes));
}

}  // namespace

TensorDType dtype_from_storage_type(std::string_view storage_type) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.storage_type == storage_type) return info.dtype;
  }
  return TensorDType::kUnknown;
}

std::string_view storage_type_of(TensorDType dtype) {
  const DTypeInfo* info = find_dtype(dtype);
  return info != nullptr ? info->storage_type : std::string_view{};
}

size_t dtype_size_bytes(TensorDType dtype) {
  const DTypeInfo* info = find_dtype(dtype);
  return info != nullptr ? info->size_bytes : 0;
}

std::string_view dtype_name(TensorDType dtype) {
  const DTypeInfo* info = find_dtype(dtype);
  return info != nullptr ? info->name : std::string_view{"unknown"};
}

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

bool TensorRef::is_contiguous() const {
  if (shape.size() != stride.size()) return false;
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Node payloads that most nodes do not need.

struct PickleValue::Extra {
  std::string name;                            // global/object name
  std::vector<PickleEntry> entries;            // dict, OrderedDict, Object
  std::unordered_map<uint64_t, size_t> index;  // key id -> position in entries / items
  std::unique_ptr<StorageRef> storage;
  std::unique_ptr<TensorRef> tensor;
  PickleValue* args = nullptr;
  PickleValue* kwargs = nullptr;
  PickleValue* state = nullptr;
};

struct PickleDocument::State {
  std::string source;
  std::deque<PickleValue> nodes;                       // a deque never moves its elements
  std::unordered_map<std::string, uint64_t> interned;  // canonical key bytes -> key id
  const PickleValue* root = nullptr;

  PickleValue* make(PickleValue::Kind kind, uint64_t offset) {
    return &nodes.emplace_back(PickleValue::Key{}, this, kind, offset);
  }
  uint64_t key_id(PickleValue* value);
  uint64_t intern(std::string canonical) {
    auto [it, inserted] = interned.try_emplace(std::move(canonical), interned.size() + 1);
    return it->second;
  }
};

namespace {

const PickleDocument::State* state_of(const void* document) {
  return static_cast<const PickleDocument::State*>(document);
}

}  // namespace

PickleValue::PickleValue(Key, const void* document, Kind kind, uint64_t offset)
    : document_(document), offset_(offset), kind_(kind) {}

PickleValue::~PickleValue() = default;

std::string_view PickleValue::kind_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kBigInt:
      return "int (big)";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kByteArray:
      return "bytearray";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kOrderedDict:
      return "OrderedDict";
    case Kind::kSet:
      return "set";
    case Kind::kFrozenSet:
      return "frozenset";
    case Kind::kTorchSize:
      return "torch.Size";
    case Kind::kStorage:
      return "storage";
    case Kind::kTensor:
      return "tensor";
    case Kind::kGlobal:
      return "global";
    case Kind::kObject:
      return "object";
  }
  return "?";
}

void PickleValue::fail_kind(std::string_view expected) const {
  std::string what = "expected ";
  what += expected;
  what += ", got ";
  what += kind_name();
  if (kind_ == Kind::kGlobal || kind_ == Kind::kObject) {
    what += " ";
    what += text_;
    what += ".";
    what += extra_->name;
  }
  throw SerializationError(state_of(document_)->source, offset_, what);
}

PickleValue::Extra& PickleValue::extra() {
  if (!extra_) extra_ = std::make_unique<Extra>();
  return *extra_;
}

bool PickleValue::as_bool() const {
  if (kind_ != Kind::kBool) fail_kind("a bool");
  return flag_;
}

int64_t PickleValue::as_int() const {
  if (kind_ == Kind::kBool) return flag_ ? 1 : 0;
  if (kind_ != Kind::kInt) fail_kind(kind_ == Kind::kBigInt ? "an int within int64" : "an int");
  return int_;
}

const std::string& PickleValue::big_int_bytes() const {
  if (kind_ != Kind::kBigInt) fail_kind("a big int");
  return text_;
}

double PickleValue::as_float() const {
  if (kind_ == Kind::kInt) return static_cast<double>(int_);
  if (kind_ != Kind::kFloat) fail_kind("a float");
  return float_;
}

const std::string& PickleValue::as_string() const {
  if (kind_ != Kind::kString && kind_ != Kind::kBytes && kind_ != Kind::kByteArray) {
    fail_kind("a str or bytes");
  }
  return text_;
}

std::span<const PickleValue* const> PickleValue::items() const {
  switch (kind_) {
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kSet:
    case Kind::kFrozenSet:
    case Kind::kTorchSize:
    case Kind::kObject:
      return {items_.data(), items_.size()};
    default:
      fail_kind("a list, tuple, set or torch.Size");
  }
}

std::span<const PickleEntry> PickleValue::entries() const {
  if (kind_ != Kind::kDict && kind_ != Kind::kOrderedDict && kind_ != Kind::kObject) {
    fail_kind("a dict");
  }
  if (!extra_) return {};
  return {extra_->entries.data(), extra_->entries.size()};
}

size_t PickleValue::size() const {
  if (kind_ == Kind::kDict || kind_ == Kind::kOrderedDict) return entries().size();
  return items().size();
}

const PickleValue* PickleValue::find(std::string_view key) const {
  std::span<const PickleEntry> all = entries();
  if (all.empty()) return nullptr;
  const auto* state = state_of(document_);
  std::string canonical(1, 'S');
  canonical.append(key);
  auto interned = state->interned.find(canonical);
  if (interned == state->interned.end()) return nullptr;
  auto position = extra_->index.find(interned->second);
  if (position == extra_->index.end()) return nullptr;
  return all[position->second].value;
}

const PickleValue& PickleValue::at(std::string_view key) const {
  const PickleValue* value = find(key);
  if (value == nullptr) {
    std::string what(kind_name());
    what += " has no key '";
    what += key;
    what += "'";
    throw SerializationError(state_of(document_)->source, offset_, what);
  }
  return *value;
}

std::vector<int64_t> PickleValue::as_int_list() const {
  if (kind_ != Kind::kTorchSize && kind_ != Kind::kList && kind_ != Kind::kTuple) {
    fail_kind("a torch.Size or a list of ints");
  }
  std::vector<int64_t> out;
  out.reserve(items_.size());
  for (const PickleValue* item : items_) out.push_back(item->as_int());
  return out;
}

const StorageRef& PickleValue::storage() const {
  if (kind_ != Kind::kStorage) fail_kind("a storage");
  return *extra_->storage;
}

const TensorRef& PickleValue::tensor() const {
  if (kind_ != Kind::kTensor) fail_kind("a tensor");
  return *extra_->tensor;
}

const std::string& PickleValue::module() const {
  if (kind_ != Kind::kGlobal && kind_ != Kind::kObject) fail_kind("a global or object");
  return text_;
}

const std::string& PickleValue::name() const {
  if (kind_ != Kind::kGlobal && kind_ != Kind::kObject) fail_kind("a global or object");
  return extra_->name;
}

const PickleValue& PickleValue::args() const {
  if (kind_ != Kind::kObject) fail_kind("an object");
  return *extra_->args;
}

const PickleValue* PickleValue::kwargs() const {
  if (kind_ != Kind::kObject) fail_kind("an object");
  return extra_->kwargs;
}

bool PickleValue::made_by_newobj() const {
  if (kind_ != Kind::kObject) fail_kind("an object");
  return flag_;
}

const PickleValue* PickleValue::state() const noexcept { return extra_ ? extra_->state : nullptr; }

// ---------------------------------------------------------------------------------------------
// Keys. Python looks dict keys up by hash and ==; here every hashable value gets an interned
// id from a canonical byte string, so equal values (1 == 1.0 == True, equal tuples) share an
// id and a lookup costs one hash of the key's own bytes. A tuple's canonical form lists its
// elements' ids, not their bytes, so nesting through the memo cannot blow it up.

uint64_t PickleDocument::State::key_id(PickleValue* value) {
  using Kind = PickleValue::Kind;
  if (value->key_id_ != 0) return value->key_id_;
  std::string canonical;
  switch (value->kind_) {
    case Kind::kNone:
      canonical.push_back('N');
      break;
    case Kind::kBool:
    case Kind::kInt:
      canonical.push_back('I');
      append_u64(canonical, static_cast<uint64_t>(value->as_int()));
      break;
    case Kind::kBigInt:
      canonical.push_back('L');
      canonical += value->text_;
      break;
    case Kind::kFloat: {
      const double f = value->float_;
      // An integral float equals the int of the same value (2.0 == 2).
      if (std::isfinite(f) && std::trunc(f) == f && f >= -9.2e18 && f <= 9.2e18) {
        canonical.push_back('I');
        append_u64(canonical, static_cast<uint64_t>(static_cast<int64_t>(f)));
      } else {
        uint64_t bits;
        std::memcpy(&bits, &f, sizeof(bits));
        canonical.push_back('F');
        append_u64(canonical, bits);
      }
      break;
    }
    case Kind::kString:
      canonical.push_back('S');
      canonical += value->text_;
      break;
    case Kind::kBytes:
      canonical.push_back('B');
      canonical += value->text_;
      break;
    case Kind::kTuple:
    case Kind::kTorchSize:
    case Kind::kFrozenSet: {
      if (value->depth_ > kMaxKeyDepth) {
        throw std::invalid_argument("a key nested deeper than " + std::to_string(kMaxKeyDepth));
      }
      std::vector<uint64_t> ids;
      ids.reserve(value->items_.size());
      for (PickleValue* item : value->items_) ids.push_back(key_id(item));
      if (value->kind_ == Kind::kFrozenSet) {
        std::sort(ids.begin(), ids.end());
        canonical.push_back('Z');
      } else {
        canonical.push_back('T');
      }
      for (uint64_t id : ids) append_u64(canonical, id);
      break;
    }
    case Kind::kGlobal:
      canonical.push_back('G');
      canonical += value->text_;
      canonical.push_back('\n');
      canonical += value->extra_->name;
      break;
    case Kind::kStorage:
    case Kind::kTensor:
    case Kind::kObject:
      // Objects hash by identity unless their class says otherwise; nothing is run here.
      canonical.push_back('P');
      append_u64(canonical, reinterpret_cast<uintptr_t>(value));
      break;
    case Kind::kByteArray:
    case Kind::kList:
    case Kind::kDict:
    case Kind::kOrderedDict:
    case Kind::kSet:
      throw std::invalid_argument("unhashable type: '" + std::string(value->kind_name()) + "'");
  }
  value->key_id_ = intern(std::move(canonical));
  return value->key_id_;
}

// ---------------------------------------------------------------------------------------------
// PickleDocument.

PickleDocument::PickleDocument(std::string source) : state_(std::make_unique<State>()) {
  state_->source = std::move(source);
}
PickleDocument::~PickleDocument() = default;
PickleDocument::PickleDocument(PickleDocument&&) noexcept = default;
PickleDocument& PickleDocument::operator=(PickleDocument&&) noexcept = default;

const std::string& PickleDocument::source() const noexcept { return state_->source; }

const PickleValue& PickleDocument::root() const {
  if (state_->root == nullptr) {
    throw SerializationError(state_->source, kNoOffset, "the pickle has no root value");
  }
  return *state_->root;
}

void PickleDocument::set_root(const PickleValue* root) { state_->root = root; }

size_t PickleDocument::node_count() const noexcept { return state_->nodes.size(); }

PickleValue* PickleDocument::none(uint64_t offset) {
  return state_->make(PickleValue::Kind::kNone, offset);
}

PickleValue* PickleDocument::boolean(bool value, uint64_t offset) {
  PickleValue* node = state_->make(PickleValue::Kind::kBool, offset);
  node->flag_ = value;
  return node;
}

PickleValue* PickleDocument::integer(int64_t value, uint64_t offset) {
  PickleValue* node = state_->make(PickleValue::Kind::kInt, offset);
  node->int_ = value;
  return node;
}

size_t minimal_int_length(std::string_view le_bytes) {
  // Drop high bytes that only repeat the sign of the byte below them.
  size_t length = le_bytes.size();
  while (length > 1) {
    const auto top = static_cast<uint8_t>(le_bytes[length - 1]);
    const auto below = static_cast<uint8_t>(le_bytes[length - 2]);
    if ((top == 0x00 && (below & 0x80) == 0) || (top == 0xff && (below & 0x80) != 0)) {
      --length;
    } else {
      break;
    }
  }
  return length;
}

PickleValue* PickleDocument::integer_from_bytes(std::string_view le_bytes, uint64_t offset) {
  const size_t length = minimal_int_length(le_bytes);
  if (length <= 8) {
    uint64_t bits = 0;
    for (size_t i = 0; i < length; ++i) {
      bits |= static_cast<uint64_t>(static_cast<uint8_t>(le_bytes[i])) << (8 * i);
    }
    if (length > 0 && length < 8 && (static_cast<uint8_t>(le_bytes[length - 1]) & 0x80) != 0) {
      bits |= ~uint64_t{0} << (8 * length);  // sign-extend
    }
    return integer(static_cast<int64_t>(bits), offset);
  }
  PickleValue* node = state_->make(PickleValue::Kind::kBigInt, offset);
  node->text_.assign(le_bytes.substr(0, length));
  return node;
}

PickleValue* PickleDocument::floating(double value, uint64_t offset) {
  PickleValue* node = state_->make(PickleValue::Kind::kFloat, offset);
  node->float_ = value;
  return node;
}

PickleValue* PickleDocument::string(std::string utf8, uint64_t offset) {
  PickleValue* node = state_->make(PickleValue::Kind::kString, offset);
  node->text_ = std::move(utf8);
  return node;
}

PickleValue* PickleDocument::bytes(std::string data, bool bytearray, uint64_t offset) {
  PickleValue* node =
      state_->make(bytearray ? PickleValue::Kind::kByteArray : PickleValue::Kind::kBytes, offset);
  node->text_ = std::move(data);
  return node;
}

PickleValue* PickleDocument::list(uint64_t offset) {
  return state_->make(PickleValue::Kind::kList, offset);
}

PickleValue* PickleDocument::tuple(std::vector<PickleValue*> items, uint64_t offset) {
  PickleValue* node = state_->make(PickleValue::Kind::kTuple, offset);
  int32_t depth = 0;  // exact for tuples: their elements never change after creation
  for (const PickleValue* item : items) depth = std::max(depth, item->depth_);
  node->depth_ = depth + 1;
  node->items_ = std::move(items);
  return node;
}

PickleValue* PickleDocument::dict(bool ordered, uint64_t offset) {
  return state_->make(ordered ? PickleValue::Kind::kOrderedDict : PickleValue::Kind::kDict, offset);
}

PickleValue* PickleDocument::set(bool frozen, uint64_t offset) {
  return state_->make(frozen ? PickleValue::Kind::kFrozenSet : PickleValue::Kind::kSet, offset);
}

PickleValue* PickleDocument::torch_size(std::span<const int64_t> dims, uint64_t offset) {
  PickleValue* node = state_->make(PickleValue::Kind::kTorchSize, offset);
  node->items_.reserve(dims.size());
  for (int64_t dim : dims) node->items_.push_back(integer(dim, offset));
  node->depth_ = 2;
  return node;
}

PickleValue* PickleDocument::storage(StorageRef storage, uint64_t offset) {
  if (storage.numel < 0) throw std::invalid_argument("storage with a negative numel");
  PickleValue* node = state_->make(PickleValue::Kind::kStorage, offset);
  node->extra().storage = std::make_unique<StorageRef>(std::move(storage));
  return node;
}

PickleValue* PickleDocument::tensor(TensorRef tensor, uint64_t offset) {
  if (tensor.shape.size() != tensor.stride.size()) {
    throw std::invalid_argument("tensor with " + std::to_string(tensor.shape.size()) +
                                " sizes but " + std::to_string(tensor.stride.size()) + " strides");
  }
  if (tensor.storage_offset < 0) throw std::invalid_argument("tensor with a negative offset");
  // The last element the view reaches, in elements; kept below 2^62 so nothing overflows.
  constexpr int64_t kLimit = int64_t{1} << 62;
  int64_t last = tensor.storage_offset;
  bool empty = false;
  for (size_t i = 0; i < tensor.shape.size(); ++i) {
    const int64_t size = tensor.shape[i];
    const int64_t stride = tensor.stride[i];
    if (size < 0 || stride < 0) throw std::invalid_argument("tensor with a negative size/stride");
    if (size > kLimit || stride > kLimit) throw std::invalid_argument("tensor size out of range");
    if (size == 0) {
      empty = true;
      continue;
    }
    if (stride != 0 && size - 1 > (kLimit - last) / stride) {
      throw std::invalid_argument("tensor view out of range");
    }
    last += (size - 1) * stride;
  }
  int64_t numel = 1;
  for (int64_t size : tensor.shape) {
    if (size != 0 && numel > kLimit / size) throw std::invalid_argument("tensor numel overflows");
    numel *= size;
  }
  if (!empty && last >= tensor.storage.numel) {
    throw std::invalid_argument("tensor view reaches element " + std::to_string(last) +
                                " of storage '" + tensor.storage.key + "' with " +
                                std::to_string(tensor.storage.numel) + " elements");
  }
  PickleValue* node = state_->make(PickleValue::Kind::kTensor, offset);
  node->extra().tensor = std::make_unique<TensorRef>(std::move(tensor));
  return node;
}

PickleValue* PickleDocument::global(std::string module, std::string name, uint64_t offset) {
  PickleValue* node = state_->make(PickleValue::Kind::kGlobal, offset);
  node->text_ = std::move(module);
  node->extra().name = std::move(name);
  return node;
}

PickleValue* PickleDocument::object(std::string module, std::string name, PickleValue* args,
                                    bool made_by_newobj, PickleValue* kwargs, uint64_t offset) {
  if (args == nullptr || !args->is(PickleValue::Kind::kTuple)) {
    throw std::invalid_argument("call arguments are not a tuple");
  }
  if (kwargs != nullptr && !kwargs->is(PickleValue::Kind::kDict)) {
    throw std::invalid_argument("call keyword arguments are not a dict");
  }
  PickleValue* node = state_->make(PickleValue::Kind::kObject, offset);
  node->text_ = std::move(module);
  node->flag_ = made_by_newobj;
  PickleValue::Extra& extra = node->extra();
  extra.name = std::move(name);
  extra.args = args;
  extra.kwargs = kwargs;
  return node;
}

void PickleDocument::append(PickleValue* list, PickleValue* item) {
  if (!list->is(PickleValue::Kind::kList) && !list->is(PickleValue::Kind::kObject)) {
    throw std::invalid_argument("cannot append to a " + std::string(list->kind_name()));
  }
  list->items_.push_back(item);
}

void PickleDocument::set_item(PickleValue* dict, PickleValue* key, PickleValue* value) {
  if (!dict->is(PickleValue::Kind::kDict) && !dict->is(PickleValue::Kind::kOrderedDict) &&
      !dict->is(PickleValue::Kind::kObject)) {
    throw std::invalid_argument("cannot set an item of a " + std::string(dict->kind_name()));
  }
  const uint64_t id = state_->key_id(key);
  PickleValue::Extra& extra = dict->extra();
  auto [it, inserted] = extra.index.try_emplace(id, extra.entries.size());
  if (inserted) {
    extra.entries.push_back({key, value});
  } else {
    extra.entries[it->second].value = value;
  }
}

void PickleDocument::add(PickleValue* set, PickleValue* item) {
  if (!set->is(PickleValue::Kind::kSet) && !set->is(PickleValue::Kind::kFrozenSet)) {
    throw std::invalid_argument("cannot add to a " + std::string(set->kind_name()));
  }
  const uint64_t id = state_->key_id(item);
  PickleValue::Extra& extra = set->extra();
  if (extra.index.try_emplace(id, set->items_.size()).second) {
    set->items_.push_back(item);
    set->depth_ = std::max(set->depth_, item->depth_ + 1);
  }
}

void PickleDocument::set_state(PickleValue* target, PickleValue* state) {
  switch (target->kind_) {
    case PickleValue::Kind::kObject:
    case PickleValue::Kind::kOrderedDict:
    case PickleValue::Kind::kDict:
    case PickleValue::Kind::kList:
    case PickleValue::Kind::kSet:
    case PickleValue::Kind::kTensor:
      target->extra().state = state;
      return;
    default:
      throw std::invalid_argument("cannot BUILD a " + std::string(target->kind_name()));
  }
}

void PickleDocument::check_tree(size_t max_depth) const {
  if (state_->root == nullptr) return;
  // Iterative depth-first walk. Each node's depth (longest path below it) is computed once;
  // a node met again while it is still open closes a cycle.
  enum : uint8_t { kOpen = 1, kDone = 2 };
  std::unordered_map<const PickleValue*, std::pair<uint8_t, size_t>> seen;  // mark, depth
  struct Frame {
    const PickleValue* node;
    std::vector<const PickleValue*> children;
    size_t next = 0;
    size_t depth = 1;
  };
  auto children_of = [](const PickleValue* node) {
    std::vector<const PickleValue*> out(node->items_.begin(), node->items_.end());
    if (node->extra_) {
      for (const PickleEntry& entry : node->extra_->entries) {
        out.push_back(entry.key);
        out.push_back(entry.value);
      }
      for (const PickleValue* child :
           {node->extra_->args, node->extra_->kwargs, node->extra_->state}) {
        if (child != nullptr) out.push_back(child);
      }
    }
    return out;
  };
  auto fail = [&](const PickleValue* node, const std::string& what) {
    throw SerializationError(state_->source, node->offset_, what);
  };
  std::vector<Frame> stack;
  stack.push_back({state_->root, children_of(state_->root)});
  seen[state_->root] = {kOpen, 0};
  while (!stack.empty()) {
    Frame& frame = stack.back();
    if (stack.size() > max_depth) {
      fail(frame.node, "values nested deeper than " + std::to_string(max_depth) + " levels");
    }
    if (frame.next == frame.children.size()) {
      seen[frame.node] = {kDone, frame.depth};
      const size_t depth = frame.depth;
      stack.pop_back();
      if (!stack.empty()) stack.back().depth = std::max(stack.back().depth, depth + 1);
      continue;
    }
    const PickleValue* child = frame.children[frame.next++];
    auto [it, inserted] = seen.try_emplace(child, kOpen, 0);
    if (inserted) {
      stack.push_back({child, children_of(child)});
      continue;
    }
    if (it->second.first == kOpen) {
      fail(child, std::string("a ") + std::string(child->kind_name()) + " contains itself");
    }
    frame.depth = std::max(frame.depth, it->second.second + 1);
    if (stack.size() + it->second.second > max_depth) {
      fail(child, "values nested deeper than " + std::to_string(max_depth) + " levels");
    }
  }
}

}  // namespace zinf::serialization
