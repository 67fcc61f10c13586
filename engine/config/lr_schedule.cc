#include "engine/config/lr_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace zinf::config {
namespace {

// DeepSpeed's last_batch_iteration while update `step` runs (see the header).
int64_t iteration_of(int64_t step) { return std::max<int64_t>(step, 1) - 2; }

// max(2, warmup_num_steps): DeepSpeed's warm-up length (log(1) would divide by zero).
int64_t warmup_steps(const SchedulerConfig& s) { return std::max<int64_t>(2, s.warmup_num_steps); }

// The warm-up fraction g for iteration i (0 <= i < W).
double warmup_gamma(const SchedulerConfig& s, int64_t i) {
  const auto w = static_cast<double>(warmup_steps(s));
  if (s.warmup_type == WarmupType::kLog) return std::log(static_cast<double>(i + 1)) / std::log(w);
  return static_cast<double>(i) / w;
}

// WarmupLR (decay false) peaks at warmup_max_lr, else the optimizer's lr; WarmupDecayLR at
// warmup_max_lr, else 0.001 (the defaults of the two DeepSpeed classes differ).
double warmup_decay_lr(const SchedulerConfig& s, double base_lr, int64_t i, bool decay) {
  if (i < 0) return s.warmup_min_lr;
  const double max_lr = s.warmup_max_lr.value_or(decay ? 0.001 : base_lr);
  const int64_t w = warmup_steps(s);
  double gamma = 1.0;
  if (i < w) {
    gamma = warmup_gamma(s, i);
  } else if (decay) {
    gamma = std::max(0.0, static_cast<double>(s.total_num_steps - i) /
                              std::max(1.0, static_cast<double>(s.total_num_steps - w)));
  }
  return s.warmup_min_lr + (max_lr - s.warmup_min_lr) * gamma;
}

double warmup_cosine_ratio(const SchedulerConfig& s, int64_t i) {
  if (i < 0) return 0.0;
  const int64_t w = warmup_steps(s);
  if (i < w) return s.warmup_min_ratio + (1.0 - s.warmup_min_ratio) * warmup_gamma(s, i);
  // The progress is clamped at 1: from total_num_steps on (and throughout when total <= W)
  // the ratio stays at cos_min_ratio.
  const auto done = static_cast<double>(i - w + 1);
  const double span = std::max<double>(1.0, static_cast<double>(s.total_num_steps - w));
  const double cosine = (1.0 + std::cos(std::numbers::pi * std::min(1.0, done / span))) / 2.0;
  return std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
}

// OneCycle's cycle length in steps and the share of it spent rising.
struct Cycle {
  double total = 0.0;
  double rise = 0.0;
  double first = 0.0;  // cycle_first_step_size
};
Cycle cycle_of(const SchedulerConfig& s) {
  const auto first = static_cast<double>(s.cycle_first_step_size);
  const double second =
      s.cycle_second_step_size > 0 ? static_cast<double>(s.cycle_second_step_size) : first;
  return {first + second, first / (first + second), first};
}

// The position f in [0, 1] within the cycle for iteration i (< total). With a stair count n
// for the half the iteration is in, f is held flat over n stairs: floor(position * n) / n,
// the position taken from the whole iteration count within the cycle (not from f, which can
// land a rounding error under a stair).
double cycle_scale(const SchedulerConfig& s, const Cycle& c, int64_t i) {
  const auto batch = static_cast<double>(i + 1);
  const double b = batch / c.total;
  const double x = 1.0 + b - std::floor(1.0 + b);
  const bool rising = x <= c.rise;
  const int64_t stairs = rising ? s.cycle_first_stair_count : s.cycle_second_stair_count;
  if (stairs <= 0) return rising ? x / c.rise : (x - 1.0) / (c.rise - 1.0);
  const double in_cycle = std::fmod(batch, c.total);
  const double n = static_cast<double>(stairs);
  const double position =
      in_cycle <= c.first ? in_cycle * n / c.first : (c.total - in_cycle) * n / (c.total - c.first);
  return std::floor(position) / n;
}

double one_cycle_lr(const SchedulerConfig& s, int64_t i) {
  const Cycle c = cycle_of(s);
  if (static_cast<double>(i) < c.total) {
    return s.cycle_min_lr + (s.cycle_max_lr - s.cycle_min_lr) * cycle_scale(s, c, i);
  }
  if (s.decay_step_size == 0 || s.decay_lr_rate == 0.0) return s.cycle_min_lr;
  const double interval =
      (static_cast<double>(i) - c.total + 1.0) / static_cast<double>(s.decay_step_size);
  return s.cycle_min_lr / (1.0 + s.decay_lr_rate * interval);
}

double one_cycle_beta1(const SchedulerConfig& s, int64_t i) {
  if (i < 0) return s.cycle_min_mom;  // what DeepSpeed's constructor sets
  const Cycle c = cycle_of(s);
  if (static_cast<double>(i) < c.total) {
    return s.cycle_max_mom - (s.cycle_max_mom - s.cycle_min_mom) * cycle_scale(s, c, i);
  }
  if (s.decay_step_size == 0 || s.decay_mom_rate == 0.0) return s.cycle_max_mom;
  const double interval =
      (static_cast<double>(i) - c.total + 1.0) / static_cast<double>(s.decay_step_size);
  return s.cycle_max_mom * (1.0 + s.decay_mom_rate * interval);
}

double range_test_lr(const SchedulerConfig& s, int64_t i) {
  double n = static_cast<double>(i + 1) / static_cast<double>(s.lr_range_test_step_size);
  if (s.lr_range_test_staircase) n = std::floor(n);
  return s.lr_range_test_min_lr * (1.0 + s.lr_range_test_step_rate * n);
}

}  // namespace

