// The reference model of `zinf train`: a Llama-style decoder in LibTorch — token embedding,
// decoder layers (RMSNorm, multi-head causal self-attention with rotary positions, RMSNorm,
// SwiGLU MLP, residual connections), a final RMSNorm and an output head, optionally tied to
// the embedding. The same decoder covers the families transformers writes as model_type
// "llama", "mistral", "qwen2" and "qwen3": grouped-query attention, an explicit head_dim,
// scaled rotary positions (linear, dynamic NTK, Llama 3, YaRN), projection biases (Llama's
// attention_bias and mlp_bias, Qwen2's q/k/v biases), Qwen3's per-head q/k RMSNorm and
// sliding-window attention (Mistral; Qwen's sliding layers). Parameter names follow Hugging Face's
// Llama (`model.embed_tokens.weight`, `model.layers.0.self_attn.q_proj.weight`, ...,
// `lm_head.weight`), so consolidated checkpoints load into HF tools and HF checkpoints load here.
//
// Each decoder layer is wrapped in a zero::ZeroBlock: under stage 3 a layer's parameters
// exist in full only while it runs. Construction allocates parameters without writing them
// (so a model larger than RAM can be built and partitioned one parameter at a time); their
// values come from init_parameter(), a function of the seed and the parameter's name alone —
// the same model for any world size, rank or construction order.
//
// Precision: the layers compute in their parameters' dtype (fp32, bf16 or fp16); RMSNorm
// and softmax run in fp32; logits are returned in fp32. On CPU fp16 tensors the ops LibTorch
// 1.13 has no CPU fp16 kernel for (kCpuFp16InFp32) run in fp32 and round their results to
// fp16, as a GPU's fp16 GEMM accumulates in fp32; parameters, activations and gradients stay
// fp16.
//
// Thread safety: as torch::nn::Module.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/memory_plan.h"
#include "zero/zero_block.h"

namespace zinf::engine {

// The ops computed in fp32 and rounded to fp16 when the model runs in fp16 on the CPU (their
// LibTorch 1.13 CPU kernels do not exist for fp16), for start-up notes.
inline constexpr const char* kCpuFp16InFp32 = "matmuls (addmm, bmm) and SiLU";

// How rotary positions are scaled (transformers' rope_parameters / rope_scaling "rope_type").
enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kYarn };

// "default", "linear", "dynamic", "llama3", "yarn".
[[nodiscard]] const char* rope_type_name(RopeType type) noexcept;

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;  // linear, dynamic, llama3, yarn
  // llama3: wavelengths above original / low_freq_factor are divided by factor, those below
  // original / high_freq_factor kept, those between blended.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and yarn: the context length the model was pretrained with.
  int64_t original_max_position_embeddings = 0;
  // yarn: the rotation counts bounding the blend, and the factor cos and sin are scaled by
  // (resolved from factor, mscale and mscale_all_dim when the config does not give it).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 1.0;
  bool truncate = true;
};

struct LlamaConfig {
  std::string name = "custom";
  // transformers' model_type: "llama", "mistral", "qwen2" or "qwen3" (what config.json said;
  // the fields below carry every difference the model computes).
  std::string model_type = "llama";
  int64_t vocab_size = 256;
  int64_t hidden_size = 64;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  // Key/value heads (grouped-query attention: each serves num_heads / num_kv_heads query
  // heads; 1 is multi-query attention); 0 means num_heads.
  int64_t num_kv_heads = 0;
  // Elements per head; 0 means hidden_size / num_heads. q_proj is [num_heads * head_dim,
  // hidden], k_proj and v_proj [num_kv_heads * head_dim, hidden], o_proj [hidden,
  // num_heads * head_dim].
  int64_t head_dim = 0;
  int64_t intermediate_size = 176;
  int64_t max_seq_len = 256;
  bool tie_embeddings = false;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-5;
  // Biases: q_proj, k_proj and v_proj (Llama's attention_bias, Qwen2's); o_proj (Llama's
  // attention_bias, not Qwen2's); gate_proj, up_proj and down_proj (Llama's mlp_bias).
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  // Qwen3: an RMSNorm over each query and key head (self_attn.q_norm, self_attn.k_norm, of
  // head_dim elements) before the rotary positions.
  bool qk_norm = false;
  // Per layer, how many positions a query sees (itself and the window - 1 before it): 0 is
  // plain causal attention. Empty: every layer plain causal.
  std::vector<int64_t> attention_windows;
  // Element type the parameters are allocated in (LlamaModelImpl sets it from its argument).
  at::ScalarType dtype = at::kFloat;

  [[nodiscard]] int64_t kv_heads() const noexcept {
    return num_kv_heads > 0 ? num_kv_heads : num_heads;
  }
  [[nodiscard]] int64_t head_size() const noexcept {
    return head_dim > 0 ? head_dim : hidden_size / num_heads;
  }
  // Layer `layer`'s attention window (0: none).
  [[nodiscard]] int64_t attention_window(int64_t layer) const noexcept {
    return layer < static_cast<int64_t>(attention_windows.size())
               ? attention_windows[static_cast<size_t>(layer)]
               : 0;
  }
  // Parameter count of this shape (tied embeddings counted once): the sum over
  // llama_parameter_shapes().
  [[nodiscard]] int64_t parameter_count() const noexcept;
  // Throws std::invalid_argument naming the field (e.g. hidden_size not divisible by heads).
  void validate() const;
};

// What the model computes beyond a plain Llama, for start-up lines: "qwen3; q/k RMSNorm;
// rotary yarn x4 (from 32 positions, attention factor 1.139); sliding window 4 on 2 of 4
// layers"; "" for a plain Llama.
[[nodiscard]] std::string architecture_notes(const LlamaConfig& config);

