// SPDX-License-Identifier: Apache-2.0
// LossScaler against DeepSpeed's DynamicLossScaler.update_scale, step by step.
#include "optim/loss_scaler.h"

#include <cmath>
#include <vector>

#include "tests/test_util.h"

namespace strata::optim {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

// A transcription of DeepSpeed's update_scale (loss_scaler.py) to compare
// against on long random sequences.
struct DeepSpeedScaler {
  double cur_scale;
  int64_t cur_iter = 0, last_overflow_iter = -1;
  double scale_factor = 2.0;
  int64_t scale_window;
  double min_scale;
  int delayed_shift, cur_hysteresis;
  bool consecutive_hysteresis;
  bool raised = false;

  void update_scale(bool overflow) {
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        if (cur_scale == min_scale) {
          raised = true;
          return;
        }
        cur_scale = std::max(cur_scale / scale_factor, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) cur_hysteresis = delayed_shift;
      if ((cur_iter - last_overflow_iter) % scale_window == 0) {
        if (!consecutive_hysteresis) cur_hysteresis = delayed_shift;
        cur_scale *= scale_factor;
      }
    }
    cur_iter += 1;
  }
};

LossScaler Make(const LossScalerConfig& c) {
  auto r = LossScaler::Create(c);
  EXPECT_OK(r.status());
  return std::move(r).value();
}

TEST(LossScaler, DefaultsAreDeepSpeedsConfigDefaults) {
  LossScaler s = Make(LossScalerConfig{});
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.state().cur_hysteresis, 2);
  LossScaler implicit = Make(LossScalerConfig::DeepSpeedImplicit());
  EXPECT_EQ(implicit.scale(), 4294967296.0);
  EXPECT_EQ(implicit.state().cur_hysteresis, 1);
}

TEST(LossScaler, GrowsAfterAWindowWithoutOverflow) {
  LossScalerConfig c;
  c.initial_scale_power = 4;
  c.loss_scale_window = 3;
  LossScaler s = Make(c);
  // iter 0: (0 - -1) % 3 != 0; iter 1: 2 % 3; iter 2: 3 % 3 == 0 -> grow.
  ASSERT_OK(s.Update(false));
  EXPECT_EQ(s.scale(), 16.0);
  ASSERT_OK(s.Update(false));
  EXPECT_EQ(s.scale(), 16.0);
  ASSERT_OK(s.Update(false));
  EXPECT_EQ(s.scale(), 32.0);
  ASSERT_OK(s.Update(false));
  ASSERT_OK(s.Update(false));
  ASSERT_OK(s.Update(false));
  EXPECT_EQ(s.scale(), 64.0);
}

TEST(LossScaler, HysteresisDelaysTheDrop) {
  LossScalerConfig c;
  c.initial_scale_power = 10;
  c.hysteresis = 2;
  c.loss_scale_window = 1000;
  LossScaler s = Make(c);
  ASSERT_OK(s.Update(true));  // hysteresis 2 -> 1, scale kept
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.state().cur_hysteresis, 1);
  ASSERT_OK(s.Update(true));  // now it drops
  EXPECT_EQ(s.scale(), 512.0);
  // A good step does not refill the hysteresis (consecutive_hysteresis off)...
  ASSERT_OK(s.Update(false));
  EXPECT_EQ(s.state().cur_hysteresis, 1);
  ASSERT_OK(s.Update(true));
  EXPECT_EQ(s.scale(), 256.0);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryGoodStep) {
  LossScalerConfig c;
  c.initial_scale_power = 10;
  c.hysteresis = 2;
  c.consecutive_hysteresis = true;
  LossScaler s = Make(c);
  ASSERT_OK(s.Update(true));
  EXPECT_EQ(s.state().cur_hysteresis, 1);
  ASSERT_OK(s.Update(false));
  EXPECT_EQ(s.state().cur_hysteresis, 2);
  ASSERT_OK(s.Update(true));
  EXPECT_EQ(s.scale(), 1024.0);  // absorbed again
}

