#include "consolidate/checkpoint_plan.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "consolidate/element_convert.h"
#include "serialization/serialization_error.h"
#include "serialization/zip_reader.h"

namespace zinf::consolidate {

using serialization::kNoOffset;
using serialization::PickleValue;
using serialization::SerializationError;
using serialization::TensorDType;
using serialization::TorchArchive;
namespace fs = std::filesystem;

namespace {

// Checkpoint file names are matched by hand (no std::regex: GCC 12 warns inside it under
// -fsanitize=address, and a rank too long for an int must not throw from std::stoi).
bool take(std::string_view& s, std::string_view word) {
  if (s.substr(0, word.size()) != word) return false;
  s.remove_prefix(word.size());
  return true;
}

// The decimal number at the start of `s` (1 to 9 digits), consumed; nullopt otherwise.
std::optional<int> take_number(std::string_view& s) {
  size_t n = 0;
  while (n < s.size() && n < 10 && s[n] >= '0' && s[n] <= '9') ++n;
  if (n == 0 || n > 9) return std::nullopt;
  int value = 0;
  std::from_chars(s.data(), s.data() + n, value);
  s.remove_prefix(n);
  return value;
}

// "zero_pp_rank_<dp>_mp_rank_<mp><suffix>": {dp, mp}, or nullopt for any other name.
std::optional<std::pair<int, int>> zero_file_ranks(std::string_view s, std::string_view suffix) {
  if (!take(s, "zero_pp_rank_")) return std::nullopt;
  const std::optional<int> dp = take_number(s);
  if (!dp || !take(s, "_mp_rank_")) return std::nullopt;
  const std::optional<int> mp = take_number(s);
  if (!mp || s != suffix) return std::nullopt;
  return std::make_pair(*dp, *mp);
}

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw SerializationError(file, kNoOffset, what);
}

std::string hex32(uint32_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(8, '0');
  for (int i = 7; i >= 0; --i, value >>= 4) text[static_cast<size_t>(i)] = kDigits[value & 15];
  return text;
}

std::string name_of(const PickleValue& key, const std::string& file) {
  if (!key.is(PickleValue::Kind::kString)) {
    fail(file,
         std::string("a tensor name is a ") + std::string(key.kind_name()) + ", expected a str");
  }
  return key.as_string();
}

uint64_t shape_numel(const std::vector<int64_t>& shape) {
  uint64_t numel = 1;
  for (const int64_t dim : shape) numel *= static_cast<uint64_t>(dim);
  return numel;
}

// One opened torch.save file of the checkpoint.
struct Opened {
  const TorchArchive* archive = nullptr;
  std::string path;
};

// The elements of a stored tensor as one piece.
Piece tensor_piece(const Opened& file, const PickleValue& value, const std::string& what) {
  if (!value.is(PickleValue::Kind::kTensor)) {
    fail(file.path, what + " is a " + std::string(value.kind_name()) + ", expected a tensor");
  }
  const serialization::TensorRef& tensor = value.tensor();
  if (!convertible(tensor.storage.dtype)) {
    fail(file.path, what + " has dtype " + std::string(dtype_name(tensor.storage.dtype)) +
                        ", which cannot be converted to a float type");
  }
  const std::span<const uint8_t> bytes = file.archive->tensor_bytes(tensor);
  return Piece{bytes.data(), tensor.storage.dtype, static_cast<uint64_t>(tensor.numel())};
}

// Ordered name -> shape of a param_shapes / frozen_param_shapes dict.
std::vector<std::pair<std::string, std::vector<int64_t>>> read_shapes(const PickleValue& dict,
                                                                      const std::string& file,
                                                                      const std::string& key) {
  if (!dict.is(PickleValue::Kind::kDict) && !dict.is(PickleValue::Kind::kOrderedDict)) {
    fail(file, key + " holds a " + std::string(dict.kind_name()) + ", expected a dict");
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const serialization::PickleEntry& entry : dict.entries()) {
    std::vector<int64_t> shape = entry.value->as_int_list();
    uint64_t numel = 1;
    for (const int64_t dim : shape) {
      if (dim < 0) fail(file, key + ": " + name_of(*entry.key, file) + " has a negative size");
      // Bounded so that element and byte counts (numel x 8) never overflow 64 bits.
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel) ||
          numel > (uint64_t{1} << 60)) {
        fail(file, key + ": " + name_of(*entry.key, file) + " has more than 2^60 elements");
      }
    }
    shapes.emplace_back(name_of(*entry.key, file), std::move(shape));
  }
  return shapes;
}

