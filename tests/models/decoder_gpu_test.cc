// SPDX-License-Identifier: Apache-2.0
// models::Decoder on the CUDA backend against the CPU backend: the same
// parameters, the same prompt and then the CPU's greedy tokens fed one per
// step: the logits of every position agree within the dtype's bound, the
// greedy choices agree (but where the CPU's two largest logits are within
// that bound), and a second run gives the same bits; for GPT-2 and a Llama.
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

// Per position logits of `tokens` (prompt of P, then one per step).
std::vector<float> Decode(kernels::Backend* be, ResidentModel& m, DType dt, const std::vector<int32_t>& tokens, int64_t P) {
  auto d = Decoder::Create(be, m.spec(), dt, UnitParams(m), Decoder::Options{static_cast<int64_t>(tokens.size()), P});
  EXPECT_OK(d.status());
  if (!d.ok()) return {};
  std::vector<float> all, logits;
  EXPECT_OK((*d)->Step(tokens.data(), P, Decoder::Logits::kAll, &logits));
  all = logits;
  for (size_t i = static_cast<size_t>(P); i < tokens.size(); ++i) {
    EXPECT_OK((*d)->Step(&tokens[i], 1, Decoder::Logits::kLast, &logits));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

void ExpectMatchesTheCpu(kernels::Backend* gpu, const ModelSpec& spec, DType dt, uint64_t seed) {
  auto cpu = kernels::MakeCpuBackend(0);
  auto mc = RandomModel(cpu.get(), spec, dt, seed);
  auto mg = RandomModel(gpu, spec, dt, seed);
  ASSERT_TRUE(mc && mg);
  const int64_t V = mc->spec().vocab_size, T = mc->spec().max_seq, P = 7;
  // The CPU's greedy continuation of a prompt.
  std::vector<int32_t> seq;
  for (int64_t i = 0; i < P; ++i) seq.push_back(static_cast<int32_t>((i * 41 + 3) % V));
  {
    ASSERT_OK_AND_ASSIGN(auto d, Decoder::Create(cpu.get(), mc->spec(), dt, UnitParams(*mc), Decoder::Options{T, P}));
    std::vector<float> logits;
    ASSERT_OK(d->Step(seq.data(), P, Decoder::Logits::kLast, &logits));
    while (static_cast<int64_t>(seq.size()) < T) {
      seq.push_back(Argmax(logits.data(), V));
      if (static_cast<int64_t>(seq.size()) < T) {
        ASSERT_OK(d->Step(&seq.back(), 1, Decoder::Logits::kLast, &logits));
      }
    }
  }
  const std::vector<float> c = Decode(cpu.get(), *mc, dt, seq, P), g = Decode(gpu, *mg, dt, seq, P);
  ASSERT_EQ(c.size(), static_cast<size_t>(T * V));
  ASSERT_EQ(g.size(), c.size());
  const double tol = dt == DType::kF32 ? 5e-5 : 3e-2;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> cr(c.begin() + t * V, c.begin() + (t + 1) * V), gr(g.begin() + t * V, g.begin() + (t + 1) * V);
    EXPECT_LE(RelErr(gr, cr), tol) << "position " << t;
    if (Argmax(g.data() + t * V, V) != Argmax(c.data() + t * V, V)) {
      EXPECT_LT(TopGap(c.data() + t * V, V), 0.05) << "position " << t << ": the greedy choices differ";
    }
  }
  // The GPU's own full recompute agrees with its cache too.
  const std::vector<float> full = FullLogits(gpu, mg->spec(), dt, UnitParams(*mg), seq);
  EXPECT_LE(RelErr(std::vector<double>(g.begin(), g.end()), std::vector<double>(full.begin(), full.end())), tol);
  EXPECT_EQ(Decode(gpu, *mg, dt, seq, P), g) << "a second run gave other bits";
}

class CudaDecoderTest : public ::testing::TestWithParam<DType> {};

TEST_P(CudaDecoderTest, MatchesTheCpu) {
  if (!::strata::testing::GpuTestsOnCpu()) STRATA_SKIP_WITHOUT_GPU();
  const uint64_t seed = ::strata::testing::TestSeed(17);
  SCOPED_TRACE(::strata::testing::SeedNote(seed));
  ASSERT_OK_AND_ASSIGN(auto gpu, ::strata::testing::MakeBackendUnderTest());
  ExpectMatchesTheCpu(gpu.get(), ::strata::models::testing::Spec(DecoderTestConfig()), GetParam(), seed);
}

// RMSNorm, RoPE at the cache's positions, SwiGLU, 4:2 grouped-query
// attention, no position table, an untied head.
TEST_P(CudaDecoderTest, LlamaMatchesTheCpu) {
  if (!::strata::testing::GpuTestsOnCpu()) STRATA_SKIP_WITHOUT_GPU();
  const uint64_t seed = ::strata::testing::TestSeed(31);
  SCOPED_TRACE(::strata::testing::SeedNote(seed));
  ASSERT_OK_AND_ASSIGN(auto gpu, ::strata::testing::MakeBackendUnderTest());
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, LlamaSpec(::strata::models::testing::DecoderTestLlama(false)));
  ExpectMatchesTheCpu(gpu.get(), spec, GetParam(), seed);
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaDecoderTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace strata::models
