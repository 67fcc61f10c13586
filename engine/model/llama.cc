#include "engine/model/llama.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#include "engine/model/attention.h"
#include "engine/model/fused_ops.h"
#include "engine/model/lm_loss.h"

namespace zinf::engine {
namespace {

// 64-bit FNV-1a of the name, mixed with the seed (splitmix64 finaliser).
uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h = (h ^ c) * 0x100000001b3ull;
  }
  uint64_t z = h ^ (seed + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

int64_t LlamaConfig::parameter_count() const noexcept {
  int64_t total = 0;
  for (const LlamaParameterShape& p : llama_parameter_shapes(*this)) total += p.numel;
  return total;
}

const char* rope_type_name(RopeType type) noexcept {
  switch (type) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kDynamic:
      return "dynamic";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
  }
  return "?";
}

void LlamaConfig::validate() const {
  auto positive = [](int64_t v, const char* field) {
    if (v <= 0) {
      throw std::invalid_argument(fmt::format("model {} must be positive, not {}", field, v));
    }
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_layers, "num_layers");
  positive(num_heads, "num_heads");
  positive(intermediate_size, "intermediate_size");
  positive(max_seq_len, "max_seq_len");
  if (num_kv_heads < 0 || head_dim < 0) {
    throw std::invalid_argument(
        fmt::format("model num_kv_heads {} and head_dim {} must not be negative (0: the default)",
                    num_kv_heads, head_dim));
  }
  if (head_dim == 0 && hidden_size % num_heads != 0) {
    throw std::invalid_argument(
        fmt::format("model hidden_size {} must split into num_heads {} heads (or give head_dim)",
                    hidden_size, num_heads));
  }
  if (head_size() % 2 != 0) {
    throw std::invalid_argument(
        fmt::format("model head_dim {} must be even (rotary positions rotate pairs)", head_size()));
  }
  if (num_heads % kv_heads() != 0) {
    throw std::invalid_argument(fmt::format(
        "model num_heads {} must be a multiple of num_kv_heads {}", num_heads, kv_heads()));
  }
  if (!attention_windows.empty() && attention_windows.size() != static_cast<size_t>(num_layers)) {
    throw std::invalid_argument(fmt::format("model attention_windows has {} entries for {} layers",
                                            attention_windows.size(), num_layers));
  }
  for (int64_t w : attention_windows) {
    if (w < 0) {
      throw std::invalid_argument(fmt::format("model attention window {} must not be negative", w));
    }
  }
  const RopeScaling& r = rope_scaling;
  if (r.type != RopeType::kDefault && !(r.factor > 0.0)) {
    throw std::invalid_argument(
        fmt::format("model rope_scaling factor {} must be positive", r.factor));
  }
  if ((r.type == RopeType::kLlama3 || r.type == RopeType::kYarn) &&
      r.original_max_position_embeddings <= 0) {
    throw std::invalid_argument(
        fmt::format("model rope_scaling of type {} needs original_max_position_embeddings",
                    rope_type_name(r.type)));
  }
  if (r.type == RopeType::kLlama3 && !(r.high_freq_factor > r.low_freq_factor)) {
    throw std::invalid_argument(
        fmt::format("model rope_scaling high_freq_factor {} must exceed low_freq_factor {}",
                    r.high_freq_factor, r.low_freq_factor));
  }
}

std::string architecture_notes(const LlamaConfig& c) {
  std::vector<std::string> notes;
  if (c.model_type != "llama") notes.push_back(c.model_type);
  std::vector<std::string> biases;
  if (c.qkv_bias) biases.emplace_back("q/k/v");
  if (c.o_bias) biases.emplace_back("o");
  if (c.mlp_bias) biases.emplace_back("MLP");
  if (!biases.empty()) notes.push_back(fmt::format("{} biases", fmt::join(biases, ", ")));
  if (c.qk_norm) notes.emplace_back("q/k RMSNorm");
  const RopeScaling& r = c.rope_scaling;
  switch (r.type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear:
    case RopeType::kDynamic:
      notes.push_back(fmt::format("rotary {} x{:g}", rope_type_name(r.type), r.factor));
      break;
    case RopeType::kLlama3:
      notes.push_back(fmt::format("rotary llama3 x{:g} (from {} positions)", r.factor,
                                  r.original_max_position_embeddings));
      break;
    case RopeType::kYarn:
      notes.push_back(fmt::format("rotary yarn x{:g} (from {} positions, attention factor {:.4g})",
                                  r.factor, r.original_max_position_embeddings,
                                  r.attention_factor));
      break;
  }
  int64_t sliding = 0;
  int64_t window = 0;
  for (int64_t w : c.attention_windows) {
    if (w > 0) ++sliding, window = std::max(window, w);
  }
  if (sliding > 0) {
    notes.push_back(
        fmt::format("sliding window {} on {} of {} layers", window, sliding, c.num_layers));
  }
  return fmt::format("{}", fmt::join(notes, "; "));
}

std::optional<LlamaConfig> named_llama(const std::string& name, int64_t vocab_size) {
  LlamaConfig c;
  c.name = name;
  c.vocab_size = vocab_size;
  // hidden, layers, heads, intermediate (SwiGLU: about 8/3 hidden, rounded to 8)
  if (name == "tiny") {
    c.hidden_size = 64, c.num_layers = 2, c.num_heads = 4, c.intermediate_size = 176;
  } else if (name == "small") {
    c.hidden_size = 256, c.num_layers = 4, c.num_heads = 8, c.intermediate_size = 688;
  } else if (name == "125m") {
    c.hidden_size = 768, c.num_layers = 12, c.num_heads = 12, c.intermediate_size = 2048;
  } else if (name == "350m") {
    c.hidden_size = 1024, c.num_layers = 24, c.num_heads = 16, c.intermediate_size = 2816;
  } else if (name == "1b") {
    c.hidden_size = 2048, c.num_layers = 16, c.num_heads = 32, c.intermediate_size = 5504;
  } else if (name == "3b") {
    c.hidden_size = 3200, c.num_layers = 26, c.num_heads = 32, c.intermediate_size = 8640;
  } else if (name == "7b") {
    c.hidden_size = 4096, c.num_layers = 32, c.num_heads = 32, c.intermediate_size = 11008;
  } else if (name == "13b") {
    c.hidden_size = 5120, c.num_layers = 40, c.num_heads = 40, c.intermediate_size = 13824;
  } else {
    return std::nullopt;
  }
  return c;
}

std::string named_llama_list() { return "tiny, small, 125m, 350m, 1b, 3b, 7b, 13b"; }

std::vector<LlamaParameterShape> llama_parameter_shapes(const LlamaConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t inter = c.intermediate_size;
  std::vector<LlamaParameterShape> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool in_block) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    out.push_back({std::move(name), numel, in_block, std::move(shape)});
  };
  add("model.embed_tokens.weight", {c.vocab_size, h}, false);
  out.back().tied = c.tie_embeddings;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    const int64_t q = c.num_heads * c.head_size();
    const int64_t kv = c.kv_heads() * c.head_size();
    // In transformers' registration order: each projection's weight, then its bias.
    auto projection = [&](const std::string& name, int64_t rows, int64_t cols, bool bias) {
      add(p + name + ".weight", {rows, cols}, true);
      if (bias) add(p + name + ".bias", {rows}, true);
    };
    projection("self_attn.q_proj", q, h, c.qkv_bias);
    projection("self_attn.k_proj", kv, h, c.qkv_bias);
    projection("self_attn.v_proj", kv, h, c.qkv_bias);
    projection("self_attn.o_proj", h, q, c.o_bias);
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {c.head_size()}, true);
      add(p + "self_attn.k_norm.weight", {c.head_size()}, true);
    }
    projection("mlp.gate_proj", inter, h, c.mlp_bias);
    projection("mlp.up_proj", inter, h, c.mlp_bias);
    projection("mlp.down_proj", h, inter, c.mlp_bias);
    add(p + "input_layernorm.weight", {h}, true);
    add(p + "post_attention_layernorm.weight", {h}, true);
  }
  add("model.norm.weight", {h}, false);
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab_size, h}, false);
  return out;
}