// The concatenation of a rank's partitions, read front to back: take() hands out the pieces
// of [offset, offset + count) for non-decreasing offsets.
class FlatCursor {
 public:
  FlatCursor(std::vector<Piece> segments, std::string file)
      : segments_(std::move(segments)), file_(std::move(file)) {
    for (const Piece& piece : segments_) total_ += piece.numel;
  }
  uint64_t total() const { return total_; }
  const std::string& file() const { return file_; }

  void take(uint64_t offset, uint64_t count, std::vector<Piece>& out) {
    while (count > 0) {
      while (index_ < segments_.size() && offset >= start_ + segments_[index_].numel) {
        start_ += segments_[index_].numel;
        ++index_;
      }
      const Piece& segment = segments_[index_];
      const uint64_t skip = offset - start_;
      const uint64_t take = std::min(count, segment.numel - skip);
      const uint64_t element = serialization::dtype_size_bytes(segment.dtype);
      out.push_back(Piece{segment.data + skip * element, segment.dtype, take, segment.record});
      offset += take;
      count -= take;
    }
  }

 private:
  std::vector<Piece> segments_;
  std::string file_;
  uint64_t total_ = 0;
  size_t index_ = 0;
  uint64_t start_ = 0;  // element offset of segments_[index_]
};

// zero_stage: an int, or DeepSpeed's ZeroStageEnum pickled as ZeroStageEnum(value) or (from
// Python 3.11 on) getattr(ZeroStageEnum, "member").
int read_zero_stage(const PickleValue& value, const std::string& file) {
  if (value.is(PickleValue::Kind::kInt)) return static_cast<int>(value.as_int());
  if (value.is(PickleValue::Kind::kObject)) {
    const PickleValue& args = value.args();
    if (value.name() == "ZeroStageEnum" && args.size() == 1 &&
        args.items()[0]->is(PickleValue::Kind::kInt)) {
      return static_cast<int>(args.items()[0]->as_int());
    }
    if (value.name() == "getattr" && args.size() == 2 &&
        args.items()[1]->is(PickleValue::Kind::kString)) {
      static const std::map<std::string, int> kMembers = {
          {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}};
      const auto it = kMembers.find(args.items()[1]->as_string());
      if (it != kMembers.end()) return it->second;
    }
  }
  fail(file, "optimizer_state_dict.zero_stage is not a ZeRO stage (a " +
                 std::string(value.kind_name()) + ")");
}

// The ZeRO stage a model-states file says it was saved with: zinf's `zinf.zero_stage`, else
// DeepSpeed's `ds_config.zero_optimization.stage`; nullopt when it says neither.
std::optional<int> saved_stage(const PickleValue& root) {
  const auto int_at = [](const PickleValue* dict, std::string_view key) -> const PickleValue* {
    if (dict == nullptr ||
        (!dict->is(PickleValue::Kind::kDict) && !dict->is(PickleValue::Kind::kOrderedDict))) {
      return nullptr;
    }
    const PickleValue* value = dict->find(key);
    return value != nullptr && value->is(PickleValue::Kind::kInt) ? value : nullptr;
  };
  if (const PickleValue* stage = int_at(root.find("zinf"), "zero_stage")) {
    return static_cast<int>(stage->as_int());
  }
  const PickleValue* config = root.find("ds_config");
  if (config != nullptr &&
      (config->is(PickleValue::Kind::kDict) || config->is(PickleValue::Kind::kOrderedDict))) {
    if (const PickleValue* stage = int_at(config->find("zero_optimization"), "stage")) {
      return static_cast<int>(stage->as_int());
    }
  }
  return std::nullopt;
}

