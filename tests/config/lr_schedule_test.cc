// LR schedules against DeepSpeed. The expected values were printed by DeepSpeed's own
// deepspeed/runtime/lr_schedules.py (commit 38327e07f) driven the way its engine drives it: the
// scheduler built over a torch optimizer, the lr (and betas) read before each update, then
// scheduler.step() after it; the WarmupCosineLR clamp, OneCycle's stairs and WarmupLR's
// default peak follow the later lr_schedules.py (master of 2026-08, #8142, #8179, #7360),
// their values computed from its formulas. Each table also notes the formula the value comes from,
// with i = step - 2 (DeepSpeed's last_batch_iteration during that update).
#include "engine/config/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/config/test_util.h"

namespace zinf::config {
namespace {

struct Point {
  int64_t step;
  double value;
};

void expect_curve(const LrSchedule& lr, const std::vector<Point>& points) {
  for (const Point& p : points) {
    EXPECT_NEAR(lr(p.step), p.value, 1e-12 * std::max(1.0, std::abs(p.value)))
        << "at step " << p.step;
  }
}

SchedulerConfig warmup(SchedulerType type, WarmupType warmup_type, double min_lr) {
  SchedulerConfig s;
  s.type = type;
  s.warmup_min_lr = min_lr;
  s.warmup_max_lr = 0.01;
  s.warmup_num_steps = 10;
  s.warmup_type = warmup_type;
  s.total_num_steps = 30;
  return s;
}

TEST(LrScheduleTest, WarmupLrLog) {
  const LrSchedule lr =
      make_lr_schedule(warmup(SchedulerType::kWarmupLR, WarmupType::kLog, 0.001), 0.5);
  expect_curve(lr, {
                       {1, 0.001},                  // i = -1: the constructor's min_lr
                       {2, 0.001},                  // log(1) = 0
                       {3, 0.0037092699609758304},  // 0.001 + 0.009 * log(2) / log(10)
                       {4, 0.005294091292476962},
                       {5, 0.006418539921951661},
                       {7, 0.008003361253452792},
                       {11, 0.01},  // i = 9: log(10) / log(10)
                       {12, 0.01},
                       {40, 0.01},
                   });
  // Steps below 1 read as the first.
  EXPECT_DOUBLE_EQ(lr(0), 0.001);
}

TEST(LrScheduleTest, WarmupLrLinear) {
  expect_curve(make_lr_schedule(warmup(SchedulerType::kWarmupLR, WarmupType::kLinear, 0.0), 0.5),
               {
                   {1, 0.0},
                   {2, 0.0},    // i / W = 0
                   {3, 0.001},  // 1 / 10
                   {5, 0.003},
                   {7, 0.005},
                   {11, 0.009},
                   {12, 0.01},
                   {35, 0.01},
               });
}

TEST(LrScheduleTest, WarmupDecayLr) {
  expect_curve(
      make_lr_schedule(warmup(SchedulerType::kWarmupDecayLR, WarmupType::kLinear, 0.0), 0.5),
      {
          {1, 0.0},
          {3, 0.001},
          {11, 0.009},
          {12, 0.01},    // i = 10 = W: (30 - 10) / (30 - 10)
          {13, 0.0095},  // (30 - 11) / 20
          {20, 0.006},
          {25, 0.0035},
          {31, 0.0005},
          {32, 0.0},  // i = 30 = total
          {40, 0.0},
      });
}

// WarmupCosineLR over `total` steps, 10 of warm-up, ending at 1% of the peak.
SchedulerConfig cosine(int64_t total, WarmupType warmup_type) {
  SchedulerConfig s;
  s.type = SchedulerType::kWarmupCosineLR;
  s.total_num_steps = total;
  s.warmup_num_steps = 10;
  s.cos_min_ratio = 0.01;
  s.warmup_type = warmup_type;
  return s;
}

TEST(LrScheduleTest, WarmupCosineLr) {
  SchedulerConfig s = cosine(30, WarmupType::kLog);
  s.warmup_min_ratio = 0.1;
  // The peak is the optimizer's lr (0.5).
  expect_curve(make_lr_schedule(s, 0.5),
               {
                   {1, 0.0},   // the constructor sets ratio 0
                   {2, 0.05},  // 0.5 * (0.1 + 0.9 * log(1) / log(10))
                   {3, 0.18546349804879153},
                   {4, 0.26470456462384806},
                   {7, 0.4001680626726396},
                   {11, 0.5},
                   {12, 0.4969528642972966},  // 0.5 * (0.01 + 0.99 * (1 + cos(pi * 1 / 20)) / 2)
                   {13, 0.48788648778305055},
                   {20, 0.29121753009745716},
                   {25, 0.10702315005761293},
                   {31, 0.005},  // cos(pi) = -1: cos_min_ratio
                   {32, 0.005},  // past total the progress is clamped at 1 (DeepSpeed #8142)
                   {40, 0.005},
               });
}

// total_num_steps not past the warm-up: DeepSpeed warns and, after the warm-up, holds the
// cosine floor (max(1, total - W) as the span, the progress clamped at 1).
TEST(LrScheduleTest, WarmupCosineLrWithoutACosinePhaseHoldsTheFloor) {
  const SchedulerConfig s = cosine(5, WarmupType::kLinear);
  ASSERT_TRUE(scheduler_warning(s));
  expect_curve(make_lr_schedule(s, 0.5), {
                                             {6, 0.2},  // 0.5 * 4 / 10
                                             {11, 0.45},
                                             {12, 0.005},
                                             {20, 0.005},
                                         });
}

// warmup_max_lr left out: WarmupLR climbs to the optimizer's lr (DeepSpeed #7360), while
// WarmupDecayLR keeps its own default of 0.001.
TEST(LrScheduleTest, WarmupMaxLrDefaults) {
  SchedulerConfig s = warmup(SchedulerType::kWarmupLR, WarmupType::kLinear, 0.0);
  s.warmup_max_lr.reset();
  expect_curve(make_lr_schedule(s, 0.5), {{2, 0.0}, {7, 0.25}, {12, 0.5}, {20, 0.5}});
  s.type = SchedulerType::kWarmupDecayLR;
  s.total_num_steps = 1000;
  expect_curve(make_lr_schedule(s, 0.5), {{2, 0.0}, {7, 0.0005}, {12, 0.001}});
  // Through the parser: a WarmupLR block without warmup_max_lr.
  const RunConfig c = parse_config_string(R"({"optimizer": {"type": "AdamW", "params":
      {"lr": 0.02}}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10,
      "warmup_type": "linear"}}})");
  EXPECT_FALSE(c.scheduler.warmup_max_lr);
  EXPECT_DOUBLE_EQ(make_lr_schedule(c.scheduler, c.optimizer.lr)(12), 0.02);
}

