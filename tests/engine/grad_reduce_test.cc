// SPDX-License-Identifier: Apache-2.0
// GradReduce (engine/grad_reduce.h) on the CPU backend, where a sum is
// complete when Submit returns: the padding zeroed before the sum reads the
// accumulator, the sums taken in the order submitted, errors that name the
// units. The sums over real ranks beside the backward are tested in
// tests/engine/dp_ranks.cc (MPI) and data_parallel_gpu_test.cc (NCCL).
#include "engine/grad_reduce.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "tests/test_util.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

struct Call {
  size_t unit;
  int64_t numel, padded;
  bool stream;
  std::vector<float> seen;  // the accumulator as the sum found it
};

// A "sum" over two ranks holding the same values: each value doubled, in place.
GradReduce::SumFn Doubling(std::vector<Call>* calls) {
  return [calls](size_t unit, float* acc, int64_t numel, int64_t padded, void* stream) -> Status {
    calls->push_back(Call{unit, numel, padded, stream != nullptr, std::vector<float>(acc, acc + padded)});
    for (int64_t i = 0; i < padded; ++i) acc[i] *= 2;
    return Status::OK();
  };
}

TEST(GradReduce, ZeroesThePaddingAndSumsInPlace) {
  auto backend = kernels::MakeCpuBackend(1);
  std::vector<Call> calls;
  ASSERT_OK_AND_ASSIGN(auto g, GradReduce::Create(backend.get(), 0, Doubling(&calls)));
  std::vector<float> acc = {1, 2, 3, 9, 9};  // 3 values padded to 4, a 5th outside
  ASSERT_OK(g->Submit(7, acc.data(), 3, 4));
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].unit, 7u);
  EXPECT_EQ(calls[0].numel, 3);
  EXPECT_EQ(calls[0].padded, 4);
  EXPECT_FALSE(calls[0].stream);  // the CPU backend: no stream
  EXPECT_EQ(calls[0].seen, (std::vector<float>{1, 2, 3, 0}));
  EXPECT_EQ(acc, (std::vector<float>{2, 4, 6, 0, 9}));
  EXPECT_EQ(g->in_flight(), 1u);
  ASSERT_OK(g->Await(7));
  EXPECT_EQ(g->in_flight(), 0u);
}

TEST(GradReduce, SumsAreTakenInTheOrderSubmitted) {
  auto backend = kernels::MakeCpuBackend(1);
  std::vector<Call> calls;
  ASSERT_OK_AND_ASSIGN(auto g, GradReduce::Create(backend.get(), 0, Doubling(&calls)));
  std::vector<float> a(4, 1), b(4, 1);
  ASSERT_OK(g->Submit(3, a.data(), 4, 4));
  ASSERT_OK(g->Submit(2, b.data(), 4, 4));
  Status early = g->Await(2);
  EXPECT_EQ(early.code(), StatusCode::kInternal);
  EXPECT_THAT(early.message(), HasSubstr("unit 2's sum awaited, but unit 3's is the oldest"));
  ASSERT_OK(g->Await(3));
  ASSERT_OK(g->Await(2));
  Status none = g->Await(2);
  EXPECT_THAT(none.message(), HasSubstr("none is in flight"));
}

// A step that failed between a Submit and its Await: the next one starts clean.
TEST(GradReduce, DrainForgetsTheSumsInFlight) {
  auto backend = kernels::MakeCpuBackend(1);
  std::vector<Call> calls;
  ASSERT_OK_AND_ASSIGN(auto g, GradReduce::Create(backend.get(), 0, Doubling(&calls)));
  std::vector<float> a(4, 1), b(4, 1);
  ASSERT_OK(g->Submit(3, a.data(), 4, 4));
  ASSERT_OK(g->Submit(2, b.data(), 4, 4));
  ASSERT_OK(g->Drain());
  EXPECT_EQ(g->in_flight(), 0u);
  ASSERT_OK(g->Submit(3, a.data(), 4, 4));
  ASSERT_OK(g->Await(3));
  EXPECT_EQ(a, (std::vector<float>(4, 4)));
}

TEST(GradReduce, RefusesAnAccumulatorShorterThanItsUnit) {
  auto backend = kernels::MakeCpuBackend(1);
  std::vector<Call> calls;
  ASSERT_OK_AND_ASSIGN(auto g, GradReduce::Create(backend.get(), 0, Doubling(&calls)));
  std::vector<float> acc(4, 1);
  Status s = g->Submit(4, acc.data(), 4, 3);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("unit 4 of 4 elements in an accumulator padded to 3"));
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(g->in_flight(), 0u);
}

TEST(GradReduce, ASumsErrorIsSubmitsAndNothingIsInFlight) {
  auto backend = kernels::MakeCpuBackend(1);
  auto failing = [](size_t, float*, int64_t, int64_t, void*) -> Status {
    return Unavailable("reduce-scatter on rank 0 of 2: peer 1 did not answer");
  };
  ASSERT_OK_AND_ASSIGN(auto g, GradReduce::Create(backend.get(), 0, failing));
  std::vector<float> acc(4, 1);
  Status s = g->Submit(1, acc.data(), 4, 4);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("peer 1"));
  EXPECT_EQ(g->in_flight(), 0u);
}

TEST(GradReduce, NeedsASumFunction) {
  auto backend = kernels::MakeCpuBackend(1);
  EXPECT_EQ(GradReduce::Create(backend.get(), 0, nullptr).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
