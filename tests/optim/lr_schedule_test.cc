// SPDX-License-Identifier: Apache-2.0
// LR schedules at their boundaries. The expected numbers come from a Python
// transcription of DeepSpeed's lr_schedules.py get_lr()/get_mom() (run
// separately; the values are pasted here).
#include "optim/lr_schedule.h"

#include "tests/test_util.h"

namespace strata::optim {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

template <class T>
T Value(Result<T> r) {
  EXPECT_OK(r.status());
  return std::move(r).value();
}

TEST(LrSchedule, WarmupLRLogAndLinear) {
  WarmupLRParams p;
  p.warmup_min_lr = 1e-5;
  p.warmup_max_lr = 1e-3;
  p.warmup_num_steps = 100;
  LrSchedule log = Value(LrSchedule::WarmupLR(p, 0.5));
  EXPECT_EQ(log.type(), LrScheduleType::kWarmupLR);
  EXPECT_DOUBLE_EQ(log.At(-1).lr, 1e-5);  // what the constructor sets
  EXPECT_DOUBLE_EQ(log.At(0).lr, 1e-5);
  EXPECT_DOUBLE_EQ(log.At(1).lr, 0.00015900984785367068);
  EXPECT_DOUBLE_EQ(log.At(9).lr, 0.0005049999999999999);
  EXPECT_DOUBLE_EQ(log.At(99).lr, 0.0009999999999999998);
  EXPECT_DOUBLE_EQ(log.At(100).lr, 1e-3);
  EXPECT_DOUBLE_EQ(log.At(1000).lr, 1e-3);
  EXPECT_FALSE(log.At(5).beta1.has_value());
  p.warmup_type = WarmupType::kLinear;
  LrSchedule lin = Value(LrSchedule::WarmupLR(p, 0.5));
  EXPECT_DOUBLE_EQ(lin.At(1).lr, 1.9900000000000003e-05);
  EXPECT_DOUBLE_EQ(lin.At(9).lr, 9.91e-05);
  EXPECT_DOUBLE_EQ(lin.At(99).lr, 0.0009901);
  EXPECT_DOUBLE_EQ(lin.At(100).lr, 1e-3);
  // The k-th applied step runs with At(k - 2).
  EXPECT_DOUBLE_EQ(lin.ForStep(1).lr, 1e-5);
  EXPECT_DOUBLE_EQ(lin.ForStep(3).lr, lin.At(1).lr);
  // warmup_max_lr unset: the optimizer's lr.
  p.warmup_max_lr.reset();
  LrSchedule base = Value(LrSchedule::WarmupLR(p, 0.5));
  EXPECT_DOUBLE_EQ(base.At(100).lr, 0.5);
  // warmup_num_steps below 2 counts as 2 (DeepSpeed's max(2, n)).
  p.warmup_num_steps = 0;
  p.warmup_max_lr = 1.0;
  p.warmup_min_lr = 0.0;
  LrSchedule tiny = Value(LrSchedule::WarmupLR(p, 0.5));
  EXPECT_DOUBLE_EQ(tiny.At(1).lr, 0.5);
  EXPECT_DOUBLE_EQ(tiny.At(2).lr, 1.0);
}

TEST(LrSchedule, WarmupDecayLR) {
  WarmupDecayLRParams p;
  p.total_num_steps = 1000;
  p.warmup_min_lr = 0.0;
  p.warmup_max_lr = 1e-3;
  p.warmup_num_steps = 100;
  p.warmup_type = WarmupType::kLinear;
  LrSchedule s = Value(LrSchedule::WarmupDecayLR(p));
  EXPECT_DOUBLE_EQ(s.At(-1).lr, 0.0);
  EXPECT_DOUBLE_EQ(s.At(0).lr, 0.0);
  EXPECT_DOUBLE_EQ(s.At(99).lr, 0.00099);
  EXPECT_DOUBLE_EQ(s.At(100).lr, 0.001);
  EXPECT_DOUBLE_EQ(s.At(101).lr, 0.000998888888888889);
  EXPECT_DOUBLE_EQ(s.At(500).lr, 0.0005555555555555556);
  EXPECT_DOUBLE_EQ(s.At(999).lr, 1.111111111111111e-06);
  EXPECT_DOUBLE_EQ(s.At(1000).lr, 0.0);
  EXPECT_DOUBLE_EQ(s.At(1001).lr, 0.0);
}

TEST(LrSchedule, WarmupCosineLR) {
  WarmupCosineLRParams p;
  p.total_num_steps = 110;
  p.warmup_min_ratio = 0.1;
  p.warmup_num_steps = 10;
  p.cos_min_ratio = 0.01;
  LrSchedule s = Value(LrSchedule::WarmupCosineLR(p, 6e-4));
  EXPECT_DOUBLE_EQ(s.At(-1).lr, 0.0);  // DeepSpeed's first step runs with lr 0
  EXPECT_DOUBLE_EQ(s.ForStep(1).lr, 0.0);
  EXPECT_DOUBLE_EQ(s.At(0).lr, 5.9999999999999995e-05);
  EXPECT_DOUBLE_EQ(s.At(9).lr, 0.0005999999999999998);
  EXPECT_DOUBLE_EQ(s.At(10).lr, 0.0005998534484286223);
  EXPECT_DOUBLE_EQ(s.At(11).lr, 0.0005994139383431966);
  EXPECT_DOUBLE_EQ(s.At(55).lr, 0.0003402239703685984);
  EXPECT_DOUBLE_EQ(s.At(109).lr, 5.999999999999999e-06);
  // Past total_num_steps the cosine rises again, as in DeepSpeed.
  EXPECT_DOUBLE_EQ(s.At(110).lr, 6.146551571377715e-06);
  EXPECT_DOUBLE_EQ(s.At(111).lr, 6.5860616568033465e-06);
}

TEST(LrSchedule, OneCycleWithMomentumAndDecay) {
  OneCycleParams p;
  p.cycle_min_lr = 1e-4;
  p.cycle_max_lr = 1e-3;
  p.cycle_first_step_size = 100;
  p.cycle_second_step_size = 100;
  p.decay_lr_rate = 0.5;
  p.decay_step_size = 10;
  p.cycle_min_mom = 0.8;
  p.cycle_max_mom = 0.9;
  p.decay_mom_rate = 0.1;
  LrSchedule s = Value(LrSchedule::OneCycle(p));
  auto expect = [&](int64_t it, double lr, double mom) {
    LrValue v = s.At(it);
    EXPECT_DOUBLE_EQ(v.lr, lr) << "it " << it;
    ASSERT_TRUE(v.beta1.has_value());
    EXPECT_DOUBLE_EQ(*v.beta1, mom) << "it " << it;
    EXPECT_EQ(v.beta2, 0.99);
  };
  expect(-1, 0.0001, 0.8);
  expect(0, 0.00010899999999999982, 0.899);
  expect(49, 0.00055, 0.8500000000000001);
  expect(99, 0.001, 0.8);
  expect(100, 0.0009910000000000001, 0.801);
  expect(149, 0.00055, 0.8500000000000001);
  expect(199, 0.0001, 0.9);
  expect(200, 9.523809523809524e-05, 0.909);
  expect(201, 9.09090909090909e-05, 0.918);
  expect(300, 1.652892561983471e-05, 1.809);  // DeepSpeed does not cap beta1
}

TEST(LrSchedule, OneCycleAsymmetricWithoutDecay) {
  OneCycleParams p;
  p.cycle_min_lr = 0.0;
  p.cycle_max_lr = 1.0;
  p.cycle_first_step_size = 30;
  p.cycle_second_step_size = 70;
  p.cycle_momentum = false;
  LrSchedule s = Value(LrSchedule::OneCycle(p));
  EXPECT_DOUBLE_EQ(s.At(0).lr, 0.03333333333333337);
  EXPECT_DOUBLE_EQ(s.At(29).lr, 1.0);
  EXPECT_DOUBLE_EQ(s.At(30).lr, 0.9857142857142857);
  EXPECT_DOUBLE_EQ(s.At(99).lr, 0.0);
  EXPECT_DOUBLE_EQ(s.At(100).lr, 0.0);  // no decay: stays at cycle_min_lr
  EXPECT_FALSE(s.At(10).beta1.has_value());
}

TEST(LrSchedule, Constant) {
  LrSchedule s = Value(LrSchedule::Constant(3e-4));
  EXPECT_DOUBLE_EQ(s.At(-1).lr, 3e-4);
  EXPECT_DOUBLE_EQ(s.ForStep(12345).lr, 3e-4);
}

TEST(LrSchedule, NamesParse) {
  EXPECT_EQ(Value(ParseLrScheduleType("WarmupCosineLR")), LrScheduleType::kWarmupCosineLR);
  EXPECT_EQ(Value(ParseLrScheduleType("OneCycle")), LrScheduleType::kOneCycle);
  auto bad = ParseLrScheduleType("WarmupCosine");
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("WarmupCosineLR"));
  EXPECT_EQ(Value(ParseWarmupType("linear")), WarmupType::kLinear);
  EXPECT_THAT(ParseWarmupType("cosine"), StatusIs(StatusCode::kInvalidArgument));
}

