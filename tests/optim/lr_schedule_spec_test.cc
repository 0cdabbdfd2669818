// SPDX-License-Identifier: Apache-2.0
// The scheduler table (optim/lr_schedule_spec.h): each DeepSpeed type's
// parameters with their kind, default and need, written out here, and
// MakeLrSchedule building from it.
#include "optim/lr_schedule_spec.h"

#include <bit>
#include <cstdint>

#include "tests/test_util.h"

namespace strata::optim {
namespace {

using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

using enum LrParamKind;
using enum LrParamNeed;
using enum LrParamDefault;

// What a row of the table says, written out.
struct Expected {
  const char* name;
  LrParamKind kind;
  LrParamNeed need;
  LrParamDefault from;
  LrParamValue value;         // from == kValue
  const char* same_as = "";  // from == kSameAs
};

void ExpectTable(const char* type, const std::vector<Expected>& rows) {
  const LrScheduleSpec* spec = FindLrScheduleSpec(type);
  ASSERT_NE(spec, nullptr) << type;
  EXPECT_EQ(spec->name, type);
  EXPECT_EQ(LrScheduleTypeName(spec->type), type);
  ASSERT_EQ(spec->params.size(), rows.size()) << type;
  for (size_t i = 0; i < rows.size(); ++i) {
    const LrParamSpec& p = spec->params[i];
    const Expected& e = rows[i];
    SCOPED_TRACE(std::string(type) + "." + e.name);
    EXPECT_EQ(p.name, e.name);
    EXPECT_EQ(p.kind, e.kind);
    EXPECT_EQ(p.need, e.need);
    EXPECT_EQ(p.from, e.from);
    if (e.from == kValue) {
      EXPECT_EQ(p.value, e.value);
    }
    EXPECT_EQ(p.same_as, e.same_as);
  }
}

const LrParamValue kLog = std::string("log");

TEST(LrScheduleSpec, TheFourDeepSpeedTypesInOrder) {
  std::vector<std::string_view> names;
  for (const LrScheduleSpec& s : LrScheduleSpecs()) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string_view>{"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle"}));
  EXPECT_EQ(FindLrScheduleSpec("warmuplr"), nullptr);  // exact spelling (the parser canonicalizes)
  EXPECT_EQ(FindLrScheduleSpec("Constant"), nullptr);  // no "scheduler" section, not a type
}

// The defaults as they are (DeepSpeed's, deepspeed/runtime/lr_schedules.py).
TEST(LrScheduleSpec, WarmupLRDefaults) {
  ExpectTable("WarmupLR", {
                              {"warmup_min_lr", kNumber, kOptional, kValue, 0.0},
                              {"warmup_max_lr", kNumber, kOptional, kOptimizerLr, {}},
                              {"warmup_num_steps", kSteps, kOptional, kValue, int64_t{1000}},
                              {"warmup_type", kWarmupType, kOptional, kValue, kLog},
                              {"last_batch_iteration", kSteps, kUnused, kValue, int64_t{-1}},
                          });
}

TEST(LrScheduleSpec, WarmupDecayLRDefaults) {
  ExpectTable("WarmupDecayLR", {
                                   {"warmup_min_lr", kNumber, kOptional, kValue, 0.0},
                                   {"warmup_max_lr", kNumber, kOptional, kValue, 0.001},
                                   {"warmup_num_steps", kSteps, kOptional, kValue, int64_t{1000}},
                                   {"warmup_type", kWarmupType, kOptional, kValue, kLog},
                                   {"total_num_steps", kSteps, kRequired, kTotalSteps, {}},
                                   {"last_batch_iteration", kSteps, kUnused, kValue, int64_t{-1}},
                               });
}

TEST(LrScheduleSpec, WarmupCosineLRDefaults) {
  ExpectTable("WarmupCosineLR", {
                                    {"total_num_steps", kSteps, kRequired, kTotalSteps, {}},
                                    {"warmup_min_ratio", kNumber, kOptional, kValue, 0.0},
                                    {"warmup_num_steps", kSteps, kOptional, kValue, int64_t{1000}},
                                    {"cos_min_ratio", kNumber, kOptional, kValue, 0.0001},
                                    {"warmup_type", kWarmupType, kOptional, kValue, kLog},
                                    {"last_batch_iteration", kSteps, kUnused, kValue, int64_t{-1}},
                                });
}

TEST(LrScheduleSpec, OneCycleDefaults) {
  ExpectTable("OneCycle", {
                              {"cycle_min_lr", kNumber, kRequired, kValue, 0.0},
                              {"cycle_max_lr", kNumber, kRequired, kValue, 0.0},
                              {"decay_lr_rate", kNumber, kOptional, kValue, 0.0},
                              {"cycle_first_step_size", kSteps, kOptional, kValue, int64_t{2000}},
                              {"cycle_second_step_size", kSteps, kOptional, kSameAs, {}, "cycle_first_step_size"},
                              {"cycle_first_stair_count", kSteps, kUnused, kValue, int64_t{0}},
                              {"cycle_second_stair_count", kSteps, kUnused, kSameAs, {}, "cycle_first_stair_count"},
                              {"decay_step_size", kSteps, kOptional, kValue, int64_t{0}},
                              {"cycle_momentum", kBool, kOptional, kValue, true},
                              {"cycle_min_mom", kNumber, kOptional, kValue, 0.8},
                              {"cycle_max_mom", kNumber, kOptional, kValue, 0.9},
                              {"decay_mom_rate", kNumber, kOptional, kValue, 0.0},
                              {"last_batch_iteration", kSteps, kUnused, kValue, int64_t{-1}},
                          });
}

