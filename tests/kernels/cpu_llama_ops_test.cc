// SPDX-License-Identifier: Apache-2.0
// The Llama ops of the CPU backend (RMSNorm, RoPE, SwiGLU, grouped-query
// attention): fp64 gradients against central finite differences, and each
// forward against a direct formula (RoPE: HF's rotate_half written out;
// GQA: the same attention with K and V replicated per query head).
#include <cmath>
#include <functional>
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

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ||analytic - numeric|| / ||numeric|| over every coordinate (the inputs are small).
void CheckGradient(const char* what, std::vector<double>& x, const std::vector<double>& grad,
                   const std::function<double()>& loss, double tol = 1e-7) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  std::vector<double> numeric(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + 1e-5;
    const double lp = loss();
    x[i] = x0 - 1e-5;
    const double lm = loss();
    x[i] = x0;
    numeric[i] = (lp - lm) / 2e-5;
  }
  EXPECT_LT(RelError(grad, numeric), tol) << what;
  EXPECT_GT(Dot(numeric, numeric), 0) << what << ": all zero, the check would prove nothing";
}

class LlamaOpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = MakeCpuBackend(2);
};

TEST_F(LlamaOpsTest, RmsNormGradients) {
  const int64_t N = 5, C = 12;
  auto x = RandomVector(N * C, 1), w = RandomVector(C, 2, 0.5, 1.5), r = RandomVector(N * C, 3);
  Tensor tx(be_.get(), kF64, N * C), tw(be_.get(), kF64, C), y(be_.get(), kF64, N * C), rstd(be_.get(), kF64, N);
  const RmsNormArgs a{N, C, kF64, 1e-5f};
  auto forward = [&] {
    tx.Set(x), tw.Set(w);
    EXPECT_OK(be_->RmsNormForward(a, y.data(), rstd.as<float>(), tx.data(), tw.data()));
    return Dot(y.Get(), r);
  };
  forward();
  // y = x / sqrt(mean(x^2) + eps) * w, directly.
  const std::vector<double> got = y.Get();
  for (int64_t i = 0; i < N; ++i) {
    double ms = 0;
    for (int64_t j = 0; j < C; ++j) ms += x[i * C + j] * x[i * C + j] / C;
    const double rs = 1 / std::sqrt(ms + static_cast<double>(1e-5f));
    for (int64_t j = 0; j < C; ++j) EXPECT_NEAR(got[i * C + j], x[i * C + j] * rs * w[j], 1e-14);
  }
  Tensor dy = Tensor::From(be_.get(), r, kF64);
  Tensor dx = Tensor::From(be_.get(), std::vector<double>(N * C, 0.5), kF64);  // accumulated into
  Tensor dw = Tensor::From(be_.get(), std::vector<double>(C, 0.25), kF64);
  ASSERT_OK(be_->RmsNormBackward(a, dx.data(), dw.data(), kF64, /*accumulate=*/true, dy.data(), tx.data(), tw.data(),
                                 rstd.as<float>()));
  std::vector<double> gx = dx.Get(), gw = dw.Get();
  for (double& v : gx) v -= 0.5;
  for (double& v : gw) v -= 0.25;
  CheckGradient("dx", x, gx, forward);
  CheckGradient("dweight", w, gw, forward);
}

TEST_F(LlamaOpsTest, RopeIsHfRotateHalfAndItsBackwardIsTheTranspose) {
  const int64_t B = 2, T = 7, heads = 3, D = 8, W = heads * D + 5;  // 5 columns copied
  for (RopeParams::Type type : {RopeParams::kDefault, RopeParams::kLinear, RopeParams::kLlama3}) {
    SCOPED_TRACE(static_cast<int>(type));
    RopeParams p;
    p.type = type, p.theta = 500000.f, p.factor = 8.f, p.low_freq_factor = 1.f, p.high_freq_factor = 4.f;
    p.original_max_positions = 4;  // so llama3's three bands all occur at D = 8
    const RopeArgs a{B, T, W, heads, D, kF64, p};
    auto x = RandomVector(B * T * W, 4), r = RandomVector(B * T * W, 5);
    Tensor tx(be_.get(), kF64, x.size()), y(be_.get(), kF64, x.size());
    auto forward = [&] {
      tx.Set(x);
      EXPECT_OK(be_->RopeForward(a, y.data(), tx.data()));
      return Dot(y.Get(), r);
    };
    forward();
    const std::vector<double> got = y.Get();
    for (int64_t row = 0; row < B * T; ++row) {
      const int64_t t = row % T;
      for (int64_t j = 0; j < W; ++j) {
        double want = x[row * W + j];
        if (j < heads * D) {
          const int64_t i = j % D, half = D / 2, pair = i % half;
          const float angle = static_cast<float>(t) * RopeInvFreq(p, D, pair);
          const double c = static_cast<float>(std::cos(static_cast<double>(angle)));
          const double s = static_cast<float>(std::sin(static_cast<double>(angle)));
          const double rot = i < half ? -x[row * W + j + half] : x[row * W + j - half];  // rotate_half
          want = x[row * W + j] * c + rot * s;
        }
        EXPECT_NEAR(got[row * W + j], want, 1e-14) << "row " << row << " col " << j;
      }
    }
    Tensor dy = Tensor::From(be_.get(), r, kF64), dx(be_.get(), kF64, x.size());
    ASSERT_OK(be_->RopeBackward(a, dx.data(), dy.data()));
    CheckGradient("dx", x, dx.Get(), forward);
    // In place gives the same bits.
    ASSERT_OK(be_->RopeBackward(a, dy.data(), dy.data()));
    EXPECT_EQ(dy.Get(), dx.Get());
  }
}

