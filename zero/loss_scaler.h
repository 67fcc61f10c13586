// LossScaler: fp16's loss scale, static or dynamic, with DeepSpeed's update rule (the `fp16`
// config block: loss_scale, initial_scale_power, loss_scale_window, hysteresis,
// consecutive_hysteresis, min_loss_scale).
//
// Dynamic rule, applied once per optimizer step with the global overflow verdict:
//   overflow:  if hysteresis is used up (or is 1), scale = max(scale / 2, min_loss_scale) —
//              an overflow at min_loss_scale is an error, the run cannot make progress —
//              else one unit of hysteresis is spent; the step is skipped either way.
//   no overflow: with consecutive_hysteresis the hysteresis is refilled; every
//              loss_scale_window steps since the last overflow the scale doubles (and,
//              without consecutive_hysteresis, the hysteresis is refilled then).
// A static scale never changes; bf16 and fp32 runs use scale 1 (static).
//
// Thread safety: none (the engine's driving thread owns it).
#pragma once

#include <cstdint>

#include "zero/zero_config.h"

namespace zinf::zero {

class LossScaler {
 public:
  // A static scale of 1 (no scaling).
  LossScaler() = default;
  // From the fp16 block: dynamic when config.loss_scale is 0. Throws ZeroError for values
  // that cannot work (a window < 1, hysteresis < 1, min_loss_scale <= 0, ...), naming the key.
  explicit LossScaler(const LossScaleConfig& config);

  [[nodiscard]] double scale() const noexcept { return scale_; }
  [[nodiscard]] bool dynamic() const noexcept { return dynamic_; }
  // The dynamic rule's settings (the fp16 block's min_loss_scale, loss_scale_window,
  // hysteresis and consecutive_hysteresis), for checkpoints.
  [[nodiscard]] double min_scale() const noexcept { return min_scale_; }
  [[nodiscard]] int window() const noexcept { return window_; }
  [[nodiscard]] int hysteresis() const noexcept { return hysteresis_; }
  [[nodiscard]] bool consecutive_hysteresis() const noexcept { return consecutive_hysteresis_; }

  // Records one step's global overflow verdict and adjusts the scale. Throws ZeroError when
  // an overflow happens with the scale already at min_loss_scale.
  void update(bool overflow);

  // State, for checkpoints and logs.
  struct State {
    double scale = 1.0;
    int64_t iteration = 0;  // updates so far
    int64_t last_overflow_iteration = -1;
    int hysteresis_left = 1;
  };
  [[nodiscard]] State state() const noexcept;
  void restore(const State& state) noexcept;

 private:
  bool dynamic_ = false;
  double scale_ = 1.0;
  double min_scale_ = 1.0;
  int window_ = 1000;
  int hysteresis_ = 1;
  bool consecutive_hysteresis_ = false;
  int hysteresis_left_ = 1;
  int64_t iteration_ = 0;
  int64_t last_overflow_iteration_ = -1;
};

}  // namespace zinf::zero