bool SameBits(const std::optional<double>& a, const std::optional<double>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || std::bit_cast<uint64_t>(*a) == std::bit_cast<uint64_t>(*b);
}

// `got` gives the same bits as `want` at every iteration from the
// constructor's (-1) to well past the schedule's end.
void ExpectSameSchedule(const Result<LrSchedule>& got, const Result<LrSchedule>& want, int64_t until) {
  ASSERT_OK(got.status());
  ASSERT_OK(want.status());
  EXPECT_EQ(got->type(), want->type());
  for (int64_t it = -1; it <= until; ++it) {
    const LrValue a = got->At(it), b = want->At(it);
    ASSERT_TRUE(SameBits(a.lr, b.lr) && SameBits(a.beta1, b.beta1) && SameBits(a.beta2, b.beta2)) << "it " << it;
  }
}

// Left out, each parameter is its default: the schedules equal those of the
// figures written out.
TEST(MakeLrSchedule, ParametersLeftOutAreTheDefaults) {
  const double lr = 6e-4;
  const int64_t total = 5000;
  ExpectSameSchedule(MakeLrSchedule("WarmupLR", {}, lr, total),
                     LrSchedule::WarmupLR({.warmup_min_lr = 0.0,
                                           .warmup_max_lr = lr,  // the optimizer's
                                           .warmup_num_steps = 1000,
                                           .warmup_type = WarmupType::kLog},
                                          0.123),
                     3000);
  ExpectSameSchedule(MakeLrSchedule("WarmupDecayLR", {{"total_num_steps", int64_t{3000}}}, lr, total),
                     LrSchedule::WarmupDecayLR({.total_num_steps = 3000,
                                                .warmup_min_lr = 0.0,
                                                .warmup_max_lr = 0.001,
                                                .warmup_num_steps = 1000,
                                                .warmup_type = WarmupType::kLog}),
                     4000);
  ExpectSameSchedule(MakeLrSchedule("WarmupCosineLR", {{"total_num_steps", int64_t{3000}}}, lr, total),
                     LrSchedule::WarmupCosineLR({.total_num_steps = 3000,
                                                 .warmup_min_ratio = 0.0,
                                                 .warmup_num_steps = 1000,
                                                 .cos_min_ratio = 0.0001,
                                                 .warmup_type = WarmupType::kLog},
                                                lr),
                     4000);
  ExpectSameSchedule(MakeLrSchedule("OneCycle", {{"cycle_min_lr", 1e-5}, {"cycle_max_lr", 1e-3}}, lr, total),
                     LrSchedule::OneCycle({.cycle_min_lr = 1e-5,
                                           .cycle_max_lr = 1e-3,
                                           .decay_lr_rate = 0.0,
                                           .cycle_first_step_size = 2000,
                                           .cycle_second_step_size = 2000,  // as the first
                                           .cycle_first_stair_count = 0,
                                           .cycle_second_stair_count = std::nullopt,
                                           .decay_step_size = 0,
                                           .cycle_momentum = true,
                                           .cycle_min_mom = 0.8,
                                           .cycle_max_mom = 0.9,
                                           .decay_mom_rate = 0.0}),
                     5000);
  ExpectSameSchedule(MakeLrSchedule("", {}, lr, total), LrSchedule::Constant(lr), 10);
  // Spot values of the defaults: the log warmup reaches the optimizer's lr
  // at warmup_num_steps 1000; OneCycle peaks after 2000 steps.
  ASSERT_OK_AND_ASSIGN(LrSchedule w, MakeLrSchedule("WarmupLR", {}, lr, total));
  EXPECT_DOUBLE_EQ(w.At(-1).lr, 0.0);
  EXPECT_DOUBLE_EQ(w.At(99).lr, lr * std::log(100.0) / std::log(1000.0));
  EXPECT_DOUBLE_EQ(w.At(1000).lr, lr);
  ASSERT_OK_AND_ASSIGN(LrSchedule o, MakeLrSchedule("OneCycle", {{"cycle_min_lr", 0.0}, {"cycle_max_lr", 1.0}}, lr, total));
  EXPECT_DOUBLE_EQ(o.At(1999).lr, 1.0);
  EXPECT_DOUBLE_EQ(*o.At(1999).beta1, 0.8);
  EXPECT_DOUBLE_EQ(o.At(3999).lr, 0.0);
}

