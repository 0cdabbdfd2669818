// SPDX-License-Identifier: Apache-2.0
// CPU backend ops in fp64 against naive double references (forward ops), and
// each op's contract: accumulation flags, aliasing, ignored targets, padding,
// beta = 0 never reading C, argument errors. Gradients are checked against
// finite differences in cpu_gradcheck_test.cc, lower precisions against fp64
// in cpu_precision_test.cc.
#include <cmath>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/test_util.h"

namespace strata::kernels {
namespace {

using ::strata::testing::StatusIs;
using testing::GeluRef;
using testing::RandomVector;
using testing::RelError;
using testing::Tensor;

constexpr DType kF64 = DType::kF64;

class CpuOpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = MakeCpuBackend(2);
};

// ---- Gemm -------------------------------------------------------------------

struct GemmCase {
  bool ta, tb;
  int64_t m, n, k;
  int batch;
  bool bias, gelu;
  float alpha, beta;
};

// op(X)(i, j) of a row-major matrix with leading dimension ld.
double At(const std::vector<double>& x, size_t base, int64_t ld, bool trans, int64_t i, int64_t j) {
  return trans ? x[base + j * ld + i] : x[base + i * ld + j];
}

void RunGemmCase(Backend* be, const GemmCase& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "ta=" << c.ta << " tb=" << c.tb << " m=" << c.m << " n=" << c.n << " k=" << c.k
               << " batch=" << c.batch << " bias=" << c.bias << " gelu=" << c.gelu
               << " alpha=" << c.alpha << " beta=" << c.beta);
  const int64_t lda = (c.ta ? c.m : c.k) + 3, ldb = (c.tb ? c.k : c.n) + 1, ldc = c.n + 2;
  const int64_t rows_a = c.ta ? c.k : c.m, rows_b = c.tb ? c.n : c.k;
  const int64_t sa = rows_a * lda + 5, sb = rows_b * ldb + 2, sc = c.m * ldc + 1;
  auto a = RandomVector(static_cast<size_t>(sa * c.batch), seed);
  auto b = RandomVector(static_cast<size_t>(sb * c.batch), seed + 1);
  auto c0 = RandomVector(static_cast<size_t>(sc * c.batch), seed + 2);
  auto bias = RandomVector(static_cast<size_t>(c.n), seed + 3);
  Tensor ta = Tensor::From(be, a, kF64), tb = Tensor::From(be, b, kF64);
  Tensor tbias = Tensor::From(be, bias, kF64);
  // beta = 0 must not read C: poison it.
  Tensor tc = c.beta == 0 ? Tensor::Poisoned(be, kF64, c0.size()) : Tensor::From(be, c0, kF64);
  Tensor aux = Tensor::From(be, c0, kF64);
  GemmArgs g;
  g.trans_a = c.ta, g.trans_b = c.tb, g.m = c.m, g.n = c.n, g.k = c.k;
  g.a = ta.data(), g.lda = lda, g.b = tb.data(), g.ldb = ldb, g.c = tc.data(), g.ldc = ldc;
  g.ab_dtype = g.c_dtype = kF64;
  g.alpha = c.alpha, g.beta = c.beta;
  g.bias = c.bias ? tbias.data() : nullptr;
  g.gelu = c.gelu;
  g.gelu_aux = c.gelu ? aux.data() : nullptr;
  g.batch = c.batch, g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
  ASSERT_OK(be->Gemm(g));
  auto out = tc.Get(), aux_out = aux.Get();
  std::vector<double> want_c = c0, want_aux = c0, got_c = c0, got_aux = c0;
  for (int p = 0; p < c.batch; ++p) {
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double s = 0;
        for (int64_t l = 0; l < c.k; ++l)
          s += At(a, p * sa, lda, c.ta, i, l) * At(b, p * sb, ldb, c.tb, l, j);
        const size_t at = static_cast<size_t>(p * sc + i * ldc + j);
        double v = double(c.alpha) * s + (c.beta != 0 ? double(c.beta) * c0[at] : 0.0) +
                   (c.bias ? bias[j] : 0.0);
        want_aux[at] = v;
        want_c[at] = c.gelu ? GeluRef(v) : v;
        got_c[at] = out[at];
        got_aux[at] = aux_out[at];
      }
    }
  }
  EXPECT_LT(RelError(got_c, want_c), 1e-13);
  if (c.gelu) {
    EXPECT_LT(RelError(got_aux, want_aux), 1e-13);
  }
  // Padding between rows / batch items is untouched (only when C was not poisoned).
  if (c.beta != 0) {
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t within = static_cast<int64_t>(i) % sc;
      bool inside = within < c.m * ldc && within % ldc < c.n;
      if (!inside) {
        ASSERT_EQ(out[i], c0[i]) << "element " << i << " outside C was written";
      }
    }
  }
}

TEST_F(CpuOpsTest, GemmMatchesNaiveReferenceOnAwkwardShapes) {
  uint64_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                             {127, 96, 33},
                             {3, 300, 70},
                             {130, 257, 5}})
        RunGemmCase(be_.get(), {ta, tb, m, n, k, 1, false, false, 1.f, 0.f}, seed++);
}

