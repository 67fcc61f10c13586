// ZeroBlock: wraps one heavy module of a model (e.g. a transformer layer) so ZeRO can manage
// it — the unit of parameter gathering, release and activation recomputation.
//
// The block registers the wrapped module's children, parameters and buffers as its own (so
// parameter names carry no extra path component: "layers.0.attn.q.weight"). Until a
// ZeroModel attaches it, forward() simply runs the module. Attached, forward() is a custom
// autograd function:
//   forward   the ZeroModel enters the block (stage 3: its parameters are gathered), the
//             module runs without building a graph, the block is left (stage 3: parameters
//             released unless kept for reuse); only the input is saved — on the device, or
//             moved to pinned memory or NVMe by the model's ActivationOffload
//             (zero/activation_offload.h) when zinf.activation_offload asks for it; nothing
//             is kept when no backward will come (grad mode off).
//   backward  the block is entered again, the forward is recomputed with grad from the saved
//             input (brought back first when it was offloaded) with the random-number state
//             it first ran with, autograd gives the input's and the parameters' gradients,
//             the block is left (its parameters are needed no more, so the next block's
//             fetch can start) and the parameter gradients go to the ZeroModel's reducer at
//             once.
// Parameter gradients therefore never reach `.grad` of a block's parameters; the input's
// gradient flows on to the previous block as usual.
//
// The wrapped module's forward must take and return one tensor, and must compute the same
// function when run twice from the same input and random state.
//
// Thread safety: as torch::nn::Module; forward/backward run on the thread that calls them.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>

namespace zinf::zero {

class ZeroModel;

class ZeroBlockImpl : public torch::nn::Module {
 public:
  // `module` must have a `torch::Tensor forward(torch::Tensor)` (or const-ref) method.
  template <typename M>
  explicit ZeroBlockImpl(std::shared_ptr<M> module)
      : inner_(module), forward_([module](const torch::Tensor& x) { return module->forward(x); }) {
    adopt();
  }
  template <typename M>
  explicit ZeroBlockImpl(torch::nn::ModuleHolder<M> module) : ZeroBlockImpl(module.ptr()) {}

  torch::Tensor forward(const torch::Tensor& x);

  // The wrapped module.
  [[nodiscard]] const std::shared_ptr<torch::nn::Module>& inner() const noexcept { return inner_; }
  // Runs the wrapped module directly (no gathering, no custom autograd).
  [[nodiscard]] torch::Tensor run_module(const torch::Tensor& x) const { return forward_(x); }

  // Called by ZeroModel: attach to `model` as block `id`, or detach (nullptr).
  void attach(ZeroModel* model, size_t id) noexcept {
    model_ = model;
    id_ = id;
  }
  [[nodiscard]] ZeroModel* model() const noexcept { return model_; }
  [[nodiscard]] size_t id() const noexcept { return id_; }

 private:
  void adopt();

  std::shared_ptr<torch::nn::Module> inner_;
  std::function<torch::Tensor(const torch::Tensor&)> forward_;
  ZeroModel* model_ = nullptr;
  size_t id_ = 0;
  torch::Tensor trigger_;  // a scalar requiring grad: makes autograd call the block's backward
};

TORCH_MODULE(ZeroBlock);

}  // namespace zinf::zero
