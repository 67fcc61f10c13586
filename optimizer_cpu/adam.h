// Adam and AdamW on the CPU with DeepSpeed's DeepSpeedCPUAdam semantics, over raw arrays.
//
// Per element, with g the gradient times grad_scale, t the step number and lr, b1, b2, eps,
// wd from the config:
//   L2 mode (adamw_mode = false): g += wd * p
//   m = b1 * m + (1 - b1) * g
//   v = b2 * v + (1 - b2) * g * g
//   AdamW mode: p -= lr * wd * p          (decoupled decay, before the update)
//   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
// with bc1 = 1 - b1^t, bc2 = 1 - b2^t when bias_correction is set, else bc1 = bc2 = 1.
// The powers b^t are kept per optimizer (one object per parameter group): multiplied by b
// when the step advances by one, recomputed with pow() when the step jumps (a resumed
// checkpoint) or when the betas change.
//
// Thread-safety: see optimizer.h (step() may run concurrently on disjoint arrays).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string_view>

#include "optimizer_cpu/optimizer.h"

namespace zinf::optimizer_cpu {

struct AdamConfig {
  float lr = 1e-3f;           // >= 0
  float beta1 = 0.9f;         // in [0, 1)
  float beta2 = 0.999f;       // in [0, 1)
  float eps = 1e-8f;          // >= 0
  float weight_decay = 0.0f;  // >= 0
  bool bias_correction = true;
  bool adamw_mode = true;  // true: AdamW (decoupled decay); false: Adam with L2
};

class AdamOptimizer final : public Optimizer {
 public:
  // Throws std::invalid_argument naming the field (e.g. "beta1") when out of range.
  explicit AdamOptimizer(const AdamConfig& config = {});

  AdamOptimizer(const AdamOptimizer&) = delete;
  AdamOptimizer& operator=(const AdamOptimizer&) = delete;

  // Needs params, grads, exp_avg and exp_avg_sq.
  [[nodiscard]] StepResult step(const StepArgs& args) override;

  [[nodiscard]] AdamConfig config() const;
  // Validates like the constructor; changed betas reset the cached beta powers.
  void set_config(const AdamConfig& config);

  [[nodiscard]] float lr() const override;
  void set_lr(float lr) override;
  bool set_beta1(float beta1) override;  // set_config with beta1 changed
  [[nodiscard]] std::string_view name() const noexcept override;
  [[nodiscard]] OptimizerKind kind() const noexcept override;

 private:
  // The coefficients one step needs, derived from the config and the step number.
  struct StepCoefficients;
  StepCoefficients prepare(std::int64_t step);

  std::atomic<bool> adamw_mode_;  // mirrors config_.adamw_mode for name()
  mutable std::mutex mu_;
  AdamConfig config_;             // guarded by mu_
  std::int64_t cached_step_ = 0;  // guarded by mu_; step the powers below belong to
  double beta1_pow_ = 1.0;        // guarded by mu_; beta1^cached_step_
  double beta2_pow_ = 1.0;        // guarded by mu_; beta2^cached_step_
};

}  // namespace zinf::optimizer_cpu
