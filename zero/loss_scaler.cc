#include "zero/loss_scaler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "zero/error.h"

namespace zinf::zero {

LossScaler::LossScaler(const LossScaleConfig& config) {
  if (!(config.loss_scale >= 0.0) || !std::isfinite(config.loss_scale)) {
    throw ZeroError(fmt::format("fp16.loss_scale must be 0 (dynamic) or a positive number, not {}",
                                config.loss_scale));
  }
  if (config.loss_scale > 0.0) {
    scale_ = config.loss_scale;
    return;
  }
  if (config.initial_scale_power < 0 || config.initial_scale_power > 126) {
    throw ZeroError(fmt::format("fp16.initial_scale_power must be in [0, 126], not {}",
                                config.initial_scale_power));
  }
  if (config.loss_scale_window < 1) {
    throw ZeroError(
        fmt::format("fp16.loss_scale_window must be >= 1, not {}", config.loss_scale_window));
  }
  if (config.hysteresis < 1) {
    throw ZeroError(fmt::format("fp16.hysteresis must be >= 1, not {}", config.hysteresis));
  }
  if (!(config.min_loss_scale > 0.0) || !std::isfinite(config.min_loss_scale)) {
    throw ZeroError(fmt::format("fp16.min_loss_scale must be a positive number, not {}",
                                config.min_loss_scale));
  }
  dynamic_ = true;
  scale_ = std::ldexp(1.0, config.initial_scale_power);
  min_scale_ = config.min_loss_scale;
  window_ = config.loss_scale_window;
  hysteresis_ = config.hysteresis;
  hysteresis_left_ = config.hysteresis;
  consecutive_hysteresis_ = config.consecutive_hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) {
    ++iteration_;
    return;
  }
  if (overflow) {
    if (hysteresis_ == 1 || hysteresis_left_ == 1) {
      if (scale_ == min_scale_) {
        throw ZeroError(fmt::format(
            "fp16: gradients overflowed with the loss scale already at fp16.min_loss_scale "
            "({}) at iteration {}; the run cannot make progress (lower the learning rate, "
            "lower min_loss_scale, or use bf16)",
            min_scale_, iteration_));
      }
      scale_ = std::max(scale_ / 2.0, min_scale_);
    } else {
      --hysteresis_left_;
    }
    last_overflow_iteration_ = iteration_;
  } else {
    if (consecutive_hysteresis_) {
      hysteresis_left_ = hysteresis_;
    }
    if ((iteration_ - last_overflow_iteration_) % window_ == 0) {
      if (!consecutive_hysteresis_) {
        hysteresis_left_ = hysteresis_;
      }
      scale_ *= 2.0;
    }
  }
  ++iteration_;
}

LossScaler::State LossScaler::state() const noexcept {
  return {scale_, iteration_, last_overflow_iteration_, hysteresis_left_};
}

void LossScaler::restore(const State& state) noexcept {
  scale_ = state.scale;
  iteration_ = state.iteration;
  last_overflow_iteration_ = state.last_overflow_iteration;
  hysteresis_left_ = state.hysteresis_left;
}

}  // namespace zinf::zero
