#include "engine/model/hf_checkpoint.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "serialization/serialization_error.h"

namespace zinf::engine {
namespace {

namespace fs = std::filesystem;
using serialization::Dtype;
using serialization::SafetensorsReader;
using serialization::TensorInfo;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// config.json read key by key; every error names the file and the key.
class ConfigReader {
 public:
  ConfigReader(std::string path, const nlohmann::json& root)
      : path_(std::move(path)), root_(root) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw HfCheckpointError(fmt::format("{}: \"{}\" {}", path_, key, what));
  }
  const nlohmann::json& root() const { return root_; }
  // The value of `key`, or nullptr when absent or null.
  const nlohmann::json* get(const std::string& key) const {
    const auto it = root_.find(key);
    return it == root_.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t positive(const std::string& key) const {
    const nlohmann::json* v = get(key);
    if (v == nullptr) fail(key, "is missing: zinf needs it to build the model");
    if (!v->is_number_integer() || v->get<int64_t>() <= 0) {
      fail(key, fmt::format("must be a positive integer, not {}", v->dump()));
    }
    return v->get<int64_t>();
  }
  int64_t positive_or(const std::string& key, int64_t fallback) const {
    return get(key) == nullptr ? fallback : positive(key);
  }
  double number_or(const std::string& key, double fallback) const {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || v->get<double>() <= 0) {
      fail(key, fmt::format("must be a positive number, not {}", v->dump()));
    }
    return v->get<double>();
  }
  bool boolean_or(const std::string& key, bool fallback) const {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(key, fmt::format("must be true or false, not {}", v->dump()));
    return v->get<bool>();
  }
  std::string string_or(const std::string& key, const std::string& fallback) const {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) fail(key, fmt::format("must be a string, not {}", v->dump()));
    return v->get<std::string>();
  }

 private:
  std::string path_;
  const nlohmann::json& root_;
};

std::string shape_text(const std::vector<uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::vector<uint64_t> unsigned_shape(const std::vector<int64_t>& shape) {
  return {shape.begin(), shape.end()};
}

at::ScalarType scalar_type(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32:
      return at::kFloat;
    case Dtype::kBF16:
      return at::kBFloat16;
    case Dtype::kF16:
      return at::kHalf;
    default:
      return at::ScalarType::Undefined;
  }
}

