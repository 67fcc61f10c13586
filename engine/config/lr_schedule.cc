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

double warmup_decay_lr(const SchedulerConfig& s, int64_t i, bool decay) {
  if (i < 0) return s.warmup_min_lr;
  const int64_t w = warmup_steps(s);
  double gamma = 1.0;
  if (i < w) {
    gamma = warmup_gamma(s, i);
  } else if (decay) {
    gamma = std::max(0.0, static_cast<double>(s.total_num_steps - i) /
                              std::max(1.0, static_cast<double>(s.total_num_steps - w)));
  }
  return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
}

double warmup_cosine_ratio(const SchedulerConfig& s, int64_t i) {
  if (i < 0) return 0.0;
  const int64_t w = warmup_steps(s);
  if (i < w) return s.warmup_min_ratio + (1.0 - s.warmup_min_ratio) * warmup_gamma(s, i);
  const auto done = static_cast<double>(i - w + 1);
  const auto span = static_cast<double>(s.total_num_steps - w);
  const double cosine = (1.0 + std::cos(std::numbers::pi * done / span)) / 2.0;
  return std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
}

// OneCycle's cycle length in steps and the share of it spent rising.
struct Cycle {
  double total = 0.0;
  double rise = 0.0;
};
Cycle cycle_of(const SchedulerConfig& s) {
  const auto first = static_cast<double>(s.cycle_first_step_size);
  const double second =
      s.cycle_second_step_size > 0 ? static_cast<double>(s.cycle_second_step_size) : first;
  return {first + second, first / (first + second)};
}

// The position f in [0, 1] within the cycle for iteration i (< total).
double cycle_scale(const Cycle& c, int64_t i) {
  const double b = static_cast<double>(i + 1) / c.total;
  const double x = 1.0 + b - std::floor(1.0 + b);
  return x <= c.rise ? x / c.rise : (x - 1.0) / (c.rise - 1.0);
}

double one_cycle_lr(const SchedulerConfig& s, int64_t i) {
  const Cycle c = cycle_of(s);
  if (static_cast<double>(i) < c.total) {
    return s.cycle_min_lr + (s.cycle_max_lr - s.cycle_min_lr) * cycle_scale(c, i);
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
    return s.cycle_max_mom - (s.cycle_max_mom - s.cycle_min_mom) * cycle_scale(c, i);
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

void check_scheduler(const SchedulerConfig& s, const std::string& source) {
  if (s.type == SchedulerType::kWarmupCosineLR && s.total_num_steps <= warmup_steps(s)) {
    throw ConfigError(source, "scheduler.params.total_num_steps",
                      fmt::format("{} must be greater than warmup_num_steps ({}) for "
                                  "WarmupCosineLR: its cosine phase would have no steps",
                                  s.total_num_steps, warmup_steps(s)));
  }
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
      return [s](int64_t step) { return warmup_decay_lr(s, iteration_of(step), false); };
    case SchedulerType::kWarmupDecayLR:
      return [s](int64_t step) { return warmup_decay_lr(s, iteration_of(step), true); };
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
