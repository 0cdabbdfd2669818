// SPDX-License-Identifier: Apache-2.0
// Gradient checks: the CPU backend in fp64 against central finite
// differences, for every op (through the calls the model makes for its
// backward) on awkward shapes (the whole model: tests/models/gradcheck_test.cc).
//
// Each check defines a scalar loss L = sum(R * out) with fixed random R, gets
// the analytic gradient from the backward ops (with R as the output gradient)
// and compares it with (L(x + e) - L(x - e)) / 2e on up to kSamples
// coordinates of each input: ||analytic - numeric|| / ||numeric|| must be
// below kTol = 1e-7 (fp64, eps = 1e-5: the errors seen are 2e-10 .. 4e-9).
#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/test_util.h"

namespace strata::kernels {
namespace {

using testing::RandomVector;
using testing::RelError;
using testing::Tensor;

constexpr DType kF64 = DType::kF64;
constexpr double kEps = 1e-5;
constexpr double kTol = 1e-7;
constexpr size_t kSamples = 150;

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

std::vector<size_t> SampleIndices(size_t n, uint64_t seed, size_t samples = kSamples) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  if (n <= samples) return idx;
  std::mt19937_64 rng(seed);
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(samples);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Checks analytic gradient `grad` of loss() w.r.t. x on sampled coordinates;
// loss() must read the current contents of x.
void CheckGradient(const char* what, std::vector<double>& x, const std::vector<double>& grad,
                   const std::function<double()>& loss, uint64_t seed = 1, double eps = kEps,
                   double tol = kTol) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  std::vector<double> got, numeric;
  for (size_t i : SampleIndices(x.size(), seed)) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = loss();
    x[i] = x0 - eps;
    const double lm = loss();
    x[i] = x0;
    numeric.push_back((lp - lm) / (2 * eps));
    got.push_back(grad[i]);
  }
  const double err = RelError(got, numeric);
  EXPECT_LT(err, tol) << what << ": relative error " << err << " over " << got.size()
                      << " coordinates";
  double norm = 0;
  for (double v : numeric) norm += v * v;
  EXPECT_GT(norm, 0) << what << ": gradient is all zero, the check would prove nothing";
}

class GradCheckTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = MakeCpuBackend(2);
};

// ---- Gemm with bias and GELU epilogue, all transposes --------------------------
//
// out = gelu(op(A) op(B) + bias); backward through the Gemm calls the model
// uses: dpre = GeluBackward(aux, R), dA/dB by transposed Gemms, dbias by
// BiasBackward.

struct GemmShape {
  bool ta, tb;
  int64_t m, n, k;
  bool gelu;
};

void CheckGemmGradient(Backend* be, const GemmShape& s, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "ta=" << s.ta << " tb=" << s.tb << " m=" << s.m
                                    << " n=" << s.n << " k=" << s.k << " gelu=" << s.gelu);
  const int64_t m = s.m, n = s.n, k = s.k;
  const int64_t lda = s.ta ? m : k, ldb = s.tb ? k : n;
  auto a = RandomVector(m * k, seed), b = RandomVector(k * n, seed + 1);
  auto bias = RandomVector(n, seed + 2), r = RandomVector(m * n, seed + 3);
  Tensor ta(be, kF64, m * k), tb(be, kF64, k * n), tbias(be, kF64, n);
  Tensor out(be, kF64, m * n), aux(be, kF64, m * n);
  auto forward = [&]() {
    ta.Set(a), tb.Set(b), tbias.Set(bias);
    GemmArgs g;
    g.trans_a = s.ta, g.trans_b = s.tb, g.m = m, g.n = n, g.k = k;
    g.a = ta.data(), g.lda = lda, g.b = tb.data(), g.ldb = ldb, g.c = out.data(), g.ldc = n;
    g.ab_dtype = g.c_dtype = kF64, g.bias = tbias.data();
    g.gelu = s.gelu, g.gelu_aux = s.gelu ? aux.data() : nullptr;
    EXPECT_OK(be->Gemm(g));
    return Dot(out.Get(), r);
  };
  forward();
  Tensor dpre = Tensor::From(be, r, kF64);
  if (s.gelu) {
    ASSERT_OK(be->GeluBackward(dpre.data(), aux.data(), dpre.data(), m * n, kF64));
  }
  Tensor da = Tensor::Poisoned(be, kF64, m * k), db = Tensor::Poisoned(be, kF64, k * n);
  Tensor dbias = Tensor::Poisoned(be, kF64, n);
  GemmArgs g;
  g.ab_dtype = g.c_dtype = kF64;
  if (!s.ta) {  // dA [m,k] = dpre [m,n] @ op(B)^T
    g.m = m, g.n = k, g.k = n, g.a = dpre.data(), g.lda = n;
    g.b = tb.data(), g.trans_b = !s.tb, g.ldb = ldb;
  } else {  // dA [k,m] = op(B) [k,n] @ dpre^T
    g.m = k, g.n = m, g.k = n, g.a = tb.data(), g.trans_a = s.tb, g.lda = ldb;
    g.b = dpre.data(), g.trans_b = true, g.ldb = n;
  }
  g.c = da.data(), g.ldc = s.ta ? m : k;
  ASSERT_OK(be->Gemm(g));
  g = GemmArgs{};
  g.ab_dtype = g.c_dtype = kF64;
  if (!s.tb) {  // dB [k,n] = op(A)^T @ dpre
    g.m = k, g.n = n, g.k = m, g.a = ta.data(), g.trans_a = !s.ta, g.lda = lda;
    g.b = dpre.data(), g.ldb = n;
  } else {  // dB [n,k] = dpre^T @ op(A)
    g.m = n, g.n = k, g.k = m, g.a = dpre.data(), g.trans_a = true, g.lda = n;
    g.b = ta.data(), g.trans_b = s.ta, g.ldb = lda;
  }
  g.c = db.data(), g.ldc = s.tb ? k : n;
  ASSERT_OK(be->Gemm(g));
  ASSERT_OK(be->BiasBackward(dbias.data(), kF64, false, dpre.data(), m, n, kF64));
  CheckGradient("dA", a, da.Get(), forward, seed);
  CheckGradient("dB", b, db.Get(), forward, seed);
  CheckGradient("dbias", bias, dbias.Get(), forward, seed);
}