// Drops the mapping's whole pages inside `bytes` from this process's resident set: the next
// access faults them in again from the file, so this is a hint with no effect on values.
void release_pages(std::span<const uint8_t> bytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(bytes.data());
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + bytes.size()) / page * page;
  if (last > first) {
    // A failure leaves the pages resident (page cache the kernel may reclaim): nothing to do.
    (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
}

// The rotary settings: transformers 5.x writes "rope_parameters" ({"rope_type", "rope_theta",
// and the type's keys}); older configs a top-level "rope_theta" and "rope_scaling" ({"type" or
// "rope_type", ...}). A non-null rope_scaling is read alone, as transformers does. *theta
// receives the base (the object's rope_theta over the top-level one).
RopeScaling read_rope_scaling(const ConfigReader& r, const std::string& config_path, double* theta,
                              int64_t max_positions) {
  // As transformers reads them: a non-null rope_scaling replaces rope_parameters whole (its
  // base then comes from the top-level rope_theta unless it gives its own).
  const char* object_key = r.get("rope_scaling") != nullptr ? "rope_scaling" : "rope_parameters";
  const nlohmann::json* object = r.get(object_key);
  const nlohmann::json empty = nlohmann::json::object();
  if (object != nullptr && !object->is_object()) {
    r.fail(object_key, fmt::format("must be an object or null, not {}", object->dump()));
  }
  if (object != nullptr) {
    for (const auto& [name, value] : object->items()) {
      if (value.is_object()) {
        r.fail(object_key, fmt::format("holds \"{}\": {}: rotary settings per layer type are not "
                                       "something zinf's decoder computes",
                                       name, value.dump()));
      }
    }
  }
  const ConfigReader nested(fmt::format("{} \"{}\"", config_path, object_key),
                            object != nullptr ? *object : empty);
  *theta = nested.number_or("rope_theta", *theta);
  const char* type_key = nested.get("rope_type") != nullptr ? "rope_type" : "type";
  const std::string type = nested.string_or(type_key, "default");
  if (nested.get("partial_rotary_factor") != nullptr &&
      nested.number_or("partial_rotary_factor", 1.0) != 1.0) {
    nested.fail("partial_rotary_factor", "must be 1.0: zinf rotates whole heads");
  }
  RopeScaling s;
  if (type == "default") return s;
  if (type == "linear") {
    s.type = RopeType::kLinear;
  } else if (type == "dynamic") {
    s.type = RopeType::kDynamic;
  } else if (type == "llama3") {
    s.type = RopeType::kLlama3;
  } else if (type == "yarn") {
    s.type = RopeType::kYarn;
  } else {
    nested.fail(type_key, fmt::format("is \"{}\": zinf computes the rotary types \"default\", "
                                      "\"linear\", \"dynamic\", \"llama3\" and \"yarn\"",
                                      type));
  }
  auto required = [&](const char* key) {
    if (nested.get(key) == nullptr) {
      nested.fail(key, fmt::format("is missing: rotary type \"{}\" needs it", type));
    }
    return nested.number_or(key, 1.0);
  };
  // The pretraining context of llama3 and yarn: a top-level original_max_position_embeddings
  // wins (as transformers reads Phi-3-style configs), then the nested one, then
  // max_position_embeddings.
  auto original_positions = [&] {
    if (r.get("original_max_position_embeddings") != nullptr) {
      return r.positive("original_max_position_embeddings");
    }
    return nested.positive_or("original_max_position_embeddings", max_positions);
  };
  switch (s.type) {
    case RopeType::kLinear:
    case RopeType::kDynamic:
      s.factor = required("factor");
      break;
    case RopeType::kLlama3:
      s.factor = required("factor");
      s.low_freq_factor = required("low_freq_factor");
      s.high_freq_factor = required("high_freq_factor");
      s.original_max_position_embeddings = original_positions();
      if (s.high_freq_factor <= s.low_freq_factor) {
        nested.fail("high_freq_factor", fmt::format("is {}: it must exceed low_freq_factor ({})",
                                                    s.high_freq_factor, s.low_freq_factor));
      }
      break;
    case RopeType::kYarn: {
      s.original_max_position_embeddings = original_positions();
      s.factor = nested.get("factor") != nullptr
                     ? nested.number_or("factor", 1.0)
                     : static_cast<double>(max_positions) /
                           static_cast<double>(s.original_max_position_embeddings);
      // 0 or absent: the defaults (transformers reads them with `or`).
      auto or_default = [&](const char* key, double fallback) {
        const nlohmann::json* v = nested.get(key);
        if (v == nullptr) return fallback;
        if (!v->is_number()) nested.fail(key, fmt::format("must be a number, not {}", v->dump()));
        return v->get<double>() == 0.0 ? fallback : v->get<double>();
      };
      s.beta_fast = or_default("beta_fast", 32.0);
      s.beta_slow = or_default("beta_slow", 1.0);
      s.truncate = nested.boolean_or("truncate", true);
      auto mscale_of = [](double scale, double mscale) {
        return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
      };
      if (nested.get("attention_factor") != nullptr) {
        s.attention_factor = nested.number_or("attention_factor", 1.0);
      } else {
        const double mscale = or_default("mscale", 0.0);
        const double mscale_all_dim = or_default("mscale_all_dim", 0.0);
        s.attention_factor = mscale != 0.0 && mscale_all_dim != 0.0
                                 ? mscale_of(s.factor, mscale) / mscale_of(s.factor, mscale_all_dim)
                                 : mscale_of(s.factor, 1.0);
      }
      break;
    }
    case RopeType::kDefault:
      break;
  }
  return s;
}

// Each layer's attention window (empty: none), as transformers decides it per family: Mistral
// slides every layer over sliding_window (4096 when the key is absent; null: no window);
// Qwen2 and Qwen3 only when use_sliding_window is true, on the layers layer_types marks
// "sliding_attention" (or, without layer_types, from max_window_layers on). A Llama has none.
std::vector<int64_t> read_attention_windows(const ConfigReader& r, const std::string& model_type,
                                            int64_t layers) {
  auto window_of = [&](int64_t fallback) -> int64_t {
    const auto it = r.root().find("sliding_window");
    if (it == r.root().end()) return fallback;
    if (it->is_null()) return 0;
    return r.positive("sliding_window");
  };
  if (model_type == "mistral") {
    const int64_t window = window_of(4096);
    return window == 0 ? std::vector<int64_t>{}
                       : std::vector<int64_t>(static_cast<size_t>(layers), window);
  }
  if (model_type != "qwen2" && model_type != "qwen3") return {};
  const int64_t window = r.boolean_or("use_sliding_window", false) ? window_of(4096) : 0;
  std::vector<int64_t> windows(static_cast<size_t>(layers), 0);
  if (const nlohmann::json* types = r.get("layer_types")) {
    if (!types->is_array() || types->size() != static_cast<size_t>(layers)) {
      r.fail("layer_types", fmt::format("must list one type for each of the {} layers, not {}",
                                        layers, types->dump()));
    }
    for (size_t i = 0; i < windows.size(); ++i) {
      const nlohmann::json& t = (*types)[i];
      if (t == "full_attention") continue;
      if (t != "sliding_attention") {
        r.fail("layer_types", fmt::format("has {} at {}: zinf computes \"full_attention\" and "
                                          "\"sliding_attention\"",
                                          t.dump(), i));
      }
      if (window == 0) {
        r.fail("layer_types",
               fmt::format("marks layer {} \"sliding_attention\" but no window applies "
                           "(use_sliding_window is not true, or sliding_window is null): "
                           "transformers refuses this config too",
                           i));
      }
      windows[i] = window;
    }
  } else if (window > 0) {
    int64_t first = 28;  // Qwen2Config's and Qwen3Config's default
    if (const nlohmann::json* m = r.get("max_window_layers")) {
      if (!m->is_number_integer()) {
        r.fail("max_window_layers", fmt::format("must be an integer, not {}", m->dump()));
      }
      first = m->get<int64_t>();
    }
    for (int64_t i = std::max<int64_t>(first, 0); i < layers; ++i) {
      windows[static_cast<size_t>(i)] = window;
    }
  }
  for (int64_t w : windows) {
    if (w > 0) return windows;
  }
  return {};
}

}  // namespace