TEST_F(CpuOpsTest, GemmEpiloguesBetaAlphaAndBatch) {
  uint64_t seed = 100;
  RunGemmCase(be_.get(), {false, false, 70, 300, 40, 1, true, false, 1.f, 0.f}, seed++);
  RunGemmCase(be_.get(), {false, false, 70, 300, 40, 1, true, true, 1.f, 0.f}, seed++);
  RunGemmCase(be_.get(), {true, false, 65, 97, 31, 1, true, true, 0.5f, 1.f}, seed++);
  RunGemmCase(be_.get(), {false, true, 17, 19, 23, 1, false, false, 0.75f, 0.5f}, seed++);
  RunGemmCase(be_.get(), {false, true, 33, 12, 16, 3, true, false, 1.f, 1.f}, seed++);
  RunGemmCase(be_.get(), {true, true, 9, 70, 11, 4, false, true, 2.f, 0.f}, seed++);
  // k = 0: C = beta C + bias.
  RunGemmCase(be_.get(), {false, false, 5, 7, 0, 1, true, false, 1.f, 0.5f}, seed++);
}

TEST_F(CpuOpsTest, GemmBroadcastsAnOperandWithStrideZero) {
  // B shared by all batch items (stride_b = 0), as attention-style callers do.
  const int64_t m = 4, n = 5, k = 3, batch = 3;
  auto a = RandomVector(batch * m * k, 7), b = RandomVector(k * n, 8);
  Tensor ta = Tensor::From(be_.get(), a, kF64), tb = Tensor::From(be_.get(), b, kF64);
  Tensor tc = Tensor::Poisoned(be_.get(), kF64, batch * m * n);
  GemmArgs g;
  g.m = m, g.n = n, g.k = k, g.a = ta.data(), g.lda = k, g.b = tb.data(), g.ldb = n;
  g.c = tc.data(), g.ldc = n, g.ab_dtype = g.c_dtype = kF64;
  g.batch = batch, g.stride_a = m * k, g.stride_b = 0, g.stride_c = m * n;
  ASSERT_OK(be_->Gemm(g));
  auto c = tc.Get();
  for (int p = 0; p < batch; ++p)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int l = 0; l < k; ++l) s += a[p * m * k + i * k + l] * b[l * n + j];
        EXPECT_NEAR(c[p * m * n + i * n + j], s, 1e-14);
      }
}

TEST_F(CpuOpsTest, GemmMixedDtypesAccumulateIntoF32) {
  // bf16 A, B; f32 C with beta = 1 (gradient accumulation).
  const int64_t m = 37, n = 45, k = 129;
  auto a = testing::Rounded(RandomVector(m * k, 11), DType::kBF16);
  auto b = testing::Rounded(RandomVector(k * n, 12), DType::kBF16);
  auto c0 = testing::Rounded(RandomVector(m * n, 13), DType::kF32);
  Tensor ta = Tensor::From(be_.get(), a, DType::kBF16),
         tb = Tensor::From(be_.get(), b, DType::kBF16);
  Tensor tc = Tensor::From(be_.get(), c0, DType::kF32);
  GemmArgs g;
  g.m = m, g.n = n, g.k = k, g.a = ta.data(), g.lda = k, g.b = tb.data(), g.ldb = n;
  g.c = tc.data(), g.ldc = n, g.ab_dtype = DType::kBF16, g.c_dtype = DType::kF32, g.beta = 1.f;
  ASSERT_OK(be_->Gemm(g));
  std::vector<double> want(m * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = c0[i * n + j];
      for (int l = 0; l < k; ++l) s += a[i * k + l] * b[l * n + j];
      want[i * n + j] = s;
    }
  EXPECT_LT(RelError(tc.Get(), want), 1e-6);  // fp32 accumulation of exact bf16 products
}

