// SPDX-License-Identifier: Apache-2.0
// models::Decoder on the CPU backend: greedy decoding with the KV cache
// picks, at every position, the argmax of the logits a full recompute of
// the sequence gives, and its logits match the full forward's at every
// position (the prompt's rows from the prefill and each generated row from
// its one-token step); a prompt fed in pieces gives what one pass gives; bad
// steps and blocks it cannot run are errors naming what is wrong.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "models/decoder.h"
#include "tests/kernels/backend_compare.h"
#include "tests/models/decoder_reference.h"
#include "tests/test_util.h"

namespace strata::models {
namespace {

using ::strata::models::testing::Argmax;
using ::strata::models::testing::DecoderTestConfig;
using ::strata::models::testing::FullLogits;
using ::strata::models::testing::RandomModel;
using ::strata::models::testing::TopGap;
using ::strata::models::testing::UnitParams;
using ::strata::testing::RelErr;
using ::strata::testing::StatusIs;

std::vector<double> Row(const std::vector<float>& v, int64_t r, int64_t n) {
  return std::vector<double>(v.begin() + r * n, v.begin() + (r + 1) * n);
}

class DecoderTest : public ::testing::TestWithParam<DType> {};

TEST_P(DecoderTest, GreedyWithTheCacheMatchesFullRecompute) {
  const DType dt = GetParam();
  const uint64_t seed = ::strata::testing::TestSeed(7);
  SCOPED_TRACE(::strata::testing::SeedNote(seed));
  auto be = kernels::MakeCpuBackend(2);
  auto model = RandomModel(be.get(), DecoderTestConfig(), dt, seed);
  ASSERT_NE(model, nullptr);
  const ModelSpec& spec = model->spec();
  const int64_t V = spec.vocab_size, P = 6, T = spec.max_seq;
  ASSERT_OK_AND_ASSIGN(auto d, Decoder::Create(be.get(), spec, dt, UnitParams(*model), Decoder::Options{T, P}));
  std::vector<int32_t> seq;
  for (int64_t i = 0; i < P; ++i) seq.push_back(static_cast<int32_t>((seed * 7919 + static_cast<uint64_t>(i) * 104729) % V));
  // Cached logits per position: the prompt's rows, then one row per step.
  std::vector<float> cached, logits;
  ASSERT_OK(d->Step(seq.data(), P, Decoder::Logits::kAll, &logits));
  cached = logits;
  while (static_cast<int64_t>(seq.size()) < T) {
    const int32_t next = Argmax(logits.data() + logits.size() - V, V);
    seq.push_back(next);
    if (static_cast<int64_t>(seq.size()) == T) break;
    ASSERT_OK(d->Step(&next, 1, Decoder::Logits::kLast, &logits));
    cached.insert(cached.end(), logits.begin(), logits.end());
  }
  ASSERT_EQ(d->position(), T - 1);
  const std::vector<float> full = FullLogits(be.get(), spec, dt, UnitParams(*model), seq);
  ASSERT_EQ(full.size(), static_cast<size_t>(T * V));
  const double tol = dt == DType::kF32 ? 2e-5 : 2e-2;
  for (int64_t t = 0; t + 1 < T; ++t) {
    EXPECT_LE(RelErr(Row(cached, t, V), Row(full, t, V)), tol) << "logits of position " << t;
    if (t + 1 < P) continue;
    // The token chosen after position t is the full recompute's argmax,
    // unless the two largest logits are within rounding of each other.
    const int32_t want = Argmax(full.data() + t * V, V);
    if (seq[static_cast<size_t>(t + 1)] != want) {
      EXPECT_LT(TopGap(full.data() + t * V, V), tol * 10) << "position " << t << ": chose " << seq[t + 1] << ", full "
                                                          << want;
    }
  }
  // The logits are far from uniform: the check above is not vacuous.
  EXPECT_GT(TopGap(full.data() + (T - 2) * V, V) + TopGap(full.data(), V), 0.0);
}

INSTANTIATE_TEST_SUITE_P(DTypes, DecoderTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(DecoderSteps, APromptInPiecesGivesWhatOnePassGives) {
  auto be = kernels::MakeCpuBackend(2);
  auto model = RandomModel(be.get(), DecoderTestConfig(), DType::kF32, 11);
  ASSERT_NE(model, nullptr);
  const int64_t V = model->spec().vocab_size;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 12; ++i) prompt.push_back((i * 37 + 5) % static_cast<int>(V));
  ASSERT_OK_AND_ASSIGN(auto one, Decoder::Create(be.get(), model->spec(), DType::kF32, UnitParams(*model), {}));
  std::vector<float> a, b;
  ASSERT_OK(one->Step(prompt.data(), 12, Decoder::Logits::kAll, &a));
  ASSERT_OK_AND_ASSIGN(auto pieces, Decoder::Create(be.get(), model->spec(), DType::kF32, UnitParams(*model), {}));
  std::vector<float> got;
  for (auto [at, n] : {std::pair{0, 3}, std::pair{3, 1}, std::pair{4, 8}}) {
    ASSERT_OK(pieces->Step(prompt.data() + at, n, Decoder::Logits::kAll, &b));
    got.insert(got.end(), b.begin(), b.end());
  }
  EXPECT_LE(RelErr(std::vector<double>(got.begin(), got.end()), std::vector<double>(a.begin(), a.end())), 1e-5);
  // Reset starts over: the same first logits again.
  pieces->Reset();
  ASSERT_OK(pieces->Step(prompt.data(), 3, Decoder::Logits::kAll, &b));
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 3 * V), b);
}

