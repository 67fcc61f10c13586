// A small model for the ZeRO tests: an input projection, residual MLP blocks wrapped in
// ZeroBlocks (optionally two of them sharing one Linear: a tied parameter), and an output
// head; plus a reference trainer in plain LibTorch (torch::optim::AdamW) and the helpers
// that compare parameters.
//
// Thread safety: none (test code).
#pragma once

#include <gtest/gtest.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "zero/zero_block.h"
#include "zero/zero_model.h"

namespace zinf::zero::testing {

// fc(x) for an fp32 `x`, with fp16 weights taken to fp32 for the product: this LibTorch's
// CPU kernels have no fp16 matrix product or tanh ("addmm_impl_cpu_" / "tanh_vml_cpu" not
// implemented for 'Half'), so an fp16 model computes in fp32 while its params and grads
// stay fp16.
inline torch::Tensor linear(torch::nn::Linear fc, const torch::Tensor& x) {
  if (fc->weight.scalar_type() != at::kHalf) {
    return fc(x);
  }
  return torch::nn::functional::linear(x, fc->weight.to(at::kFloat), fc->bias.to(at::kFloat));
}

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t dim, torch::nn::Linear shared_fc1 = nullptr) {
    fc1 = shared_fc1 ? shared_fc1 : torch::nn::Linear(dim, 2 * dim);
    register_module("fc1", fc1);
    fc2 = register_module("fc2", torch::nn::Linear(2 * dim, dim));
    scale = register_parameter("scale", torch::ones({dim}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const bool half = x.scalar_type() == at::kHalf;
    const torch::Tensor v = half ? x.to(at::kFloat) : x;
    const torch::Tensor out =
        v + linear(fc2, torch::tanh(linear(fc1, v * (half ? scale.to(at::kFloat) : scale))));
    return half ? out.to(at::kHalf) : out;
  }

  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(Mlp);

struct NetImpl : torch::nn::Module {
  // `tie`: blocks 1 and 2 share their fc1 (needs blocks >= 3).
  NetImpl(int64_t in, int64_t dim, int64_t out, int blocks, bool tie = false) {
    embed = register_module("embed", torch::nn::Linear(in, dim));
    list = register_module("layers", torch::nn::ModuleList());
    torch::nn::Linear shared = nullptr;
    for (int b = 0; b < blocks; ++b) {
      torch::nn::Linear fc1 = nullptr;
      if (tie && (b == 1 || b == 2)) {
        if (!shared) shared = torch::nn::Linear(dim, 2 * dim);
        fc1 = shared;
      }
      layers.push_back(zero::ZeroBlock(Mlp(dim, fc1)));
      list->push_back(layers.back());
    }
    head = register_module("head", torch::nn::Linear(dim, out));
  }
  torch::Tensor forward(torch::Tensor x) {
    const bool half = x.scalar_type() == at::kHalf;  // fp16: the blocks see fp16 tensors
    x = linear(embed, half ? x.to(at::kFloat) : x);
    if (half) x = x.to(at::kHalf);
    for (auto& layer : layers) x = layer(x);
    return linear(head, half ? x.to(at::kFloat) : x);
  }

  torch::nn::Linear embed{nullptr};
  torch::nn::ModuleList list{nullptr};
  std::vector<zero::ZeroBlock> layers;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

struct NetShape {
  int64_t in = 6, dim = 13, out = 5;
  int blocks = 4;
  bool tie = false;
};

inline Net make_net(const NetShape& s, uint64_t seed) {
  torch::manual_seed(seed);
  return Net(s.in, s.dim, s.out, s.blocks, s.tie);
}

// Deterministic data: micro-batch `i` of `batch` samples.
struct Batch {
  torch::Tensor x, y;
};
inline Batch make_batch(const NetShape& s, int64_t batch, uint64_t seed, int64_t i) {
  torch::manual_seed(seed * 7919 + static_cast<uint64_t>(i));
  return {torch::randn({batch, s.in}), torch::randn({batch, s.out})};
}

struct TrainOptions {
  int steps = 5;
  int micro_batches = 1;  // gradient accumulation
  int64_t micro_batch_size = 8;
  double lr = 1e-2, weight_decay = 0.01, clip = 0.0;
};

// The model's parameters, each tensor once (LibTorch lists a tied tensor under every name).
inline std::vector<torch::Tensor> unique_parameters(Net& net) {
  std::vector<torch::Tensor> unique;
  for (const torch::Tensor& p : net->parameters()) {
    if (std::none_of(unique.begin(), unique.end(), [&](const torch::Tensor& q) {
          return q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
        })) {
      unique.push_back(p);
    }
  }
  return unique;
}

// Plain LibTorch: AdamW (DeepSpeed's CPU Adam semantics in AdamW mode), optional clipping.
// Returns the loss of every step (mean over the micro-batches).
inline std::vector<double> train_reference(Net& net, const NetShape& shape, const TrainOptions& o,
                                           uint64_t data_seed) {
  torch::optim::AdamW opt(
      unique_parameters(net),
      torch::optim::AdamWOptions(o.lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(o.weight_decay));
  std::vector<double> losses;
  int64_t index = 0;
  for (int step = 0; step < o.steps; ++step) {
    opt.zero_grad();
    double total = 0;
    for (int mb = 0; mb < o.micro_batches; ++mb) {
      Batch b = make_batch(shape, o.micro_batch_size, data_seed, index++);
      torch::Tensor loss = torch::mse_loss(net->forward(b.x), b.y);
      total += loss.item<double>();
      (loss / o.micro_batches).backward();
    }
    if (o.clip > 0) torch::nn::utils::clip_grad_norm_(unique_parameters(net), o.clip);
    opt.step();
    losses.push_back(total / o.micro_batches);
  }
  return losses;
}

// The same loop through a ZeroModel; samples [rank*per_rank, (rank+1)*per_rank) of each
// global micro-batch of micro_batch_size * world samples. Loss: this rank's mean.
inline std::vector<double> train_zero(Net& net, zero::ZeroModel& model, const NetShape& shape,
                                      const TrainOptions& o, uint64_t data_seed, int rank = 0,
                                      int world = 1) {
  std::vector<double> losses;
  int64_t index = 0;
  int64_t applied = 0;
  for (int step = 0; step < o.steps; ++step) {
    double total = 0;
    for (int mb = 0; mb < o.micro_batches; ++mb) {
      Batch b = make_batch(shape, o.micro_batch_size * world, data_seed, index++);
      torch::Tensor x = b.x.narrow(0, rank * o.micro_batch_size, o.micro_batch_size);
      torch::Tensor y = b.y.narrow(0, rank * o.micro_batch_size, o.micro_batch_size);
      model.begin_micro_batch(mb);
      const at::ScalarType dtype = net->embed->weight.scalar_type();
      torch::Tensor loss = torch::mse_loss(net->forward(x.to(dtype)).to(at::kFloat), y);
      total += loss.item<double>();
      (loss / o.micro_batches).backward();
      model.end_micro_batch();
    }
    const zero::OptimizerStepOutcome outcome = model.step(applied + 1, 1.0);
    if (!outcome.skipped) ++applied;
    losses.push_back(total / o.micro_batches);
  }
  return losses;
}

// Norm-wise relative error ||a - b|| / ||b|| of one tensor (fp64). Elementwise maxima are
// the wrong yardstick for comparing two fp32 summation orders after several Adam steps:
// Adam divides by sqrt(v), so an element whose gradient is near zero turns a rounding
// difference of the sum into a visible step difference (seen: 1.6e-4 of the tensor's
// largest value at one element while the tensor as a whole agreed to 1e-7).
inline double relative_error(const torch::Tensor& got, const torch::Tensor& expected) {
  const torch::Tensor a = got.to(torch::kDouble);
  const torch::Tensor b = expected.to(torch::kDouble);
  const double scale = std::max(b.norm().item<double>(), 1e-12);
  return (a - b).norm().item<double>() / scale;
}

// The largest relative_error() over every parameter, by name.
inline double max_relative_error(const std::vector<torch::Tensor>& got,
                                 const std::vector<zero::ZeroModel::Param>& params, Net& ref) {
  double worst = 0;
  auto named = ref->named_parameters(true);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!got[i].defined()) continue;
    const torch::Tensor* expected = named.find(params[i].name);
    EXPECT_NE(expected, nullptr) << params[i].name;
    if (expected == nullptr) continue;
    const double err = relative_error(got[i], *expected);
    EXPECT_LE(err, 1e-5) << params[i].name;
    worst = std::max(worst, err);
  }
  return worst;
}

}  // namespace zinf::zero::testing
