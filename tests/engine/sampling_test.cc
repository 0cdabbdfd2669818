// SPDX-License-Identifier: Apache-2.0
// The sampler (engine/sampling.h): temperature 0 is the argmax (the lower
// id on a tie); a seed gives the same draws; top-k and top-p cut to the
// tokens they name; the draws follow softmax(logits / T); bad options are
// errors naming the flag.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/sampling.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;

std::vector<int32_t> Draws(const SamplingOptions& o, const std::vector<float>& logits, int n) {
  Sampler s(o);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    auto t = s.Next(logits);
    EXPECT_OK(t.status());
    out.push_back(t.ok() ? *t : -1);
  }
  return out;
}

TEST(Sampler, TemperatureZeroIsTheArgmaxAndTiesGoToTheLowerId) {
  EXPECT_EQ(Draws({0, 0, 1, 5}, {0.1f, 2.f, -1.f, 1.9f}, 3), (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(Draws({0, 0, 1, 5}, {1.f, 3.f, 3.f, 0.f}, 1), (std::vector<int32_t>{1}));
  EXPECT_EQ(Draws({0, 0, 1, 5}, {NAN, 0.f, 1.f}, 1), (std::vector<int32_t>{2}));
}

TEST(Sampler, ASeedGivesTheSameDrawsAndAnotherSeedOthers) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(i * 1.3));
  const SamplingOptions a{1.0, 0, 1.0, 42};
  EXPECT_EQ(Draws(a, logits, 200), Draws(a, logits, 200));
  SamplingOptions b = a;
  b.seed = 43;
  EXPECT_NE(Draws(a, logits, 200), Draws(b, logits, 200));
}

TEST(Sampler, TopKAndTopPKeepOnlyTheTokensTheyName) {
  // Probabilities at T = 1: about 0.64, 0.24, 0.09, 0.03 (ids 3, 0, 2, 1).
  const std::vector<float> logits{2.f, -1.f, 1.f, 3.f};
  for (int32_t t : Draws({1.0, 2, 1.0, 1}, logits, 500)) EXPECT_TRUE(t == 3 || t == 0) << t;
  for (int32_t t : Draws({1.0, 1, 1.0, 1}, logits, 50)) EXPECT_EQ(t, 3);
  for (int32_t t : Draws({1.0, 0, 0.5, 1}, logits, 50)) EXPECT_EQ(t, 3);  // 0.64 alone reaches 0.5
  std::map<int32_t, int> seen;
  for (int32_t t : Draws({1.0, 0, 0.8, 1}, logits, 2000)) ++seen[t];  // 3 and 0 reach 0.88
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[0], 0);
}

TEST(Sampler, DrawsFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits{0.f, 1.f, 2.f};
  for (double temp : {1.0, 0.5, 2.0}) {
    const int n = 20000;
    std::vector<int> count(3);
    for (int32_t t : Draws({temp, 0, 1.0, 9}, logits, n)) ++count[static_cast<size_t>(t)];
    double z = 0;
    for (float l : logits) z += std::exp(l / temp);
    for (int i = 0; i < 3; ++i) {
      const double p = std::exp(logits[static_cast<size_t>(i)] / temp) / z;
      const double sd = std::sqrt(p * (1 - p) / n);
      EXPECT_NEAR(count[static_cast<size_t>(i)] / static_cast<double>(n), p, 5 * sd) << "T " << temp << " id " << i;
    }
  }
}

TEST(Sampler, BadOptionsNameTheFlag) {
  auto expect = [](const SamplingOptions& o, const std::string& flag) {
    const Status s = CheckSamplingOptions(o);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_NE(s.message().find(flag), std::string::npos) << s.message();
  };
  expect({-1, 0, 1, 0}, "--temperature");
  expect({NAN, 0, 1, 0}, "--temperature");
  expect({1, -2, 1, 0}, "--top-k");
  expect({1, 0, 0, 0}, "--top-p");
  expect({1, 0, 1.5, 0}, "--top-p");
  EXPECT_OK(CheckSamplingOptions({0, 0, 1, 0}));
  Sampler s({1, 0, 1, 0});
  EXPECT_THAT(s.Next(std::vector<float>{}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(s.Next(std::vector<float>{NAN, NAN}), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace strata
