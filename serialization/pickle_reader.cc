// read_pickle's interpreter (serialization/pickle_reader.h). One file over 800 lines
// because it is one machine: the stack, the memo and the dispatch over every opcode of
// protocols 2-5 (Reader::step) share its state, and the opcode names are its messages'.
#include "serialization/pickle_reader.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "serialization/pickle_opcodes.h"
#include "serialization/serialization_error.h"

namespace zinf::serialization {

namespace {

using Kind = PickleValue::Kind;
namespace op = pickle_op;

// Whether `data` is UTF-8 as Python's "surrogatepass" decoder accepts it (surrogate code
// points allowed, overlong forms and values past U+10FFFF refused).
bool valid_utf8(std::string_view data) {
  size_t i = 0;
  while (i < data.size()) {
    const auto c = static_cast<uint8_t>(data[i]);
    size_t extra = 0;
    uint32_t min = 0;
    uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      extra = 1, min = 0x80, code = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2, min = 0x800, code = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3, min = 0x10000, code = c & 0x07;
    } else {
      return false;
    }
    if (data.size() - i <= extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<uint8_t>(data[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      code = (code << 6) | (next & 0x3f);
    }
    if (code < min || code > 0x10ffff) return false;
    i += extra + 1;
  }
  return true;
}

// Latin-1 bytes from the UTF-8 text of code points < 256 (how protocol 2 pickles bytes).
bool latin1_from_utf8(std::string_view text, std::string& out) {
  out.clear();
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<uint8_t>(text[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if ((c == 0xc2 || c == 0xc3) && i + 1 < text.size()) {
      const auto next = static_cast<uint8_t>(text[++i]);
      if ((next & 0xc0) != 0x80) return false;
      out.push_back(static_cast<char>(((c & 0x03) << 6) | (next & 0x3f)));
    } else {
      return false;
    }
  }
  return true;
}

// Python 2 module names that protocols 0-2 carry, read as Python 3's (as Python's
// fix_imports does), so a consumer sees one name whatever the protocol.
std::string python3_module(std::string module) {
  if (module == "__builtin__") return "builtins";
  if (module == "copy_reg") return "copyreg";
  return module;
}

bool is_builtins(std::string_view module) { return module == "builtins"; }

class Reader {
 public:
  Reader(std::span<const uint8_t> data, std::string source, const PickleReadOptions& options)
      : data_(data), options_(options), document_(std::move(source)) {}

  PickleDocument run() {
    while (true) {
      opcode_offset_ = pos_;
      if (pos_ >= data_.size()) {
        opcode_ = 0;
        throw SerializationError(document_.source(), pos_,
                                 "truncated: the pickle ends before its STOP opcode");
      }
      opcode_ = data_[pos_++];
      try {
        if (step()) break;
      } catch (const std::invalid_argument& e) {
        fail(e.what());
      }
    }
    document_.check_tree(options_.max_depth);
    return std::move(document_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    char code[8];
    std::snprintf(code, sizeof(code), "0x%02x", opcode_);
    throw SerializationError(
        document_.source(), opcode_offset_,
        std::string("opcode ") + pickle_opcode_name(opcode_) + " (" + code + "): " + what);
  }

  // ---- Input. ----
  std::string_view take(uint64_t length) {
    if (length > data_.size() - pos_) {
      fail("truncated: needs " + std::to_string(length) + " bytes, " +
           std::to_string(data_.size() - pos_) + " left");
    }
    std::string_view out(reinterpret_cast<const char*>(data_.data() + pos_),
                         static_cast<size_t>(length));
    pos_ += static_cast<size_t>(length);
    return out;
  }
  uint64_t read_le(size_t bytes) {
    std::string_view raw = take(bytes);
    uint64_t value = 0;
    for (size_t i = 0; i < bytes; ++i) {
      value |= static_cast<uint64_t>(static_cast<uint8_t>(raw[i])) << (8 * i);
    }
    return value;
  }
  std::string_view read_line() {
    const auto* begin = data_.data() + pos_;
    const void* newline = std::memchr(begin, '\n', data_.size() - pos_);
    if (newline == nullptr) fail("truncated: no end of line");
    const size_t length = static_cast<size_t>(static_cast<const uint8_t*>(newline) - begin);
    std::string_view line = take(length);
    ++pos_;
    return line;
  }
  std::string read_text(uint64_t length) {
    std::string_view raw = take(length);
    if (!valid_utf8(raw)) fail("a string that is not valid UTF-8");
    return std::string(raw);
  }

  // ---- Stack. ----
  size_t mark_base() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(PickleValue* value) { stack_.push_back(value); }
  PickleValue* pop() {
    if (stack_.size() <= mark_base()) fail("stack underflow");
    PickleValue* value = stack_.back();
    stack_.pop_back();
    return value;
  }
  PickleValue* top() {
    if (stack_.size() <= mark_base()) fail("stack underflow");
    return stack_.back();
  }
  std::vector<PickleValue*> pop_mark() {
    if (marks_.empty()) fail("no MARK on the stack");
    const size_t base = marks_.back();
    marks_.pop_back();
    std::vector<PickleValue*> items(stack_.begin() + static_cast<std::ptrdiff_t>(base),
                                    stack_.end());
    stack_.resize(base);
    return items;
  }
  void memo_put(uint64_t index) { memo_[index] = top(); }
  void memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) fail("memo entry " + std::to_string(index) + " was never stored");
    push(it->second);
  }
  // Tuples nested past max_depth are caught by check_tree() at STOP, and refused as keys by
  // the document before that.
  PickleValue* make_tuple(std::vector<PickleValue*> items) {
    return document_.tuple(std::move(items), opcode_offset_);
  }

  // Recognised calls copy their arguments into new nodes (set(list), OrderedDict(pairs),
  // torch.Size(tuple), tensor shapes, bytes), and the memo lets a few input bytes name a
  // large argument again and again. Every copied element or byte is charged against a budget
  // proportional to the input, so the tree stays within a constant factor of it.
  void charge_copy_of(std::span<const PickleValue* const> args) {
    uint64_t cost = 1;
    for (const PickleValue* arg : args) {
      switch (arg->kind()) {
        case Kind::kString:
        case Kind::kBytes:
        case Kind::kByteArray:
          cost += arg->as_string().size();
          break;
        case Kind::kList:
        case Kind::kTuple:
        case Kind::kSet:
        case Kind::kFrozenSet:
        case Kind::kTorchSize:
          cost += arg->items().size();
          break;
        case Kind::kTensor:
          cost += arg->tensor().shape.size();
          break;
        default:
          break;
      }
    }
    if (cost > copy_budget_) {
      fail("the pickle expands to more than " + std::to_string(kCopyFactor) +
           " times its size through memo references (" + std::to_string(data_.size()) +
           " bytes of input)");
    }
    copy_budget_ -= cost;
  }

  // ---- Calls of globals (recognised by name, never executed). ----
  PickleValue* call(PickleValue* callable, PickleValue* args, bool newobj, PickleValue* kwargs);
  PickleValue* rebuild_tensor(const PickleValue& args, bool v2);
  PickleValue* rebuild_parameter(const PickleValue& args, bool with_state);
  PickleValue* rebuild_from_type(const PickleValue& args);
  PickleValue* persistent_load(PickleValue* pid);
  static std::vector<int64_t> ints_of(const PickleValue& value, const char* what);

  // One opcode; true at STOP.
  bool step();

  std::span<const uint8_t> data_;
  const PickleReadOptions options_;
  PickleDocument document_;
  size_t pos_ = 0;
  size_t opcode_offset_ = 0;
  uint8_t opcode_ = 0;
  std::vector<PickleValue*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PickleValue*> memo_;
  static constexpr uint64_t kCopyFactor = 16;
  uint64_t copy_budget_ = kCopyFactor * data_.size() + (uint64_t{1} << 16);
};

std::vector<int64_t> Reader::ints_of(const PickleValue& value, const char* what) {
  if (!value.is(Kind::kTuple) && !value.is(Kind::kTorchSize) && !value.is(Kind::kList)) {
    throw std::invalid_argument(std::string(what) + " is a " + std::string(value.kind_name()) +
                                ", not a tuple of ints");
  }
  std::vector<int64_t> out;
  for (const PickleValue* item : value.items()) {
    if (!item->is(Kind::kInt)) {
      throw std::invalid_argument(std::string(what) + " holds a " + std::string(item->kind_name()) +
                                  ", not an int");
    }
    out.push_back(item->as_int());
  }
  return out;
}

PickleValue* Reader::persistent_load(PickleValue* pid) {
  // ('storage', torch.<T>Storage, key, location, numel)
  const char* shape = "a persistent id that is not ('storage', type, key, location, numel)";
  if (!pid->is(Kind::kTuple) || pid->items().size() != 5) fail(shape);
  std::span<const PickleValue* const> f = pid->items();
  if (!f[0]->is(Kind::kString) || f[0]->as_string() != "storage" || !f[1]->is(Kind::kGlobal) ||
      !(f[2]->is(Kind::kString) || f[2]->is(Kind::kInt)) || !f[3]->is(Kind::kString) ||
      !f[4]->is(Kind::kInt)) {
    fail(shape);
  }
  StorageRef storage;
  storage.key = f[2]->is(Kind::kInt) ? std::to_string(f[2]->as_int()) : f[2]->as_string();
  storage.storage_type = f[1]->name();
  storage.dtype = f[1]->module() == "torch" ? dtype_from_storage_type(storage.storage_type)
                                            : TensorDType::kUnknown;
  storage.location = f[3]->as_string();
  storage.numel = f[4]->as_int();
  return document_.storage(std::move(storage), opcode_offset_);
}

PickleValue* Reader::rebuild_tensor(const PickleValue& args, bool v2) {
  // _rebuild_tensor(storage, offset, size, stride)
  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks[, metadata])
  std::span<const PickleValue* const> a = args.items();
  if (a.size() < 4 || (v2 && a.size() < 5)) {
    fail("too few arguments for a tensor rebuild: " + std::to_string(a.size()));
  }
  if (!a[0]->is(Kind::kStorage)) {
    fail("tensor rebuild from a " + std::string(a[0]->kind_name()) + ", not a storage");
  }
  if (!a[1]->is(Kind::kInt)) fail("tensor storage offset is not an int");
  TensorRef tensor;
  tensor.storage = a[0]->storage();
  tensor.storage_offset = a[1]->as_int();
  tensor.shape = ints_of(*a[2], "tensor size");
  tensor.stride = ints_of(*a[3], "tensor stride");
  if (v2) {
    if (!a[4]->is(Kind::kBool) && !a[4]->is(Kind::kInt)) fail("requires_grad is not a bool");
    tensor.requires_grad = a[4]->as_int() != 0;
  }
  return document_.tensor(std::move(tensor), opcode_offset_);
}

PickleValue* Reader::rebuild_parameter(const PickleValue& args, bool with_state) {
  // _rebuild_parameter(data, requires_grad, backward_hooks)
  // _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state)
  std::span<const PickleValue* const> a = args.items();
  if (a.size() < (with_state ? 4u : 3u)) fail("too few arguments for a parameter rebuild");
  if (!a[0]->is(Kind::kTensor)) fail("parameter data is not a tensor");
  if (!a[1]->is(Kind::kBool) && !a[1]->is(Kind::kInt)) fail("requires_grad is not a bool");
  TensorRef tensor = a[0]->tensor();
  tensor.requires_grad = a[1]->as_int() != 0;
  tensor.is_parameter = true;
  PickleValue* node = document_.tensor(std::move(tensor), opcode_offset_);
  if (with_state) document_.set_state(node, const_cast<PickleValue*>(a[3]));
  return node;
}

PickleValue* Reader::rebuild_from_type(const PickleValue& args) {
  // torch._tensor._rebuild_from_type_v2(func, new_type, args, state): how torch saves a tensor
  // of a Tensor subclass or one carrying Python attributes (DeepSpeed's stage-3
  // fp32_flat_groups carry `ds_id`). func is a torch._utils rebuild whose arguments are
  // `args`; the tensor is what it describes, the Python type is dropped, the attributes are
  // kept as the tensor's BUILD state.
  std::span<const PickleValue* const> a = args.items();
  if (a.size() < 4) fail("too few arguments for _rebuild_from_type_v2");
  if (!a[0]->is(Kind::kGlobal) || a[0]->module() != "torch._utils") {
    fail("_rebuild_from_type_v2 of a " + std::string(a[0]->kind_name()) +
         ", not of a torch._utils tensor rebuild");
  }
  if (!a[2]->is(Kind::kTuple)) fail("_rebuild_from_type_v2's arguments are not a tuple");
  const std::string& rebuild = a[0]->name();
  PickleValue* node = nullptr;
  if (rebuild == "_rebuild_tensor_v2") {
    node = rebuild_tensor(*a[2], true);
  } else if (rebuild == "_rebuild_tensor") {
    node = rebuild_tensor(*a[2], false);
  } else if (rebuild == "_rebuild_parameter") {
    node = rebuild_parameter(*a[2], false);
  } else {
    fail("_rebuild_from_type_v2 of torch._utils." + rebuild + ", not of a tensor rebuild");
  }
  const bool has_state = a[3]->is(Kind::kDict) || a[3]->is(Kind::kTuple);
  if (has_state && a[3]->size() > 0) document_.set_state(node, const_cast<PickleValue*>(a[3]));
  return node;
}

PickleValue* Reader::call(PickleValue* callable, PickleValue* args, bool newobj,
                          PickleValue* kwargs) {
  if (!callable->is(Kind::kGlobal)) {
    fail("call of a " + std::string(callable->kind_name()) + ", not of a global");
  }
  if (!args->is(Kind::kTuple)) fail("call arguments are a " + std::string(args->kind_name()));
  const std::string& module = callable->module();
  const std::string& name = callable->name();
  std::span<const PickleValue* const> a = args->items();
  const uint64_t at = opcode_offset_;
  const bool recognised =
      (module == "collections" && name == "OrderedDict") ||
      (is_builtins(module) &&
       (name == "set" || name == "frozenset" || name == "bytearray" || name == "bytes")) ||
      (module == "_codecs" && name == "encode") || (module == "torch" && name == "Size") ||
      module == "torch._utils" || (module == "torch._tensor" && name == "_rebuild_from_type_v2");
  if (recognised && !newobj && kwargs == nullptr) {
    charge_copy_of(a);
    // OrderedDict(pairs) and set(iterable) copy one level further down.
    if (a.size() == 1 && (a[0]->is(Kind::kList) || a[0]->is(Kind::kTuple))) {
      charge_copy_of(a[0]->items());
    }
    if (module == "collections" && name == "OrderedDict") {
      if (a.empty()) return document_.dict(true, at);
      bool pairs = a.size() == 1 && (a[0]->is(Kind::kList) || a[0]->is(Kind::kTuple));
      if (pairs) {
        for (const PickleValue* pair : a[0]->items()) {
          pairs = pairs && (pair->is(Kind::kTuple) || pair->is(Kind::kList)) &&
                  pair->items().size() == 2;
        }
      }
      if (pairs) {
        PickleValue* dict = document_.dict(true, at);
        for (const PickleValue* pair : a[0]->items()) {
          document_.set_item(dict, const_cast<PickleValue*>(pair->items()[0]),
                             const_cast<PickleValue*>(pair->items()[1]));
        }
        return dict;
      }
    } else if (is_builtins(module) && (name == "set" || name == "frozenset")) {
      const bool iterable = a.size() == 1 && (a[0]->is(Kind::kList) || a[0]->is(Kind::kTuple) ||
                                              a[0]->is(Kind::kSet) || a[0]->is(Kind::kFrozenSet));
      if (a.empty() || iterable) {
        PickleValue* set = document_.set(name == "frozenset", at);
        if (iterable) {
          for (const PickleValue* item : a[0]->items()) {
            document_.add(set, const_cast<PickleValue*>(item));
          }
        }
        return set;
      }
    } else if ((is_builtins(module) && (name == "bytearray" || name == "bytes")) ||
               (module == "_codecs" && name == "encode")) {
      // bytes at protocol 2: _codecs.encode(latin-1 text, 'latin1'); b'' is bytes();
      // bytearray(latin-1 text, 'latin-1') or bytearray(bytes).
      const bool bytearray = name == "bytearray";
      if (a.empty() && name != "encode") return document_.bytes({}, bytearray, at);
      if (a.size() == 1 && bytearray && a[0]->is(Kind::kBytes)) {
        return document_.bytes(a[0]->as_string(), true, at);
      }
      if (a.size() == 2 && a[0]->is(Kind::kString) && a[1]->is(Kind::kString) &&
          (a[1]->as_string() == "latin1" || a[1]->as_string() == "latin-1")) {
        std::string raw;
        if (latin1_from_utf8(a[0]->as_string(), raw)) {
          return document_.bytes(std::move(raw), bytearray, at);
        }
      }
    } else if (module == "torch" && name == "Size") {
      if (a.size() == 1) return document_.torch_size(ints_of(*a[0], "torch.Size"), at);
    } else if (module == "torch._utils") {
      if (name == "_rebuild_tensor_v2") return rebuild_tensor(*args, true);
      if (name == "_rebuild_tensor") return rebuild_tensor(*args, false);
      if (name == "_rebuild_parameter") return rebuild_parameter(*args, false);
      if (name == "_rebuild_parameter_with_state") return rebuild_parameter(*args, true);
    } else if (module == "torch._tensor" && name == "_rebuild_from_type_v2") {
      return rebuild_from_type(*args);
    }
  }
  return document_.object(module, name, args, newobj, kwargs, at);
}

// One opcode of the pickle machine: a dispatch over the format's opcodes (one case each,
// grouped as the protocol groups them), long because the format has that many.
bool Reader::step() {
  const uint64_t at = opcode_offset_;
  switch (opcode_) {
    // ---- Framing. ----
    case op::kProto: {
      const uint64_t version = read_le(1);
      if (version > 5) fail("unsupported pickle protocol " + std::to_string(version));
      return false;
    }
    case op::kFrame: {
      const uint64_t length = read_le(8);
      if (length > data_.size() - pos_) fail("a frame longer than the bytes left");
      return false;
    }
    case op::kStop:
      document_.set_root(pop());
      return true;

    // ---- Stack manipulation. ----
    case op::kMark:
      if (marks_.size() >= options_.max_depth) {
        fail("MARKs nested deeper than " + std::to_string(options_.max_depth));
      }
      marks_.push_back(stack_.size());
      return false;
    case op::kPop:
      if (stack_.size() > mark_base()) {
        stack_.pop_back();
      } else {
        (void)pop_mark();
      }
      return false;
    case op::kPopMark:
      (void)pop_mark();
      return false;
    case op::kDup:
      push(top());
      return false;

    // ---- Memo. ----
    case op::kBinPut:
      memo_put(read_le(1));
      return false;
    case op::kLongBinPut:
      memo_put(read_le(4));
      return false;
    case op::kMemoize:
      memo_put(memo_.size());
      return false;
    case op::kBinGet:
      memo_get(read_le(1));
      return false;
    case op::kLongBinGet:
      memo_get(read_le(4));
      return false;

    // ---- Scalars. ----
    case op::kNone:
      push(document_.none(at));
      return false;
    case op::kNewTrue:
    case op::kNewFalse:
      push(document_.boolean(opcode_ == op::kNewTrue, at));
      return false;
    case op::kBinInt1:
      push(document_.integer(static_cast<int64_t>(read_le(1)), at));
      return false;
    case op::kBinInt2:
      push(document_.integer(static_cast<int64_t>(read_le(2)), at));
      return false;
    case op::kBinInt:
      push(document_.integer(static_cast<int32_t>(static_cast<uint32_t>(read_le(4))), at));
      return false;
    case op::kLong1:
    case op::kLong4: {
      const uint64_t raw = read_le(opcode_ == op::kLong1 ? 1 : 4);
      if (opcode_ == op::kLong4 && (raw & 0x80000000u) != 0) fail("negative LONG4 length");
      push(document_.integer_from_bytes(take(raw), at));
      return false;
    }
    case op::kBinFloat: {
      const uint64_t bits = __builtin_bswap64(read_le(8));  // big-endian on the wire
      push(document_.floating(std::bit_cast<double>(bits), at));
      return false;
    }

    // ---- Strings and bytes. ----
    case op::kShortBinUnicode:
      push(document_.string(read_text(read_le(1)), at));
      return false;
    case op::kBinUnicode:
      push(document_.string(read_text(read_le(4)), at));
      return false;
    case op::kBinUnicode8:
      push(document_.string(read_text(read_le(8)), at));
      return false;
    case op::kShortBinString:
      push(document_.string(read_text(read_le(1)), at));
      return false;
    case op::kBinString: {
      const uint64_t length = read_le(4);
      if ((length & 0x80000000u) != 0) fail("negative BINSTRING length");
      push(document_.string(read_text(length), at));
      return false;
    }
    case op::kShortBinBytes:
      push(document_.bytes(std::string(take(read_le(1))), false, at));
      return false;
    case op::kBinBytes:
      push(document_.bytes(std::string(take(read_le(4))), false, at));
      return false;
    case op::kBinBytes8:
      push(document_.bytes(std::string(take(read_le(8))), false, at));
      return false;
    case op::kByteArray8:
      push(document_.bytes(std::string(take(read_le(8))), true, at));
      return false;

    // ---- Containers. ----
    case op::kEmptyList:
      push(document_.list(at));
      return false;
    case op::kList: {
      PickleValue* list = document_.list(at);
      for (PickleValue* item : pop_mark()) document_.append(list, item);
      push(list);
      return false;
    }
    case op::kAppend: {
      PickleValue* item = pop();
      document_.append(top(), item);
      return false;
    }
    case op::kAppends: {
      std::vector<PickleValue*> items = pop_mark();
      PickleValue* list = top();
      for (PickleValue* item : items) document_.append(list, item);
      return false;
    }
    case op::kEmptyTuple:
      push(make_tuple({}));
      return false;
    case op::kTuple:
      push(make_tuple(pop_mark()));
      return false;
    case op::kTuple1:
    case op::kTuple2:
    case op::kTuple3: {
      const size_t count = static_cast<size_t>(opcode_ - op::kTuple1) + 1;
      std::vector<PickleValue*> items(count);
      for (size_t i = count; i-- > 0;) items[i] = pop();
      push(make_tuple(std::move(items)));
      return false;
    }
    case op::kEmptyDict:
      push(document_.dict(false, at));
      return false;
    case op::kDict: {
      std::vector<PickleValue*> items = pop_mark();
      if (items.size() % 2 != 0) fail("an odd number of items for a dict");
      PickleValue* dict = document_.dict(false, at);
      for (size_t i = 0; i < items.size(); i += 2) document_.set_item(dict, items[i], items[i + 1]);
      push(dict);
      return false;
    }
    case op::kSetItem: {
      PickleValue* value = pop();
      PickleValue* key = pop();
      document_.set_item(top(), key, value);
      return false;
    }
    case op::kSetItems: {
      std::vector<PickleValue*> items = pop_mark();
      if (items.size() % 2 != 0) fail("an odd number of items for SETITEMS");
      PickleValue* dict = top();
      for (size_t i = 0; i < items.size(); i += 2) document_.set_item(dict, items[i], items[i + 1]);
      return false;
    }
    case op::kEmptySet:
      push(document_.set(false, at));
      return false;
    case op::kAddItems: {
      std::vector<PickleValue*> items = pop_mark();
      PickleValue* set = top();
      if (!set->is(Kind::kSet)) fail("ADDITEMS to a " + std::string(set->kind_name()));
      for (PickleValue* item : items) document_.add(set, item);
      return false;
    }
    case op::kFrozenSet: {
      PickleValue* set = document_.set(true, at);
      for (PickleValue* item : pop_mark()) document_.add(set, item);
      push(set);
      return false;
    }

    // ---- Globals, calls and persistent ids. ----
    case op::kGlobal: {
      std::string module(read_line());
      std::string name(read_line());
      if (!valid_utf8(module) || !valid_utf8(name)) fail("a global name that is not UTF-8");
      push(document_.global(python3_module(std::move(module)), std::move(name), at));
      return false;
    }
    case op::kStackGlobal: {
      PickleValue* name = pop();
      PickleValue* module = pop();
      if (!name->is(Kind::kString) || !module->is(Kind::kString)) {
        fail("STACK_GLOBAL of a non-str module or name");
      }
      push(document_.global(python3_module(module->as_string()), name->as_string(), at));
      return false;
    }
    case op::kReduce: {
      PickleValue* args = pop();
      PickleValue* callable = pop();
      push(call(callable, args, false, nullptr));
      return false;
    }
    case op::kNewObj: {
      PickleValue* args = pop();
      PickleValue* cls = pop();
      push(call(cls, args, true, nullptr));
      return false;
    }
    case op::kNewObjEx: {
      PickleValue* kwargs = pop();
      PickleValue* args = pop();
      PickleValue* cls = pop();
      push(call(cls, args, true, kwargs));
      return false;
    }
    case op::kBuild: {
      PickleValue* state = pop();
      document_.set_state(top(), state);
      return false;
    }
    case op::kBinPersId:
      push(persistent_load(pop()));
      return false;

    // ---- Refused. ----
    case op::kNextBuffer:
    case op::kReadOnlyBuffer:
      fail("out-of-band buffers (pickle protocol 5 buffer_callback) are not supported");
    case op::kExt1:
    case op::kExt2:
    case op::kExt4:
      fail("the copyreg extension registry is not supported");
    case op::kInt:
    case op::kLong:
    case op::kFloat:
    case op::kString:
    case op::kUnicode:
    case op::kGet:
    case op::kPut:
    case op::kPersId:
    case op::kInst:
    case op::kObj:
      fail("text opcodes of pickle protocols 0-1 are not supported");
    default:
      fail("unknown opcode");
  }
}

}  // namespace

// A dispatch over the format's opcodes: one name per opcode, for messages.
const char* pickle_opcode_name(uint8_t opcode) {
  switch (opcode) {
    case op::kMark:
      return "MARK";
    case op::kStop:
      return "STOP";
    case op::kPop:
      return "POP";
    case op::kPopMark:
      return "POP_MARK";
    case op::kDup:
      return "DUP";
    case op::kFloat:
      return "FLOAT";
    case op::kInt:
      return "INT";
    case op::kBinInt:
      return "BININT";
    case op::kBinInt1:
      return "BININT1";
    case op::kLong:
      return "LONG";
    case op::kBinInt2:
      return "BININT2";
    case op::kNone:
      return "NONE";
    case op::kPersId:
      return "PERSID";
    case op::kBinPersId:
      return "BINPERSID";
    case op::kReduce:
      return "REDUCE";
    case op::kString:
      return "STRING";
    case op::kBinString:
      return "BINSTRING";
    case op::kShortBinString:
      return "SHORT_BINSTRING";
    case op::kUnicode:
      return "UNICODE";
    case op::kBinUnicode:
      return "BINUNICODE";
    case op::kAppend:
      return "APPEND";
    case op::kBuild:
      return "BUILD";
    case op::kGlobal:
      return "GLOBAL";
    case op::kDict:
      return "DICT";
    case op::kEmptyDict:
      return "EMPTY_DICT";
    case op::kAppends:
      return "APPENDS";
    case op::kGet:
      return "GET";
    case op::kBinGet:
      return "BINGET";
    case op::kInst:
      return "INST";
    case op::kLongBinGet:
      return "LONG_BINGET";
    case op::kList:
      return "LIST";
    case op::kEmptyList:
      return "EMPTY_LIST";
    case op::kObj:
      return "OBJ";
    case op::kPut:
      return "PUT";
    case op::kBinPut:
      return "BINPUT";
    case op::kLongBinPut:
      return "LONG_BINPUT";
    case op::kSetItem:
      return "SETITEM";
    case op::kTuple:
      return "TUPLE";
    case op::kEmptyTuple:
      return "EMPTY_TUPLE";
    case op::kSetItems:
      return "SETITEMS";
    case op::kBinFloat:
      return "BINFLOAT";
    case op::kProto:
      return "PROTO";
    case op::kNewObj:
      return "NEWOBJ";
    case op::kExt1:
      return "EXT1";
    case op::kExt2:
      return "EXT2";
    case op::kExt4:
      return "EXT4";
    case op::kTuple1:
      return "TUPLE1";
    case op::kTuple2:
      return "TUPLE2";
    case op::kTuple3:
      return "TUPLE3";
    case op::kNewTrue:
      return "NEWTRUE";
    case op::kNewFalse:
      return "NEWFALSE";
    case op::kLong1:
      return "LONG1";
    case op::kLong4:
      return "LONG4";
    case op::kBinBytes:
      return "BINBYTES";
    case op::kShortBinBytes:
      return "SHORT_BINBYTES";
    case op::kShortBinUnicode:
      return "SHORT_BINUNICODE";
    case op::kBinUnicode8:
      return "BINUNICODE8";
    case op::kBinBytes8:
      return "BINBYTES8";
    case op::kEmptySet:
      return "EMPTY_SET";
    case op::kAddItems:
      return "ADDITEMS";
    case op::kFrozenSet:
      return "FROZENSET";
    case op::kNewObjEx:
      return "NEWOBJ_EX";
    case op::kStackGlobal:
      return "STACK_GLOBAL";
    case op::kMemoize:
      return "MEMOIZE";
    case op::kFrame:
      return "FRAME";
    case op::kByteArray8:
      return "BYTEARRAY8";
    case op::kNextBuffer:
      return "NEXT_BUFFER";
    case op::kReadOnlyBuffer:
      return "READONLY_BUFFER";
    default:
      return "unknown";
  }
}

PickleDocument read_pickle(std::span<const uint8_t> data, std::string source,
                           const PickleReadOptions& options) {
  return Reader(data, std::move(source), options).run();
}

}  // namespace zinf::serialization
