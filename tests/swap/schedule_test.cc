// SPDX-License-Identifier: Apache-2.0
// AccessSchedule: next-use queries across cycle boundaries, and the checks
// Finish makes on a sequence the store would refuse.
#include "swap/schedule.h"

#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

constexpr TierKind kGpu = TierKind::kGpu, kHost = TierKind::kHost;

TensorId Id(uint64_t v) { return TensorId{v}; }

// a b a c | a b a c | ... as acquire/release pairs: a at 0, 4; b at 2; c at 6.
AccessSchedule Abac() {
  AccessSchedule s(kGpu);
  for (uint64_t v : {1, 2, 1, 3}) {
    s.Acquire(Id(v), Access::kRead);
    s.Release(Id(v));
  }
  s.Describe(Id(1), 100, kHost, "a");
  s.Describe(Id(2), 200, kHost, "b");
  s.Describe(Id(3), 300, kGpu, "c");
  return s;
}

TEST(AccessSchedule, NextUseWithinAndAcrossCycles) {
  AccessSchedule s = Abac();
  ASSERT_OK(s.Finish());
  EXPECT_EQ(s.size(), 8u);
  // a: acquires at 0 and 4 of every cycle of 8 events.
  EXPECT_EQ(s.NextUse(Id(1), 0), 4u);
  EXPECT_EQ(s.NextUse(Id(1), 3), 4u);
  EXPECT_EQ(s.NextUse(Id(1), 4), 8u);  // wraps into the next cycle
  EXPECT_EQ(s.NextUse(Id(1), 7), 8u);
  EXPECT_EQ(s.NextUse(Id(1), 8 * 5 + 1), 8u * 5 + 4);
  EXPECT_EQ(s.UseFrom(Id(1), 4), 4u);
  EXPECT_EQ(s.UseFrom(Id(1), 5), 8u);
  // b: once per cycle, at 2.
  EXPECT_EQ(s.NextUse(Id(2), 2), 10u);
  EXPECT_EQ(s.NextUse(Id(2), 1), 2u);
  EXPECT_EQ(s.NextUse(Id(9), 1), std::nullopt);  // not in the schedule
  // The O(1) form agrees at every acquire.
  for (uint64_t t = 0; t < 3 * s.size(); ++t) {
    if (s.event(t).type != ScheduleEvent::kAcquire) continue;
    EXPECT_EQ(s.NextAcquireAfter(t), *s.NextUse(s.tensors()[s.event(t).tensor].id, t)) << "tick " << t;
  }
}

TEST(AccessSchedule, KnowsWhichCopiesAreCaches) {
  AccessSchedule s = Abac();
  ASSERT_OK(s.Finish());
  EXPECT_TRUE(s.managed(*s.IndexOf(Id(1))));
  EXPECT_FALSE(s.managed(*s.IndexOf(Id(3))));  // lives on the gpu: never moves
  EXPECT_EQ(s.EventString(0), "acquire 'a' (read)");
  EXPECT_EQ(s.EventString(8 + 3), "release 'b'");
}

TEST(AccessSchedule, RefusesAnUndescribedTensor) {
  AccessSchedule s(kGpu);
  s.Acquire(Id(1), Access::kRead);
  s.Release(Id(1));
  EXPECT_THAT(s.Finish(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(s.Finish().ToString(), HasSubstr("not described"));
}

TEST(AccessSchedule, RefusesAReleaseWithoutAcquire) {
  AccessSchedule s(kGpu);
  s.Describe(Id(1), 8, kHost, "a");
  s.Release(Id(1));
  Status st = s.Finish();
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(st.ToString(), HasSubstr("releases 'a', which is not acquired"));
}

TEST(AccessSchedule, RefusesAPinLeftAtTheEndOfTheCycle) {
  AccessSchedule s(kGpu);
  s.Describe(Id(1), 8, kHost, "a");
  s.Acquire(Id(1), Access::kRead);
  Status st = s.Finish();
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(st.ToString(), HasSubstr("'a' is still acquired"));
}

TEST(AccessSchedule, RefusesAWriterBesideAnotherPin) {
  AccessSchedule s(kGpu);
  s.Describe(Id(1), 8, kHost, "a");
  s.Acquire(Id(1), Access::kRead);
  s.Acquire(Id(1), Access::kWriteDiscard);
  s.Release(Id(1));
  s.Release(Id(1));
  Status st = s.Finish();
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(st.ToString(), HasSubstr("while it is acquired"));
}

TEST(AccessSchedule, RefusesATensorThatCannotHaveACopyOnItsTier) {
  AccessSchedule s(kHost);
  s.Describe(Id(1), 8, kGpu, "a");  // gpu home: never cached on the host
  s.Acquire(Id(1), Access::kRead);
  s.Release(Id(1));
  Status st = s.Finish();
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(st.ToString(), HasSubstr("faster than the schedule's tier host"));
}

TEST(AccessSchedule, RefusesAnEmptyCycle) {
  AccessSchedule s(kGpu);
  EXPECT_THAT(s.Finish(), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace strata