SchedulerConfig one_cycle() {
  SchedulerConfig s;
  s.type = SchedulerType::kOneCycle;
  s.cycle_min_lr = 0.001;
  s.cycle_max_lr = 0.01;
  s.decay_lr_rate = 0.5;
  s.cycle_first_step_size = 4;
  s.cycle_second_step_size = 6;
  s.decay_step_size = 2;
  s.cycle_min_mom = 0.8;
  s.cycle_max_mom = 0.9;
  s.decay_mom_rate = 0.1;
  return s;
}

TEST(LrScheduleTest, OneCycleLr) {
  expect_curve(make_lr_schedule(one_cycle(), 0.5),
               {
                   {1, 0.001},
                   {2, 0.00325},  // b = 1, x = 0.1, f = 0.1 / 0.4: 0.001 + 0.009 * 0.25
                   {3, 0.0055},
                   {4, 0.00775},
                   {5, 0.01},   // top of the cycle
                   {7, 0.007},  // falling: f = (x - 1) / (r - 1)
                   {11, 0.001},
                   {12, 0.0008},  // decay: 0.001 / (1 + 0.5 * 1 / 2)
                   {13, 0.0006666666666666666},
                   {20, 0.0003076923076923077},
                   {31, 0.00016666666666666666},
                   {40, 0.00012121212121212121},
               });
}

TEST(LrScheduleTest, OneCycleMomentum) {
  const MomentumSchedule m = make_momentum_schedule(one_cycle(), OptimizerType::kAdamW);
  ASSERT_TRUE(m.beta1);
  EXPECT_DOUBLE_EQ(m.beta2, 0.99);  // DeepSpeed pins beta2 while it cycles beta1
  expect_curve(m.beta1, {
                            {1, 0.8},  // the constructor sets cycle_min_mom
                            {2, 0.875},
                            {3, 0.85},
                            {4, 0.825},
                            {5, 0.8},
                            {7, 0.8333333333333334},
                            {11, 0.9},
                            {12, 0.945},  // 0.9 * (1 + 0.1 * 1 / 2)
                            {13, 0.99},
                            {20, 1.305},  // DeepSpeed's decay keeps growing past 1
                            {40, 2.205},
                        });
  // No schedule without cycling, for Adagrad (no betas), and for other schedulers.
  SchedulerConfig s = one_cycle();
  s.cycle_momentum = false;
  EXPECT_FALSE(make_momentum_schedule(s, OptimizerType::kAdamW).beta1);
  EXPECT_FALSE(make_momentum_schedule(one_cycle(), OptimizerType::kAdagrad).beta1);
  EXPECT_FALSE(make_momentum_schedule(warmup(SchedulerType::kWarmupLR, WarmupType::kLog, 0),
                                      OptimizerType::kAdam)
                   .beta1);
}