// tanh-GELU derivative in fp64 (the formula of backend.h).
double GeluGradRef(double x) {
  const double k = std::sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

TEST_F(CpuOpsTest, GemmDgeluAndBiasGradMatchNaiveReference) {
  uint64_t seed = 100;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 0.5f})
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb << " beta=" << beta
                                            << " accumulate=" << accumulate);
          // m spans several 64-row tiles and a ragged one; n two 256-column tiles.
          const int64_t m = 150, n = 300, k = 17, ldc = n + 3;
          const int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2;
          auto a = RandomVector((ta ? k : m) * lda, ++seed), b = RandomVector((tb ? n : k) * ldb, ++seed);
          auto cin = RandomVector(m * ldc, ++seed), pre = RandomVector(m * ldc, ++seed, -4, 4);
          auto db0 = RandomVector(n, ++seed);
          Tensor tA = Tensor::From(be_.get(), a, kF64), tB = Tensor::From(be_.get(), b, kF64);
          Tensor tcin = Tensor::From(be_.get(), cin, kF64), tpre = Tensor::From(be_.get(), pre, kF64);
          Tensor tc = Tensor::Poisoned(be_.get(), kF64, m * ldc);
          Tensor tdb = accumulate ? Tensor::From(be_.get(), db0, kF64) : Tensor::Poisoned(be_.get(), kF64, n);
          GemmArgs g;
          g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k;
          g.a = tA.data(), g.lda = lda, g.b = tB.data(), g.ldb = ldb, g.c = tc.data(), g.ldc = ldc;
          g.ab_dtype = g.c_dtype = kF64, g.alpha = 0.75f, g.beta = beta;
          g.c_in = tcin.data(), g.dgelu = true, g.gelu_aux = tpre.data();
          g.bias_grad = tdb.data(), g.bias_grad_dtype = kF64, g.bias_grad_accumulate = accumulate;
          ASSERT_OK(be_->Gemm(g));
          std::vector<double> want(m * n), got(m * n), colsum(n, 0.0);
          const auto c = tc.Get();
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double s = 0;
              for (int64_t l = 0; l < k; ++l) s += At(a, 0, lda, ta, i, l) * At(b, 0, ldb, tb, l, j);
              double v = 0.75 * s + double(beta) * cin[i * ldc + j];
              v *= GeluGradRef(pre[i * ldc + j]);
              want[i * n + j] = v;
              got[i * n + j] = c[i * ldc + j];
              colsum[j] += v;
            }
          EXPECT_LT(RelError(got, want), 1e-13);
          if (accumulate)
            for (int64_t j = 0; j < n; ++j) colsum[j] += db0[j];
          EXPECT_LT(RelError(tdb.Get(), colsum), 1e-13);
          EXPECT_EQ(tcin.Get(), cin);  // C_in is only read
          EXPECT_EQ(tpre.Get(), pre);  // and so is the pre-activation
        }
}

TEST_F(CpuOpsTest, GemmCInAndBiasGradWithoutDgelu) {
  // C = A B + 1 * C_in + bias into a poisoned C; bias_grad sums that result
  // (f32 gradient of bf16 operands); C_in = C in place gives the same.
  const int64_t m = 70, n = 33, k = 9;
  const DType bf16 = DType::kBF16;
  auto a = testing::Rounded(RandomVector(m * k, 21), bf16);
  auto b = testing::Rounded(RandomVector(k * n, 22), bf16);
  auto cin = testing::Rounded(RandomVector(m * n, 23), bf16);
  auto bias = testing::Rounded(RandomVector(n, 24), bf16);
  Tensor tA = Tensor::From(be_.get(), a, bf16), tB = Tensor::From(be_.get(), b, bf16);
  Tensor tcin = Tensor::From(be_.get(), cin, bf16), tbias = Tensor::From(be_.get(), bias, bf16);
  Tensor tc = Tensor::Poisoned(be_.get(), bf16, m * n), tdb = Tensor::Poisoned(be_.get(), DType::kF32, n);
  GemmArgs g;
  g.m = m, g.n = n, g.k = k, g.a = tA.data(), g.lda = k, g.b = tB.data(), g.ldb = n;
  g.c = tc.data(), g.ldc = n, g.ab_dtype = g.c_dtype = bf16, g.beta = 1.f, g.c_in = tcin.data();
  g.bias = tbias.data(), g.bias_grad = tdb.data(), g.bias_grad_dtype = DType::kF32;
  ASSERT_OK(be_->Gemm(g));
  std::vector<double> want(m * n), colsum(n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = cin[i * n + j] + bias[j];
      for (int64_t l = 0; l < k; ++l) s += a[i * k + l] * b[l * n + j];
      want[i * n + j] = s;
      colsum[j] += s;
    }
  EXPECT_LT(RelError(tc.Get(), want), 4e-3);     // bf16 output
  EXPECT_LT(RelError(tdb.Get(), colsum), 1e-6);  // fp32 sums of the unrounded values
  EXPECT_EQ(tcin.Get(), cin);
  const auto out = tc.Get();
  g.c = tcin.data(), g.c_in = tcin.data();  // in place
  ASSERT_OK(be_->Gemm(g));
  EXPECT_EQ(tcin.Get(), out);
}

TEST_F(CpuOpsTest, GemmBiasGradOfNoRowsIsZero) {
  Tensor a = Tensor::Poisoned(be_.get(), kF64, 16), c = Tensor::Poisoned(be_.get(), kF64, 16);
  Tensor db = Tensor::Poisoned(be_.get(), DType::kF32, 5);
  GemmArgs g;
  g.m = 0, g.n = 5, g.k = 3, g.a = a.data(), g.lda = 3, g.b = a.data(), g.ldb = 5;
  g.c = c.data(), g.ldc = 5, g.ab_dtype = g.c_dtype = kF64;
  g.bias_grad = db.data(), g.bias_grad_dtype = DType::kF32;
  ASSERT_OK(be_->Gemm(g));
  EXPECT_EQ(db.Get(), std::vector<double>(5, 0.0));
  db.Set(std::vector<double>(5, 2.0));
  g.bias_grad_accumulate = true;
  ASSERT_OK(be_->Gemm(g));
  EXPECT_EQ(db.Get(), std::vector<double>(5, 2.0));
}

