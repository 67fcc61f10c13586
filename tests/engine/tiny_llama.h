// The model and data the engine's parity tests train: a 3-layer Llama small enough for many
// 20-step runs on 2 cores, and batches of arithmetic sequences mod 16 (random starts and
// strides: a pattern the model learns within those steps).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

#include "engine/model/llama.h"

namespace zinf::engine::testing {

inline LlamaConfig tiny_llama(int64_t vocab_size) {
  LlamaConfig c = *named_llama("tiny", vocab_size);
  c.hidden_size = 32;
  c.intermediate_size = 88;
  c.num_layers = 3;
  return c;
}

// `size` samples of `seq` tokens (inputs, and targets shifted by one) from a generator seeded
// with `seed`: the same batch for the same arguments.
inline std::pair<at::Tensor, at::Tensor> arithmetic_batch(uint64_t seed, int64_t size,
                                                          int64_t seq) {
  at::manual_seed(seed);
  const at::Tensor start = at::randint(16, {size, 1}, at::kLong);
  const at::Tensor stride = at::randint(1, 4, {size, 1}, at::kLong);
  const at::Tensor tokens = (start + stride * at::arange(seq + 1, at::kLong)).remainder(16);
  return {tokens.narrow(1, 0, seq), tokens.narrow(1, 1, seq)};
}

}  // namespace zinf::engine::testing