// Stair counts hold the lr and beta1 flat: 2 stairs on the 4-step rise, 3 on the 6-step fall
// (DeepSpeed #8179): f = floor(p * n) / n from the step's place c in the cycle.
TEST(LrScheduleTest, OneCycleStairs) {
  SchedulerConfig s = one_cycle();
  s.cycle_first_stair_count = 2;
  s.cycle_second_stair_count = 3;
  expect_curve(make_lr_schedule(s, 0.5), {
                                             {1, 0.001},
                                             {2, 0.001},  // c = 1: floor(1 * 2 / 4) = 0
                                             {3, 0.0055},
                                             {4, 0.0055},
                                             {5, 0.01},
                                             {6, 0.007},  // c = 5: floor(5 * 3 / 6) / 3
                                             {7, 0.007},
                                             {8, 0.004},
                                             {10, 0.001},
                                             {11, 0.001},
                                         });
  expect_curve(make_momentum_schedule(s, OptimizerType::kAdamW).beta1,
               {{3, 0.85}, {4, 0.85}, {6, 0.8333333333333334}, {8, 0.8666666666666667}});
  // Parsed: the second count defaults to the first.
  const RunConfig c = parse_config_string(R"({"scheduler": {"type": "OneCycle", "params": {
      "cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 4,
      "cycle_first_stair_count": 2}}})");
  EXPECT_EQ(c.scheduler.cycle_second_stair_count, 2);
  // Symmetric 8-step cycle, 2 stairs each way: c = 5 falls to floor(3 * 2 / 4) / 2 = 0.5.
  EXPECT_NEAR(make_lr_schedule(c.scheduler, 0.5)(7), 0.0055, 1e-15);
}

TEST(LrScheduleTest, OneCycleWithoutDecayStaysAtTheFloor) {
  SchedulerConfig s = one_cycle();
  s.decay_step_size = 0;
  const LrSchedule lr = make_lr_schedule(s, 0.5);
  EXPECT_DOUBLE_EQ(lr(12), 0.001);
  EXPECT_DOUBLE_EQ(lr(100), 0.001);
  EXPECT_DOUBLE_EQ(make_momentum_schedule(s, OptimizerType::kLion).beta1(100), 0.9);
  // Second step size 0 means "the same as the first": a symmetric cycle of 8 steps.
  s.cycle_second_step_size = 0;
  const LrSchedule symmetric = make_lr_schedule(s, 0.5);
  EXPECT_DOUBLE_EQ(symmetric(5), 0.01);  // b = 4 = first step size: the top
  EXPECT_DOUBLE_EQ(symmetric(9), 0.001);
}

TEST(LrScheduleTest, LrRangeTest) {
  SchedulerConfig s;
  s.type = SchedulerType::kLRRangeTest;
  s.lr_range_test_min_lr = 0.001;
  s.lr_range_test_step_size = 3;
  s.lr_range_test_step_rate = 2.0;
  expect_curve(make_lr_schedule(s, 0.5), {
                                             {1, 0.001},
                                             {2, 0.0016666666666666666},  // 0.001 * (1 + 2 * 1 / 3)
                                             {3, 0.002333333333333333},
                                             {4, 0.003},
                                             {13, 0.009},
                                             {40, 0.027},
                                         });
  s.lr_range_test_staircase = true;
  expect_curve(make_lr_schedule(s, 0.5), {
                                             {1, 0.001},
                                             {3, 0.001},  // floor(2 / 3) = 0
                                             {4, 0.003},
                                             {12, 0.007},
                                             {13, 0.009},
                                             {32, 0.021},
                                         });
}

TEST(LrScheduleTest, NoSchedulerIsTheConstantLr) {
  const LrSchedule lr = make_lr_schedule(SchedulerConfig{}, 3e-4);
  EXPECT_DOUBLE_EQ(lr(1), 3e-4);
  EXPECT_DOUBLE_EQ(lr(1000000), 3e-4);
}

TEST(LrScheduleTest, ParametersThatCannotMakeACurve) {
  SchedulerConfig s = one_cycle();
  s.cycle_first_step_size = 0;
  testing::expect_error(testing::error_of([&] { (void)make_lr_schedule(s, 1.0, "x.json"); }),
                        "scheduler.params.cycle_first_step_size", {"x.json", "at least 1"});
}

TEST(LrScheduleTest, ParsedConfigDrivesTheSchedule) {
  // The zero2 example's WarmupLR (log, 0 -> 3e-4 over 100 steps) through the parser.
  RunConfig c = parse_config_string(R"({"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
                    "warmup_num_steps": 100}}})");
  const LrSchedule lr = make_lr_schedule(c.scheduler, c.optimizer.lr);
  EXPECT_DOUBLE_EQ(lr(1), 0.0);
  EXPECT_DOUBLE_EQ(lr(2), 0.0);
  EXPECT_NEAR(lr(12), 3e-4 * 0.5206963425791124, 1e-15);  // log(11) / log(100)
  EXPECT_DOUBLE_EQ(lr(102), 3e-4);
}

}  // namespace
}  // namespace zinf::config
