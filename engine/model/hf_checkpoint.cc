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

#include "engine/serialization/serialization_error.h"

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

  const std::string model_type = r.string_or("model_type", "llama");
  if (model_type != "llama") {
    r.fail("model_type", fmt::format("is \"{}\": zinf's reference model is a Llama", model_type));
  }
  LlamaConfig c;
  c.name = fs::path(config_path).parent_path().filename().string();
  c.hidden_size = r.positive("hidden_size");
  c.intermediate_size = r.positive("intermediate_size");
  c.num_layers = r.positive("num_hidden_layers");
  c.num_heads = r.positive("num_attention_heads");
  c.vocab_size = r.positive("vocab_size");
  c.max_seq_len = r.positive_or("max_position_embeddings", 2048);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.rope_theta = r.number_or("rope_theta", 10000.0);
  // Recent transformers (5.x) write the rotary settings as "rope_parameters": {"rope_theta":
  // ..., "rope_type": "default"}; only the default (unscaled) type is what the model computes.
  if (const nlohmann::json* rope = r.get("rope_parameters")) {
    if (!rope->is_object()) {
      r.fail("rope_parameters", fmt::format("must be an object, not {}", rope->dump()));
    }
    const ConfigReader nested(config_path + " \"rope_parameters\"", *rope);
    c.rope_theta = nested.number_or("rope_theta", c.rope_theta);
    const std::string type = nested.string_or("rope_type", "default");
    if (type != "default") {
      nested.fail("rope_type", fmt::format("is \"{}\": zinf's Llama supports plain rotary "
                                           "positions only (\"default\")",
                                           type));
    }
  }
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);

  // Grouped-query attention (Llama 3, Mistral, Qwen2, SmolLM, TinyLlama): each key/value head
  // serves num_attention_heads / num_key_value_heads query heads.
  c.num_kv_heads = r.positive_or("num_key_value_heads", c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0) {
    r.fail("num_key_value_heads", fmt::format("is {}: it must divide num_attention_heads ({})",
                                              c.num_kv_heads, c.num_heads));
  }
  if (r.get("head_dim") != nullptr && !r.get("head_dim")->is_null()) {
    c.head_dim = r.positive("head_dim");
    if (c.head_dim % 2 != 0) {
      r.fail("head_dim", fmt::format("is {}: rotary positions need an even head size", c.head_dim));
    }
  } else if (c.hidden_size % c.num_heads != 0) {
    r.fail("num_attention_heads",
           fmt::format("is {} and hidden_size {} is not a multiple of it: give head_dim",
                       c.num_heads, c.hidden_size));
  }
  const std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu") {
    r.fail("hidden_act", fmt::format("is \"{}\": zinf's Llama MLP is SwiGLU (\"silu\")", act));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (r.boolean_or(key, false)) {
      r.fail(key, "is true: zinf's Llama projections have no bias");
    }
  }
  if (const nlohmann::json* scaling = r.get("rope_scaling")) {
    r.fail("rope_scaling",
           fmt::format("is {}: zinf's Llama supports plain rotary positions only (null)",
                       scaling->dump()));
  }
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
          fmt::format("{}: tensor \"{}\" is not a parameter of the Llama model config.json "
                      "describes (zinf does not drop weights silently)",
                      reader.name(), t.name));
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
