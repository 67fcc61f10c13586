#include "zero/zero_block.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <vector>

#include "zero/activation_offload.h"
#include "zero/error.h"
#include "zero/zero_model.h"

namespace zinf::zero {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The random state the block's forward draws from: the CPU generator's, and the device's when
// the block computes on one (a GPU's dropout draws there), so the recompute repeats it.
struct RngState {
  at::Tensor cpu;
  at::Tensor device;  // undefined on the CPU
};

at::Tensor generator_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

RngState rng_state(const c10::Device& device) {
  RngState s;
  s.cpu = generator_state(at::detail::getDefaultCPUGenerator());
  if (!device.is_cpu()) {
    s.device = generator_state(at::globalContext().defaultGenerator(device));
  }
  return s;
}

void set_rng_state(const RngState& s, const c10::Device& device) {
  set_generator_state(at::detail::getDefaultCPUGenerator(), s.cpu);
  if (s.device.defined()) {
    set_generator_state(at::globalContext().defaultGenerator(device), s.device);
  }
}

// The block's forward without a graph, and its recomputation in backward. `trigger` is a
// scalar that requires grad, so autograd calls backward even when `x` needs no gradient.
// The parameters are not inputs: at stage 3 they are empty tensors during forward, and an
// input would fix the shape autograd expects for their gradients to [0]. Their gradients
// come from the recomputed graph and go to the ZeroModel, never to `.grad`.
struct BlockFunction : public torch::autograd::Function<BlockFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t block_address,
                               const torch::Tensor& trigger, bool for_backward) {
    (void)trigger;
    auto* block = reinterpret_cast<ZeroBlockImpl*>(block_address);
    ZeroModel& model = *block->model();
    ctx->saved_data["block"] = block_address;
    const RngState rng = rng_state(x.device());
    ctx->saved_data["rng"] = rng.cpu;
    if (rng.device.defined()) {
      ctx->saved_data["rng_device"] = rng.device;
    }
    // With activation offload the input leaves the device before the block runs (an NVMe
    // write then overlaps the block's compute); without a backward to come nothing is kept.
    ActivationOffload* offload = for_backward ? model.activation_offload() : nullptr;
    torch::Tensor token;
    if (offload != nullptr) {
      token = offload->save(x);
      ctx->saved_data["x_needs_grad"] = x.requires_grad();
    }
    model.enter_block(block->id());
    torch::Tensor out;
    try {
      out = block->run_module(x);
    } catch (...) {
      model.leave_block(block->id());
      throw;
    }
    model.leave_block(block->id());
    ctx->save_for_backward({offload != nullptr ? token : x});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* block = reinterpret_cast<ZeroBlockImpl*>(ctx->saved_data["block"].toInt());
    ZeroModel& model = *block->model();
    torch::Tensor x = ctx->get_saved_variables()[0];
    bool x_needs_grad = x.requires_grad();
    if (auto it = ctx->saved_data.find("x_needs_grad"); it != ctx->saved_data.end()) {
      x_needs_grad = it->second.toBool();
      x = model.activation_offload()->restore(x);  // x is the token save() gave
    }

    model.enter_block(block->id());
    torch::Tensor grad_x;
    std::vector<torch::Tensor> param_grads;
    try {
      const std::vector<torch::Tensor>& params = model.block_tensors(block->id());
      variable_list grads;
      {
        torch::AutoGradMode enable(true);
        const c10::Device device = x.device();
        const RngState current = rng_state(device);
        RngState saved;
        saved.cpu = ctx->saved_data["rng"].toTensor();
        if (auto it = ctx->saved_data.find("rng_device"); it != ctx->saved_data.end()) {
          saved.device = it->second.toTensor();
        }
        set_rng_state(saved, device);
        torch::Tensor input = x.detach().requires_grad_(x_needs_grad);
        torch::Tensor out;
        try {
          out = block->run_module(input);
        } catch (...) {
          set_rng_state(current, device);
          throw;
        }
        set_rng_state(current, device);
        variable_list inputs;
        if (x_needs_grad) {
          inputs.push_back(input);
        }
        for (const torch::Tensor& p : params) {
          if (p.requires_grad()) {
            inputs.push_back(p);
          }
        }
        torch::Tensor grad_out = grad_outputs[0];
        if (!grad_out.defined()) {
          grad_out = torch::zeros_like(out);
        }
        grads = torch::autograd::grad({out}, inputs, {grad_out}, /*retain_graph=*/false,
                                      /*create_graph=*/false, /*allow_unused=*/true);
      }
      size_t next = 0;
      if (x_needs_grad) {
        grad_x = grads[next++];
      }
      param_grads.resize(params.size());
      for (size_t k = 0; k < params.size(); ++k) {
        if (params[k].requires_grad()) {
          param_grads[k] = grads[next++];
        }
      }
    } catch (...) {
      model.leave_block(block->id());
      throw;
    }
    // The gradients are computed: the parameters are not needed any more, and leaving first
    // lets the next block's fetch run while the gradients are handed over.
    model.leave_block(block->id());
    model.block_grads(block->id(), param_grads);

    return {grad_x, torch::Tensor(), torch::Tensor(), torch::Tensor()};  // x, block, trigger, flag
  }
};

}  // namespace

void ZeroBlockImpl::adopt() {
  for (const auto& child : inner_->named_children()) {
    register_module(child.key(), child.value());
  }
  for (const auto& param : inner_->named_parameters(/*recurse=*/false)) {
    register_parameter(param.key(), param.value(), param.value().requires_grad());
  }
  for (const auto& buffer : inner_->named_buffers(/*recurse=*/false)) {
    register_buffer(buffer.key(), buffer.value());
  }
}

torch::Tensor ZeroBlockImpl::forward(const torch::Tensor& x) {
  if (model_ == nullptr) {
    return forward_(x);
  }
  if (!trigger_.defined()) {
    trigger_ = torch::zeros({}, torch::TensorOptions().requires_grad(true));
  }
  return BlockFunction::apply(x, reinterpret_cast<int64_t>(this), trigger_,
                              torch::GradMode::is_enabled());
}

}  // namespace zinf::zero