TEST_F(CpuOpsTest, GemmRejectsBadArguments) {
  Tensor a = Tensor::Poisoned(be_.get(), kF64, 64), c = Tensor::Poisoned(be_.get(), kF64, 64);
  GemmArgs g;
  g.m = 4, g.n = 4, g.k = 4, g.a = a.data(), g.b = a.data(), g.c = c.data();
  g.lda = 4, g.ldb = 4, g.ldc = 4, g.ab_dtype = g.c_dtype = kF64;
  GemmArgs bad = g;
  bad.lda = 3;
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.trans_b = true, bad.ldb = 3;
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.ldc = 2;
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.m = -1;
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.c = nullptr;
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.ab_dtype = DType::kI32;
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.gelu_aux = c.data();  // aux without gelu
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.batch = 2, bad.stride_c = 8;  // the two C items overlap
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.batch = 0;
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  Tensor aux = Tensor::Poisoned(be_.get(), kF64, 64), db = Tensor::Poisoned(be_.get(), kF64, 8);
  bad = g;
  bad.dgelu = true;  // no pre-activation
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad.gelu_aux = aux.data(), bad.gelu = true;  // gelu and dgelu
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad.gelu = false, bad.bias = a.data();  // dgelu with a forward bias
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad.bias = nullptr, bad.gelu_aux = c.data();  // pre-activation aliasing C
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.bias_grad = db.data(), bad.batch = 2, bad.stride_c = 16;  // bias_grad of a batch
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.bias_grad = db.data(), bad.bias_grad_dtype = DType::kI32;
  EXPECT_THAT(be_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
}

// ---- LayerNorm ----------------------------------------------------------------

// At unit variance (the first inputs) and at a variance of about epsilon
// (x scaled by 3e-3: 1.9e-5), where epsilon moves rstd by a fifth: a
// LayerNorm that drops or misplaces it fails both ways.
TEST_F(CpuOpsTest, LayerNormForwardMatchesReference) {
  for (double spread : {1.0, 3e-3})
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {127, 96}, {3, 2048}}) {
    auto x = RandomVector(N * C, N + C, -3, 2), w = RandomVector(C, 2), b = RandomVector(C, 3);
    for (double& v : x) v *= spread;
    Tensor tx = Tensor::From(be_.get(), x, kF64), tw = Tensor::From(be_.get(), w, kF64);
    Tensor tb = Tensor::From(be_.get(), b, kF64), ty = Tensor::Poisoned(be_.get(), kF64, N * C);
    Tensor mean = Tensor::Poisoned(be_.get(), kF64, N), rstd = Tensor::Poisoned(be_.get(), kF64, N);
    LayerNormArgs la{N, C, kF64, 1e-5f};
    ASSERT_OK(be_->LayerNormForward(la, ty.data(), mean.as<float>(), rstd.as<float>(), tx.data(),
                                    tw.data(), tb.data()));
    std::vector<double> y(N * C), mu(N), rs(N);
    for (int64_t r = 0; r < N; ++r) {
      double s = 0, v = 0;
      for (int64_t j = 0; j < C; ++j) s += x[r * C + j];
      mu[r] = s / C;
      for (int64_t j = 0; j < C; ++j) v += (x[r * C + j] - mu[r]) * (x[r * C + j] - mu[r]);
      rs[r] = 1 / std::sqrt(v / C + double(1e-5f));
      for (int64_t j = 0; j < C; ++j) y[r * C + j] = (x[r * C + j] - mu[r]) * rs[r] * w[j] + b[j];
    }
    EXPECT_LT(RelError(ty.Get(), y), 1e-13) << N << "x" << C << " spread " << spread;
    EXPECT_LT(RelError(mean.Get(), mu), 1e-13);
    EXPECT_LT(RelError(rstd.Get(), rs), 1e-13);
  }
}