// Checks the CRC-32 of `path`'s pickle record (`<top>/data.pkl`) before it is decoded: a
// flipped byte there could rename or reshape a tensor without breaking the pickle.
void verify_pickle_crc(const std::string& path) {
  const serialization::ZipReader zip = serialization::ZipReader::open(path);
  for (const serialization::ZipEntry& entry : zip.entries()) {
    const size_t slash = entry.name.find('/');
    if (slash == std::string::npos ||
        std::string_view(entry.name).substr(slash + 1) != "data.pkl") {
      continue;
    }
    const uint32_t crc = serialization::crc32_update(0, zip.data(entry));
    if (crc != entry.crc32) {
      throw SerializationError(path, entry.data_offset,
                               "record " + entry.name + " fails its CRC-32 (recorded " +
                                   hex32(entry.crc32) + ", data " + hex32(crc) +
                                   "): the file is corrupt");
    }
  }
}

class PlanBuilder {
 public:
  PlanBuilder(CheckpointPlan& plan, const PlanOptions& options) : plan_(plan), options_(options) {}

  void build(const std::string& checkpoint_dir) {
    plan_.tag = options_.tag.empty() ? read_latest_tag(checkpoint_dir) : options_.tag;
    plan_.tag_dir = (fs::path(checkpoint_dir) / plan_.tag).string();
    std::error_code ec;
    if (!fs::is_directory(plan_.tag_dir, ec)) {
      fail(plan_.tag_dir, "no such checkpoint folder (tag '" + plan_.tag + "')");
    }
    list_files();
    if (optim_paths_.empty() && !model3_paths_.empty()) {
      // Stage-3 model-states files hold no weights: the optimizer files are the checkpoint.
      fail_missing_optim(0, model3_paths_.rbegin()->first + 1, 3);
    }
    if (optim_paths_.empty()) {
      build_stage0();
    } else {
      open_optim_files();
      if (plan_.stage == 3) {
        build_stage3();
      } else {
        build_stage12();
      }
    }
    add_aliases();
  }

 private:
  Opened open(const std::string& path) {
    if (options_.verify_crc) verify_pickle_crc(path);
    plan_.archives.push_back(std::make_unique<TorchArchive>(TorchArchive::open(path)));
    plan_.files.push_back(path);
    return Opened{plan_.archives.back().get(), path};
  }

  // tensor_piece(), with the piece's storage record registered in plan_.records.
  Piece piece_of(const Opened& file, const PickleValue& value, const std::string& what) {
    Piece piece = tensor_piece(file, value, what);
    const serialization::TorchArchive::StorageRecord record =
        file.archive->storage_record(value.tensor().storage);
    const auto [it, added] =
        record_index_.try_emplace(file.path + '\0' + record.name, plan_.records.size());
    if (added) {
      plan_.records.push_back(
          SourceRecord{file.path, record.name, record.data_offset, record.bytes, record.crc32});
    }
    piece.record = it->second;
    return piece;
  }

  // The optimizer files of ranks [first, last) are missing from a checkpoint whose model
  // states say ZeRO stage `stage`: the error names them (the first as the file), since the
  // fp32 weights live in them. `why`: how the missing ranks were found, when not from the
  // model states.
  [[noreturn]] void fail_missing_optim(int first, int last, int stage,
                                       const std::string& why = "") const {
    const auto name = [this](int rank) {
      return prefix_ + "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_optim_states.pt";
    };
    std::string names = name(first);
    if (last - first == 2) names += " and " + name(last - 1);
    if (last - first > 2) names += " ... " + name(last - 1);
    fail(expected_path(name(first)),
         std::string("missing: the optimizer file") + (last - first > 1 ? "s " : " ") + names +
             " of this ZeRO stage-" + std::to_string(stage) + " checkpoint (" +
             std::to_string(last - first) + " of " + std::to_string(std::max(last, 1)) +
             " ranks), which hold its fp32 weights" + (why.empty() ? "" : " (" + why + ")"));
  }