ActivationEstimate llama_activations(const LlamaConfig& c, int64_t batch, int64_t seq,
                                     int64_t element_bytes) {
  const auto tokens = static_cast<uint64_t>(batch * seq);
  const auto e = static_cast<uint64_t>(element_bytes);
  const auto h = static_cast<uint64_t>(c.hidden_size);
  const auto inter = static_cast<uint64_t>(c.intermediate_size);
  // Saved block inputs, one per layer; the residual stream in and out of the stack.
  ActivationEstimate a;
  a.saved_input_bytes = tokens * h * e;
  a.saved_inputs = static_cast<uint64_t>(c.num_layers);
  const uint64_t stream = 2 * tokens * h * e;
  // One layer recomputed with grad: norms, q/k/v/o and rotary copies (~8 h), the MLP's
  // gate/up/silu/product (4 inter), scores and probabilities in fp32 and the dtype; their
  // gradients about as much again.
  // Past full_scores_limit() the attention holds one chunk of them (about 16 MiB of fp32)
  // and fp32 accumulators for the key and value gradients instead (attention.h).
  const uint64_t score_elements = static_cast<uint64_t>(batch) *
                                  static_cast<uint64_t>(c.num_heads) * static_cast<uint64_t>(seq) *
                                  static_cast<uint64_t>(seq);
  const uint64_t scores =
      score_elements * 4 <= full_scores_limit()
          ? score_elements * (4 + 4 + e)
          : kScoresChunkBytes / 4 * (4 + 4 + e) +
                2 * tokens * static_cast<uint64_t>(c.num_heads * c.head_size()) * 4;
  const uint64_t layer = 2 * (tokens * (8 * h + 4 * inter) * e + scores);
  // fp32 logits, their softmax and gradient; past full_logits_limit() one chunk of them
  // (about 32 MiB) twice and an fp32 accumulator for the head's gradient (lm_loss.h).
  const uint64_t vocab = static_cast<uint64_t>(c.vocab_size);
  const uint64_t logits = tokens * vocab * 4 <= full_logits_limit()
                              ? 3 * tokens * vocab * 4
                              : 2 * kLogitsChunkBytes + vocab * h * 4;
  a.working_bytes = stream + layer + logits;
  return a;
}

