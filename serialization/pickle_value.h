// PickleValue: the value tree a pickle decodes to, without running any Python.
//
// A PickleDocument owns every node of one tree (an arena: nodes live until the document is
// destroyed and never move, so `const PickleValue&` and pointers into it stay valid). Nodes
// have reference semantics like Python objects: a value memoized and fetched twice is the
// same node, and a container filled after it was first referenced is seen filled from every
// place that holds it.
//
// Kinds: None, bool, int (int64; an int outside int64 is a BigInt kept as little-endian
// two's complement bytes, minimal length), float, str (UTF-8 bytes as in the pickle), bytes,
// bytearray, list, tuple, dict and collections.OrderedDict (insertion order kept; keys are
// any hashable values, looked up by identity of value as Python does: 1, 1.0 and True are one
// key), set, frozenset, torch.Size, Storage (a torch persistent id), Tensor (a view of a
// storage: torch._utils._rebuild_tensor_v2 / _rebuild_parameter), Global (a module.name
// reference never looked up) and Object (any other call of a global: REDUCE, NEWOBJ, kept as
// module, name, args and the BUILD state).
//
// Errors: the read accessors throw SerializationError naming the document's source and the
// byte offset of the opcode that made the node when the node is not of the kind asked for
// ("expected a dict, got list"), so a consumer reading a checkpoint reports where the file is
// not what it expected. The builder calls of PickleDocument throw std::invalid_argument on
// misuse (an unhashable key, appending to a tuple); the pickle reader turns those into
// SerializationErrors with the offset and opcode.
//
// Thread safety: a document and its nodes may be read from any number of threads once built;
// building (the PickleDocument calls that create or change nodes) is single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::serialization {

// Element types of torch storages, named after the storage classes that carry them.
enum class TensorDType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
  kComplex64,
  kComplex128,
  kUnknown,  // a storage class this reader does not know (quantized types): kept by name
};

// "FloatStorage" -> kFloat32, ...; kUnknown for any other name.
[[nodiscard]] TensorDType dtype_from_storage_type(std::string_view storage_type);
// kFloat32 -> "FloatStorage"; "" for kUnknown.
[[nodiscard]] std::string_view storage_type_of(TensorDType dtype);
// Bytes per element; 0 for kUnknown.
[[nodiscard]] size_t dtype_size_bytes(TensorDType dtype);
// "float32", "bfloat16", ... (torch's names without the "torch." prefix); "unknown".
[[nodiscard]] std::string_view dtype_name(TensorDType dtype);

// The length of the minimal little-endian two's complement form of the integer in
// `le_bytes` (high bytes that only repeat the sign dropped; at least 1 for a non-empty input).
[[nodiscard]] size_t minimal_int_length(std::string_view le_bytes);

// A torch persistent storage id: ('storage', torch.<storage_type>, key, location, numel).
// The bytes live in the archive record `data/<key>`.
struct StorageRef {
  std::string key;
  std::string storage_type;  // "FloatStorage"
  TensorDType dtype = TensorDType::kUnknown;
  std::string location;  // "cpu", "cuda:0"
  int64_t numel = 0;     // elements in the storage
};

// A tensor as torch.save records it: a strided view of a storage. Offsets, shape and stride
// are in elements. The reader checks that the view stays inside the storage's numel.
struct TensorRef {
  StorageRef storage;
  int64_t storage_offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  bool requires_grad = false;
  bool is_parameter = false;  // came through _rebuild_parameter (an nn.Parameter)

  // Product of shape (1 for a scalar).
  [[nodiscard]] int64_t numel() const;
  // Whether stride is the row-major stride of shape (size-1 dimensions are ignored).
  [[nodiscard]] bool is_contiguous() const;
};

class PickleValue;
class PickleDocument;

// One dict (or OrderedDict) entry, in insertion order.
struct PickleEntry {
  const PickleValue* key;
  const PickleValue* value;
};