// A decoder's new rows: rows at position_offset P are the rows P.. of the
// whole sequence, bit for bit (and a negative offset is an error naming it).
TEST_F(LlamaOpsTest, RopeAtAPositionOffsetIsTheLongerSequencesRows) {
  const int64_t T = 11, P = 7, R = 4, heads = 3, D = 8, W = heads * D + 2;
  RopeParams p;
  p.theta = 500.f;
  const std::vector<double> x = RandomVector(T * W, 8);
  Tensor whole = Tensor::From(be_.get(), x, kF64), all(be_.get(), kF64, x.size());
  ASSERT_OK(be_->RopeForward(RopeArgs{1, T, W, heads, D, kF64, p}, all.data(), whole.data()));
  Tensor tail = Tensor::From(be_.get(), std::vector<double>(x.begin() + P * W, x.end()), kF64);
  Tensor got(be_.get(), kF64, static_cast<size_t>(R * W));
  RopeArgs a{1, R, W, heads, D, kF64, p};
  a.position_offset = P;
  ASSERT_OK(be_->RopeForward(a, got.data(), tail.data()));
  const std::vector<double> want = all.Get();
  EXPECT_EQ(got.Get(), std::vector<double>(want.begin() + P * W, want.end()));
  a.position_offset = 0;
  ASSERT_OK(be_->RopeForward(a, got.data(), tail.data()));
  EXPECT_NE(got.Get(), std::vector<double>(want.begin() + P * W, want.end()));
  a.position_offset = -1;
  const Status bad = be_->RopeForward(a, got.data(), tail.data());
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("position_offset"), std::string::npos) << bad;
}

TEST_F(LlamaOpsTest, Llama3ScalingKeepsHighFrequenciesAndDividesLowOnes) {
  RopeParams p;
  p.type = RopeParams::kLlama3, p.theta = 500000.f, p.factor = 8.f, p.original_max_positions = 8192;
  RopeParams plain = p;
  plain.type = RopeParams::kDefault;
  EXPECT_EQ(RopeInvFreq(p, 128, 0), RopeInvFreq(plain, 128, 0));  // wavelength 2 pi: unchanged
  EXPECT_FLOAT_EQ(RopeInvFreq(p, 128, 63), RopeInvFreq(plain, 128, 63) / 8.f);  // longest: divided
}

TEST_F(LlamaOpsTest, SwiGluGradients) {
  const int64_t rows = 4, F = 6;
  auto in = RandomVector(rows * 2 * F, 6, -3, 3), r = RandomVector(rows * F, 7);
  Tensor tin(be_.get(), kF64, in.size()), out(be_.get(), kF64, rows * F);
  auto forward = [&] {
    tin.Set(in);
    EXPECT_OK(be_->SwiGluForward(out.data(), tin.data(), rows, F, kF64));
    return Dot(out.Get(), r);
  };
  forward();
  const std::vector<double> got = out.Get();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < F; ++j) {
      const double g = in[i * 2 * F + j], u = in[i * 2 * F + F + j];
      EXPECT_NEAR(got[i * F + j], g / (1 + std::exp(-g)) * u, 1e-14);
    }
  Tensor dout = Tensor::From(be_.get(), r, kF64), din(be_.get(), kF64, in.size());
  ASSERT_OK(be_->SwiGluBackward(din.data(), dout.data(), tin.data(), rows, F, kF64));
  CheckGradient("din", in, din.Get(), forward);
  // In place over the input gives the same bits.
  tin.Set(in);
  ASSERT_OK(be_->SwiGluBackward(tin.data(), dout.data(), tin.data(), rows, F, kF64));
  EXPECT_EQ(tin.Get(), din.Get());
}

