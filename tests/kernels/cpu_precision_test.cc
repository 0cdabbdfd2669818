// SPDX-License-Identifier: Apache-2.0
// Every op in f32, f16 and bf16 storage against the same op in f64 on the
// same inputs (rounded to the storage dtype first, so only the op's own
// arithmetic and output rounding differ). Error = ||out - out_f64|| /
// ||out_f64|| per output; tolerances per dtype (METHOD.md: fp32 far under
// 1e-3, bf16 operands 1e-3 .. 1e-2):
//   f32 1e-5, f16 3e-3, bf16 2e-2.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/test_util.h"

namespace strata::kernels {
namespace {

using testing::RandomVector;
using testing::RelError;
using testing::Rounded;
using testing::StatDType;
using testing::Tensor;

constexpr DType kF64 = DType::kF64;

struct Output {
  std::string name;
  std::vector<double> values;
};
// Runs an op with storage dtype t on inputs already rounded to the tested
// dtype; returns its outputs.
using OpRun = std::function<std::vector<Output>(Backend*, DType t)>;

class PrecisionTest : public ::testing::TestWithParam<DType> {
 protected:
  DType dt() const { return GetParam(); }
  double Tol() const {
    switch (GetParam()) {
      case DType::kF32: return 1e-5;
      case DType::kF16: return 3e-3;
      default: return 2e-2;
    }
  }
  // Inputs in double, rounded to the tested dtype.
  std::vector<double> In(size_t n, uint64_t seed, double lo = -1, double hi = 1) const {
    return Rounded(RandomVector(n, seed, lo, hi), dt());
  }
  void Compare(const char* op, const OpRun& run) {
    auto got = run(be_.get(), dt());
    auto want = run(be_.get(), kF64);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = RelError(got[i].values, want[i].values);
      EXPECT_LT(err, Tol()) << op << " " << got[i].name << " in " << DTypeName(dt());
      std::printf("[ precision ] %-18s %-8s %-5s %.2e\n", op, got[i].name.c_str(),
                  std::string(DTypeName(dt())).c_str(), err);
    }
  }
  std::unique_ptr<Backend> be_ = MakeCpuBackend(2);
};

TEST_P(PrecisionTest, GemmBiasGelu) {
  for (bool ta : {false, true}) {
    const int64_t m = 127, n = 96, k = 200;
    auto a = In(m * k, 1), b = In(k * n, 2), bias = In(n, 3);
    Compare(ta ? "gemm A^T+bias+gelu" : "gemm +bias+gelu", [&](Backend* be, DType t) {
      Tensor ta_ = Tensor::From(be, a, t), tb = Tensor::From(be, b, t),
             tbias = Tensor::From(be, bias, t);
      Tensor c = Tensor::Poisoned(be, t, m * n), aux = Tensor::Poisoned(be, t, m * n);
      GemmArgs g;
      g.trans_a = ta, g.m = m, g.n = n, g.k = k, g.a = ta_.data(), g.lda = ta ? m : k;
      g.b = tb.data(), g.ldb = n, g.c = c.data(), g.ldc = n, g.ab_dtype = g.c_dtype = t;
      g.bias = tbias.data(), g.gelu = true, g.gelu_aux = aux.data();
      // Row-major A given as [m, k]; with ta the same numbers read as [k, m].
      EXPECT_OK(be->Gemm(g));
      return std::vector<Output>{{"c", c.Get()}, {"aux", aux.Get()}};
    });
  }
}

TEST_P(PrecisionTest, LayerNorm) {
  const int64_t N = 127, C = 96;
  auto x = In(N * C, 1, -3, 3), w = In(C, 2, 0.5, 1.5), b = In(C, 3), dy = In(N * C, 4);
  Compare("layernorm", [&](Backend* be, DType t) {
    Tensor tx = Tensor::From(be, x, t), tw = Tensor::From(be, w, t), tb = Tensor::From(be, b, t);
    Tensor y = Tensor::Poisoned(be, t, N * C), mean(be, StatDType(t), N), rstd(be, StatDType(t), N);
    LayerNormArgs la{N, C, t, 1e-5f};
    EXPECT_OK(be->LayerNormForward(la, y.data(), mean.as<float>(), rstd.as<float>(), tx.data(),
                                   tw.data(), tb.data()));
    Tensor tdy = Tensor::From(be, dy, t), dx = Tensor::From(be, std::vector<double>(N * C, 0.0), t);
    Tensor dw = Tensor::Poisoned(be, DType::kF32, C), dbias = Tensor::Poisoned(be, DType::kF32, C);
    EXPECT_OK(be->LayerNormBackward(la, dx.data(), dw.data(), dbias.data(), DType::kF32, false,
                                    tdy.data(), tx.data(), tw.data(), mean.as<float>(),
                                    rstd.as<float>()));
    return std::vector<Output>{{"y", y.Get()},
                               {"rstd", rstd.Get()},
                               {"dx", dx.Get()},
                               {"dweight", dw.Get()},
                               {"dbias", dbias.Get()}};
  });
}

TEST_P(PrecisionTest, GeluAddScaleBias) {
  const int64_t n = 5000, m = 50, c = 100;
  auto x = In(n, 1, -5, 5), y = In(n, 2);
  Compare("elementwise", [&](Backend* be, DType t) {
    Tensor tx = Tensor::From(be, x, t), ty = Tensor::From(be, y, t);
    Tensor g = Tensor::Poisoned(be, t, n), dx = Tensor::Poisoned(be, t, n);
    Tensor sum = Tensor::Poisoned(be, t, n), db = Tensor::Poisoned(be, DType::kF32, c);
    EXPECT_OK(be->GeluForward(g.data(), tx.data(), n, t));
    EXPECT_OK(be->GeluBackward(dx.data(), tx.data(), ty.data(), n, t));
    EXPECT_OK(be->Add(sum.data(), tx.data(), ty.data(), n, t));
    EXPECT_OK(be->Scale(sum.data(), t, n, 0.3f));
    EXPECT_OK(be->BiasBackward(db.data(), DType::kF32, false, ty.data(), m, c, t));
    return std::vector<Output>{
        {"gelu", g.Get()}, {"gelu'", dx.Get()}, {"add*s", sum.Get()}, {"dbias", db.Get()}};
  });
}

TEST_P(PrecisionTest, Attention) {
  const int64_t B = 2, T = 127, H = 3, D = 32, C = H * D;
  auto qkv = In(B * T * 3 * C, 1, -2, 2), dout = In(B * T * C, 2);
  Compare("attention", [&](Backend* be, DType t) {
    Tensor tq = Tensor::From(be, qkv, t), out = Tensor::Poisoned(be, t, B * T * C);
    Tensor lse = Tensor::Poisoned(be, StatDType(t), B * H * T);
    AttentionShape s{B, T, H, D, t, 0.f};
    EXPECT_OK(be->AttentionForward(s, out.data(), lse.as<float>(), tq.data(), nullptr));
    Tensor td = Tensor::From(be, dout, t), dqkv = Tensor::Poisoned(be, t, B * T * 3 * C);
    EXPECT_OK(be->AttentionBackward(s, dqkv.data(), td.data(), tq.data(), out.data(),
                                    lse.as<float>(), nullptr));
    return std::vector<Output>{{"out", out.Get()}, {"lse", lse.Get()}, {"dqkv", dqkv.Get()}};
  });
}

TEST_P(PrecisionTest, EmbeddingAndCrossEntropy) {
  const int64_t B = 2, T = 33, C = 64, V = 200, Vp = 256, N = B * T;
  std::vector<int32_t> tok(N), tgt(N);
  for (int64_t i = 0; i < N; ++i) tok[i] = (i * 7) % 50, tgt[i] = i % 9 == 0 ? -1 : (i * 13) % V;
  auto wte = In(Vp * C, 1), wpe = In(T * C, 2), dout = In(N * C, 3), logits = In(N * Vp, 4, -4, 4);
  Compare("embedding", [&](Backend* be, DType t) {
    Tensor tt = Tensor::Ints(be, tok), tw = Tensor::From(be, wte, t), tp = Tensor::From(be, wpe, t);
    Tensor out = Tensor::Poisoned(be, t, N * C);
    EXPECT_OK(be->EmbeddingForward(out.data(), tt.as<int32_t>(), tw.data(), tp.data(), B, T, C, t));
    Tensor td = Tensor::From(be, dout, t);
    Tensor dw = Tensor::From(be, std::vector<double>(Vp * C, 0.0), DType::kF32);
    Tensor dp = Tensor::From(be, std::vector<double>(T * C, 0.0), DType::kF32);
    EXPECT_OK(be->EmbeddingBackward(dw.data(), dp.data(), DType::kF32, td.data(), tt.as<int32_t>(),
                                    B, T, C, Vp, t));
    return std::vector<Output>{{"out", out.Get()}, {"dwte", dw.Get()}, {"dwpe", dp.Get()}};
  });
  Compare("cross-entropy", [&](Backend* be, DType t) {
    Tensor tl = Tensor::From(be, logits, t), tt = Tensor::Ints(be, tgt);
    Tensor losses = Tensor::Poisoned(be, StatDType(t), N), d = Tensor::Poisoned(be, t, N * Vp);
    EXPECT_OK(be->CrossEntropy(losses.as<float>(), d.data(), tl.data(), tt.as<int32_t>(), N, V, Vp,
                               1.f / 60, t));
    return std::vector<Output>{{"losses", losses.Get()}, {"dlogits", d.Get()}};
  });
}

TEST_P(PrecisionTest, CastAndGradStats) {
  const int64_t n = 3000;
  auto x = In(n, 1, -100, 100);
  Compare("cast/gradstats", [&](Backend* be, DType t) {
    Tensor tx = Tensor::From(be, x, t), f = Tensor::Poisoned(be, DType::kF32, n);
    EXPECT_OK(be->Cast(f.data(), DType::kF32, tx.data(), t, n));
    Tensor s = Tensor::From(be, {0.0}, StatDType(t));
    Tensor bad = Tensor::Ints(be, {0});
    EXPECT_OK(be->GradStats(tx.data(), t, n, s.as<float>(), bad.as<int32_t>()));
    return std::vector<Output>{{"cast", f.Get()}, {"sumsq", s.Get()}};
  });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PrecisionTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(DTypeName(i.param));
                         });

}  // namespace
}  // namespace strata::kernels