// ---- modules -------------------------------------------------------------------------------

RmsNormImpl::RmsNormImpl(int64_t dim, double eps_, at::ScalarType dtype) : eps(eps_) {
  weight = register_parameter("weight", at::empty({dim}, dtype));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) { return rms_norm(x, weight, eps); }

ProjectionImpl::ProjectionImpl(int64_t in, int64_t out, at::ScalarType dtype, bool with_bias) {
  weight = register_parameter("weight", at::empty({out, in}, dtype));
  if (with_bias) bias = register_parameter("bias", at::empty({out}, dtype));
}

ProjectionImpl::ProjectionImpl(torch::Tensor shared_weight) {
  weight = register_parameter("weight", std::move(shared_weight));
}

torch::Tensor ProjectionImpl::forward(const torch::Tensor& x) {
  const at::Tensor y = portable_matmul(x, weight.t());
  return bias.defined() ? y + bias : y;
}

EmbeddingImpl::EmbeddingImpl(int64_t vocab, int64_t dim, at::ScalarType dtype) {
  weight = register_parameter("weight", at::empty({vocab, dim}, dtype));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& tokens) {
  return at::embedding(weight, tokens);
}

at::Tensor rope_inverse_frequencies(const LlamaConfig& c, int64_t seq, at::Device device,
                                    double* scaling) {
  // Computed in fp32 with the ops transformers uses, so the angles agree to the last bit
  // where the formulas are the same.
  const at::TensorOptions f32 = at::TensorOptions().device(device).dtype(at::kFloat);
  const int64_t dim = c.head_size();
  const RopeScaling& r = c.rope_scaling;
  *scaling = 1.0;
  double base = c.rope_theta;
  if (r.type == RopeType::kDynamic) {
    // NTK-aware: past max_position_embeddings the base grows with the sequence.
    const double len = static_cast<double>(std::max(seq, c.max_seq_len));
    base *= std::pow(r.factor * len / static_cast<double>(c.max_seq_len) - (r.factor - 1.0),
                     static_cast<double>(dim) / static_cast<double>(dim - 2));
  }
  const at::Tensor exponents = at::arange(0, dim, 2, f32) / static_cast<double>(dim);
  const at::Tensor powers = at::pow(base, exponents);  // base^(2i / dim)
  at::Tensor inv_freq = 1.0 / powers;
  switch (r.type) {
    case RopeType::kDefault:
    case RopeType::kDynamic:
      break;
    case RopeType::kLinear:
      inv_freq = inv_freq / r.factor;
      break;
    case RopeType::kLlama3: {
      // Long wavelengths are divided by the factor, short ones kept, the band between blended.
      const double old_len = static_cast<double>(r.original_max_position_embeddings);
      const double low_wavelen = old_len / r.low_freq_factor;
      const double high_wavelen = old_len / r.high_freq_factor;
      const at::Tensor wavelen = (2.0 * M_PI) / inv_freq;
      const at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
      const at::Tensor smooth =
          (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      const at::Tensor blended = (1 - smooth) * scaled / r.factor + smooth * scaled;
      const at::Tensor medium =
          at::logical_not(wavelen < high_wavelen) * at::logical_not(wavelen > low_wavelen);
      inv_freq = at::where(medium, blended, scaled);
      break;
    }
    case RopeType::kYarn: {
      // Dimensions rotating fewer than beta_slow times over the original context are
      // interpolated (divided by the factor), those rotating more than beta_fast times kept,
      // with a linear ramp between; cos and sin are scaled by the attention factor.
      const double d = static_cast<double>(dim);
      const double original = static_cast<double>(r.original_max_position_embeddings);
      auto correction_dim = [&](double rotations) {
        return d * std::log(original / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
      };
      double low = correction_dim(r.beta_fast);
      double high = correction_dim(r.beta_slow);
      if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, d - 1.0);
      if (low == high) high += 0.001;
      const at::Tensor ramp = at::clamp((at::arange(dim / 2, f32) - low) / (high - low), 0.0, 1.0);
      const at::Tensor keep = 1.0 - ramp;  // 1: extrapolate (keep), 0: interpolate
      const at::Tensor interpolated = 1.0 / (r.factor * powers);
      inv_freq = interpolated * (1.0 - keep) + inv_freq * keep;
      *scaling = r.attention_factor;
      break;
    }
  }
  return inv_freq;
}

AttentionImpl::AttentionImpl(const LlamaConfig& c, int64_t layer)
    : config(c),
      heads(c.num_heads),
      kv_heads(c.kv_heads()),
      head_dim(c.head_size()),
      window(c.attention_window(layer)) {
  const int64_t q = heads * head_dim;
  const int64_t kv = kv_heads * head_dim;
  q_proj = register_module("q_proj", Projection(c.hidden_size, q, c.dtype, c.qkv_bias));
  k_proj = register_module("k_proj", Projection(c.hidden_size, kv, c.dtype, c.qkv_bias));
  v_proj = register_module("v_proj", Projection(c.hidden_size, kv, c.dtype, c.qkv_bias));
  o_proj = register_module("o_proj", Projection(q, c.hidden_size, c.dtype, c.o_bias));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", RmsNorm(head_dim, c.rms_norm_eps, c.dtype));
    k_norm = register_module("k_norm", RmsNorm(head_dim, c.rms_norm_eps, c.dtype));
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  auto split = [&](const at::Tensor& t, int64_t n, RmsNorm* norm) {
    at::Tensor heads_last = t.view({batch, seq, n, head_dim});
    if (norm != nullptr && !norm->is_empty()) heads_last = (*norm)(heads_last);
    return heads_last.transpose(1, 2);  // [B, n, S, D]
  };
  at::Tensor q = split(q_proj(x), heads, &q_norm);
  at::Tensor k = split(k_proj(x), kv_heads, &k_norm);
  at::Tensor v = split(v_proj(x), kv_heads, nullptr);
  // Rotary positions (the "rotate half" form): angle = position * inverse frequency, on the
  // activations' device (a GPU's when the engine computes on one).
  const at::TensorOptions on_device = at::TensorOptions().device(x.device());
  double scaling = 1.0;
  const at::Tensor inv_freq = rope_inverse_frequencies(config, seq, x.device(), &scaling);
  const at::Tensor freqs = at::outer(at::arange(seq, on_device.dtype(at::kFloat)), inv_freq);
  const at::Tensor angles = at::cat({freqs, freqs}, -1);  // [S, D]
  at::Tensor cos = angles.cos();
  at::Tensor sin = angles.sin();
  if (scaling != 1.0) {
    cos = cos * scaling;
    sin = sin * scaling;
  }
  cos = cos.to(x.scalar_type());
  sin = sin.to(x.scalar_type());
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  if (kv_heads != heads) {
    // Grouped-query attention: key/value head j serves query heads j * g .. (j + 1) * g - 1.
    const int64_t g = heads / kv_heads;
    k = k.repeat_interleave(g, 1);
    v = v.repeat_interleave(g, 1);
  }
  // The whole score matrix while it is small; past full_scores_limit() a formulation that
  // never holds it (attention.h).
  const int64_t visible = window > 0 && window < seq ? window : 0;
  const uint64_t scores_bytes = static_cast<uint64_t>(batch) * static_cast<uint64_t>(heads) *
                                static_cast<uint64_t>(seq) * static_cast<uint64_t>(seq) * 4;
  at::Tensor attended;
  if (scores_bytes <= full_scores_limit()) {
    attended = full_attention(q, k, v, visible);
  } else {
#if TORCH_VERSION_MAJOR >= 2
    // LibTorch 2.x: its fused kernels for the causal mask, where they exist (CUDA's since 2.0;
    // the CPU's flash attention since 2.2 — before it the CPU fell back to the whole matrix).
    constexpr bool kCpuFlash =
        TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2);
    if (visible == 0 && !fp16_on_cpu(q) && (kCpuFlash || q.is_cuda())) {
      attended = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                  /*is_causal=*/true);
    }
#endif
    if (!attended.defined()) attended = memory_efficient_attention(q, k, v, visible);
  }
  const at::Tensor out = attended.transpose(1, 2).reshape({batch, seq, heads * head_dim});
  return o_proj(out);
}