  void list_files() {
    std::map<int, std::string> optim;
    std::error_code ec;
    for (const fs::directory_entry& entry : fs::directory_iterator(plan_.tag_dir, ec)) {
      const std::string name = entry.path().filename().string();
      std::string_view rest = name;
      const bool bf16 = take(rest, "bf16_");
      if (const auto ids = zero_file_ranks(rest, "_optim_states.pt")) {
        if (ids->second != 0) {
          fail(entry.path().string(), "model parallelism (mp_rank > 0) is not supported");
        }
        const int rank = ids->first;
        if (optim.count(rank) != 0) {
          fail(entry.path().string(), "a second optimizer file for rank " + std::to_string(rank) +
                                          " (beside " + optim[rank] + ")");
        }
        optim[rank] = entry.path().string();
        prefix_ = bf16 ? "bf16_" : "";
      } else if (bf16) {
        continue;  // no model-states file carries the prefix
      } else if (const auto ids3 = zero_file_ranks(rest, "_model_states.pt")) {
        if (ids3->second != 0) {
          fail(entry.path().string(), "model parallelism (mp_rank > 0) is not supported");
        }
        model3_paths_[ids3->first] = entry.path().string();
      } else if (take(rest, "mp_rank_")) {
        const std::optional<int> mp = take_number(rest);
        if (mp && *mp == 0 && rest == "_model_states.pt") model_path_ = entry.path().string();
      }
    }
    if (ec) fail(plan_.tag_dir, "cannot list the folder: " + ec.message());
    const int world_size = static_cast<int>(optim.size());
    for (int rank = 0; rank < world_size; ++rank) {
      if (optim.count(rank) == 0) {
        fail((fs::path(plan_.tag_dir) /
              (prefix_ + "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_optim_states.pt"))
                 .string(),
             "missing: the optimizer file of rank " + std::to_string(rank) + " (found " +
                 std::to_string(world_size) + " optimizer files, ranks up to " +
                 std::to_string(optim.rbegin()->first) + ")");
      }
      optim_paths_.push_back(optim[rank]);
    }
    plan_.world_size = std::max(world_size, 1);
  }

  std::string expected_path(const std::string& name) const {
    return (fs::path(plan_.tag_dir) / name).string();
  }

  const PickleValue& inner_state(const Opened& file) {
    const PickleValue& root = file.archive->root();
    const PickleValue* inner = root.find("optimizer_state_dict");
    if (inner == nullptr) {
      fail(file.path, "not a ZeRO optimizer file: no 'optimizer_state_dict' key");
    }
    return *inner;
  }

