// LossScaler against DeepSpeed's dynamic loss-scale rule, written out independently here,
// on random overflow sequences and on hand-made cases.

#include "zero/loss_scaler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "tests/common/seed.h"
#include "zero/error.h"

namespace zinf::zero {
namespace {

// The rule as DeepSpeed documents it, state by state.
struct ReferenceScaler {
  double scale;
  double min_scale;
  int window;
  int hysteresis;
  bool consecutive;
  int left;
  long iteration = 0;
  long last_overflow = -1;

  bool update(bool overflow) {  // false: the scaler would raise (overflow at min scale)
    if (overflow) {
      if (hysteresis == 1 || left == 1) {
        if (scale == min_scale) return false;
        scale = std::max(scale / 2, min_scale);
      } else {
        --left;
      }
      last_overflow = iteration;
    } else {
      if (consecutive) left = hysteresis;
      if ((iteration - last_overflow) % window == 0) {
        if (!consecutive) left = hysteresis;
        scale *= 2;
      }
    }
    ++iteration;
    return true;
  }
};

TEST(LossScaler, DynamicMatchesTheRuleOnRandomSequences) {
  const uint64_t seed = testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    LossScaleConfig c;
    c.initial_scale_power = static_cast<int>(rng() % 20);
    c.loss_scale_window = 1 + static_cast<int>(rng() % 6);
    c.hysteresis = 1 + static_cast<int>(rng() % 3);
    c.consecutive_hysteresis = (rng() % 2) == 1;
    c.min_loss_scale = std::ldexp(1.0, static_cast<int>(rng() % 4));
    LossScaler scaler(c);
    ReferenceScaler ref{std::ldexp(1.0, c.initial_scale_power),
                        c.min_loss_scale,
                        c.loss_scale_window,
                        c.hysteresis,
                        c.consecutive_hysteresis,
                        c.hysteresis};
    const double overflow_rate = static_cast<double>(rng() % 100) / 100.0;
    std::bernoulli_distribution overflow(overflow_rate);
    for (int step = 0; step < 60; ++step) {
      const bool o = overflow(rng);
      if (!ref.update(o)) {
        EXPECT_THROW(scaler.update(o), ZeroError) << "trial " << trial << " step " << step;
        break;
      }
      scaler.update(o);
      ASSERT_EQ(scaler.scale(), ref.scale) << "trial " << trial << " step " << step;
      ASSERT_EQ(scaler.state().hysteresis_left, ref.left);
    }
  }
}

// A dynamic scale from 2^power.
LossScaleConfig dynamic_config(int power, int window, int hysteresis) {
  LossScaleConfig c;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  return c;
}

TEST(LossScaler, WindowDoublesAndHysteresisDelaysTheCut) {
  LossScaler s(dynamic_config(4, 2, 2));  // 16
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 16.0);
  s.update(false);  // iteration 0: (0 - -1) % 2 != 0
  EXPECT_EQ(s.scale(), 16.0);
  s.update(false);  // iteration 1: (1 - -1) % 2 == 0 -> doubles
  EXPECT_EQ(s.scale(), 32.0);
  s.update(true);  // hysteresis 2 -> 1, scale kept
  EXPECT_EQ(s.scale(), 32.0);
  s.update(true);  // hysteresis used up -> halves
  EXPECT_EQ(s.scale(), 16.0);
}

TEST(LossScaler, ConsecutiveHysteresisIsRefilledByEveryGoodStep) {
  LossScaleConfig c = dynamic_config(4, 100, 2);  // 16
  for (bool consecutive : {false, true}) {
    c.consecutive_hysteresis = consecutive;
    LossScaler s(c);
    s.update(true);   // hysteresis 2 -> 1
    s.update(false);  // consecutive: back to 2
    s.update(true);   // consecutive: 2 -> 1, scale kept; else used up: halved
    EXPECT_EQ(s.scale(), consecutive ? 16.0 : 8.0) << "consecutive " << consecutive;
    EXPECT_EQ(s.state().hysteresis_left, 1) << "consecutive " << consecutive;
  }
}

TEST(LossScaler, TheCutStopsAtMinLossScale) {
  LossScaleConfig c = dynamic_config(2, 1000, 1);  // 4
  c.min_loss_scale = 3.0;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.scale(), 3.0);  // max(4 / 2, 3)
  EXPECT_THROW(s.update(true), ZeroError);
}

TEST(LossScaler, StaticScaleNeverChanges) {
  LossScaleConfig c;
  c.loss_scale = 128.0;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  for (int i = 0; i < 5; ++i) s.update(i % 2 == 0);
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, OverflowAtTheMinimumIsAnErrorNamingTheKey) {
  LossScaleConfig c;
  c.initial_scale_power = 0;
  c.hysteresis = 1;
  c.min_loss_scale = 1.0;
  LossScaler s(c);
  try {
    s.update(true);
    FAIL() << "no error";
  } catch (const ZeroError& e) {
    EXPECT_NE(std::string(e.what()).find("min_loss_scale"), std::string::npos) << e.what();
  }
}

TEST(LossScaler, RejectsValuesThatCannotWork) {
  LossScaleConfig c;
  c.loss_scale_window = 0;
  EXPECT_THROW(LossScaler{c}, ZeroError);
  c = {};
  c.hysteresis = 0;
  EXPECT_THROW(LossScaler{c}, ZeroError);
  c = {};
  c.min_loss_scale = 0;
  EXPECT_THROW(LossScaler{c}, ZeroError);
  c = {};
  c.loss_scale = -1;
  EXPECT_THROW(LossScaler{c}, ZeroError);
}

TEST(LossScaler, StateRoundTrips) {
  LossScaleConfig c;
  c.initial_scale_power = 10;
  c.loss_scale_window = 3;
  LossScaler a(c);
  a.update(true);
  a.update(false);
  LossScaler b(c);
  b.restore(a.state());
  for (int i = 0; i < 10; ++i) {
    a.update(i % 4 == 0);
    b.update(i % 4 == 0);
    EXPECT_EQ(a.scale(), b.scale());
  }
}

}  // namespace
}  // namespace zinf::zero
