#include "optimizer_cpu/lion.h"

#include <cmath>

#include "optimizer_cpu/step_common.h"

namespace zinf::optimizer_cpu {
namespace {

void check_config(const LionConfig& c) {
  detail::check_range("lr", c.lr, 0.0f, HUGE_VALF);
  detail::check_range("beta1", c.beta1, 0.0f, 1.0f);
  detail::check_range("beta2", c.beta2, 0.0f, 1.0f);
  detail::check_range("weight_decay", c.weight_decay, 0.0f, HUGE_VALF);
}

}  // namespace

LionOptimizer::LionOptimizer(const LionConfig& config) : config_(config) { check_config(config); }

LionConfig LionOptimizer::config() const {
  std::lock_guard<std::mutex> lock(mu_);
  return config_;
}

void LionOptimizer::set_config(const LionConfig& config) {
  check_config(config);
  std::lock_guard<std::mutex> lock(mu_);
  config_ = config;
}

float LionOptimizer::lr() const {
  std::lock_guard<std::mutex> lock(mu_);
  return config_.lr;
}

void LionOptimizer::set_lr(float lr) {
  detail::check_range("lr", lr, 0.0f, HUGE_VALF);
  std::lock_guard<std::mutex> lock(mu_);
  config_.lr = lr;
}

std::string_view LionOptimizer::name() const noexcept { return "lion"; }

OptimizerKind LionOptimizer::kind() const noexcept { return OptimizerKind::kLion; }

StepResult LionOptimizer::step(const StepArgs& args) {
  const detail::KernelArrays arrays = detail::check_step_args(args, state_arrays());
  const LionConfig c = config();
  detail::LionCoefficients k;
  k.beta1 = c.beta1;
  k.beta2 = c.beta2;
  k.one_minus_beta1 = 1.0f - c.beta1;
  k.one_minus_beta2 = 1.0f - c.beta2;
  k.neg_lr = -c.lr;
  k.decoupled_decay = -c.lr * c.weight_decay;
  return detail::run_step(args, arrays, k, detail::active_kernel_table().lion);
}

}  // namespace zinf::optimizer_cpu