class PickleValue {
 public:
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,
    kBigInt,
    kFloat,
    kString,
    kBytes,
    kByteArray,
    kList,
    kTuple,
    kDict,
    kOrderedDict,
    kSet,
    kFrozenSet,
    kTorchSize,
    kStorage,
    kTensor,
    kGlobal,
    kObject,
  };

  // Only a PickleDocument makes nodes.
  struct Key {
   private:
    friend class PickleDocument;
    Key() = default;
  };
  PickleValue(Key, const void* document, Kind kind, uint64_t offset);
  ~PickleValue();
  PickleValue(const PickleValue&) = delete;
  PickleValue& operator=(const PickleValue&) = delete;

  [[nodiscard]] Kind kind() const noexcept { return kind_; }
  [[nodiscard]] bool is(Kind kind) const noexcept { return kind_ == kind; }
  [[nodiscard]] bool is_none() const noexcept { return kind_ == Kind::kNone; }
  // The offset of the pickle opcode that made this node (0 for nodes built in memory).
  [[nodiscard]] uint64_t offset() const noexcept { return offset_; }
  // "dict", "OrderedDict", "torch.Size", "tensor", ... for messages.
  [[nodiscard]] std::string_view kind_name() const noexcept { return kind_name(kind_); }
  [[nodiscard]] static std::string_view kind_name(Kind kind) noexcept;

  // kBool.
  [[nodiscard]] bool as_bool() const;
  // kInt (and kBool, as Python's bool is an int).
  [[nodiscard]] int64_t as_int() const;
  // kBigInt: little-endian two's complement, minimal length, never fits an int64.
  [[nodiscard]] const std::string& big_int_bytes() const;
  // kFloat (and kInt, converted).
  [[nodiscard]] double as_float() const;
  // kString: the UTF-8 text. kBytes, kByteArray: the raw bytes.
  [[nodiscard]] const std::string& as_string() const;

  // Elements of a list, tuple, set, frozenset or torch.Size, and the items an Object was
  // given by APPEND(S); sets keep first-insertion order.
  [[nodiscard]] std::span<const PickleValue* const> items() const;
  // Entries of a dict or OrderedDict, and those an Object was given by SETITEM(S).
  [[nodiscard]] std::span<const PickleEntry> entries() const;
  // items().size() or entries().size(), whichever the kind has.
  [[nodiscard]] size_t size() const;
  // The value under the str key `key` in a dict, OrderedDict or Object; nullptr when absent.
  [[nodiscard]] const PickleValue* find(std::string_view key) const;
  // As find(), but absence is an error naming the key.
  [[nodiscard]] const PickleValue& at(std::string_view key) const;
  // The elements of a torch.Size, list or tuple of ints.
  [[nodiscard]] std::vector<int64_t> as_int_list() const;

  // kStorage.
  [[nodiscard]] const StorageRef& storage() const;
  // kTensor.
  [[nodiscard]] const TensorRef& tensor() const;

  // kGlobal, kObject: the global's module and name ("collections", "OrderedDict").
  [[nodiscard]] const std::string& module() const;
  [[nodiscard]] const std::string& name() const;
  // kObject: the argument tuple of the call (never null), NEWOBJ_EX's kwargs (null when
  // absent) and whether NEWOBJ made it (cls.__new__(cls, *args)) rather than REDUCE.
  [[nodiscard]] const PickleValue& args() const;
  [[nodiscard]] const PickleValue* kwargs() const;
  [[nodiscard]] bool made_by_newobj() const;
  // The state BUILD gave this node (Object, OrderedDict, dict, list, set, tensor); null when
  // none.
  [[nodiscard]] const PickleValue* state() const noexcept;

 private:
  friend class PickleDocument;
  struct Extra;

  [[noreturn]] void fail_kind(std::string_view expected) const;
  Extra& extra();

  const void* document_;  // the PickleDocument's stable state, for messages and key lookup
  uint64_t offset_;
  uint64_t key_id_ = 0;  // interned identity when used as a dict key or set element
  Kind kind_;
  bool flag_ = false;  // kBool: the value; kObject: made by NEWOBJ
  int32_t depth_ = 1;  // tuples, torch.Size: exact nesting depth (immutable after creation)
  union {
    int64_t int_ = 0;
    double float_;
  };
  std::string text_;  // str, bytes, bytearray, big int bytes, module of a global/object
  std::vector<PickleValue*> items_;
  std::unique_ptr<Extra> extra_;
};