TEST_F(GradCheckTest, GemmAllTransposesWithBiasAndGelu) {
  uint64_t seed = 10;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CheckGemmGradient(be_.get(), {ta, tb, 7, 96, 13, true}, seed += 10);
      CheckGemmGradient(be_.get(), {ta, tb, 1, 5, 3, false}, seed += 10);
    }
  CheckGemmGradient(be_.get(), {false, false, 127, 9, 11, true}, seed += 10);
}

// ---- the MLP backward through the Gemm's GELU-backward epilogue ----------------
//
// out = gelu(X W1 + b1) W2; backward as the model's fused path does it:
// dpre = (R W2^T) * gelu'(pre) and db1 = column sums of dpre from one Gemm
// (dgelu, bias_grad), dW1 = X^T dpre. Padded leading dimensions throughout.

TEST_F(GradCheckTest, MlpBackwardThroughDgeluEpilogue) {
  const int64_t m = 37, kin = 11, h = 70, nout = 9;
  const int64_t ldh = h + 3;  // pre, y, dpre rows
  auto x = RandomVector(m * kin, 1), w1 = RandomVector(kin * h, 2), b1 = RandomVector(h, 3);
  auto w2 = RandomVector(h * nout, 4), r = RandomVector(m * nout, 5);
  Tensor tx(be_.get(), kF64, m * kin), tw1(be_.get(), kF64, kin * h), tb1(be_.get(), kF64, h);
  Tensor tw2 = Tensor::From(be_.get(), w2, kF64), tr = Tensor::From(be_.get(), r, kF64);
  Tensor pre(be_.get(), kF64, m * ldh), y(be_.get(), kF64, m * ldh), out(be_.get(), kF64, m * nout);
  auto forward = [&]() {
    tx.Set(x), tw1.Set(w1), tb1.Set(b1);
    GemmArgs g;
    g.m = m, g.n = h, g.k = kin;
    g.a = tx.data(), g.lda = kin, g.b = tw1.data(), g.ldb = h, g.c = y.data(), g.ldc = ldh;
    g.ab_dtype = g.c_dtype = kF64, g.bias = tb1.data(), g.gelu = true, g.gelu_aux = pre.data();
    EXPECT_OK(be_->Gemm(g));
    g = GemmArgs{};
    g.m = m, g.n = nout, g.k = h;
    g.a = y.data(), g.lda = ldh, g.b = tw2.data(), g.ldb = nout, g.c = out.data(), g.ldc = nout;
    g.ab_dtype = g.c_dtype = kF64;
    EXPECT_OK(be_->Gemm(g));
    return Dot(out.Get(), r);
  };
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    forward();  // pre at the unperturbed parameters (CheckGradient leaves it perturbed)
    const std::vector<double> db_start(h, accumulate ? 0.25 : 0.0);
    Tensor dpre = Tensor::Poisoned(be_.get(), kF64, m * ldh);
    Tensor db1 = accumulate ? Tensor::From(be_.get(), db_start, kF64)
                            : Tensor::Poisoned(be_.get(), kF64, h);
    GemmArgs g;
    g.trans_b = true;
    g.m = m, g.n = h, g.k = nout;
    g.a = tr.data(), g.lda = nout, g.b = tw2.data(), g.ldb = nout, g.c = dpre.data(), g.ldc = ldh;
    g.ab_dtype = g.c_dtype = kF64;
    g.dgelu = true, g.gelu_aux = pre.data();
    g.bias_grad = db1.data(), g.bias_grad_dtype = kF64, g.bias_grad_accumulate = accumulate;
    ASSERT_OK(be_->Gemm(g));
    Tensor dw1 = Tensor::Poisoned(be_.get(), kF64, kin * h);
    g = GemmArgs{};
    g.trans_a = true;
    g.m = kin, g.n = h, g.k = m;
    g.a = tx.data(), g.lda = kin, g.b = dpre.data(), g.ldb = ldh, g.c = dw1.data(), g.ldc = h;
    g.ab_dtype = g.c_dtype = kF64;
    ASSERT_OK(be_->Gemm(g));
    std::vector<double> db = db1.Get();
    for (int64_t j = 0; j < h; ++j) db[j] -= db_start[j];
    CheckGradient("db1", b1, db, forward, 7);
    CheckGradient("dW1", w1, dw1.Get(), forward, 8);
  }
}

