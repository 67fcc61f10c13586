#include "engine/model/llama.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

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

// LibTorch 1.13 has no CPU kernels for these ops in fp16 (matmul's addmm and bmm, SiLU): on a
// CPU fp16 tensor they run in fp32 and round the result to fp16, as a GPU's fp16 GEMM
// accumulates in fp32 and rounds its output. The casts are autograd ops, so gradients flow
// back through them and arrive in fp16. Every other dtype and device takes LibTorch's kernel
// unchanged (fp32 and bf16 results are bit-identical to calling it directly).
bool fp16_on_cpu(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf && t.device().is_cpu();
}

at::Tensor portable_matmul(const at::Tensor& a, const at::Tensor& b) {
  if (!fp16_on_cpu(a) && !fp16_on_cpu(b)) {
    return at::matmul(a, b);
  }
  return at::matmul(a.to(at::kFloat), b.to(at::kFloat)).to(at::kHalf);
}

at::Tensor portable_silu(const at::Tensor& x) {
  if (!fp16_on_cpu(x)) {
    return at::silu(x);
  }
  return at::silu(x.to(at::kFloat)).to(at::kHalf);
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

int64_t LlamaConfig::parameter_count() const noexcept {
  const int64_t h = hidden_size;
  const int64_t q = num_heads * head_size();
  const int64_t kv = kv_heads() * head_size();
  const int64_t per_layer = 2 * h * q + 2 * h * kv + 3 * h * intermediate_size + 2 * h;
  return vocab_size * h * (tie_embeddings ? 1 : 2) + num_layers * per_layer + h;
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
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    const int64_t q = c.num_heads * c.head_size();
    const int64_t kv = c.kv_heads() * c.head_size();
    add(p + "self_attn.q_proj.weight", {q, h}, true);
    add(p + "self_attn.k_proj.weight", {kv, h}, true);
    add(p + "self_attn.v_proj.weight", {kv, h}, true);
    add(p + "self_attn.o_proj.weight", {h, q}, true);
    add(p + "mlp.gate_proj.weight", {inter, h}, true);
    add(p + "mlp.up_proj.weight", {inter, h}, true);
    add(p + "mlp.down_proj.weight", {h, inter}, true);
    add(p + "input_layernorm.weight", {h}, true);
    add(p + "post_attention_layernorm.weight", {h}, true);
  }
  add("model.norm.weight", {h}, false);
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab_size, h}, false);
  return out;
}

uint64_t llama_activation_bytes(const LlamaConfig& c, int64_t batch, int64_t seq,
                                int64_t element_bytes) {
  const auto tokens = static_cast<uint64_t>(batch * seq);
  const auto e = static_cast<uint64_t>(element_bytes);
  const auto h = static_cast<uint64_t>(c.hidden_size);
  const auto inter = static_cast<uint64_t>(c.intermediate_size);
  // Saved block inputs, one per layer, plus the residual stream in and out of the stack.
  const uint64_t saved = (static_cast<uint64_t>(c.num_layers) + 2) * tokens * h * e;
  // One layer recomputed with grad: norms, q/k/v/o and rotary copies (~8 h), the MLP's
  // gate/up/silu/product (4 inter), scores and probabilities in fp32 and the dtype; their
  // gradients about as much again.
  const uint64_t scores = static_cast<uint64_t>(batch) * static_cast<uint64_t>(c.num_heads) *
                          static_cast<uint64_t>(seq) * static_cast<uint64_t>(seq) * (4 + 4 + e);
  const uint64_t layer = 2 * (tokens * (8 * h + 4 * inter) * e + scores);
  // fp32 logits, their softmax and gradient.
  const uint64_t logits = 3 * tokens * static_cast<uint64_t>(c.vocab_size) * 4;
  return saved + layer + logits;
}

// ---- modules -------------------------------------------------------------------------------

RmsNormImpl::RmsNormImpl(int64_t dim, double eps_, at::ScalarType dtype) : eps(eps_) {
  weight = register_parameter("weight", at::empty({dim}, dtype));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (normed * weight.to(at::kFloat)).to(x.scalar_type());
}

ProjectionImpl::ProjectionImpl(int64_t in, int64_t out, at::ScalarType dtype) {
  weight = register_parameter("weight", at::empty({out, in}, dtype));
}

ProjectionImpl::ProjectionImpl(torch::Tensor shared_weight) {
  weight = register_parameter("weight", std::move(shared_weight));
}

torch::Tensor ProjectionImpl::forward(const torch::Tensor& x) {
  return portable_matmul(x, weight.t());
}