std::optional<std::string> scheduler_warning(const SchedulerConfig& s) {
  const int64_t w = warmup_steps(s);
  if (s.type == SchedulerType::kWarmupDecayLR && s.total_num_steps < s.warmup_num_steps) {
    return fmt::format("{} is less than warmup_num_steps {}: the decay never starts",
                       s.total_num_steps, s.warmup_num_steps);
  }
  if (s.type == SchedulerType::kWarmupCosineLR && s.total_num_steps <= w) {
    return fmt::format(
        "{} is not more than the warm-up ({} steps: max(2, warmup_num_steps)): after the "
        "warm-up the lr stays at cos_min_ratio x lr, as in DeepSpeed",
        s.total_num_steps, w);
  }
  return std::nullopt;
}

void check_scheduler(const SchedulerConfig& s, const std::string& source) {
  if (s.type == SchedulerType::kOneCycle && s.cycle_first_step_size < 1) {
    throw ConfigError(source, "scheduler.params.cycle_first_step_size",
                      fmt::format("{} must be at least 1", s.cycle_first_step_size));
  }
  if (s.type == SchedulerType::kLRRangeTest && s.lr_range_test_step_size < 1) {
    throw ConfigError(source, "scheduler.params.lr_range_test_step_size",
                      fmt::format("{} must be at least 1", s.lr_range_test_step_size));
  }
}

LrSchedule make_lr_schedule(const SchedulerConfig& scheduler, double base_lr,
                            const std::string& source) {
  check_scheduler(scheduler, source);
  const SchedulerConfig s = scheduler;
  switch (s.type) {
    case SchedulerType::kNone:
      return [base_lr](int64_t) { return base_lr; };
    case SchedulerType::kWarmupLR:
      return [s, base_lr](int64_t step) {
        return warmup_decay_lr(s, base_lr, iteration_of(step), false);
      };
    case SchedulerType::kWarmupDecayLR:
      return [s, base_lr](int64_t step) {
        return warmup_decay_lr(s, base_lr, iteration_of(step), true);
      };
    case SchedulerType::kWarmupCosineLR:
      return [s, base_lr](int64_t step) {
        return base_lr * warmup_cosine_ratio(s, iteration_of(step));
      };
    case SchedulerType::kOneCycle:
      return [s](int64_t step) { return one_cycle_lr(s, iteration_of(step)); };
    case SchedulerType::kLRRangeTest:
      return [s](int64_t step) { return range_test_lr(s, iteration_of(step)); };
  }
  return [base_lr](int64_t) { return base_lr; };
}

MomentumSchedule make_momentum_schedule(const SchedulerConfig& scheduler, OptimizerType optimizer) {
  MomentumSchedule m;
  if (scheduler.type != SchedulerType::kOneCycle || !scheduler.cycle_momentum ||
      optimizer == OptimizerType::kAdagrad) {
    return m;
  }
  const SchedulerConfig s = scheduler;
  m.beta1 = [s](int64_t step) { return one_cycle_beta1(s, iteration_of(step)); };
  m.beta2 = kOneCycleBeta2;
  return m;
}

}  // namespace zinf::config