// GQA on (H, KV) equals multi-head attention on K and V replicated per query
// head, forward and backward (d K, d V of a key/value head the sum over its group).
TEST_F(LlamaOpsTest, GroupedQueryAttentionIsReplicatedMultiHead) {
  for (int64_t KV : {1, 2}) {  // multi-query and 4:2
    SCOPED_TRACE(KV);
    const int64_t B = 2, T = 70, H = 4, D = 8, C = H * D, group = H / KV;
    const int64_t Wg = (H + 2 * KV) * D, Wm = 3 * C;
    auto qkv = RandomVector(B * T * Wg, 8, -1.5, 1.5), r = RandomVector(B * T * C, 9);
    std::vector<double> rep(B * T * Wm);
    for (int64_t row = 0; row < B * T; ++row)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t kvh = h / group;
          rep[row * Wm + h * D + d] = qkv[row * Wg + h * D + d];
          rep[row * Wm + C + h * D + d] = qkv[row * Wg + C + kvh * D + d];
          rep[row * Wm + 2 * C + h * D + d] = qkv[row * Wg + C + KV * D + kvh * D + d];
        }
    const AttentionShape g{B, T, H, D, kF64, 0.f, KV}, m{B, T, H, D, kF64, 0.f};
    Tensor tg = Tensor::From(be_.get(), qkv, kF64), tm = Tensor::From(be_.get(), rep, kF64);
    Tensor og(be_.get(), kF64, B * T * C), om(be_.get(), kF64, B * T * C);
    Tensor lg(be_.get(), kF64, B * H * T), lm(be_.get(), kF64, B * H * T);
    ASSERT_OK(be_->AttentionForward(g, og.data(), lg.as<float>(), tg.data(), nullptr));
    ASSERT_OK(be_->AttentionForward(m, om.data(), lm.as<float>(), tm.data(), nullptr));
    EXPECT_EQ(og.Get(), om.Get());
    EXPECT_EQ(lg.Get(), lm.Get());
    Tensor dout = Tensor::From(be_.get(), r, kF64);
    Tensor dg = Tensor::Poisoned(be_.get(), kF64, qkv.size()), dm = Tensor::Poisoned(be_.get(), kF64, rep.size());
    ASSERT_OK(be_->AttentionBackward(g, dg.data(), dout.data(), tg.data(), og.data(), lg.as<float>(), nullptr));
    ASSERT_OK(be_->AttentionBackward(m, dm.data(), dout.data(), tm.data(), om.data(), lm.as<float>(), nullptr));
    const std::vector<double> gg = dg.Get(), gm = dm.Get();
    double worst = 0;
    for (int64_t row = 0; row < B * T; ++row)
      for (int64_t kvh = 0; kvh < KV; ++kvh)
        for (int64_t d = 0; d < D; ++d) {
          double dk = 0, dv = 0;
          for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
            dk += gm[row * Wm + C + h * D + d];
            dv += gm[row * Wm + 2 * C + h * D + d];
          }
          worst = std::max({worst, std::fabs(gg[row * Wg + C + kvh * D + d] - dk),
                            std::fabs(gg[row * Wg + C + KV * D + kvh * D + d] - dv)});
        }
    for (int64_t row = 0; row < B * T; ++row)
      for (int64_t j = 0; j < C; ++j) EXPECT_EQ(gg[row * Wg + j], gm[row * Wm + j]) << "dq " << row << " " << j;
    EXPECT_LT(worst, 1e-12);
  }
}

TEST_F(LlamaOpsTest, GqaNeedsKvHeadsDividingHeads) {
  Tensor q(be_.get(), DType::kF32, 2 * 5 * 8), o(be_.get(), DType::kF32, 2 * 4 * 8), l(be_.get(), DType::kF32, 8);
  const AttentionShape s{1, 2, 4, 8, DType::kF32, 0.f, 3};
  EXPECT_THAT(be_->AttentionForward(s, o.data(), l.as<float>(), q.data(), nullptr).message(),
              ::testing::HasSubstr("kv_heads = 3"));
}

}  // namespace
}  // namespace strata::kernels
