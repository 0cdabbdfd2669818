// SPDX-License-Identifier: Apache-2.0
// CUDA backend ops against the CPU backend on awkward shapes (1, 127, 1000
// rows; 64, 96, 2048 columns), fresh random inputs, poisoned outputs:
// LayerNorm, GELU, Add, Scale, Cast, BiasBackward, Embedding, CrossEntropy,
// GradStats; plus argument errors and run-to-run determinism.
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/kernels/backend_compare.h"
#include "tests/test_util.h"

namespace strata::kernels {
namespace {

using ::strata::testing::CudaVsCpu;
using ::strata::testing::Mirror;
using ::strata::testing::OpKind;
using ::strata::testing::RandomFloats;
using ::strata::testing::StatusIs;
using ::strata::testing::ToBytes;
using ::strata::testing::Tolerance;

const DType kF32 = DType::kF32, kBF16 = DType::kBF16, kF16 = DType::kF16;

std::string DtName(DType d) { return std::string(DTypeName(d)); }

// Shifts every value by `offset` (inputs with a non-zero mean).
std::vector<float> Shifted(std::vector<float> v, float offset) {
  for (auto& x : v) x += offset;
  return v;
}

// ---- LayerNorm --------------------------------------------------------------

using LnParam = std::tuple<DType, int64_t /*rows*/, int64_t /*cols*/>;

class CudaLayerNormTest : public CudaVsCpu, public ::testing::TestWithParam<LnParam> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_P(CudaLayerNormTest, ForwardMatchesCpu) {
  auto [dt, N, C] = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  auto x = mir.MakeFloats(Shifted(RandomFloats(N * C, seed_, -2.f, 2.f), 0.7f), dt);
  auto w = mir.MakeFloats(RandomFloats(C, seed_ + 1, 0.5f, 1.5f), dt);
  auto b = mir.MakeFloats(RandomFloats(C, seed_ + 2), dt);
  Mirror y = mir.Make(N * C * DTypeSize(dt));
  Mirror mean = mir.Make(N * 4), rstd = mir.Make(N * 4);
  LayerNormArgs a{N, C, dt, 1e-5f};
  ASSERT_OK(cpu_->LayerNormForward(a, y.ref.as<void>(), mean.ref.as<float>(), rstd.ref.as<float>(),
                                   x.ref.data(), w.ref.data(), b.ref.data()));
  ASSERT_OK(gpu_->LayerNormForward(a, y.gpu.as<void>(), mean.gpu.as<float>(), rstd.gpu.as<float>(),
                                   x.gpu.data(), w.gpu.data(), b.gpu.data()));
  EXPECT_CLOSE(mir, y, dt, Tolerance(dt, OpKind::kReduction), "y");
  EXPECT_CLOSE(mir, mean, kF32, 2e-5, "mean");
  EXPECT_CLOSE(mir, rstd, kF32, 2e-5, "rstd");
}

TEST_P(CudaLayerNormTest, BackwardMatchesCpu) {
  auto [dt, N, C] = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  auto x = mir.MakeFloats(Shifted(RandomFloats(N * C, seed_, -2.f, 2.f), 0.7f), dt);
  auto w = mir.MakeFloats(RandomFloats(C, seed_ + 1, 0.5f, 1.5f), dt);
  auto b = mir.MakeFloats(RandomFloats(C, seed_ + 2), dt);
  Mirror y = mir.Make(N * C * DTypeSize(dt));
  Mirror mean = mir.Make(N * 4), rstd = mir.Make(N * 4);
  LayerNormArgs a{N, C, dt, 1e-5f};
  // Both backward passes get the CPU's statistics.
  ASSERT_OK(cpu_->LayerNormForward(a, y.ref.as<void>(), mean.ref.as<float>(), rstd.ref.as<float>(),
                                   x.ref.data(), w.ref.data(), b.ref.data()));
  mir.Set(mean, mir.RefBytes(mean));
  mir.Set(rstd, mir.RefBytes(rstd));
  auto dy = mir.MakeFloats(RandomFloats(N * C, seed_ + 3), dt);
  for (DType gdt : {kF32, dt}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE("grad " + DtName(gdt) + (accumulate ? " accumulate" : " overwrite"));
      auto dx = mir.MakeFloats(RandomFloats(N * C, seed_ + 4), dt);  // accumulated into
      Mirror dw = accumulate ? mir.MakeFloats(RandomFloats(C, seed_ + 5), gdt) : mir.Make(C * DTypeSize(gdt));
      Mirror db = accumulate ? mir.MakeFloats(RandomFloats(C, seed_ + 6), gdt) : mir.Make(C * DTypeSize(gdt));
      ASSERT_OK(cpu_->LayerNormBackward(a, dx.ref.data(), dw.ref.data(), db.ref.data(), gdt,
                                        accumulate, dy.ref.data(), x.ref.data(), w.ref.data(),
                                        mean.ref.as<float>(), rstd.ref.as<float>()));
      ASSERT_OK(gpu_->LayerNormBackward(a, dx.gpu.data(), dw.gpu.data(), db.gpu.data(), gdt,
                                        accumulate, dy.gpu.data(), x.gpu.data(), w.gpu.data(),
                                        mean.gpu.as<float>(), rstd.gpu.as<float>()));
      EXPECT_CLOSE(mir, dx, dt, Tolerance(dt, OpKind::kReduction), "dx");
      EXPECT_CLOSE(mir, dw, gdt, Tolerance(gdt, OpKind::kReduction), "dweight");
      EXPECT_CLOSE(mir, db, gdt, Tolerance(gdt, OpKind::kReduction), "dbias");
    }
  }
}

// Rows whose variance is about epsilon (inputs 3e-3 (u + 0.7), u uniform in
// [-2, 2]: variance 1.2e-5): here epsilon moves rstd by a third, so a kernel
// that drops it, or adds it in the wrong place, fails; at unit variance it
// moves rstd by 4e-6, under the f32 tolerance.
TEST_P(CudaLayerNormTest, ForwardSeesEpsilonAtSmallVariance) {
  auto [dt, N, C] = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  std::vector<float> xs = Shifted(RandomFloats(N * C, seed_, -2.f, 2.f), 0.7f);
  for (float& v : xs) v *= 3e-3f;
  auto x = mir.MakeFloats(xs, dt);
  auto w = mir.MakeFloats(RandomFloats(C, seed_ + 1, 0.5f, 1.5f), dt);
  auto b = mir.MakeFloats(RandomFloats(C, seed_ + 2), dt);
  Mirror y = mir.Make(N * C * DTypeSize(dt));
  Mirror mean = mir.Make(N * 4), rstd = mir.Make(N * 4);
  LayerNormArgs a{N, C, dt, 1e-5f};
  ASSERT_OK(cpu_->LayerNormForward(a, y.ref.as<void>(), mean.ref.as<float>(), rstd.ref.as<float>(),
                                   x.ref.data(), w.ref.data(), b.ref.data()));
  ASSERT_OK(gpu_->LayerNormForward(a, y.gpu.as<void>(), mean.gpu.as<float>(), rstd.gpu.as<float>(),
                                   x.gpu.data(), w.gpu.data(), b.gpu.data()));
  EXPECT_CLOSE(mir, y, dt, Tolerance(dt, OpKind::kReduction), "y");
  EXPECT_CLOSE(mir, rstd, kF32, 2e-5, "rstd");
  // The inputs do expose epsilon: without it the reference's rstd differs.
  if (C > 1) {
    Mirror rstd0 = mir.Make(N * 4);
    LayerNormArgs a0{N, C, dt, 0.f};
    ASSERT_OK(cpu_->LayerNormForward(a0, y.ref.as<void>(), mean.ref.as<float>(), rstd0.ref.as<float>(),
                                     x.ref.data(), w.ref.data(), b.ref.data()));
    EXPECT_GT(::strata::testing::RelErr(mir.Ref(rstd0, kF32), mir.Ref(rstd, kF32)), 0.1);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaLayerNormTest,
                         ::testing::Combine(::testing::Values(kF32, kBF16, kF16),
                                            ::testing::Values(1, 127, 1000),
                                            ::testing::Values(64, 96, 2048, 50)),
                         [](const auto& info) {
                           return DtName(std::get<0>(info.param)) + "_N" +
                                  std::to_string(std::get<1>(info.param)) + "_C" +
                                  std::to_string(std::get<2>(info.param));
                         });

// ---- elementwise: GELU, Add, Scale -------------------------------------------

// misaligned: the buffers start one element past a 16-byte boundary (the
// scalar paths of the kernels).
using EwParam = std::tuple<DType, int64_t /*n*/, bool /*misaligned*/>;

class CudaElementwiseTest : public CudaVsCpu, public ::testing::TestWithParam<EwParam> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
  // A mirror of n+1 elements; Off() points at element `off`.
  size_t off() const { return std::get<2>(GetParam()) ? 1 : 0; }
  template <typename B>
  void* At(const B& buf, DType dt) const {
    return static_cast<char*>(buf.data()) + off() * DTypeSize(dt);
  }
};

// Per element, in ulps of the output dtype. GELU and GELU' cancel for x << 0
// (1 + tanh(u) with tanh(u) near -1, the CPU's 1 / (1 + exp(-2u)) against the
// GPU's tanhf): there the two agree only to about an ulp of 1 times the
// terms' size, so each element is also allowed 8 * 2^-24 (|x| + 1) (times
// |dy| (1 + x^2) for the derivative); elsewhere 4 ulps in f32 (two libm-free
// formulas of a few ulps each) and 1 in f16/bf16 (one rounding of f32 values
// that may differ in their last bits).
TEST_P(CudaElementwiseTest, GeluForwardBackwardMatchCpu) {
  auto [dt, n, mis] = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const int64_t len = n + 1;
  const double ulps = dt == kF32 ? 4 : 1;
  auto x = mir.MakeFloats(RandomFloats(len, seed_, -5.f, 5.f), dt);
  Mirror y = mir.Make(len * DTypeSize(dt));
  ASSERT_OK(cpu_->GeluForward(At(y.ref, dt), At(x.ref, dt), n, dt));
  ASSERT_OK(gpu_->GeluForward(At(y.gpu, dt), At(x.gpu, dt), n, dt));
  // Compare only the n elements written (the others stay poisoned on both).
  auto slice = [&](const std::vector<double>& v) {
    return std::vector<double>(v.begin() + off(), v.begin() + off() + n);
  };
  const auto xs = slice(mir.Ref(x, dt));
  std::vector<double> allow(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) allow[i] = 8 * std::ldexp(std::fabs(xs[i]) + 1, -24);
  EXPECT_TRUE(::strata::testing::WithinUlps(slice(mir.Gpu(y, dt)), slice(mir.Ref(y, dt)), dt, ulps, allow))
      << "gelu forward";

  auto dy = mir.MakeFloats(RandomFloats(len, seed_ + 1), dt);
  Mirror dx = mir.Make(len * DTypeSize(dt));
  ASSERT_OK(cpu_->GeluBackward(At(dx.ref, dt), At(x.ref, dt), At(dy.ref, dt), n, dt));
  ASSERT_OK(gpu_->GeluBackward(At(dx.gpu, dt), At(x.gpu, dt), At(dy.gpu, dt), n, dt));
  const auto dys = slice(mir.Ref(dy, dt));
  for (size_t i = 0; i < xs.size(); ++i)
    allow[i] = 8 * std::ldexp((std::fabs(xs[i]) + 1) * (1 + xs[i] * xs[i]) * std::fabs(dys[i]), -24);
  EXPECT_TRUE(::strata::testing::WithinUlps(slice(mir.Gpu(dx, dt)), slice(mir.Ref(dx, dt)), dt, ulps, allow))
      << "gelu backward";

  // dx may alias dy.
  ASSERT_OK(cpu_->GeluBackward(At(dy.ref, dt), At(x.ref, dt), At(dy.ref, dt), n, dt));
  ASSERT_OK(gpu_->GeluBackward(At(dy.gpu, dt), At(x.gpu, dt), At(dy.gpu, dt), n, dt));
  EXPECT_TRUE(::strata::testing::WithinUlps(slice(mir.Gpu(dy, dt)), slice(mir.Ref(dy, dt)), dt, ulps, allow))
      << "gelu backward in place";
}

// Add and Scale are one rounding of an exact f32 result on both backends
// (round to nearest even): at most 1 ulp apart per element (the same bits
// unless one backend rounds through another path).
TEST_P(CudaElementwiseTest, AddAndScaleMatchCpu) {
  auto [dt, n, mis] = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const int64_t len = n + 1;
  auto slice = [&](const std::vector<double>& v) {
    return std::vector<double>(v.begin() + off(), v.begin() + off() + n);
  };
  auto a = mir.MakeFloats(RandomFloats(len, seed_, -3.f, 3.f), dt);
  auto b = mir.MakeFloats(RandomFloats(len, seed_ + 1, -3.f, 3.f), dt);
  Mirror out = mir.Make(len * DTypeSize(dt));  // poisoned on both
  ASSERT_OK(cpu_->Add(At(out.ref, dt), At(a.ref, dt), At(b.ref, dt), n, dt));
  ASSERT_OK(gpu_->Add(At(out.gpu, dt), At(a.gpu, dt), At(b.gpu, dt), n, dt));
  EXPECT_TRUE(::strata::testing::WithinUlps(slice(mir.Gpu(out, dt)), slice(mir.Ref(out, dt)), dt, 1)) << "add";
  // In place: a = a + b.
  ASSERT_OK(cpu_->Add(At(a.ref, dt), At(a.ref, dt), At(b.ref, dt), n, dt));
  ASSERT_OK(gpu_->Add(At(a.gpu, dt), At(a.gpu, dt), At(b.gpu, dt), n, dt));
  EXPECT_TRUE(::strata::testing::WithinUlps(mir.Gpu(a, dt), mir.Ref(a, dt), dt, 1)) << "add in place";
  ASSERT_OK(cpu_->Scale(At(b.ref, dt), dt, n, -0.37f));
  ASSERT_OK(gpu_->Scale(At(b.gpu, dt), dt, n, -0.37f));
  EXPECT_TRUE(::strata::testing::WithinUlps(mir.Gpu(b, dt), mir.Ref(b, dt), dt, 1)) << "scale";
}

INSTANTIATE_TEST_SUITE_P(Sizes, CudaElementwiseTest,
                         ::testing::Combine(::testing::Values(kF32, kBF16, kF16),
                                            ::testing::Values(1, 127, 96 * 1000 + 5),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return DtName(std::get<0>(info.param)) + "_n" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_misaligned" : "");
                         });

// ---- Cast ----------------------------------------------------------------------

class CudaCastTest : public CudaVsCpu, public ::testing::TestWithParam<std::tuple<DType, DType>> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_P(CudaCastTest, BitwiseEqualToCpuIncludingSpecials) {
  auto [src_dt, dst_dt] = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  std::vector<float> v = RandomFloats(1003, seed_, -3e4f, 3e4f);
  const float specials[] = {0.f, -0.f, 1e-40f, -1e-42f, 6e-8f, 3e-5f, 65504.f, 65520.f, 1e6f,
                            3.4e38f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 1.00390625f, 1.0029296875f};
  for (size_t i = 0; i < std::size(specials); ++i) v[i * 7] = specials[i];
  const int64_t n = static_cast<int64_t>(v.size());
  auto src = mir.MakeFloats(v, src_dt);
  Mirror dst = mir.Make(n * DTypeSize(dst_dt));
  ASSERT_OK(cpu_->Cast(dst.ref.data(), dst_dt, src.ref.data(), src_dt, n));
  ASSERT_OK(gpu_->Cast(dst.gpu.data(), dst_dt, src.gpu.data(), src_dt, n));
  auto g = mir.Gpu(dst, dst_dt), r = mir.Ref(dst, dst_dt);
  ASSERT_EQ(g.size(), r.size());
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    bool same = std::isnan(g[i]) ? std::isnan(r[i]) : (g[i] == r[i] && std::signbit(g[i]) == std::signbit(r[i]));
    if (!same && ++bad <= 5)
      ADD_FAILURE() << "element " << i << ": gpu " << g[i] << ", cpu " << r[i];
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Pairs, CudaCastTest,
                         ::testing::Combine(::testing::Values(kF32, kBF16, kF16),
                                            ::testing::Values(kF32, kBF16, kF16)),
                         [](const auto& info) {
                           return DtName(std::get<0>(info.param)) + "_to_" +
                                  DtName(std::get<1>(info.param));
                         });

// ---- BiasBackward -------------------------------------------------------------

using BiasParam = std::tuple<DType, int64_t /*m*/, int64_t /*n*/>;

class CudaBiasBackwardTest : public CudaVsCpu, public ::testing::TestWithParam<BiasParam> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_P(CudaBiasBackwardTest, MatchesCpu) {
  auto [dt, m, n] = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  auto dy = mir.MakeFloats(RandomFloats(m * n, seed_), dt);
  for (DType gdt : {kF32, dt}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE("grad " + DtName(gdt) + (accumulate ? " accumulate" : " overwrite"));
      Mirror db = accumulate ? mir.MakeFloats(RandomFloats(n, seed_ + 1), gdt) : mir.Make(n * DTypeSize(gdt));
      ASSERT_OK(cpu_->BiasBackward(db.ref.data(), gdt, accumulate, dy.ref.data(), m, n, dt));
      ASSERT_OK(gpu_->BiasBackward(db.gpu.data(), gdt, accumulate, dy.gpu.data(), m, n, dt));
      EXPECT_CLOSE(mir, db, gdt, Tolerance(gdt, OpKind::kReduction), "dbias");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaBiasBackwardTest,
                         ::testing::Combine(::testing::Values(kF32, kBF16),
                                            ::testing::Values(1, 127, 1000),
                                            ::testing::Values(64, 96, 2048, 8192)),
                         [](const auto& info) {
                           return DtName(std::get<0>(info.param)) + "_m" +
                                  std::to_string(std::get<1>(info.param)) + "_n" +
                                  std::to_string(std::get<2>(info.param));
                         });

// ---- Embedding ------------------------------------------------------------------

using EmbParam = std::tuple<DType, int64_t /*T*/, int64_t /*C*/>;

class CudaEmbeddingTest : public CudaVsCpu, public ::testing::TestWithParam<EmbParam> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

// Tokens with a few very frequent ones (as in real text), in [0, V).
std::vector<int32_t> SkewedTokens(int64_t n, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) {
    uint64_t r = rng() % 10;
    x = r < 3 ? 7 : r < 4 ? static_cast<int32_t>(V - 1) : static_cast<int32_t>(rng() % V);
  }
  return t;
}

TEST_P(CudaEmbeddingTest, ForwardAndBackwardMatchCpu) {
  auto [dt, T, C] = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const int64_t B = 3, V = 1000, Vp = 1024;
  auto tok = mir.MakeInts(SkewedTokens(B * T, V, seed_));
  auto wte = mir.MakeFloats(RandomFloats(Vp * C, seed_ + 1), dt);
  auto wpe = mir.MakeFloats(RandomFloats(T * C, seed_ + 2), dt);
  Mirror out = mir.Make(B * T * C * DTypeSize(dt));
  ASSERT_OK(cpu_->EmbeddingForward(out.ref.data(), tok.ref.as<int32_t>(), wte.ref.data(), wpe.ref.data(), B, T, C, dt));
  ASSERT_OK(gpu_->EmbeddingForward(out.gpu.data(), tok.gpu.as<int32_t>(), wte.gpu.data(), wpe.gpu.data(), B, T, C, dt));
  // wte[token] + wpe[t]: one rounded addition per element.
  EXPECT_TRUE(::strata::testing::WithinUlps(mir.Gpu(out, dt), mir.Ref(out, dt), dt, 1)) << "embedding out";

  auto dout = mir.MakeFloats(RandomFloats(B * T * C, seed_ + 3), dt);
  for (DType gdt : {kF32, dt}) {
    SCOPED_TRACE("grad " + DtName(gdt));
    // Accumulated into (the tied head writes dwte first).
    auto dwte = mir.MakeFloats(RandomFloats(Vp * C, seed_ + 4), gdt);
    auto dwpe = mir.MakeFloats(RandomFloats(T * C, seed_ + 5), gdt);
    ASSERT_OK(cpu_->EmbeddingBackward(dwte.ref.data(), dwpe.ref.data(), gdt, dout.ref.data(), tok.ref.as<int32_t>(), B, T, C, Vp, dt));
    ASSERT_OK(gpu_->EmbeddingBackward(dwte.gpu.data(), dwpe.gpu.data(), gdt, dout.gpu.data(), tok.gpu.as<int32_t>(), B, T, C, Vp, dt));
    EXPECT_CLOSE(mir, dwte, gdt, Tolerance(gdt, OpKind::kReduction), "dwte");
    EXPECT_CLOSE(mir, dwpe, gdt, Tolerance(gdt, OpKind::kReduction), "dwpe");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaEmbeddingTest,
                         ::testing::Combine(::testing::Values(kF32, kBF16),
                                            ::testing::Values(1, 127, 1000),
                                            ::testing::Values(64, 96, 2048)),
                         [](const auto& info) {
                           return DtName(std::get<0>(info.param)) + "_T" +
                                  std::to_string(std::get<1>(info.param)) + "_C" +
                                  std::to_string(std::get<2>(info.param));
                         });

// ---- CrossEntropy ---------------------------------------------------------------

// mode: 0 forward only, 1 separate dlogits, 2 dlogits aliasing logits.
using CeParam = std::tuple<DType, int64_t /*N*/, int64_t /*V*/, int /*mode*/>;

class CudaCrossEntropyTest : public CudaVsCpu, public ::testing::TestWithParam<CeParam> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_P(CudaCrossEntropyTest, MatchesCpu) {
  auto [dt, N, V, mode] = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const int64_t Vp = (V + 127) / 128 * 128;
  // Padding columns hold garbage (large values) that must never count.
  std::vector<float> lv = RandomFloats(N * Vp, seed_, -6.f, 6.f);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = V; c < Vp; ++c) lv[i * Vp + c] = 1e4f;
  auto logits = mir.MakeFloats(lv, dt);
  std::mt19937_64 rng(seed_ + 1);
  std::vector<int32_t> tv(N);
  for (int64_t i = 0; i < N; ++i) tv[i] = (i % 7 == 3) ? -1 : static_cast<int32_t>(rng() % V);
  auto targets = mir.MakeInts(tv);
  Mirror losses = mir.Make(N * 4);
  Mirror dlogits = mir.Make(N * Vp * DTypeSize(dt));
  const float dloss = 1.f / static_cast<float>(N);
  auto dl = [&](bool gpu) -> void* {
    if (mode == 0) return nullptr;
    if (mode == 2) return gpu ? logits.gpu.data() : logits.ref.data();
    return gpu ? dlogits.gpu.data() : dlogits.ref.data();
  };
  ASSERT_OK(cpu_->CrossEntropy(losses.ref.as<float>(), dl(false), logits.ref.data(), targets.ref.as<int32_t>(), N, V, Vp, dloss, dt));
  ASSERT_OK(gpu_->CrossEntropy(losses.gpu.as<float>(), dl(true), logits.gpu.data(), targets.gpu.as<int32_t>(), N, V, Vp, dloss, dt));
  EXPECT_CLOSE(mir, losses, kF32, 2e-5, "losses");
  auto gl = mir.Gpu(losses, kF32);
  for (int64_t i = 0; i < N; ++i) {
    if (tv[i] < 0) {
      EXPECT_EQ(gl[i], 0.0) << "ignored row " << i;
    }
  }
  if (mode == 1) EXPECT_CLOSE(mir, dlogits, dt, Tolerance(dt, OpKind::kReduction), "dlogits");
  if (mode == 2) EXPECT_CLOSE(mir, logits, dt, Tolerance(dt, OpKind::kReduction), "dlogits in place");
  if (mode != 0) {
    auto g = mir.Gpu(mode == 1 ? dlogits : logits, dt);
    int64_t nonzero_pad = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = V; c < Vp; ++c) nonzero_pad += g[i * Vp + c] != 0.0;
    EXPECT_EQ(nonzero_pad, 0) << "padding columns of dlogits must be 0";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaCrossEntropyTest,
                         ::testing::Combine(::testing::Values(kF32, kBF16),
                                            ::testing::Values(1, 127),
                                            ::testing::Values(1000, 50257, 100),
                                            ::testing::Values(0, 1, 2)),
                         [](const auto& info) {
                           return DtName(std::get<0>(info.param)) + "_N" +
                                  std::to_string(std::get<1>(info.param)) + "_V" +
                                  std::to_string(std::get<2>(info.param)) + "_mode" +
                                  std::to_string(std::get<3>(info.param));
                         });

// ---- GradStats -------------------------------------------------------------------

using StatsParam = std::tuple<DType, int64_t>;

class CudaGradStatsTest : public CudaVsCpu, public ::testing::TestWithParam<StatsParam> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_P(CudaGradStatsTest, MatchesCpuAndCountsNonFinite) {
  auto [dt, n] = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  std::vector<float> v = RandomFloats(n, seed_, -2.f, 2.f);
  int expect_bad = 0;
  if (n > 100) {
    v[3] = std::numeric_limits<float>::quiet_NaN();
    v[n / 2] = std::numeric_limits<float>::infinity();
    v[n - 1] = -std::numeric_limits<float>::infinity();
    expect_bad = 3;
  }
  auto x = mir.MakeFloats(v, dt);
  float s0 = 1.5f;
  int32_t c0 = 2;
  auto sumsq = mir.Make(4, &s0);
  auto cnt = mir.Make(4, &c0);
  ASSERT_OK(cpu_->GradStats(x.ref.data(), dt, n, sumsq.ref.as<float>(), cnt.ref.as<int32_t>()));
  ASSERT_OK(gpu_->GradStats(x.gpu.data(), dt, n, sumsq.gpu.as<float>(), cnt.gpu.as<int32_t>()));
  EXPECT_CLOSE(mir, sumsq, kF32, 2e-5, "sumsq");
  EXPECT_EQ(mir.Gpu(cnt, DType::kI32)[0], 2 + expect_bad);
  EXPECT_EQ(mir.Ref(cnt, DType::kI32)[0], 2 + expect_bad);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CudaGradStatsTest,
                         ::testing::Combine(::testing::Values(kF32, kBF16, kF16),
                                            ::testing::Values(1, 127, (1 << 20) + 3)),
                         [](const auto& info) {
                           return DtName(std::get<0>(info.param)) + "_n" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---- errors ------------------------------------------------------------------------

class CudaOpsTest : public CudaVsCpu, public ::testing::Test {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_F(CudaOpsTest, BadArgumentsAreInvalidArgument) {
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, gpu_->Allocate(1 << 20));
  void* p = buf.data();
  float* f = buf.as<float>();
  int32_t* t = buf.as<int32_t>();
  const auto kInvalid = StatusCode::kInvalidArgument;
  EXPECT_THAT(gpu_->LayerNormForward({4, 0, kBF16}, p, f, f, p, p, p), StatusIs(kInvalid));
  EXPECT_THAT(gpu_->LayerNormForward({-1, 8, kBF16}, p, f, f, p, p, p), StatusIs(kInvalid));
  EXPECT_THAT(gpu_->LayerNormForward({4, 8, DType::kI32}, p, f, f, p, p, p), StatusIs(kInvalid));
  EXPECT_THAT(gpu_->LayerNormForward({4, 8, kBF16}, nullptr, f, f, p, p, p), StatusIs(kInvalid));
  EXPECT_THAT(gpu_->LayerNormBackward({4, 8, kBF16}, p, p, p, DType::kI8, false, p, p, p, f, f),
              StatusIs(kInvalid));
  EXPECT_THAT(gpu_->GeluForward(p, nullptr, 8, kBF16), StatusIs(kInvalid));
  EXPECT_THAT(gpu_->Add(p, p, p, -1, kBF16), StatusIs(kInvalid));
  EXPECT_THAT(gpu_->Cast(p, DType::kU8, p, kF32, 8), StatusIs(kInvalid));
  EXPECT_THAT(gpu_->CrossEntropy(f, nullptr, p, t, 4, 200, 128, 1.f, kBF16), StatusIs(kInvalid));
  EXPECT_THAT(gpu_->CrossEntropy(f, nullptr, p, t, 4, 0, 128, 1.f, kBF16), StatusIs(kInvalid));
  EXPECT_THAT(gpu_->BiasBackward(p, kF32, false, p, 4, -8, kBF16), StatusIs(kInvalid));
  EXPECT_THAT(gpu_->EmbeddingForward(p, t, p, p, 2, -3, 8, kBF16), StatusIs(kInvalid));
  EXPECT_THAT(gpu_->GradStats(p, kBF16, 8, nullptr, t), StatusIs(kInvalid));
  AttentionShape s{1, 4, 2, 0, kBF16};
  EXPECT_THAT(gpu_->AttentionForward(s, p, f, p, p), StatusIs(kInvalid));
  // Zero-sized work is fine and touches nothing.
  EXPECT_OK(gpu_->GeluForward(nullptr, nullptr, 0, kBF16));
  EXPECT_OK(gpu_->LayerNormForward({0, 8, kBF16}, nullptr, nullptr, nullptr, nullptr, p, p));
  EXPECT_OK(gpu_->Synchronize());
}

// ---- determinism -------------------------------------------------------------------

TEST_F(CudaOpsTest, ReductionsAreBitwiseDeterministic) {
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  const int64_t B = 4, T = 255, C = 768, V = 1000, Vp = 1024, N = B * T;
  auto up = [&](const std::vector<uint8_t>& bytes) {
    auto r = gpu_->Allocate(bytes.size());
    EXPECT_OK(r.status());
    DeviceBuffer b = std::move(r).value();
    EXPECT_OK(gpu_->CopyToDevice(b.data(), bytes.data(), bytes.size()));
    return b;
  };
  auto down = [&](const DeviceBuffer& b) {
    std::vector<uint8_t> h(b.bytes());
    EXPECT_OK(gpu_->CopyToHost(h.data(), b.data(), b.bytes()));
    return h;
  };
  auto x = up(ToBytes(RandomFloats(N * C, seed_, -2.f, 2.f), kBF16));
  auto dy = up(ToBytes(RandomFloats(N * C, seed_ + 1), kBF16));
  auto w = up(ToBytes(RandomFloats(C, seed_ + 2, 0.5f, 1.5f), kBF16));
  auto stats = up(std::vector<uint8_t>(N * 8));
  std::vector<int32_t> tokens = SkewedTokens(N, V, seed_);
  auto tok = up(std::vector<uint8_t>(reinterpret_cast<uint8_t*>(tokens.data()),
                                     reinterpret_cast<uint8_t*>(tokens.data() + N)));
  auto logits = up(ToBytes(RandomFloats(N * Vp, seed_ + 3, -5.f, 5.f), kBF16));

  auto run_once = [&]() {
    std::vector<std::vector<uint8_t>> outs;
    LayerNormArgs a{N, C, kBF16};
    float* mean = stats.as<float>();
    float* rstd = mean + N;
    DeviceBuffer y = up(std::vector<uint8_t>(N * C * 2));
    EXPECT_OK(gpu_->LayerNormForward(a, y.data(), mean, rstd, x.data(), w.data(), w.data()));
    DeviceBuffer dx = up(std::vector<uint8_t>(N * C * 2));
    DeviceBuffer dw = up(std::vector<uint8_t>(C * 4)), db = up(std::vector<uint8_t>(C * 4));
    EXPECT_OK(gpu_->LayerNormBackward(a, dx.data(), dw.data(), db.data(), kF32, false, dy.data(),
                                      x.data(), w.data(), mean, rstd));
    DeviceBuffer dbias = up(std::vector<uint8_t>(C * 4));
    EXPECT_OK(gpu_->BiasBackward(dbias.data(), kF32, false, dy.data(), N, C, kBF16));
    DeviceBuffer dwte = up(std::vector<uint8_t>(Vp * C * 4)), dwpe = up(std::vector<uint8_t>(T * C * 4));
    EXPECT_OK(gpu_->EmbeddingBackward(dwte.data(), dwpe.data(), kF32, dy.data(), tok.as<int32_t>(),
                                      B, T, C, Vp, kBF16));
    DeviceBuffer loss = up(std::vector<uint8_t>(N * 4));
    DeviceBuffer dlog = up(std::vector<uint8_t>(N * Vp * 2));
    EXPECT_OK(gpu_->CrossEntropy(loss.as<float>(), dlog.data(), logits.data(), tok.as<int32_t>(),
                                 N, V, Vp, 1.f / N, kBF16));
    DeviceBuffer ss = up(std::vector<uint8_t>(8));
    EXPECT_OK(gpu_->GradStats(dy.data(), kBF16, N * C, ss.as<float>(), ss.as<int32_t>() + 1));
    for (auto* b : {&y, &dx, &dw, &db, &dbias, &dwte, &dwpe, &loss, &dlog, &ss}) outs.push_back(down(*b));
    return outs;
  };
  auto first = run_once();
  auto second = run_once();
  const char* names[] = {"ln y", "ln dx", "ln dweight", "ln dbias", "bias grad", "dwte", "dwpe",
                         "losses", "dlogits", "grad stats"};
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(first[i] == second[i]) << names[i] << " differs run to run";
}

}  // namespace
}  // namespace strata::kernels
