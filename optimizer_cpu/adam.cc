#include "optimizer_cpu/adam.h"

#include <cmath>

#include "optimizer_cpu/step_common.h"

namespace zinf::optimizer_cpu {
namespace {

void check_config(const AdamConfig& c) {
  detail::check_range("lr", c.lr, 0.0f, HUGE_VALF);
  detail::check_range_open("beta1", c.beta1, 0.0f, 1.0f);
  detail::check_range_open("beta2", c.beta2, 0.0f, 1.0f);
  detail::check_range("eps", c.eps, 0.0f, HUGE_VALF);
  detail::check_range("weight_decay", c.weight_decay, 0.0f, HUGE_VALF);
}

}  // namespace

struct AdamOptimizer::StepCoefficients {
  detail::AdamCoefficients kernel;
};

AdamOptimizer::AdamOptimizer(const AdamConfig& config)
    : adamw_mode_(config.adamw_mode), config_(config) {
  check_config(config);
}

AdamConfig AdamOptimizer::config() const {
  std::lock_guard<std::mutex> lock(mu_);
  return config_;
}

void AdamOptimizer::set_config(const AdamConfig& config) {
  check_config(config);
  std::lock_guard<std::mutex> lock(mu_);
  if (config.beta1 != config_.beta1 || config.beta2 != config_.beta2) cached_step_ = 0;
  config_ = config;
  adamw_mode_.store(config.adamw_mode, std::memory_order_relaxed);
}

float AdamOptimizer::lr() const {
  std::lock_guard<std::mutex> lock(mu_);
  return config_.lr;
}

void AdamOptimizer::set_lr(float lr) {
  detail::check_range("lr", lr, 0.0f, HUGE_VALF);
  std::lock_guard<std::mutex> lock(mu_);
  config_.lr = lr;
}

bool AdamOptimizer::set_beta1(float beta1) {
  AdamConfig c = config();
  c.beta1 = beta1;
  set_config(c);
  return true;
}

std::string_view AdamOptimizer::name() const noexcept {
  return adamw_mode_.load(std::memory_order_relaxed) ? "adamw" : "adam";
}

OptimizerKind AdamOptimizer::kind() const noexcept {
  return adamw_mode_.load(std::memory_order_relaxed) ? OptimizerKind::kAdamW : OptimizerKind::kAdam;
}

AdamOptimizer::StepCoefficients AdamOptimizer::prepare(std::int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  const AdamConfig& c = config_;
  // DeepSpeed's IncrementStep: advance the powers by one multiplication when the step moves
  // on by one, recompute them when it jumps (resume) or the betas changed (cached_step_ 0).
  if (step != cached_step_) {
    if (cached_step_ != 0 && step == cached_step_ + 1) {
      beta1_pow_ *= c.beta1;
      beta2_pow_ *= c.beta2;
    } else {
      beta1_pow_ = std::pow(static_cast<double>(c.beta1), static_cast<double>(step));
      beta2_pow_ = std::pow(static_cast<double>(c.beta2), static_cast<double>(step));
    }
    cached_step_ = step;
  }
  double bias_correction1 = 1.0;
  double bias_correction2 = 1.0;
  if (c.bias_correction) {
    bias_correction1 = 1.0 - beta1_pow_;
    bias_correction2 = 1.0 - beta2_pow_;
  }
  StepCoefficients k;
  k.kernel.beta1 = c.beta1;
  k.kernel.beta2 = c.beta2;
  k.kernel.one_minus_beta1 = 1.0f - c.beta1;
  k.kernel.one_minus_beta2 = 1.0f - c.beta2;
  k.kernel.eps = c.eps;
  k.kernel.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  k.kernel.step_size = static_cast<float>(-static_cast<double>(c.lr) / bias_correction1);
  k.kernel.decoupled_decay = c.adamw_mode ? -c.lr * c.weight_decay : 0.0f;
  k.kernel.l2_decay = c.adamw_mode ? 0.0f : c.weight_decay;
  return k;
}

StepResult AdamOptimizer::step(const StepArgs& args) {
  const detail::KernelArrays arrays = detail::check_step_args(args, state_arrays());
  const StepCoefficients k = prepare(args.step);
  return detail::run_step(args, arrays, k.kernel, detail::active_kernel_table().adam);
}

}  // namespace zinf::optimizer_cpu
