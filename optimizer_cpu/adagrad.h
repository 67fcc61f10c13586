// Adagrad on the CPU over raw arrays, with torch.optim.Adagrad's update rule.
//
// Per element, with g the gradient times grad_scale and t the step number:
//   g += wd * p                          (when weight_decay > 0)
//   sum += g * g                         (the state lives in StepArgs::exp_avg_sq)
//   p -= clr * g / (sqrt(sum) + eps),    clr = lr / (1 + (t - 1) * lr_decay)
// The state must start at initial_accumulator_value (usually 0); the caller fills it.
//
// Thread-safety: see optimizer.h.
#pragma once

#include <mutex>
#include <string_view>

#include "optimizer_cpu/optimizer.h"

namespace zinf::optimizer_cpu {

struct AdagradConfig {
  float lr = 1e-2f;           // >= 0
  float lr_decay = 0.0f;      // >= 0
  float eps = 1e-10f;         // >= 0
  float weight_decay = 0.0f;  // >= 0
};

class AdagradOptimizer final : public Optimizer {
 public:
  // Throws std::invalid_argument naming the field when out of range.
  explicit AdagradOptimizer(const AdagradConfig& config = {});

  AdagradOptimizer(const AdagradOptimizer&) = delete;
  AdagradOptimizer& operator=(const AdagradOptimizer&) = delete;

  // Needs params, grads and exp_avg_sq (the sum of squares); exp_avg is ignored.
  [[nodiscard]] StepResult step(const StepArgs& args) override;

  [[nodiscard]] AdagradConfig config() const;
  void set_config(const AdagradConfig& config);

  [[nodiscard]] float lr() const override;
  void set_lr(float lr) override;
  [[nodiscard]] std::string_view name() const noexcept override;
  [[nodiscard]] OptimizerKind kind() const noexcept override;

 private:
  mutable std::mutex mu_;
  AdagradConfig config_;  // guarded by mu_
};

}  // namespace zinf::optimizer_cpu