MlpImpl::MlpImpl(const LlamaConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t inter = c.intermediate_size;
  gate_proj = register_module("gate_proj", Projection(h, inter, c.dtype, c.mlp_bias));
  up_proj = register_module("up_proj", Projection(h, inter, c.dtype, c.mlp_bias));
  down_proj = register_module("down_proj", Projection(inter, h, c.dtype, c.mlp_bias));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return down_proj(swiglu(gate_proj(x), up_proj(x)));
}

// Registered in transformers' LlamaDecoderLayer order (attention, MLP, then the two norms):
// the order of parameters() is the order of the flat partitions in a checkpoint, which
// DeepSpeed fills from a model's parameters() in that order.
DecoderLayerImpl::DecoderLayerImpl(const LlamaConfig& c, int64_t layer) {
  self_attn = register_module("self_attn", Attention(c, layer));
  mlp = register_module("mlp", Mlp(c));
  input_layernorm =
      register_module("input_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps, c.dtype));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps, c.dtype));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x) {
  const at::Tensor h = x + self_attn(input_layernorm(x));
  return h + mlp(post_attention_layernorm(h));
}

LlamaBodyImpl::LlamaBodyImpl(const LlamaConfig& c) {
  embed_tokens = register_module("embed_tokens", Embedding(c.vocab_size, c.hidden_size, c.dtype));
  layer_list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    layers.emplace_back(DecoderLayer(c, i));
    layer_list->push_back(layers.back());
  }
  norm = register_module("norm", RmsNorm(c.hidden_size, c.rms_norm_eps, c.dtype));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& config, at::ScalarType dtype) : config_(config) {
  config_.validate();
  config_.dtype = dtype;  // every parameter is allocated in it: no fp32 copy to convert
  model = register_module("model", LlamaBody(config_));
  lm_head = register_module(
      "lm_head", config_.tie_embeddings
                     ? Projection(model->embed_tokens->weight)
                     : Projection(config_.hidden_size, config_.vocab_size, config_.dtype));
}

