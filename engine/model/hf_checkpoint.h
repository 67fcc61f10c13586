// Initial weights from a Hugging Face Llama folder (`zinf train --init-from DIR`): config.json
// and either model.safetensors or the sharded model-0000k-of-0000N.safetensors files with
// model.safetensors.index.json.
//
// HfCheckpoint::open() reads config.json into a LlamaConfig and maps the weight files
// (serialization's readers: nothing is read but their headers), then checks the whole
// folder before any weight is used, so a bad folder fails before training starts with one
// message naming the file and the tensor or key:
//   - config.json: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads
//     and vocab_size present and positive; rms_norm_eps (default 1e-6), rope_theta (10000),
//     max_position_embeddings (2048), tie_word_embeddings (false) of the right type;
//     num_key_value_heads (grouped-query attention; it must divide num_attention_heads) and
//     head_dim (default hidden_size / num_attention_heads; even); and nothing the reference
//     model cannot honour: model_type other than "llama", hidden_act other than "silu",
//     attention_bias or mlp_bias true, a rope_scaling, a torch_dtype (or "dtype", as recent
//     transformers name it) other than float32, bfloat16 or float16;
//   - weights: every parameter of that LlamaModel present (a tied head may be absent: it is
//     the embedding) with its shape and dtype F32, BF16 or F16; no other tensor except
//     `*.rotary_emb.inv_freq` (older checkpoints store it; the model computes it) and a tied
//     `lm_head.weight` (ignored, as Hugging Face ties it to the embedding); every shard the
//     index names present.
//
// read() converts one tensor to fp32 straight from the mapping into the caller's buffer and
// then drops the mapping's pages of it, so a rank holds one parameter at a time, never the
// whole model: handed to the Engine as its Initializer (initializer()), each parameter is read
// just before it is partitioned.
//
// Rotary positions: Hugging Face's Llama rotates the two halves of each head
// (rotate_half), and so does LlamaModel: the q_proj / k_proj weights load unchanged.
//
// Errors: HfCheckpointError (a std::runtime_error); what() names the file and the tensor or
// key. Thread safety: immutable after open(); read() may be called from several threads.
#pragma once

#include <torch/types.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "engine/model/llama.h"
#include "serialization/safetensors.h"
#include "zero/zero_model.h"

namespace zinf::engine {

class HfCheckpointError : public std::runtime_error {
 public:
  explicit HfCheckpointError(const std::string& message) : std::runtime_error(message) {}
};

// The model shape in a Hugging Face Llama config.json (checked as HfCheckpoint::open does).
// `torch_dtype` receives its torch_dtype ("" when absent or null). Throws HfCheckpointError.
[[nodiscard]] LlamaConfig read_hf_llama_config(const std::string& config_path,
                                               std::string* torch_dtype = nullptr);

class HfCheckpoint {
 public:
  // Reads and checks the folder (see above). Throws HfCheckpointError.
  [[nodiscard]] static HfCheckpoint open(const std::string& directory);

  HfCheckpoint(HfCheckpoint&&) noexcept = default;
  HfCheckpoint& operator=(HfCheckpoint&&) noexcept = default;
  HfCheckpoint(const HfCheckpoint&) = delete;
  HfCheckpoint& operator=(const HfCheckpoint&) = delete;

  // The model to build (name: the folder's name).
  [[nodiscard]] const LlamaConfig& config() const noexcept { return config_; }
  // config.json's torch_dtype ("bfloat16", ...; "" when absent).
  [[nodiscard]] const std::string& torch_dtype() const noexcept { return torch_dtype_; }
  [[nodiscard]] const std::string& directory() const noexcept { return directory_; }
  // "model.safetensors" or "model.safetensors.index.json (3 shards)".
  [[nodiscard]] std::string describe() const;

  // Writes the values of parameter `name` (a LlamaModel parameter name) into `full`, an fp32
  // tensor of the parameter's shape. Throws HfCheckpointError naming the file and tensor.
  void read(const std::string& name, torch::Tensor& full) const;
  // read() as the Engine's Initializer; this checkpoint must outlive it and stay where it is
  // (not moved from).
  [[nodiscard]] zero::ZeroModel::Initializer initializer() const;

 private:
  HfCheckpoint() = default;
  // The tensor holding parameter `name` and the file it is in; throws when absent.
  struct Source {
    const serialization::SafetensorsReader* reader = nullptr;
    const serialization::TensorInfo* tensor = nullptr;
  };
  [[nodiscard]] Source find(const std::string& name) const;
  void check_tensors() const;

  std::string directory_;
  LlamaConfig config_;
  std::string torch_dtype_;
  std::optional<serialization::SafetensorsReader> single_;
  std::optional<serialization::ShardedSafetensorsReader> sharded_;
};

}  // namespace zinf::engine