TEST_F(CpuOpsTest, LayerNormBackwardAccumulatesDxAndHonorsGradFlag) {
  const int64_t N = 9, C = 96;
  auto x = RandomVector(N * C, 1), w = RandomVector(C, 2), b = RandomVector(C, 3);
  auto dy = RandomVector(N * C, 4), dx0 = RandomVector(N * C, 5), g0 = RandomVector(C, 6);
  Tensor tx = Tensor::From(be_.get(), x, kF64), tw = Tensor::From(be_.get(), w, kF64);
  Tensor tb = Tensor::From(be_.get(), b, kF64), ty = Tensor(be_.get(), kF64, N * C);
  Tensor mean(be_.get(), kF64, N), rstd(be_.get(), kF64, N);
  LayerNormArgs la{N, C, kF64, 1e-5f};
  ASSERT_OK(be_->LayerNormForward(la, ty.data(), mean.as<float>(), rstd.as<float>(), tx.data(),
                                  tw.data(), tb.data()));
  Tensor tdy = Tensor::From(be_.get(), dy, kF64);
  // From zero dx, overwriting dw/db (poisoned).
  Tensor dx_a = Tensor::From(be_.get(), std::vector<double>(N * C, 0.0), kF64);
  Tensor dw_a = Tensor::Poisoned(be_.get(), kF64, C), db_a = Tensor::Poisoned(be_.get(), kF64, C);
  ASSERT_OK(be_->LayerNormBackward(la, dx_a.data(), dw_a.data(), db_a.data(), kF64, false,
                                   tdy.data(), tx.data(), tw.data(), mean.as<float>(),
                                   rstd.as<float>()));
  // From dx0, accumulating into g0.
  Tensor dx_b = Tensor::From(be_.get(), dx0, kF64);
  Tensor dw_b = Tensor::From(be_.get(), g0, kF64), db_b = Tensor::From(be_.get(), g0, kF64);
  ASSERT_OK(be_->LayerNormBackward(la, dx_b.data(), dw_b.data(), db_b.data(), kF64, true,
                                   tdy.data(), tx.data(), tw.data(), mean.as<float>(),
                                   rstd.as<float>()));
  auto da = dx_a.Get(), db = dx_b.Get(), wa = dw_a.Get(), wb = dw_b.Get(), ba = db_a.Get(),
       bb = db_b.Get();
  for (int64_t i = 0; i < N * C; ++i) EXPECT_NEAR(db[i], dx0[i] + da[i], 1e-12);
  double dbias_sum = 0;
  for (int64_t j = 0; j < C; ++j) {
    EXPECT_NEAR(wb[j], g0[j] + wa[j], 1e-12);
    EXPECT_NEAR(bb[j], g0[j] + ba[j], 1e-12);
    double s = 0;
    for (int64_t r = 0; r < N; ++r) s += dy[r * C + j];
    EXPECT_NEAR(ba[j], s, 1e-12);  // dbias = column sums of dy
    dbias_sum += ba[j];
  }
  EXPECT_TRUE(std::isfinite(dbias_sum));
}

// ---- elementwise ----------------------------------------------------------------

TEST_F(CpuOpsTest, GeluAddScaleCastElementwise) {
  const int64_t n = 40000 + 3;  // several parallel blocks and a ragged chunk
  auto x = RandomVector(n, 1, -6, 6), y = RandomVector(n, 2);
  Tensor tx = Tensor::From(be_.get(), x, kF64), ty = Tensor::From(be_.get(), y, kF64);
  Tensor out = Tensor::Poisoned(be_.get(), kF64, n);
  ASSERT_OK(be_->GeluForward(out.data(), tx.data(), n, kF64));
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = GeluRef(x[i]);
  EXPECT_LT(RelError(out.Get(), want), 1e-14);

  // Backward, with dx aliasing dy.
  Tensor g = Tensor::From(be_.get(), y, kF64);
  ASSERT_OK(be_->GeluBackward(g.data(), tx.data(), g.data(), n, kF64));
  for (int64_t i = 0; i < n; ++i) {
    double h = 1e-5;
    want[i] = y[i] * (GeluRef(x[i] + h) - GeluRef(x[i] - h)) / (2 * h);
  }
  EXPECT_LT(RelError(g.Get(), want), 1e-9);

  // Add, out aliasing a.
  Tensor a = Tensor::From(be_.get(), x, kF64);
  ASSERT_OK(be_->Add(a.data(), a.data(), ty.data(), n, kF64));
  for (int64_t i = 0; i < n; ++i) want[i] = x[i] + y[i];
  EXPECT_EQ(a.Get(), want);

  ASSERT_OK(be_->Scale(a.data(), kF64, n, 0.25f));
  for (int64_t i = 0; i < n; ++i) want[i] = (x[i] + y[i]) * 0.25;
  EXPECT_EQ(a.Get(), want);

  // Cast f64 -> bf16 -> f32 rounds to nearest even once per step.
  Tensor h = Tensor::Poisoned(be_.get(), DType::kBF16, n);
  Tensor f = Tensor::Poisoned(be_.get(), DType::kF32, n);
  ASSERT_OK(be_->Cast(h.data(), DType::kBF16, tx.data(), kF64, n));
  ASSERT_OK(be_->Cast(f.data(), DType::kF32, h.data(), DType::kBF16, n));
  EXPECT_EQ(f.Get(), testing::Rounded(x, DType::kBF16));
  EXPECT_THAT(be_->Cast(f.data(), DType::kI32, h.data(), DType::kBF16, n),
              StatusIs(StatusCode::kInvalidArgument));
}