LlamaConfig read_hf_llama_config(const std::string& config_path, std::string* torch_dtype) {
  std::ifstream in(config_path);
  if (!in) {
    throw HfCheckpointError(
        fmt::format("{}: cannot be read (a Hugging Face model folder holds "
                    "config.json beside its safetensors files)",
                    config_path));
  }
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw HfCheckpointError(fmt::format("{}: not valid JSON: {}", config_path, e.what()));
  }
  if (!root.is_object()) {
    throw HfCheckpointError(fmt::format("{}: not a JSON object", config_path));
  }
  const ConfigReader r(config_path, root);

  // The families whose decoder zinf's model computes (what differs between them is read
  // below, with each family's own defaults for keys config.json leaves out).
  const std::string model_type = r.string_or("model_type", "llama");
  if (model_type != "llama" && model_type != "mistral" && model_type != "qwen2" &&
      model_type != "qwen3") {
    r.fail("model_type", fmt::format("is \"{}\": zinf's decoder computes \"llama\", \"mistral\", "
                                     "\"qwen2\" and \"qwen3\" models",
                                     model_type));
  }
  const bool qwen = model_type == "qwen2" || model_type == "qwen3";
  LlamaConfig c;
  c.name = fs::path(config_path).parent_path().filename().string();
  c.model_type = model_type;
  c.hidden_size = r.positive("hidden_size");
  c.intermediate_size = r.positive("intermediate_size");
  c.num_layers = r.positive("num_hidden_layers");
  c.num_heads = r.positive("num_attention_heads");
  c.vocab_size = r.positive("vocab_size");
  const int64_t default_positions = model_type == "mistral" ? 131072 : qwen ? 32768 : 2048;
  c.max_seq_len = r.positive_or("max_position_embeddings", default_positions);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.rope_theta = r.number_or("rope_theta", 10000.0);
  c.rope_scaling = read_rope_scaling(r, config_path, &c.rope_theta, c.max_seq_len);
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);

  // Grouped-query attention (Llama 3, Mistral, Qwen2, SmolLM, TinyLlama): each key/value head
  // serves num_attention_heads / num_key_value_heads query heads.
  // Left out, each family's default (MistralConfig 8, Qwen2Config and Qwen3Config 32, Llama
  // the query heads); null means the query heads.
  const int64_t default_kv_heads = model_type == "mistral" ? 8 : qwen ? 32 : c.num_heads;
  c.num_kv_heads = r.root().contains("num_key_value_heads")
                       ? r.positive_or("num_key_value_heads", c.num_heads)
                       : default_kv_heads;
  if (c.num_heads % c.num_kv_heads != 0) {
    r.fail("num_key_value_heads", fmt::format("is {}: it must divide num_attention_heads ({})",
                                              c.num_kv_heads, c.num_heads));
  }
  if (r.get("head_dim") != nullptr) {
    c.head_dim = r.positive("head_dim");
  } else if (model_type == "qwen3") {
    c.head_dim = 128;  // Qwen3Config's default, whatever hidden_size / heads is
  } else if (c.hidden_size % c.num_heads != 0) {
    r.fail("num_attention_heads",
           fmt::format("is {} and hidden_size {} is not a multiple of it: give head_dim",
                       c.num_heads, c.hidden_size));
  }
  if (c.head_size() % 2 != 0) {
    r.fail("head_dim",
           fmt::format("is {}: rotary positions need an even head size", c.head_size()));
  }
  const std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu") {
    r.fail("hidden_act", fmt::format("is \"{}\": the MLP zinf computes is SwiGLU (\"silu\")", act));
  }
  if (const nlohmann::json* dropout = r.get("attention_dropout")) {
    if (!dropout->is_number() || dropout->get<double>() != 0.0) {
      r.fail("attention_dropout",
             fmt::format("is {}: zinf trains without attention dropout (0.0)", dropout->dump()));
    }
  }
  if (r.get("partial_rotary_factor") != nullptr &&
      r.number_or("partial_rotary_factor", 1.0) != 1.0) {
    r.fail("partial_rotary_factor", fmt::format("is {}: zinf rotates whole heads (1.0)",
                                                r.get("partial_rotary_factor")->dump()));
  }

  // Biases and norms, per family: Llama's attention_bias covers q, k, v and o, its mlp_bias
  // the MLP; Mistral has none; Qwen2 always has q, k and v biases and no other; Qwen3 has
  // attention_bias like Llama and an RMSNorm on each query and key head.
  if (model_type == "llama" || model_type == "qwen3") {
    c.qkv_bias = c.o_bias = r.boolean_or("attention_bias", false);
  } else if (model_type == "qwen2") {
    c.qkv_bias = true;
  }
  if (model_type == "llama") c.mlp_bias = r.boolean_or("mlp_bias", false);
  c.qk_norm = model_type == "qwen3";

  c.attention_windows = read_attention_windows(r, model_type, c.num_layers);
  // Recent transformers write "dtype" where older ones wrote "torch_dtype".
  const char* dtype_key =
      r.get("torch_dtype") == nullptr && r.get("dtype") != nullptr ? "dtype" : "torch_dtype";
  const std::string dtype = r.string_or(dtype_key, "");
  if (!dtype.empty() && dtype != "float32" && dtype != "bfloat16" && dtype != "float16") {
    r.fail(dtype_key,
           fmt::format("is \"{}\": weights must be float32, bfloat16 or float16", dtype));
  }
  if (torch_dtype != nullptr) *torch_dtype = dtype;
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw HfCheckpointError(fmt::format("{}: {}", config_path, e.what()));
  }
  return c;
}