// ---- LayerNorm ----------------------------------------------------------------

TEST_F(GradCheckTest, LayerNorm) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 96}, {127, 7}, {4, 3}}) {
    SCOPED_TRACE(::testing::Message() << N << "x" << C);
    auto x = RandomVector(N * C, N, -2, 2), w = RandomVector(C, 2, 0.5, 1.5);
    auto b = RandomVector(C, 3), r = RandomVector(N * C, 4);
    Tensor tx(be_.get(), kF64, N * C), tw(be_.get(), kF64, C), tb(be_.get(), kF64, C);
    Tensor ty(be_.get(), kF64, N * C), mean(be_.get(), kF64, N), rstd(be_.get(), kF64, N);
    const LayerNormArgs la{N, C, kF64, 1e-5f};
    auto forward = [&]() {
      tx.Set(x), tw.Set(w), tb.Set(b);
      EXPECT_OK(be_->LayerNormForward(la, ty.data(), mean.as<float>(), rstd.as<float>(), tx.data(),
                                      tw.data(), tb.data()));
      return Dot(ty.Get(), r);
    };
    forward();
    Tensor dy = Tensor::From(be_.get(), r, kF64);
    Tensor dx = Tensor::From(be_.get(), std::vector<double>(N * C, 0.0), kF64);
    Tensor dw = Tensor::Poisoned(be_.get(), kF64, C), db = Tensor::Poisoned(be_.get(), kF64, C);
    ASSERT_OK(be_->LayerNormBackward(la, dx.data(), dw.data(), db.data(), kF64, false, dy.data(),
                                     tx.data(), tw.data(), mean.as<float>(), rstd.as<float>()));
    CheckGradient("dx", x, dx.Get(), forward);
    CheckGradient("dweight", w, dw.Get(), forward);
    CheckGradient("dbias", b, db.Get(), forward);
  }
}

// ---- GELU, bias ---------------------------------------------------------------

TEST_F(GradCheckTest, GeluAndBias) {
  const int64_t n = 257;
  auto x = RandomVector(n, 1, -5, 5), r = RandomVector(n, 2);
  Tensor tx(be_.get(), kF64, n), ty(be_.get(), kF64, n);
  auto forward = [&]() {
    tx.Set(x);
    EXPECT_OK(be_->GeluForward(ty.data(), tx.data(), n, kF64));
    return Dot(ty.Get(), r);
  };
  Tensor dy = Tensor::From(be_.get(), r, kF64), dx = Tensor::Poisoned(be_.get(), kF64, n);
  forward();
  ASSERT_OK(be_->GeluBackward(dx.data(), tx.data(), dy.data(), n, kF64));
  CheckGradient("gelu dx", x, dx.Get(), forward);

  // out[m, c] = y[m, c] + bias[c]  =>  dbias = BiasBackward(R).
  const int64_t m = 127, c = 96;
  auto bias = RandomVector(c, 3), rr = RandomVector(m * c, 4), y = RandomVector(m * c, 5);
  auto bias_loss = [&]() {
    double s = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < c; ++j) s += rr[i * c + j] * (y[i * c + j] + bias[j]);
    return s;
  };
  Tensor trr = Tensor::From(be_.get(), rr, kF64), db = Tensor::Poisoned(be_.get(), kF64, c);
  ASSERT_OK(be_->BiasBackward(db.data(), kF64, false, trr.data(), m, c, kF64));
  CheckGradient("dbias", bias, db.Get(), bias_loss);
}

// ---- attention ------------------------------------------------------------------