EmbeddingImpl::EmbeddingImpl(int64_t vocab, int64_t dim, at::ScalarType dtype) {
  weight = register_parameter("weight", at::empty({vocab, dim}, dtype));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& tokens) {
  return at::embedding(weight, tokens);
}

AttentionImpl::AttentionImpl(const LlamaConfig& c)
    : heads(c.num_heads),
      kv_heads(c.kv_heads()),
      head_dim(c.head_size()),
      rope_theta(c.rope_theta) {
  const int64_t q = heads * head_dim;
  const int64_t kv = kv_heads * head_dim;
  q_proj = register_module("q_proj", Projection(c.hidden_size, q, c.dtype));
  k_proj = register_module("k_proj", Projection(c.hidden_size, kv, c.dtype));
  v_proj = register_module("v_proj", Projection(c.hidden_size, kv, c.dtype));
  o_proj = register_module("o_proj", Projection(q, c.hidden_size, c.dtype));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  auto split = [&](const at::Tensor& t, int64_t n) {
    return t.view({batch, seq, n, head_dim}).transpose(1, 2);  // [B, n, S, D]
  };
  at::Tensor q = split(q_proj(x), heads);
  at::Tensor k = split(k_proj(x), kv_heads);
  at::Tensor v = split(v_proj(x), kv_heads);
  // Rotary positions (the "rotate half" form): angle = position / theta^(2i / head_dim).
  // On the activations' device (a GPU's when the engine computes on one).
  const at::TensorOptions on_device = at::TensorOptions().device(x.device());
  const at::Tensor inv_freq =
      1.0 / at::pow(rope_theta, at::arange(0, head_dim, 2, on_device.dtype(at::kFloat)) /
                                    static_cast<double>(head_dim));
  const at::Tensor freqs = at::outer(at::arange(seq, on_device.dtype(at::kFloat)), inv_freq);
  const at::Tensor angles = at::cat({freqs, freqs}, -1);  // [S, D]
  const at::Tensor cos = angles.cos().to(x.scalar_type());
  const at::Tensor sin = angles.sin().to(x.scalar_type());
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  if (kv_heads != heads) {
    // Grouped-query attention: key/value head j serves query heads j * g .. (j + 1) * g - 1.
    const int64_t g = heads / kv_heads;
    k = k.repeat_interleave(g, 1);
    v = v.repeat_interleave(g, 1);
  }
  at::Tensor scores = portable_matmul(q, k.transpose(-2, -1)).to(at::kFloat) /
                      std::sqrt(static_cast<double>(head_dim));
  const at::Tensor future = at::ones({seq, seq}, on_device.dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  const at::Tensor probs = at::softmax(scores, -1).to(x.scalar_type());
  const at::Tensor out =
      portable_matmul(probs, v).transpose(1, 2).reshape({batch, seq, heads * head_dim});
  return o_proj(out);
}

MlpImpl::MlpImpl(const LlamaConfig& c) {
  gate_proj = register_module("gate_proj", Projection(c.hidden_size, c.intermediate_size, c.dtype));
  up_proj = register_module("up_proj", Projection(c.hidden_size, c.intermediate_size, c.dtype));
  down_proj = register_module("down_proj", Projection(c.intermediate_size, c.hidden_size, c.dtype));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return down_proj(portable_silu(gate_proj(x)) * up_proj(x));
}

// Registered in transformers' LlamaDecoderLayer order (attention, MLP, then the two norms):
// the order of parameters() is the order of the flat partitions in a checkpoint, which
// DeepSpeed fills from a model's parameters() in that order.
DecoderLayerImpl::DecoderLayerImpl(const LlamaConfig& c) {
  self_attn = register_module("self_attn", Attention(c));
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
    layers.emplace_back(DecoderLayer(c));
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

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& tokens) {
  at::Tensor x = model->embed_tokens(tokens);
  for (zero::ZeroBlock& layer : model->layers) {
    x = layer(x);
  }
  x = model->norm(x);
  return lm_head(x).to(at::kFloat);
}

torch::Tensor LlamaModelImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  const at::Tensor logits = forward(tokens);
  return at::cross_entropy_loss(logits.reshape({-1, config_.vocab_size}), targets.reshape({-1}));
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
  if (ends_with(name, "layernorm.weight") || ends_with(name, "norm.weight")) {
    full.fill_(1.0);
    return;
  }
  at::Generator generator = at::detail::createCPUGenerator(parameter_seed(seed, name));
  full.normal_(0.0, 0.02, generator);
}

}  // namespace zinf::engine