  void open_optim_files() {
    for (const std::string& path : optim_paths_) optim_.push_back(open(path));
    const PickleValue& inner0 = inner_state(optim_[0]);
    if (const PickleValue* stage = inner0.find("zero_stage"); stage != nullptr) {
      plan_.stage = read_zero_stage(*stage, optim_[0].path);
    } else if (inner0.find("single_partition_of_fp32_groups") != nullptr) {
      plan_.stage = 1;
      plan_.bf16_zero1 = true;
    } else {
      fail(optim_[0].path,
           "neither 'zero_stage' nor 'single_partition_of_fp32_groups' in "
           "optimizer_state_dict: not a ZeRO checkpoint this tool knows");
    }
    if (plan_.stage < 1 || plan_.stage > 3) {
      fail(optim_[0].path, "zero_stage " + std::to_string(plan_.stage) + " is not 1, 2 or 3");
    }
    for (const Opened& file : optim_) {
      const PickleValue* count = inner_state(file).find("partition_count");
      if (count == nullptr) continue;
      int64_t partitions = 0;
      if (count->is(PickleValue::Kind::kInt)) {
        partitions = count->as_int();
      } else {
        for (const int64_t c : count->as_int_list()) partitions = std::max(partitions, c);
      }
      if (partitions > plan_.world_size && partitions <= (1 << 16)) {
        fail_missing_optim(plan_.world_size, static_cast<int>(partitions), plan_.stage,
                           fs::path(file.path).filename().string() + ": partition_count says " +
                               std::to_string(partitions) + " ranks but " +
                               std::to_string(plan_.world_size) + " optimizer files were found");
      }
      if (partitions != plan_.world_size) {
        fail(file.path, "partition_count says " + std::to_string(partitions) + " ranks but " +
                            std::to_string(plan_.world_size) + " optimizer files were found");
      }
    }
    if (plan_.stage == 3) {
      if (!model3_paths_.empty() && model3_paths_.rbegin()->first >= plan_.world_size) {
        fail_missing_optim(plan_.world_size, model3_paths_.rbegin()->first + 1, 3);
      }
      for (int rank = 0; rank < plan_.world_size; ++rank) {
        const auto it = model3_paths_.find(rank);
        if (it == model3_paths_.end()) {
          fail(
              expected_path("zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_model_states.pt"),
              "missing: the stage-3 model-states file of rank " + std::to_string(rank));
        }
        models_.push_back(open(it->second));
      }
    } else {
      if (model_path_.empty()) {
        fail(expected_path("mp_rank_00_model_states.pt"), "missing: the model-states file");
      }
      models_.push_back(open(model_path_));
    }
    for (const Opened& model : models_) {
      if (model.archive->root().find("buffer_names") == nullptr) {
        fail(model.path, "not a model-states file: no 'buffer_names' key");
      }
    }
  }

  // ---- Pieces shared by all stages ----

  const PickleValue& module_of(const Opened& model) {
    const PickleValue& module = model.archive->root().at("module");
    if (!module.is(PickleValue::Kind::kDict) && !module.is(PickleValue::Kind::kOrderedDict)) {
      fail(model.path, "'module' is a " + std::string(module.kind_name()) + ", expected a dict");
    }
    return module;
  }

  void add_buffers(const Opened& model) {
    std::set<std::string> buffer_names;
    for (const PickleValue* name : model.archive->root().at("buffer_names").items()) {
      buffer_names.insert(name_of(*name, model.path));
    }
    for (const serialization::PickleEntry& entry : module_of(model).entries()) {
      const std::string name = name_of(*entry.key, model.path);
      if (buffer_names.count(name) == 0) continue;
      PlannedTensor tensor;
      tensor.name = name;
      tensor.role = TensorRole::kBuffer;
      tensor.shape = entry.value->is(PickleValue::Kind::kTensor) ? entry.value->tensor().shape
                                                                 : std::vector<int64_t>{};
      tensor.pieces.push_back(piece_of(model, *entry.value, "module['" + name + "']"));
      tensor.numel = tensor.pieces.back().numel;
      taken_.insert(name);
      plan_.tensors.push_back(std::move(tensor));
    }
  }

  std::map<std::string, std::string> shared_params() {
    std::map<std::string, std::string> shared;
    const PickleValue* value = models_[0].archive->root().find("shared_params");
    if (value == nullptr || value->is_none()) return shared;
    if (!value->is(PickleValue::Kind::kDict) && !value->is(PickleValue::Kind::kOrderedDict)) {
      fail(models_[0].path,
           "'shared_params' is a " + std::string(value->kind_name()) + ", expected a dict");
    }
    for (const serialization::PickleEntry& entry : value->entries()) {
      const std::string alias = name_of(*entry.key, models_[0].path);
      shared[alias] = name_of(*entry.value, models_[0].path);
      alias_order_.push_back(alias);
    }
    return shared;
  }

  void add_aliases() {
    std::set<std::string> names;
    for (const PlannedTensor& tensor : plan_.tensors) names.insert(tensor.name);
    for (const std::string& alias : alias_order_) {
      const std::string& target = shared_[alias];
      if (names.count(target) != 0 && names.count(alias) == 0) {
        plan_.aliases.push_back(Alias{alias, target});
      }
    }
  }