TEST(LrSchedule, WarmupTypeNamesParseBack) {
  for (WarmupType t : {WarmupType::kLog, WarmupType::kLinear}) EXPECT_EQ(Value(ParseWarmupType(WarmupTypeName(t))), t);
  EXPECT_EQ(WarmupTypeName(WarmupType::kLog), "log");
  EXPECT_EQ(WarmupTypeName(WarmupType::kLinear), "linear");
}

TEST(LrSchedule, ValidationNamesTheParameter) {
  auto expect = [](Status s, const char* key) {
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument)) << key;
    EXPECT_THAT(std::string(s.message()), HasSubstr(key));
  };
  WarmupLRParams w;
  w.warmup_min_lr = -1;
  expect(w.Validate(), "warmup_min_lr");
  w = {};
  w.warmup_num_steps = -5;
  expect(w.Validate(), "warmup_num_steps");
  WarmupDecayLRParams d;
  expect(d.Validate(), "total_num_steps");  // required
  WarmupCosineLRParams c;
  c.total_num_steps = 1000;  // == default warmup: the cosine phase would divide by 0
  expect(c.Validate(), "total_num_steps");
  c.total_num_steps = 2000;
  c.cos_min_ratio = -0.1;
  expect(c.Validate(), "cos_min_ratio");
  OneCycleParams o;
  o.cycle_first_step_size = 0;
  expect(o.Validate(), "cycle_first_step_size");
  o = {};
  o.cycle_max_mom = 1.0;
  expect(o.Validate(), "cycle_max_mom");
  o = {};
  o.decay_step_size = -1;
  expect(o.Validate(), "decay_step_size");
  expect(LrSchedule::WarmupCosineLR(WarmupCosineLRParams{.total_num_steps = 5000}, -1.0).status(), "lr");
}

}  // namespace
}  // namespace strata::optim
