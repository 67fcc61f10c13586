// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") on the CPU over
// raw arrays.
//
// Per element, with g the gradient times grad_scale:
//   p -= lr * wd * p                          (decoupled decay)
//   p -= lr * sign(b1 * m + (1 - b1) * g)     (sign(0) = 0)
//   m = b2 * m + (1 - b2) * g                 (the state lives in StepArgs::exp_avg)
//
// Thread-safety: see optimizer.h.
#pragma once

#include <mutex>
#include <string_view>

#include "optimizer_cpu/optimizer.h"

namespace zinf::optimizer_cpu {

struct LionConfig {
  float lr = 1e-4f;           // >= 0
  float beta1 = 0.9f;         // in [0, 1]
  float beta2 = 0.99f;        // in [0, 1]
  float weight_decay = 0.0f;  // >= 0
};

class LionOptimizer final : public Optimizer {
 public:
  // Throws std::invalid_argument naming the field when out of range.
  explicit LionOptimizer(const LionConfig& config = {});

  LionOptimizer(const LionOptimizer&) = delete;
  LionOptimizer& operator=(const LionOptimizer&) = delete;

  // Needs params, grads and exp_avg; exp_avg_sq is ignored.
  [[nodiscard]] StepResult step(const StepArgs& args) override;

  [[nodiscard]] LionConfig config() const;
  void set_config(const LionConfig& config);

  [[nodiscard]] float lr() const override;
  void set_lr(float lr) override;
  [[nodiscard]] std::string_view name() const noexcept override;
  [[nodiscard]] OptimizerKind kind() const noexcept override;

 private:
  mutable std::mutex mu_;
  LionConfig config_;  // guarded by mu_
};

}  // namespace zinf::optimizer_cpu