  void push(PlannedTensor tensor) {
    if (!taken_.insert(tensor.name).second) {
      fail(plan_.tag_dir, "tensor '" + tensor.name + "' appears twice in the checkpoint");
    }
    plan_.tensors.push_back(std::move(tensor));
  }

  // Frozen params saved whole in the module (stage 0-2 without frozen_param_fragments).
  void add_module_params(const std::set<std::string>& trainable, TensorRole role) {
    const Opened& model = models_[0];
    for (const serialization::PickleEntry& entry : module_of(model).entries()) {
      const std::string name = name_of(*entry.key, model.path);
      if (taken_.count(name) != 0 || trainable.count(name) != 0 || shared_.count(name) != 0) {
        continue;
      }
      if (role == TensorRole::kFrozen && options_.exclude_frozen) continue;
      PlannedTensor tensor;
      tensor.name = name;
      tensor.role = role;
      tensor.shape = entry.value->is(PickleValue::Kind::kTensor) ? entry.value->tensor().shape
                                                                 : std::vector<int64_t>{};
      tensor.pieces.push_back(piece_of(model, *entry.value, "module['" + name + "']"));
      tensor.numel = tensor.pieces.back().numel;
      push(std::move(tensor));
    }
  }

  // frozen_param_shapes + frozen_param_fragments; false when the checkpoint has none.
  bool add_frozen_fragments() {
    const PickleValue* shapes = models_[0].archive->root().find("frozen_param_shapes");
    if (shapes == nullptr || shapes->is_none()) return false;
    if (options_.exclude_frozen) return true;
    for (auto& [name, shape] : read_shapes(*shapes, models_[0].path, "frozen_param_shapes")) {
      PlannedTensor tensor;
      tensor.name = name;
      tensor.role = TensorRole::kFrozen;
      tensor.numel = shape_numel(shape);
      tensor.shape = std::move(shape);
      // Stage 2: one model file with the whole param; stage 3: one slice per rank.
      const uint64_t slice = (tensor.numel + models_.size() - 1) / models_.size();
      uint64_t have = 0;
      for (const Opened& model : models_) {
        const PickleValue& fragments = model.archive->root().at("frozen_param_fragments");
        const PickleValue* fragment = fragments.is_none() ? nullptr : fragments.find(name);
        if (fragment == nullptr) {
          fail(model.path, "frozen_param_fragments has no entry for frozen param '" + name + "'");
        }
        Piece piece = piece_of(model, *fragment, "frozen_param_fragments['" + name + "']");
        if (piece.numel != slice) {
          fail(model.path,
               "frozen_param_fragments['" + name + "'] holds " + std::to_string(piece.numel) +
                   " elements; a shape of " + std::to_string(tensor.numel) + " over " +
                   std::to_string(models_.size()) + " model files needs " + std::to_string(slice));
        }
        piece.numel = std::min(piece.numel, tensor.numel - have);
        have += piece.numel;
        if (piece.numel > 0) tensor.pieces.push_back(piece);
      }
      if (have != tensor.numel) {
        fail(models_.back().path, "the fragments of frozen param '" + name + "' hold " +
                                      std::to_string(have) + " elements; its shape needs " +
                                      std::to_string(tensor.numel));
      }
      push(std::move(tensor));
    }
    return true;
  }

  std::vector<Piece> partitions(const Opened& file, const char* key) {
    const PickleValue& list = inner_state(file).at(key);
    std::vector<Piece> pieces;
    size_t index = 0;
    for (const PickleValue* item : list.items()) {
      const std::string what = std::string(key) + "[" + std::to_string(index++) + "]";
      pieces.push_back(piece_of(file, *item, what));
      if (pieces.back().dtype != TensorDType::kFloat32) {
        fail(file.path,
             what + " is " + std::string(dtype_name(pieces.back().dtype)) + ", expected float32");
      }
    }
    return pieces;
  }