TEST(LossScaler, MinScaleIsAFloorAndThenAnError) {
  LossScalerConfig c;
  c.initial_scale_power = 2;  // 4
  c.hysteresis = 1;
  c.min_loss_scale = 2;
  LossScaler s = Make(c);
  ASSERT_OK(s.Update(true));
  EXPECT_EQ(s.scale(), 2.0);
  LossScaler::State before = s.state();
  Status st = s.Update(true);
  EXPECT_THAT(st, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(st.message()), HasSubstr("min_loss_scale"));
  EXPECT_EQ(s.state().cur_iter, before.cur_iter);
  c.raise_error_at_min_scale = false;
  LossScaler quiet = Make(c);
  ASSERT_OK(quiet.Update(true));
  ASSERT_OK(quiet.Update(true));
  EXPECT_EQ(quiet.scale(), 2.0);
  // max(scale / 2, min): a non-power-of-two floor is reached exactly.
  c.initial_scale_power = 3;
  c.min_loss_scale = 3;
  LossScaler odd = Make(c);
  ASSERT_OK(odd.Update(true));
  EXPECT_EQ(odd.scale(), 4.0);
  ASSERT_OK(odd.Update(true));
  EXPECT_EQ(odd.scale(), 3.0);
}

TEST(LossScaler, RandomSequencesMatchDeepSpeed) {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 50; ++trial) {
    LossScalerConfig c;
    c.initial_scale_power = 8 + static_cast<int>(rng() % 20);
    c.loss_scale_window = 1 + static_cast<int64_t>(rng() % 20);
    c.hysteresis = 1 + static_cast<int>(rng() % 4);
    c.consecutive_hysteresis = rng() % 2;
    c.min_loss_scale = 1.0;
    LossScaler s = Make(c);
    DeepSpeedScaler ds{std::ldexp(1.0, c.initial_scale_power), 0, -1, 2.0, c.loss_scale_window, 1.0, c.hysteresis,
                       c.hysteresis, c.consecutive_hysteresis};
    double p_overflow = (rng() % 50) / 100.0;
    for (int step = 0; step < 500; ++step) {
      bool overflow = std::uniform_real_distribution<double>(0, 1)(rng) < p_overflow;
      ds.update_scale(overflow);
      Status st = s.Update(overflow);
      if (ds.raised) {
        EXPECT_THAT(st, StatusIs(StatusCode::kFailedPrecondition));
        break;
      }
      ASSERT_OK(st);
      ASSERT_EQ(s.scale(), ds.cur_scale) << "trial " << trial << " step " << step;
      ASSERT_EQ(s.state().cur_hysteresis, ds.cur_hysteresis);
      ASSERT_EQ(s.state().last_overflow_iter, ds.last_overflow_iter);
    }
  }
}

TEST(LossScaler, StaticScaleNeverChanges) {
  LossScalerConfig c;
  c.loss_scale = 128;
  LossScaler s = Make(c);
  EXPECT_FALSE(s.dynamic());
  ASSERT_OK(s.Update(true));
  ASSERT_OK(s.Update(false));
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, ValidationNamesTheKey) {
  auto expect = [](LossScalerConfig c, const char* key) {
    auto r = LossScaler::Create(c);
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument)) << key;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(key));
  };
  LossScalerConfig c;
  c.loss_scale = -1;
  expect(c, "loss_scale");
  c = {};
  c.initial_scale_power = 200;
  expect(c, "initial_scale_power");
  c = {};
  c.loss_scale_window = 0;
  expect(c, "loss_scale_window");
  c = {};
  c.hysteresis = 0;
  expect(c, "hysteresis");
  c = {};
  c.min_loss_scale = 0;
  expect(c, "min_loss_scale");
}

TEST(LossScaler, RestoreChecksTheState) {
  LossScaler s = Make(LossScalerConfig{});
  LossScaler::State st;
  st.cur_scale = 1024;
  st.cur_iter = 10;
  st.last_overflow_iter = 4;
  st.cur_hysteresis = 1;
  ASSERT_OK(s.Restore(st));
  EXPECT_EQ(s.scale(), 1024.0);
  st.cur_hysteresis = 3;  // > hysteresis 2
  EXPECT_THAT(s.Restore(st), StatusIs(StatusCode::kInvalidArgument));
  st.cur_hysteresis = 1;
  st.cur_scale = 0;
  EXPECT_THAT(s.Restore(st), StatusIs(StatusCode::kInvalidArgument));
  st.cur_scale = 1;
  st.last_overflow_iter = 10;
  EXPECT_THAT(s.Restore(st), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace strata::optim