// Owns one value tree; see the header comment.
class PickleDocument {
 public:
  // `source` names the tree in error messages ("ckpt.pt/data.pkl").
  explicit PickleDocument(std::string source = "<memory>");
  ~PickleDocument();
  PickleDocument(PickleDocument&&) noexcept;
  PickleDocument& operator=(PickleDocument&&) noexcept;
  PickleDocument(const PickleDocument&) = delete;
  PickleDocument& operator=(const PickleDocument&) = delete;

  [[nodiscard]] const std::string& source() const noexcept;
  // The root value; throws SerializationError when none was set.
  [[nodiscard]] const PickleValue& root() const;
  void set_root(const PickleValue* root);
  // Number of nodes made so far.
  [[nodiscard]] size_t node_count() const noexcept;

  // ---- Builders. `offset` is recorded for messages (the reader passes the opcode's). ----
  PickleValue* none(uint64_t offset = 0);
  PickleValue* boolean(bool value, uint64_t offset = 0);
  PickleValue* integer(int64_t value, uint64_t offset = 0);
  // From little-endian two's complement bytes of any length (empty is 0); an int64 result
  // is a kInt, anything wider a kBigInt.
  PickleValue* integer_from_bytes(std::string_view le_bytes, uint64_t offset = 0);
  PickleValue* floating(double value, uint64_t offset = 0);
  PickleValue* string(std::string utf8, uint64_t offset = 0);
  PickleValue* bytes(std::string data, bool bytearray = false, uint64_t offset = 0);
  PickleValue* list(uint64_t offset = 0);
  PickleValue* tuple(std::vector<PickleValue*> items, uint64_t offset = 0);
  PickleValue* dict(bool ordered = false, uint64_t offset = 0);
  PickleValue* set(bool frozen = false, uint64_t offset = 0);
  PickleValue* torch_size(std::span<const int64_t> dims, uint64_t offset = 0);
  PickleValue* storage(StorageRef storage, uint64_t offset = 0);
  // Checks the view against the storage (non-negative shape and stride, equal ranks, last
  // element inside the storage): std::invalid_argument when it does not fit.
  PickleValue* tensor(TensorRef tensor, uint64_t offset = 0);
  PickleValue* global(std::string module, std::string name, uint64_t offset = 0);
  // `args` must be a tuple; `kwargs` null or a dict.
  PickleValue* object(std::string module, std::string name, PickleValue* args,
                      bool made_by_newobj = false, PickleValue* kwargs = nullptr,
                      uint64_t offset = 0);

  // Appends to a list (or an Object's items).
  void append(PickleValue* list, PickleValue* item);
  // dict[key] = value (or an Object's entries); an existing equal key keeps its position and
  // takes the new value. Throws std::invalid_argument for an unhashable key.
  void set_item(PickleValue* dict, PickleValue* key, PickleValue* value);
  // Adds to a set or frozenset being built; an equal element is not added twice.
  void add(PickleValue* set, PickleValue* item);
  // The BUILD state; replaces an earlier one.
  void set_state(PickleValue* target, PickleValue* state);

  // Checks the tree under root: no cycles, nesting no deeper than `max_depth`. Throws
  // SerializationError naming the offset of the node where it fails.
  void check_tree(size_t max_depth) const;

  struct State;  // internal: the arena and key table, at a stable address for the nodes

 private:
  std::unique_ptr<State> state_;
};

}  // namespace zinf::serialization