// Every parameter given: each reaches the schedule (the unused ones reach
// nothing, and their values, even invalid ones, are not checked).
TEST(MakeLrSchedule, GivenParametersReachTheSchedule) {
  ExpectSameSchedule(MakeLrSchedule("WarmupDecayLR",
                                    {{"warmup_min_lr", 1e-5},
                                     {"warmup_max_lr", 2e-3},
                                     {"warmup_num_steps", int64_t{50}},
                                     {"warmup_type", std::string("linear")},
                                     {"total_num_steps", int64_t{400}},
                                     {"last_batch_iteration", int64_t{-7}}},
                                    1.0, 1),
                     LrSchedule::WarmupDecayLR({.total_num_steps = 400,
                                                .warmup_min_lr = 1e-5,
                                                .warmup_max_lr = 2e-3,
                                                .warmup_num_steps = 50,
                                                .warmup_type = WarmupType::kLinear}),
                     600);
  ExpectSameSchedule(MakeLrSchedule("OneCycle",
                                    {{"cycle_min_lr", 1e-4},
                                     {"cycle_max_lr", int64_t{1}},
                                     {"decay_lr_rate", 0.5},
                                     {"cycle_first_step_size", 30.9},  // a step count: truncated to 30
                                     {"cycle_second_step_size", uint64_t{70}},
                                     {"cycle_first_stair_count", int64_t{-3}},  // unused, as in DeepSpeed
                                     {"cycle_second_stair_count", int64_t{-4}},
                                     {"decay_step_size", int64_t{10}},
                                     {"cycle_momentum", true},
                                     {"cycle_min_mom", 0.7},
                                     {"cycle_max_mom", 0.95},
                                     {"decay_mom_rate", 0.01}},
                                    1.0, 1),
                     LrSchedule::OneCycle({.cycle_min_lr = 1e-4,
                                           .cycle_max_lr = 1.0,
                                           .decay_lr_rate = 0.5,
                                           .cycle_first_step_size = 30,
                                           .cycle_second_step_size = 70,
                                           .cycle_first_stair_count = 0,
                                           .cycle_second_stair_count = std::nullopt,
                                           .decay_step_size = 10,
                                           .cycle_momentum = true,
                                           .cycle_min_mom = 0.7,
                                           .cycle_max_mom = 0.95,
                                           .decay_mom_rate = 0.01}),
                     300);
}

// Values built in code rather than read from a config (whose parser requires
// them): total_num_steps falls back to the run's steps.
TEST(MakeLrSchedule, TotalNumStepsLeftOutIsTheRunsSteps) {
  ExpectSameSchedule(MakeLrSchedule("WarmupCosineLR", {{"warmup_num_steps", int64_t{10}}}, 1e-3, 200),
                     LrSchedule::WarmupCosineLR({.total_num_steps = 200,
                                                 .warmup_min_ratio = 0.0,
                                                 .warmup_num_steps = 10,
                                                 .cos_min_ratio = 0.0001,
                                                 .warmup_type = WarmupType::kLog},
                                                1e-3),
                     300);
}

TEST(MakeLrSchedule, ErrorsNameTheConfigTheTypeAndTheParameter) {
  auto message = [](const Result<LrSchedule>& r) {
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    return std::string(r.status().message());
  };
  EXPECT_THAT(message(MakeLrSchedule("WarmupCosine", {}, 1e-3, 10, "ds.json")),
              AllOf(HasSubstr("ds.json: scheduler.type \"WarmupCosine\" is not implemented"),
                    HasSubstr("WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle")));
  // The schedule's own validation, with the context.
  EXPECT_EQ(message(MakeLrSchedule("WarmupCosineLR", {{"total_num_steps", int64_t{5}}}, 1e-3, 10, "ds.json")),
            "ds.json: scheduler (WarmupCosineLR): WarmupCosineLR.total_num_steps must be > warmup_num_steps (at "
            "least 2), got 5 <= 1000 (the cosine phase divides by their difference)");
  EXPECT_THAT(message(MakeLrSchedule("OneCycle", {{"cycle_min_lr", -1.0}, {"cycle_max_lr", 1.0}}, 1e-3, 10)),
              HasSubstr("OneCycle.cycle_min_lr must be finite and >= 0"));
  EXPECT_THAT(message(MakeLrSchedule("", {}, -1.0, 10, "ds.json")), HasSubstr("ds.json: scheduler (): Constant.lr"));
  // Values a config could not have given.
  EXPECT_EQ(message(MakeLrSchedule("WarmupLR", {{"warmup_steps", int64_t{5}}}, 1e-3, 10, "ds.json")),
            "ds.json: scheduler.params.warmup_steps: not a parameter of WarmupLR");
  EXPECT_EQ(message(MakeLrSchedule("WarmupLR", {{"warmup_num_steps", std::string("5")}}, 1e-3, 10)),
            "scheduler.params.warmup_num_steps: must be a number");
  EXPECT_EQ(message(MakeLrSchedule("OneCycle", {{"cycle_momentum", int64_t{1}}}, 1e-3, 10)),
            "scheduler.params.cycle_momentum: must be true or false");
  EXPECT_EQ(message(MakeLrSchedule("WarmupLR", {{"warmup_type", std::string("cubic")}}, 1e-3, 10)),
            "scheduler.params.warmup_type: unknown warmup_type 'cubic' (allowed: log, linear)");
}

}  // namespace
}  // namespace strata::optim