// The f32 GELU (the vectorized path the f32/bf16 models run) against the
// tanh-GELU in fp64, element by element: within 4 ulps of the result plus,
// where 1 + tanh u cancels (x << 0) and the derivative crosses zero, 8 ulps
// of the terms' size |x| + 1 (seen: forward at 0.09 of that bound, the
// derivative at 0.46). The erf GELU is 248 times the bound away: the flavour.
TEST_F(CpuOpsTest, GeluF32IsTheTanhGeluPerElement) {
  const int64_t n = 20000 + 5;
  std::vector<double> x = testing::Rounded(RandomVector(n, 7, -6, 6), DType::kF32);
  Tensor tx = Tensor::From(be_.get(), x, DType::kF32), y = Tensor::Poisoned(be_.get(), DType::kF32, n);
  ASSERT_OK(be_->GeluForward(y.data(), tx.data(), n, DType::kF32));
  Tensor g = Tensor::From(be_.get(), std::vector<double>(n, 1.0), DType::kF32);
  ASSERT_OK(be_->GeluBackward(g.data(), tx.data(), g.data(), n, DType::kF32));
  const auto yv = y.Get(), gv = g.Get();
  auto ulp = [](double v) { int e; std::frexp(std::fabs(v), &e); return std::ldexp(1.0, std::max(e - 1, -126) - 23); };
  double worst_y = 0, worst_g = 0, erf_gap = 0;
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double want = GeluRef(x[i]), dwant = GeluGradRef(x[i]);
    const double ey = std::fabs(yv[i] - want), eg = std::fabs(gv[i] - dwant);
    const double allow = 8 * ulp(std::fabs(x[i]) + 1);
    worst_y = std::max(worst_y, ey / (4 * ulp(want) + allow));
    worst_g = std::max(worst_g, eg / (4 * ulp(dwant) + allow));
    if ((ey > 4 * ulp(want) + allow || eg > 4 * ulp(dwant) + allow) && ++bad <= 3)
      ADD_FAILURE() << "x = " << x[i] << ": gelu " << yv[i] << " vs " << want << ", gelu' " << gv[i] << " vs " << dwant;
    erf_gap = std::max(erf_gap, std::fabs(0.5 * x[i] * (1 + std::erf(x[i] / std::sqrt(2.0))) - want) /
                                    (4 * ulp(want) + allow));
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(erf_gap, 100);  // the inputs tell the flavours apart
  std::printf("[ gelu f32 ] worst forward %.2f, derivative %.2f of the bound; erf's GELU %.0f times it\n", worst_y,
              worst_g, erf_gap);
}

TEST_F(CpuOpsTest, BiasBackwardSumsRowsAndAccumulates) {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{1, 1}, {127, 96}, {300, 7}}) {
    auto dy = RandomVector(m * n, m), g0 = RandomVector(n, n);
    Tensor tdy = Tensor::From(be_.get(), dy, kF64);
    Tensor over = Tensor::Poisoned(be_.get(), kF64, n), acc = Tensor::From(be_.get(), g0, kF64);
    ASSERT_OK(be_->BiasBackward(over.data(), kF64, false, tdy.data(), m, n, kF64));
    ASSERT_OK(be_->BiasBackward(acc.data(), kF64, true, tdy.data(), m, n, kF64));
    std::vector<double> s(n, 0.0), s_acc(n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) s[j] += dy[i * n + j];
    for (int64_t j = 0; j < n; ++j) s_acc[j] = g0[j] + s[j];
    EXPECT_LT(RelError(over.Get(), s), 1e-14);
    EXPECT_LT(RelError(acc.Get(), s_acc), 1e-14);
  }
}

TEST_F(CpuOpsTest, GradStatsCountsNonFiniteAndSumsTheRest) {
  const int64_t n = 50001;
  auto x = RandomVector(n, 3);
  x[10] = NAN, x[20000] = INFINITY, x[n - 1] = -INFINITY;
  double want = 0;
  for (double v : x)
    if (std::isfinite(v)) want += v * v;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, kF64}) {
    Tensor tx = Tensor::From(be_.get(), x, t);
    auto xr = testing::Rounded(x, t);
    double want_t = 0;
    for (double v : xr)
      if (std::isfinite(v)) want_t += v * v;
    Tensor sumsq = Tensor::From(be_.get(), {0.5}, testing::StatDType(t));
    Tensor bad = Tensor::Ints(be_.get(), {2});
    ASSERT_OK(be_->GradStats(tx.data(), t, n, sumsq.as<float>(), bad.as<int32_t>()));
    int32_t count = 0;
    ASSERT_OK(be_->CopyToHost(&count, bad.data(), 4));
    EXPECT_EQ(count, 2 + 3) << DTypeName(t);
    EXPECT_NEAR(sumsq.Get()[0], 0.5 + want_t, (t == kF64 ? 1e-10 : 1e-5) * want_t) << DTypeName(t);
  }
  EXPECT_GT(want, 0);
}

// ---- attention ---------------------------------------------------------------