TEST(DecoderSteps, BadStepsAreErrorsNamingTheProblem) {
  auto be = kernels::MakeCpuBackend(1);
  auto model = RandomModel(be.get(), DecoderTestConfig(), DType::kF32, 3);
  ASSERT_NE(model, nullptr);
  ASSERT_OK_AND_ASSIGN(auto d, Decoder::Create(be.get(), model->spec(), DType::kF32, UnitParams(*model),
                                               Decoder::Options{8, 4}));
  std::vector<float> logits;
  const std::vector<int32_t> ids{1, 2, 3, 4, 5};
  auto expect = [&](const Status& s, const std::string& word) {
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_NE(s.message().find(word), std::string::npos) << s.message();
  };
  expect(d->Step(ids.data(), 0, Decoder::Logits::kLast, &logits), "0 tokens");
  expect(d->Step(ids.data(), 5, Decoder::Logits::kLast, &logits), "1 to 4");
  const int32_t bad = 300;
  expect(d->Step(&bad, 1, Decoder::Logits::kLast, &logits), "300");
  ASSERT_OK(d->Step(ids.data(), 4, Decoder::Logits::kLast, &logits));
  ASSERT_OK(d->Step(ids.data(), 4, Decoder::Logits::kLast, &logits));
  expect(d->Step(ids.data(), 1, Decoder::Logits::kLast, &logits), "exceed the 8");
  expect(Decoder::Create(be.get(), model->spec(), DType::kF32, UnitParams(*model), Decoder::Options{41, 0}).status(),
         "capacity 41");
  expect(Decoder::Create(be.get(), model->spec(), DType::kF32, {}, {}).status(), "unit buffers");
}

TEST(DecoderSteps, ABlockItCannotRunIsAnErrorNamingTheOp) {
  auto be = kernels::MakeCpuBackend(1);
  auto model = RandomModel(be.get(), DecoderTestConfig(), DType::kF32, 3);
  ASSERT_NE(model, nullptr);
  ModelSpec spec = model->spec();
  spec.block.ops[3].residual = "nope";
  auto r = Decoder::Create(be.get(), spec, DType::kF32, UnitParams(*model), {});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(r.status().message().find("op 3 (Linear att -> x1)"), std::string::npos) << r.status();
  spec = model->spec();
  spec.block.ops[1].weight = "attn.missing";
  r = Decoder::Create(be.get(), spec, DType::kF32, UnitParams(*model), {});
  EXPECT_NE(r.status().message().find("attn.missing"), std::string::npos) << r.status();
  spec = model->spec();
  spec.block.ops[2].kind = static_cast<OpKind>(77);
  r = Decoder::Create(be.get(), spec, DType::kF32, UnitParams(*model), {});
  EXPECT_NE(r.status().message().find("no case for this op kind"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace strata::models