TEST_F(GradCheckTest, CausalAttention) {
  struct Case {
    int64_t B, T, H, D;
  };
  // T = 1; T = 127 and 70 cross the 64-query blocks; heads 3 and 6.
  for (Case c : {Case{2, 1, 3, 4}, Case{1, 127, 3, 8}, Case{2, 70, 6, 4}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " H=" << c.H);
    const int64_t C = c.H * c.D, n = c.B * c.T * 3 * C;
    auto qkv = RandomVector(n, c.T, -1.5, 1.5), r = RandomVector(c.B * c.T * C, 2);
    Tensor tq(be_.get(), kF64, n), out(be_.get(), kF64, c.B * c.T * C);
    Tensor lse(be_.get(), kF64, c.B * c.H * c.T);
    const AttentionShape s{c.B, c.T, c.H, c.D, kF64, 0.f};
    auto forward = [&]() {
      tq.Set(qkv);
      EXPECT_OK(be_->AttentionForward(s, out.data(), lse.as<float>(), tq.data(), nullptr));
      return Dot(out.Get(), r);
    };
    forward();
    Tensor dout = Tensor::From(be_.get(), r, kF64), dqkv = Tensor::Poisoned(be_.get(), kF64, n);
    ASSERT_OK(be_->AttentionBackward(s, dqkv.data(), dout.data(), tq.data(), out.data(),
                                     lse.as<float>(), nullptr));
    CheckGradient("dqkv", qkv, dqkv.Get(), forward, c.T);
  }
}

// ---- embedding ------------------------------------------------------------------

TEST_F(GradCheckTest, Embedding) {
  const int64_t B = 2, T = 5, C = 6, Vp = 128;
  std::vector<int32_t> tok = {3, 3, 7, 0, 127, 3, 1, 7, 7, 2};
  auto wte = RandomVector(Vp * C, 1), wpe = RandomVector(T * C, 2), r = RandomVector(B * T * C, 3);
  Tensor ttok = Tensor::Ints(be_.get(), tok);
  Tensor twte(be_.get(), kF64, Vp * C), twpe(be_.get(), kF64, T * C),
      out(be_.get(), kF64, B * T * C);
  auto forward = [&]() {
    twte.Set(wte), twpe.Set(wpe);
    EXPECT_OK(be_->EmbeddingForward(out.data(), ttok.as<int32_t>(), twte.data(), twpe.data(), B, T,
                                    C, kF64));
    return Dot(out.Get(), r);
  };
  forward();
  Tensor dout = Tensor::From(be_.get(), r, kF64);
  Tensor dwte = Tensor::From(be_.get(), std::vector<double>(Vp * C, 0.0), kF64);
  Tensor dwpe = Tensor::From(be_.get(), std::vector<double>(T * C, 0.0), kF64);
  ASSERT_OK(be_->EmbeddingBackward(dwte.data(), dwpe.data(), kF64, dout.data(), ttok.as<int32_t>(),
                                   B, T, C, Vp, kF64));
  CheckGradient("dwte", wte, dwte.Get(), forward);
  CheckGradient("dwpe", wpe, dwpe.Get(), forward);
}

// ---- cross-entropy ---------------------------------------------------------------

TEST_F(GradCheckTest, CrossEntropyWithPaddedVocabAndIgnoredTargets) {
  const int64_t N = 6, V = 100, Vp = 128;
  std::vector<int32_t> targets = {5, -1, 99, 0, 42, -1};
  auto logits = RandomVector(N * Vp, 1, -3, 3);
  const float dloss = 0.25f;
  Tensor tl(be_.get(), kF64, N * Vp), losses(be_.get(), kF64, N);
  Tensor tt = Tensor::Ints(be_.get(), targets);
  auto forward = [&]() {
    tl.Set(logits);
    EXPECT_OK(be_->CrossEntropy(losses.as<float>(), nullptr, tl.data(), tt.as<int32_t>(), N, V, Vp,
                                1.f, kF64));
    double s = 0;
    for (double v : losses.Get()) s += v;
    return s * dloss;
  };
  forward();
  Tensor d = Tensor::Poisoned(be_.get(), kF64, N * Vp);
  ASSERT_OK(be_->CrossEntropy(losses.as<float>(), d.data(), tl.data(), tt.as<int32_t>(), N, V, Vp,
                              dloss, kF64));
  auto g = d.Get();
  // Every coordinate: padding columns and ignored rows must be exactly 0.
  std::vector<double> numeric(g.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const double x0 = logits[i];
    logits[i] = x0 + kEps;
    const double lp = forward();
    logits[i] = x0 - kEps;
    const double lm = forward();
    logits[i] = x0;
    numeric[i] = (lp - lm) / (2 * kEps);
    const int64_t row = static_cast<int64_t>(i) / Vp, col = static_cast<int64_t>(i) % Vp;
    if (col >= V || targets[row] < 0) {
      ASSERT_EQ(g[i], 0.0) << "row " << row << " col " << col;
    }
  }
  EXPECT_LT(RelError(g, numeric), kTol);
}

}  // namespace
}  // namespace strata::kernels