  // "zero_pp_rank_0_mp_rank_00_optim_states.pt ... zero_pp_rank_2_mp_rank_00_optim_states.pt"
  std::string partition_files() const {
    const std::string first = fs::path(optim_.front().path).filename().string();
    if (optim_.size() == 1) return first;
    return first + " ... " + fs::path(optim_.back().path).filename().string();
  }

  // ---- Stages ----

  void build_stage0() {
    if (model_path_.empty()) {
      fail(expected_path("mp_rank_00_model_states.pt"),
           "missing: no model-states file and no ZeRO optimizer files in the folder");
    }
    models_.push_back(open(model_path_));
    if (models_[0].archive->root().find("buffer_names") == nullptr) {
      fail(model_path_, "not a model-states file: no 'buffer_names' key");
    }
    // Stages 1-2 keep only 16-bit weights in the model states: without the optimizer files
    // the export would be those, not the fp32 master weights.
    if (const std::optional<int> stage = saved_stage(models_[0].archive->root());
        stage && *stage >= 1) {
      const PickleValue* ranks = models_[0].archive->root().find("dp_world_size");
      const int world = ranks != nullptr && ranks->is(PickleValue::Kind::kInt) &&
                                ranks->as_int() >= 1 && ranks->as_int() < (1 << 20)
                            ? static_cast<int>(ranks->as_int())
                            : 1;
      fail_missing_optim(0, world, *stage);
    }
    plan_.stage = 0;
    plan_.notes.push_back(
        "no ZeRO optimizer files: stage 0 checkpoint; writing the module's weights as saved "
        "(the fp32 master copy, when there is one, lives in the optimizer state, not used)");
    shared_ = shared_params();
    add_buffers(models_[0]);
    add_module_params({}, TensorRole::kTrainable);
  }