void AttentionRef(const std::vector<double>& qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                  std::vector<double>* out, std::vector<double>* lse) {
  const int64_t C = H * D;
  out->assign(B * T * C, 0.0);
  lse->assign(B * H * T, 0.0);
  const double scale = 1 / std::sqrt(double(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t j = 0; j < D; ++j)
            d += qkv[(b * T + t) * 3 * C + h * D + j] * qkv[(b * T + u) * 3 * C + C + h * D + j];
          s[u] = d * scale;
          mx = std::max(mx, s[u]);
        }
        double z = 0;
        for (double v : s) z += std::exp(v - mx);
        (*lse)[(b * H + h) * T + t] = mx + std::log(z);
        for (int64_t u = 0; u <= t; ++u) {
          double p = std::exp(s[u] - mx) / z;
          for (int64_t j = 0; j < D; ++j)
            (*out)[(b * T + t) * C + h * D + j] += p * qkv[(b * T + u) * 3 * C + 2 * C + h * D + j];
        }
      }
}

TEST_F(CpuOpsTest, AttentionForwardMatchesReference) {
  struct Case {
    int64_t B, T, H, D;
  };
  for (Case c : {Case{1, 1, 1, 8}, Case{2, 127, 3, 32}, Case{1, 70, 6, 16}}) {
    const int64_t C = c.H * c.D;
    auto qkv = RandomVector(c.B * c.T * 3 * C, c.T, -2, 2);
    Tensor tq = Tensor::From(be_.get(), qkv, kF64);
    Tensor out = Tensor::Poisoned(be_.get(), kF64, c.B * c.T * C);
    Tensor lse = Tensor::Poisoned(be_.get(), kF64, c.B * c.H * c.T);
    AttentionShape s{c.B, c.T, c.H, c.D, kF64, 0.f};
    ASSERT_OK(be_->AttentionForward(s, out.data(), lse.as<float>(), tq.data(), nullptr));
    std::vector<double> want_out, want_lse;
    AttentionRef(qkv, c.B, c.T, c.H, c.D, &want_out, &want_lse);
    EXPECT_LT(RelError(out.Get(), want_out), 1e-13) << c.T;
    EXPECT_LT(RelError(lse.Get(), want_lse), 1e-14) << c.T;
  }
}

TEST_F(CpuOpsTest, AttentionRejectsBadShapes) {
  Tensor t = Tensor::Poisoned(be_.get(), kF64, 64);
  AttentionShape s{1, 2, 0, 4, kF64, 0.f};
  EXPECT_THAT(be_->AttentionForward(s, t.data(), t.as<float>(), t.data(), nullptr),
              StatusIs(StatusCode::kInvalidArgument));
  s = AttentionShape{1, 2, 2, 4, kF64, -1.f};
  EXPECT_THAT(
      be_->AttentionBackward(s, t.data(), t.data(), t.data(), t.data(), t.as<float>(), nullptr),
      StatusIs(StatusCode::kInvalidArgument));
}

// ---- embedding -----------------------------------------------------------------

TEST_F(CpuOpsTest, EmbeddingForwardAndDeterministicScatter) {
  const int64_t B = 3, T = 7, C = 96, Vp = 128;
  std::vector<int32_t> tok(B * T);
  for (int64_t i = 0; i < B * T; ++i) tok[i] = static_cast<int32_t>((i * 37) % 11);  // repeats
  auto wte = RandomVector(Vp * C, 1), wpe = RandomVector(T * C, 2);
  Tensor ttok = Tensor::Ints(be_.get(), tok);
  Tensor twte = Tensor::From(be_.get(), wte, kF64), twpe = Tensor::From(be_.get(), wpe, kF64);
  Tensor out = Tensor::Poisoned(be_.get(), kF64, B * T * C);
  ASSERT_OK(be_->EmbeddingForward(out.data(), ttok.as<int32_t>(), twte.data(), twpe.data(), B, T, C,
                                  kF64));
  auto o = out.Get();
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t j = 0; j < C; ++j)
      ASSERT_EQ(o[i * C + j], wte[tok[i] * C + j] + wpe[(i % T) * C + j]);

  auto dout = RandomVector(B * T * C, 3), g0 = RandomVector(Vp * C, 4), p0 = RandomVector(T * C, 5);
  Tensor td = Tensor::From(be_.get(), dout, kF64);
  Tensor dwte = Tensor::From(be_.get(), g0, kF64), dwpe = Tensor::From(be_.get(), p0, kF64);
  ASSERT_OK(be_->EmbeddingBackward(dwte.data(), dwpe.data(), kF64, td.data(), ttok.as<int32_t>(), B,
                                   T, C, Vp, kF64));
  std::vector<double> want_wte = g0, want_wpe = p0;
  std::vector<double> acc(Vp * C, 0.0);
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t j = 0; j < C; ++j) {
      acc[tok[i] * C + j] += dout[i * C + j];
      want_wpe[(i % T) * C + j] += dout[i * C + j];
    }
  for (int64_t i = 0; i < Vp * C; ++i) want_wte[i] += acc[i];
  EXPECT_LT(RelError(dwte.Get(), want_wte), 1e-15);
  EXPECT_LT(RelError(dwpe.Get(), want_wpe), 1e-15);

  tok[5] = static_cast<int32_t>(Vp);
  Tensor bad = Tensor::Ints(be_.get(), tok);
  EXPECT_THAT(be_->EmbeddingBackward(dwte.data(), dwpe.data(), kF64, td.data(), bad.as<int32_t>(),
                                     B, T, C, Vp, kF64),
              StatusIs(StatusCode::kInvalidArgument));
  tok[5] = -1;
  Tensor neg = Tensor::Ints(be_.get(), tok);
  EXPECT_THAT(
      be_->EmbeddingForward(out.data(), neg.as<int32_t>(), twte.data(), twpe.data(), B, T, C, kF64),
      StatusIs(StatusCode::kInvalidArgument));
}