HfCheckpoint HfCheckpoint::open(const std::string& directory) {
  HfCheckpoint ckpt;
  ckpt.directory_ = directory;
  const fs::path dir(directory);
  ckpt.config_ = read_hf_llama_config((dir / "config.json").string(), &ckpt.torch_dtype_);

  const fs::path index_path = dir / kIndexFile;
  const fs::path single_path = dir / kSingleFile;
  try {
    if (fs::exists(index_path)) {
      const serialization::SafetensorsIndex index =
          serialization::read_safetensors_index(index_path.string());
      for (const auto& [tensor, shard] : index.weight_map) {
        if (!fs::exists(dir / shard)) {
          throw HfCheckpointError(fmt::format(
              "{}: the weight_map places tensor \"{}\" in \"{}\", which is missing from {}",
              index_path.string(), tensor, shard, directory));
        }
      }
      ckpt.sharded_ = serialization::ShardedSafetensorsReader::open(index_path.string());
    } else if (fs::exists(single_path)) {
      ckpt.single_ = SafetensorsReader::open(single_path.string());
    } else {
      throw HfCheckpointError(
          fmt::format("{}: neither {} nor {} is there", directory, kSingleFile, kIndexFile));
    }
  } catch (const serialization::SerializationError& e) {
    throw HfCheckpointError(e.what());
  }
  ckpt.check_tensors();
  return ckpt;
}

