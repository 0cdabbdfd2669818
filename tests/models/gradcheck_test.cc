// SPDX-License-Identifier: Apache-2.0
// A whole 2-layer GPT-2 (models/resident_model.h) in fp64 on the CPU
// backend against central finite differences of its loss, on sampled
// coordinates of every parameter: ||analytic - numeric|| / ||numeric|| below
// 1e-7 (eps = 1e-5).
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "models/gpt2.h"
#include "models/resident_model.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/models/model_test_util.h"
#include "tests/test_util.h"

namespace strata::models {
namespace {

using kernels::testing::RelError;
using testing::Spec;

constexpr DType kF64 = DType::kF64;
constexpr double kEps = 1e-5;
constexpr double kTol = 1e-7;

std::vector<size_t> SampleIndices(size_t n, uint64_t seed, size_t samples) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  if (n <= samples) return idx;
  std::mt19937_64 rng(seed);
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(samples);
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(ModelGradCheckTest, TwoLayerModel) {
  auto be = kernels::MakeCpuBackend(2);
  GptConfig cfg;
  cfg.n_layer = 2, cfg.n_embd = 24, cfg.n_head = 3, cfg.vocab_size = 50, cfg.seq_len = 16;
  ResidentModel::Options o;
  o.dtype = o.grad_dtype = kF64;
  o.batch = 2, o.seq = 16;
  o.head_chunk_rows = 7;  // several chunks, a ragged last one
  ASSERT_OK_AND_ASSIGN(auto model, ResidentModel::Create(be.get(), Spec(cfg), o));
  ASSERT_OK(model->InitRandom(3));
  // Larger-than-default weights and non-trivial LayerNorm/bias parameters so
  // every path carries signal.
  std::mt19937_64 rng(5);
  std::normal_distribution<double> nd(0, 1);
  for (const ParamSpec& t : Spec(cfg).params) {
    std::vector<double> v(t.numel);
    const bool ln = t.name.find(".ln_") != std::string::npos;
    const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    for (auto& x : v) x = ln && !bias ? 1 + 0.2 * nd(rng) : (bias ? 0.1 : 0.3) * nd(rng);
    ASSERT_OK(model->SetParameter(t.name, v.data(), kF64, t.numel));
  }
  std::vector<int32_t> tokens(32), targets(32);
  for (int i = 0; i < 32; ++i) {
    tokens[i] = static_cast<int32_t>((i * 7 + 3) % 50);
    targets[i] = i % 2 ? static_cast<int32_t>((i * 11) % 50) : -1;  // 16 counted: dloss = 1/16
  }
  ASSERT_OK_AND_ASSIGN(double loss, model->ForwardBackward(tokens.data(), targets.data()));
  EXPECT_GT(loss, 1.0);
  ASSERT_OK_AND_ASSIGN(double eval, model->Evaluate(tokens.data(), targets.data()));
  EXPECT_NEAR(eval, loss, 1e-13);
  uint64_t seed = 0;
  for (const ParamSpec& t : Spec(cfg).params) {
    ASSERT_OK_AND_ASSIGN(std::vector<double> grad, model->GetGradient(t.name));
    ASSERT_OK_AND_ASSIGN(std::vector<double> p, model->GetParameter(t.name));
    std::vector<double> got, numeric;
    for (size_t i : SampleIndices(p.size(), ++seed, 12)) {
      const double x0 = p[i];
      double l[2];
      for (int side = 0; side < 2; ++side) {
        p[i] = x0 + (side ? -kEps : kEps);
        ASSERT_OK(model->SetParameter(t.name, p.data(), kF64, t.numel));
        ASSERT_OK_AND_ASSIGN(l[side], model->Evaluate(tokens.data(), targets.data()));
      }
      p[i] = x0;
      ASSERT_OK(model->SetParameter(t.name, p.data(), kF64, t.numel));
      numeric.push_back((l[0] - l[1]) / (2 * kEps));
      got.push_back(grad[i]);
    }
    EXPECT_LT(RelError(got, numeric), kTol) << t.name;
  }
}

}  // namespace
}  // namespace strata::models