// ---- cross-entropy -----------------------------------------------------------------

TEST_F(CpuOpsTest, CrossEntropyPaddingAndIgnoredTargets) {
  const int64_t N = 5, V = 200, Vp = 256;
  auto logits = RandomVector(N * Vp, 9, -4, 4);
  std::vector<int32_t> targets = {3, -1, 199, 0, -100};
  Tensor tl = Tensor::From(be_.get(), logits, kF64), tt = Tensor::Ints(be_.get(), targets);
  Tensor losses = Tensor::Poisoned(be_.get(), kF64, N);
  Tensor dl = Tensor::Poisoned(be_.get(), kF64, N * Vp);
  const float dloss = 0.375f;
  ASSERT_OK(be_->CrossEntropy(losses.as<float>(), dl.data(), tl.data(), tt.as<int32_t>(), N, V, Vp,
                              dloss, kF64));
  auto got_loss = losses.Get(), got_d = dl.Get();
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] < 0) {
      EXPECT_EQ(got_loss[i], 0.0);
      for (int64_t j = 0; j < Vp; ++j) ASSERT_EQ(got_d[i * Vp + j], 0.0);
      continue;
    }
    double mx = -INFINITY, z = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, logits[i * Vp + j]);
    for (int64_t j = 0; j < V; ++j) z += std::exp(logits[i * Vp + j] - mx);
    const double lse = mx + std::log(z);
    EXPECT_NEAR(got_loss[i], lse - logits[i * Vp + targets[i]], 1e-13);
    for (int64_t j = 0; j < Vp; ++j) {
      double want = j < V ? (std::exp(logits[i * Vp + j] - lse) - (j == targets[i])) * dloss : 0.0;
      ASSERT_NEAR(got_d[i * Vp + j], want, 1e-15) << i << "," << j;
    }
  }
  // In place (dlogits aliasing logits) gives the same.
  ASSERT_OK(be_->CrossEntropy(losses.as<float>(), tl.data(), tl.data(), tt.as<int32_t>(), N, V, Vp,
                              dloss, kF64));
  EXPECT_EQ(tl.Get(), got_d);

  targets[0] = static_cast<int32_t>(V);  // a padding column is not a valid target
  Tensor bad = Tensor::Ints(be_.get(), targets);
  EXPECT_THAT(be_->CrossEntropy(losses.as<float>(), nullptr, tl.data(), bad.as<int32_t>(), N, V, Vp,
                                1.f, kF64),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(be_->CrossEntropy(losses.as<float>(), nullptr, tl.data(), tt.as<int32_t>(), N, V + 57,
                                Vp, 1.f, kF64),
              StatusIs(StatusCode::kInvalidArgument));  // Vp < V
}

// ---- memory -----------------------------------------------------------------

TEST_F(CpuOpsTest, BuffersAreAlignedAndCopiesWork) {
  ASSERT_OK_AND_ASSIGN(DeviceBuffer a, be_->Allocate(3 << 20));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer b, be_->Allocate(3 << 20));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  auto bytes = ::strata::testing::RandomBytes(3 << 20, 5);
  ASSERT_OK(be_->CopyToDevice(a.data(), bytes.data(), bytes.size()));
  ASSERT_OK(be_->CopyDeviceToDevice(b.data(), a.data(), bytes.size()));
  std::vector<uint8_t> back(bytes.size());
  ASSERT_OK(be_->CopyToHost(back.data(), b.data(), back.size()));
  EXPECT_EQ(back, bytes);
  ASSERT_OK(be_->Memset(b.data(), 0x5a, 100));
  ASSERT_OK(be_->CopyToHost(back.data(), b.data(), 101));
  EXPECT_EQ(back[99], 0x5a);
  EXPECT_EQ(back[100], bytes[100]);
  EXPECT_THAT(be_->CopyToHost(nullptr, b.data(), 4), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(be_->kind(), BackendKind::kCpu);
  EXPECT_NE(be_->name().find("cpu (2 threads"), std::string::npos) << be_->name();
}

TEST(DefaultBackendTest, FallsBackToCpuWithoutGpu) {
  std::string why;
  if (::strata::testing::HaveGpu(&why)) GTEST_SKIP() << "a GPU is present: the default is CUDA";
  ASSERT_OK_AND_ASSIGN(auto be, MakeDefaultBackend());
  EXPECT_EQ(be->kind(), BackendKind::kCpu);
}

}  // namespace
}  // namespace strata::kernels
