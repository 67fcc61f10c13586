// Learning-rate (and OneCycle momentum) schedules with DeepSpeed's parameters and curves
// (deepspeed/runtime/lr_schedules.py): WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle,
// LRRangeTest. No LibTorch: a schedule is a function of the step number.
//
// Step numbering. The functions take `step`, the 1-based number of the optimizer step about to
// be applied (the first update is step 1; a step skipped for an fp16 overflow does not count,
// as DeepSpeed advances its scheduler only after an applied step). DeepSpeed builds the
// scheduler with last_batch_iteration = -1, which sets the lr (and OneCycle's betas) the first
// update uses, and calls scheduler.step() after each applied update; so update `step` runs with
// the value for last_batch_iteration = step - 2. The curves, with i = step - 2 and
// W = max(2, warmup_num_steps):
//
//   WarmupLR        i < 0: min_lr. i < W: min_lr + (max_lr - min_lr) * g, where g =
//                   log(i + 1) / log(W) (log) or i / W (linear). Then max_lr. max_lr:
//                   warmup_max_lr, else the optimizer's lr (WarmupDecayLR: else 0.001).
//   WarmupDecayLR   as WarmupLR while i < W; then min_lr + (max_lr - min_lr) *
//                   max(0, (total - i) / max(1, total - W)).
//   WarmupCosineLR  base_lr x ratio. i < 0: ratio 0. i < W: warmup_min_ratio + (1 -
//                   warmup_min_ratio) * g. Then max(0, cos_min_ratio + (1 - cos_min_ratio) *
//                   (1 + cos(pi * min(1, (i - W + 1) / max(1, total - W)))) / 2): from
//                   total on the ratio stays at cos_min_ratio.
//   OneCycle        i < total_size (= first + second step size): min_lr + (max_lr - min_lr) *
//                   f, with b = i + 1, x = 1 + b / total_size - floor(1 + b / total_size),
//                   f = x / r if x <= r else (x - 1) / (r - 1), r = first / total_size; with
//                   a stair count n > 0 for that half (cycle_first_stair_count rising,
//                   cycle_second_stair_count falling), f = floor(p * n) / n where p =
//                   c / first rising, (total_size - c) / second falling, c = b mod
//                   total_size. After:
//                   min_lr / (1 + decay_lr_rate * (i - total_size + 1) / decay_step_size), or
//                   min_lr when decay_step_size or decay_lr_rate is 0. The momentum (beta1) is
//                   cycle_min_mom for the first update, then max_mom - (max_mom - min_mom) * f
//                   in the cycle and max_mom * (1 + decay_mom_rate * (i - total_size + 1) /
//                   decay_step_size) after it (max_mom when no decay).
//   LRRangeTest     min_lr * (1 + step_rate * n), n = (i + 1) / step_size, floored when
//                   staircase.
//
// Thread safety: the returned functions hold copies of their parameters; they are pure and may
// be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "engine/config/run_config.h"

namespace zinf::config {

// lr for the 1-based applied optimizer step (steps below 1 are read as 1).
using LrSchedule = std::function<double(int64_t step)>;

// The schedule of `scheduler`; base_lr is the optimizer's lr (the constant lr when the type is
// kNone, the peak of WarmupCosineLR). Throws ConfigError (see check_scheduler) for parameters
// that cannot make a curve.
[[nodiscard]] LrSchedule make_lr_schedule(const SchedulerConfig& scheduler, double base_lr,
                                          const std::string& source = "config");

// OneCycle with cycle_momentum cycles beta1 and, as DeepSpeed does, pins beta2 to 0.99 for the
// whole run. For every other schedule, for cycle_momentum false, and for Adagrad (no betas:
// DeepSpeed turns cycling off with a warning) beta1 is empty and the optimizer's betas stand.
struct MomentumSchedule {
  std::function<double(int64_t step)> beta1;  // empty: no momentum schedule
  double beta2 = 0.0;                         // valid when beta1 is set
};
inline constexpr double kOneCycleBeta2 = 0.99;
[[nodiscard]] MomentumSchedule make_momentum_schedule(const SchedulerConfig& scheduler,
                                                      OptimizerType optimizer);

// Throws ConfigError naming "scheduler.params.<key>" when the parameters cannot make a curve:
// OneCycle or LRRangeTest with a step size below 1.
void check_scheduler(const SchedulerConfig& scheduler, const std::string& source);

// DeepSpeed's warning for scheduler.params.total_num_steps, if any: WarmupDecayLR's total
// below warmup_num_steps, WarmupCosineLR's total not past the warm-up (the curve still works:
// it stays at its end value).
[[nodiscard]] std::optional<std::string> scheduler_warning(const SchedulerConfig& scheduler);

}  // namespace zinf::config