// Named shapes: "tiny", "small", "125m", "350m", "1b", "3b", "7b", "13b" (vocab set by the
// caller; the last two for `zinf estimate`).
// nullopt for an unknown name.
[[nodiscard]] std::optional<LlamaConfig> named_llama(const std::string& name, int64_t vocab_size);
// "tiny, small, 125m, ..."
[[nodiscard]] std::string named_llama_list();

// One parameter of the model as HF names it, without building the model (for `zinf estimate`
// and plans of models too large to construct here).
struct LlamaParameterShape {
  std::string name;
  int64_t numel = 0;
  bool in_block = false;       // a decoder layer's (inside a ZeroBlock)
  std::vector<int64_t> shape;  // as LlamaModel allocates it ([out, in] for projections)
  bool tied = false;           // also the output head (tie_word_embeddings)
};
// In the order LlamaModel registers them; a tied head is not listed again.
[[nodiscard]] std::vector<LlamaParameterShape> llama_parameter_shapes(const LlamaConfig& config);

// Activations of one micro-batch of `batch` x `seq` tokens with `element_bytes`-byte
// activations under ZeroBlock recomputation: every layer's saved input, and the working set —
// the residual stream into and out of the stack, one layer's forward and backward
// intermediates (attention scores in fp32 included), and the fp32 logits with their
// gradient. An estimate for the memory plan, not a bound.
[[nodiscard]] ActivationEstimate llama_activations(const LlamaConfig& config, int64_t batch,
                                                   int64_t seq, int64_t element_bytes);

// y = x / rms(x) * weight, computed in fp32.
struct RmsNormImpl : torch::nn::Module {
  RmsNormImpl(int64_t dim, double eps, at::ScalarType dtype = at::kFloat);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RmsNorm);

// A linear map, with a bias when asked, whose parameters are allocated but not initialised.
struct ProjectionImpl : torch::nn::Module {
  ProjectionImpl(int64_t in, int64_t out, at::ScalarType dtype = at::kFloat, bool bias = false);
  // Shares `weight` (a tied output head).
  explicit ProjectionImpl(torch::Tensor shared_weight);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;  // [out, in]
  torch::Tensor bias;    // [out], or undefined
};
TORCH_MODULE(Projection);

// The rotary inverse frequencies [head_dim / 2] (fp32, on `device`) for sequences of `seq`
// positions, and in *scaling the factor cos and sin are multiplied by, as transformers
// computes them for config.rope_scaling. A dynamic scaling depends on `seq` (a fresh
// transformers model computes the same for its first forward of that length; transformers then
// keeps the longest length it has seen until a sequence shorter than max_position_embeddings
// comes, where zinf computes every forward from its own length).
[[nodiscard]] at::Tensor rope_inverse_frequencies(const LlamaConfig& config, int64_t seq,
                                                  at::Device device, double* scaling);

struct AttentionImpl : torch::nn::Module {
  // `layer` picks the layer's attention window.
  AttentionImpl(const LlamaConfig& config, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x);  // [batch, seq, hidden]
  Projection q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3's; null otherwise
  LlamaConfig config;                        // the rotary settings
  int64_t heads;
  int64_t kv_heads;
  int64_t head_dim;
  int64_t window;  // 0: plain causal
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  Projection gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

struct DecoderLayerImpl : torch::nn::Module {
  DecoderLayerImpl(const LlamaConfig& config, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x);
  RmsNorm input_layernorm{nullptr};
  Attention self_attn{nullptr};
  RmsNorm post_attention_layernorm{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

// A token embedding whose weight is allocated but not initialised.
struct EmbeddingImpl : torch::nn::Module {
  EmbeddingImpl(int64_t vocab, int64_t dim, at::ScalarType dtype = at::kFloat);
  torch::Tensor forward(const torch::Tensor& tokens);
  torch::Tensor weight;  // [vocab, dim]
};
TORCH_MODULE(Embedding);

// `model.*`: embedding, layers, final norm.
struct LlamaBodyImpl : torch::nn::Module {
  explicit LlamaBodyImpl(const LlamaConfig& config);
  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layer_list{nullptr};
  std::vector<zero::ZeroBlock> layers;
  RmsNorm norm{nullptr};
};
TORCH_MODULE(LlamaBody);

class LlamaModelImpl : public torch::nn::Module {
 public:
  // Parameters are allocated in `dtype` (float, bfloat16 or half) and left uninitialised:
  // call initialize() or hand init_parameter() to a ZeroModel.
  LlamaModelImpl(const LlamaConfig& config, at::ScalarType dtype = at::kFloat);

  // tokens [batch, seq] (int64) -> logits [batch, seq, vocab] (fp32).
  torch::Tensor forward(const torch::Tensor& tokens);
  // tokens -> the final norm's output [batch, seq, hidden] (what the head maps to logits).
  torch::Tensor hidden_states(const torch::Tensor& tokens);
  // Mean cross-entropy of predicting targets [batch, seq] from tokens. Past
  // full_logits_limit() bytes of logits the head and the loss are computed together over
  // chunks of tokens, without the logits (lm_loss.h).
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets);

  // Fills every parameter with init_parameter(seed, name) (for models used without ZeRO).
  void initialize(uint64_t seed);

  [[nodiscard]] const LlamaConfig& config() const noexcept { return config_; }

  LlamaBody model{nullptr};
  Projection lm_head{nullptr};  // weight [vocab, hidden]; the embedding's when tied

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaModel);

// The initial values of parameter `name` of shape `full` (fp32, written in place): norms
// 1, every other weight N(0, 0.02) from a generator seeded by (seed, name). The same values
// whatever the world size or the order of calls.
void init_parameter(uint64_t seed, const std::string& name, torch::Tensor& full);

}  // namespace zinf::engine