torch::Tensor LlamaModelImpl::hidden_states(const torch::Tensor& tokens) {
  at::Tensor x = model->embed_tokens(tokens);
  for (zero::ZeroBlock& layer : model->layers) {
    x = layer(x);
  }
  return model->norm(x);
}

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& tokens) {
  return lm_head(hidden_states(tokens)).to(at::kFloat);
}

torch::Tensor LlamaModelImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  const at::Tensor hidden = hidden_states(tokens);
  const uint64_t logits_bytes =
      static_cast<uint64_t>(tokens.numel()) * static_cast<uint64_t>(config_.vocab_size) * 4;
  if (logits_bytes <= full_logits_limit()) {
    const at::Tensor logits = lm_head(hidden).to(at::kFloat);
    return at::cross_entropy_loss(logits.reshape({-1, config_.vocab_size}), targets.reshape({-1}));
  }
  // Long sequences or large vocabularies: the head and the loss together, never holding the
  // logits (lm_loss.h).
  return chunked_lm_loss(hidden.reshape({-1, config_.hidden_size}), lm_head->weight,
                         targets.reshape({-1}));
}

void LlamaModelImpl::initialize(uint64_t seed) {
  at::NoGradGuard no_grad;
  std::vector<const void*> done;  // a tied tensor takes the values of its first name
  for (const auto& item : named_parameters(/*recurse=*/true)) {
    const void* impl = item.value().unsafeGetTensorImpl();
    if (std::find(done.begin(), done.end(), impl) != done.end()) {
      continue;
    }
    done.push_back(impl);
    at::Tensor full = at::empty(item.value().sizes(), at::kFloat);
    init_parameter(seed, item.key(), full);
    item.value().copy_(full);
  }
}

void init_parameter(uint64_t seed, const std::string& name, torch::Tensor& full) {
  at::NoGradGuard no_grad;
  if (ends_with(name, "norm.weight")) {  // layernorms, the final norm, q_norm and k_norm
    full.fill_(1.0);
    return;
  }
  if (ends_with(name, ".bias")) {
    full.zero_();
    return;
  }
  at::Generator generator = at::detail::createCPUGenerator(parameter_seed(seed, name));
  full.normal_(0.0, 0.02, generator);
}

}  // namespace zinf::engine
