#include "optimizer_cpu/adagrad.h"

#include <cmath>

#include "optimizer_cpu/step_common.h"

namespace zinf::optimizer_cpu {
namespace {

void check_config(const AdagradConfig& c) {
  detail::check_range("lr", c.lr, 0.0f, HUGE_VALF);
  detail::check_range("lr_decay", c.lr_decay, 0.0f, HUGE_VALF);
  detail::check_range("eps", c.eps, 0.0f, HUGE_VALF);
  detail::check_range("weight_decay", c.weight_decay, 0.0f, HUGE_VALF);
}

}  // namespace

AdagradOptimizer::AdagradOptimizer(const AdagradConfig& config) : config_(config) {
  check_config(config);
}

AdagradConfig AdagradOptimizer::config() const {
  std::lock_guard<std::mutex> lock(mu_);
  return config_;
}

void AdagradOptimizer::set_config(const AdagradConfig& config) {
  check_config(config);
  std::lock_guard<std::mutex> lock(mu_);
  config_ = config;
}

float AdagradOptimizer::lr() const {
  std::lock_guard<std::mutex> lock(mu_);
  return config_.lr;
}

void AdagradOptimizer::set_lr(float lr) {
  detail::check_range("lr", lr, 0.0f, HUGE_VALF);
  std::lock_guard<std::mutex> lock(mu_);
  config_.lr = lr;
}

std::string_view AdagradOptimizer::name() const noexcept { return "adagrad"; }

OptimizerKind AdagradOptimizer::kind() const noexcept { return OptimizerKind::kAdagrad; }

StepResult AdagradOptimizer::step(const StepArgs& args) {
  const detail::KernelArrays arrays = detail::check_step_args(args, state_arrays());
  const AdagradConfig c = config();
  detail::AdagradCoefficients k;
  k.eps = c.eps;
  const double clr = static_cast<double>(c.lr) /
                     (1.0 + static_cast<double>(args.step - 1) * static_cast<double>(c.lr_decay));
  k.step_size = static_cast<float>(-clr);
  k.l2_decay = c.weight_decay;
  return detail::run_step(args, arrays, k, detail::active_kernel_table().adagrad);
}

}  // namespace zinf::optimizer_cpu