  void build_stage12() {
    const Opened& model = models_[0];
    shared_ = shared_params();
    add_buffers(model);
    const PickleValue& shape_groups = model.archive->root().at("param_shapes");
    std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> groups;
    std::set<std::string> trainable;
    for (const PickleValue* group : shape_groups.items()) {
      groups.push_back(read_shapes(*group, model.path, "param_shapes"));
      for (const auto& [name, shape] : groups.back()) trainable.insert(name);
    }
    // Frozen params: stage 2 saves them; stage 1 (and bf16 ZeRO-1) only has them in module.
    if (!add_frozen_fragments()) add_module_params(trainable, TensorRole::kFrozen);

    std::vector<std::vector<Piece>> rank_groups;
    for (const Opened& file : optim_) {
      rank_groups.push_back(partitions(file, "single_partition_of_fp32_groups"));
      if (rank_groups.back().size() != groups.size()) {
        fail(file.path, "single_partition_of_fp32_groups has " +
                            std::to_string(rank_groups.back().size()) + " groups; " + model.path +
                            " has " + std::to_string(groups.size()) + " param_shapes groups");
      }
    }
    const uint64_t align = 2 * static_cast<uint64_t>(plan_.world_size);
    const auto aligned = [align](uint64_t x) { return (x + align - 1) / align * align; };
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<Piece> concat;
      for (const std::vector<Piece>& rank : rank_groups) concat.push_back(rank[g]);
      FlatCursor cursor(std::move(concat), optim_.back().path);
      uint64_t offset = 0;
      for (auto& [name, shape] : groups[g]) {
        PlannedTensor tensor;
        tensor.name = name;
        tensor.numel = shape_numel(shape);
        tensor.shape = shape;
        if (offset + tensor.numel > cursor.total()) {
          fail(model.path, "param_shapes group " + std::to_string(g) + ": param '" + name +
                               "' needs elements up to " + std::to_string(offset + tensor.numel) +
                               " but the " + std::to_string(plan_.world_size) +
                               " ranks' partitions (" + partition_files() + ") hold " +
                               std::to_string(cursor.total()));
        }
        cursor.take(offset, tensor.numel, tensor.pieces);
        offset += tensor.numel;
        push(std::move(tensor));
      }
      if (aligned(offset) != aligned(cursor.total())) {
        fail(model.path, "param_shapes group " + std::to_string(g) + ": the params use " +
                             std::to_string(offset) + " elements but the ranks' partitions (" +
                             partition_files() + ") hold " + std::to_string(cursor.total()) + " (" +
                             std::to_string(aligned(cursor.total())) + " aligned to " +
                             std::to_string(align) + ")");
      }
    }
  }

  void build_stage3() {
    shared_ = shared_params();
    add_buffers(models_[0]);
    add_frozen_fragments();
    const Opened& model = models_[0];
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (const PickleValue* group : model.archive->root().at("param_shapes").items()) {
      for (auto& entry : read_shapes(*group, model.path, "param_shapes")) {
        shapes.push_back(std::move(entry));
      }
    }
    std::vector<FlatCursor> ranks;
    for (const Opened& file : optim_) {
      ranks.emplace_back(partitions(file, "fp32_flat_groups"), file.path);
      if (ranks.back().total() != ranks.front().total()) {
        fail(file.path, "fp32_flat_groups hold " + std::to_string(ranks.back().total()) +
                            " elements; rank 0's hold " + std::to_string(ranks.front().total()));
      }
    }
    const auto ws = static_cast<uint64_t>(plan_.world_size);
    const uint64_t per_rank = ranks.front().total();
    uint64_t offset = 0;
    for (auto& [name, shape] : shapes) {
      PlannedTensor tensor;
      tensor.name = name;
      tensor.numel = shape_numel(shape);
      tensor.shape = shape;
      const uint64_t slice = (tensor.numel + ws - 1) / ws;
      if (offset + slice > per_rank) {
        fail(optim_[0].path,
             "param '" + name + "' needs elements up to " + std::to_string(offset + slice) +
                 " of every rank's fp32_flat_groups, which hold " + std::to_string(per_rank));
      }
      uint64_t left = tensor.numel;
      for (FlatCursor& rank : ranks) {
        const uint64_t take = std::min(slice, left);
        if (take > 0) rank.take(offset, take, tensor.pieces);
        left -= take;
      }
      offset += slice;
      push(std::move(tensor));
    }
    if (offset != per_rank) {
      fail(optim_[0].path, "the params use " + std::to_string(offset) +
                               " elements of each rank's fp32_flat_groups, which hold " +
                               std::to_string(per_rank));
    }
  }

  CheckpointPlan& plan_;
  const PlanOptions& options_;
  std::string prefix_;
  std::vector<std::string> optim_paths_;
  std::map<int, std::string> model3_paths_;
  std::string model_path_;
  std::vector<Opened> optim_;
  std::vector<Opened> models_;
  std::map<std::string, std::string> shared_;
  std::vector<std::string> alias_order_;
  std::set<std::string> taken_;
  std::map<std::string, size_t> record_index_;  // file + '\0' + record -> plan_.records index
};

}  // namespace

std::string read_latest_tag(const std::string& checkpoint_dir) {
  const std::string path = (fs::path(checkpoint_dir) / "latest").string();
  std::error_code ec;
  if (!fs::is_directory(checkpoint_dir, ec)) fail(checkpoint_dir, "no such checkpoint folder");
  std::ifstream in(path);
  if (!in) fail(path, "missing: no 'latest' file names the tag (pass --tag)");
  std::stringstream text;
  text << in.rdbuf();
  std::string tag = text.str();
  while (!tag.empty() &&
         (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ' || tag.back() == '\t')) {
    tag.pop_back();
  }
  if (tag.empty()) fail(path, "'latest' is empty");
  if (tag.find('/') != std::string::npos || tag == "." || tag == "..") {
    fail(path, "'latest' holds '" + tag + "', which is not a folder name");
  }
  return tag;
}

CheckpointPlan read_checkpoint_plan(const std::string& checkpoint_dir, const PlanOptions& options) {
  CheckpointPlan plan;
  PlanBuilder(plan, options).build(checkpoint_dir);
  return plan;
}

}  // namespace zinf::consolidate