std::string HfCheckpoint::describe() const {
  if (sharded_) {
    return fmt::format("{} ({} shards)", kIndexFile, sharded_->shards().size());
  }
  return kSingleFile;
}

HfCheckpoint::Source HfCheckpoint::find(const std::string& name) const {
  // A tied head is the embedding.
  const std::string key =
      config_.tie_embeddings && name == "lm_head.weight" ? "model.embed_tokens.weight" : name;
  if (sharded_) {
    const auto [reader, tensor] = sharded_->find(key);
    if (tensor == nullptr) {
      throw HfCheckpointError(fmt::format("{}: tensor \"{}\" is missing from the weight_map",
                                          (fs::path(directory_) / kIndexFile).string(), key));
    }
    return {reader, tensor};
  }
  const TensorInfo* tensor = single_->find(key);
  if (tensor == nullptr) {
    throw HfCheckpointError(fmt::format("{}: tensor \"{}\" is missing", single_->name(), key));
  }
  return {&*single_, tensor};
}

void HfCheckpoint::check_tensors() const {
  std::set<std::string> expected;
  for (const LlamaParameterShape& p : llama_parameter_shapes(config_)) {
    expected.insert(p.name);
    const Source s = find(p.name);
    if (scalar_type(s.tensor->dtype) == at::ScalarType::Undefined) {
      throw HfCheckpointError(
          fmt::format("{}: tensor \"{}\" has dtype {}; zinf reads F32, BF16 and F16",
                      s.reader->name(), p.name, serialization::dtype_name(s.tensor->dtype)));
    }
    if (s.tensor->shape != unsigned_shape(p.shape)) {
      throw HfCheckpointError(fmt::format(
          "{}: tensor \"{}\" has shape {} but config.json's model needs {}", s.reader->name(),
          p.name, shape_text(s.tensor->shape), shape_text(unsigned_shape(p.shape))));
    }
  }
  auto check_known = [&](const SafetensorsReader& reader) {
    for (const TensorInfo& t : reader.tensors()) {
      if (expected.contains(t.name) || ends_with(t.name, ".rotary_emb.inv_freq") ||
          (config_.tie_embeddings && t.name == "lm_head.weight")) {
        continue;
      }
      throw HfCheckpointError(
          fmt::format("{}: tensor \"{}\" is not a parameter of the {} model config.json "
                      "describes (zinf does not drop weights silently)",
                      reader.name(), t.name, config_.model_type));
    }
  };
  if (sharded_) {
    for (const auto& [shard, reader] : sharded_->shards()) check_known(reader);
  } else {
    check_known(*single_);
  }
}

void HfCheckpoint::read(const std::string& name, torch::Tensor& full) const {
  const Source s = find(name);
  const std::vector<uint64_t> want(full.sizes().begin(), full.sizes().end());
  if (s.tensor->shape != want || full.scalar_type() != at::kFloat || !full.is_contiguous()) {
    throw HfCheckpointError(fmt::format(
        "{}: tensor \"{}\" of shape {} cannot fill a {} {} parameter", s.reader->name(), name,
        shape_text(s.tensor->shape), shape_text(want), c10::toString(full.scalar_type())));
  }
  const std::span<const uint8_t> bytes = s.reader->data(*s.tensor);
  // The mapping is read-only; from_blob's non-const pointer is only read by copy_.
  const at::Tensor source = at::from_blob(const_cast<uint8_t*>(bytes.data()), full.sizes(),
                                          at::TensorOptions().dtype(scalar_type(s.tensor->dtype)));
  at::NoGradGuard no_grad;
  full.copy_(source);
  release_pages(bytes);
}

zero::ZeroModel::Initializer HfCheckpoint::initializer() const {
  return [this](const std::string& name, torch::Tensor& full) { read(name, full); };
}

}  // namespace zinf::engine
