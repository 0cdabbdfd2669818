// SPDX-License-Identifier: Apache-2.0
// The CPU backend's SIMD paths:
// - bulk f16/bf16 <-> f32 conversions, the AVX2/F16C build and the generic
//   build against the scalar reference of base/half.h, bitwise, on every
//   16-bit pattern and a million float patterns plus the edge cases; and
//   double -> f16/bf16 rounding once (no double rounding);
// - the vectorizable float exp (accuracy against std::exp) and the GELU /
//   exp row helpers (AVX2 build bitwise equal to the generic one).
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/half.h"
#include "kernels/cpu/avx2.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/isa.h"
#include "tests/test_util.h"

namespace strata::kernels::cpu {
namespace {

using ToF32 = void (*)(const uint16_t*, float*, int64_t);
using FromF32 = void (*)(const float*, uint16_t*, int64_t);

struct Build {
  const char* name;
  ToF32 bf16_to_f32, f16_to_f32;
  FromF32 f32_to_bf16, f32_to_f16;
};

std::vector<Build> Builds() {
  std::vector<Build> b = {{"generic", convert_impl::Bf16ToF32Generic, convert_impl::F16ToF32Generic,
                           convert_impl::F32ToBf16Generic, convert_impl::F32ToF16Generic}};
  if (Avx2Usable())
    b.push_back({"avx2", convert_impl::Bf16ToF32Avx2, convert_impl::F16ToF32Avx2,
                 convert_impl::F32ToBf16Avx2, convert_impl::F32ToF16Avx2});
  return b;
}

TEST(CpuConvertTest, EverySixteenBitPatternWidensExactly) {
  std::vector<uint16_t> all(65536 + 5);  // a ragged tail too
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (const Build& b : Builds()) {
    std::vector<float> bf(all.size()), hf(all.size());
    b.bf16_to_f32(all.data(), bf.data(), static_cast<int64_t>(all.size()));
    b.f16_to_f32(all.data(), hf.data(), static_cast<int64_t>(all.size()));
    for (size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(FloatBits(bf[i]), FloatBits(BF16ToFloat(all[i]))) << b.name << " bf16 " << i;
      ASSERT_EQ(FloatBits(hf[i]), FloatBits(HalfToFloat(all[i]))) << b.name << " f16 " << i;
    }
  }
}

TEST(CpuConvertTest, FloatPatternsNarrowLikeTheScalarReference) {
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                0x7f800001, 0xffbfffff, 0x00000001, 0x807fffff, 0x7f7fffff,
                                0x3f808000, 0x3f818000, 0x3f80ffff, 0x477ff000, 0x477fefff,
                                0x38800000, 0x387fffff, 0x33000000, 0x33000001, 0x337fffff,
                                0x3f801000, 0x3f803000, 0xc7800000};
  std::mt19937_64 rng(9);
  while (bits.size() < (1u << 20) + 3) bits.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = BitsFloat(bits[i]);
  for (const Build& b : Builds()) {
    std::vector<uint16_t> bf(f.size()), hf(f.size());
    b.f32_to_bf16(f.data(), bf.data(), static_cast<int64_t>(f.size()));
    b.f32_to_f16(f.data(), hf.data(), static_cast<int64_t>(f.size()));
    for (size_t i = 0; i < f.size(); ++i) {
      ASSERT_EQ(bf[i], FloatToBF16(f[i])) << b.name << " bf16 of 0x" << std::hex << bits[i];
      ASSERT_EQ(hf[i], FloatToHalf(f[i])) << b.name << " f16 of 0x" << std::hex << bits[i];
    }
  }
}

TEST(CpuConvertTest, DoubleRoundsOnceToBf16AndF16) {
  // Just above / below a bf16 halfway point by less than a float ulp: a
  // double -> float -> bf16 path would round both to the tie (and then to
  // even, 1.0); rounding once goes up / down.
  const double half_ulp = std::ldexp(1.0, -8), tiny = std::ldexp(1.0, -30);
  EXPECT_EQ(Store1<bf16_t>(1.0 + half_ulp + tiny).bits, 0x3f81);
  EXPECT_EQ(Store1<bf16_t>(1.0 + half_ulp - tiny).bits, 0x3f80);
  EXPECT_EQ(Store1<bf16_t>(-(1.0 + half_ulp + tiny)).bits, 0xbf81);
  EXPECT_EQ(Store1<bf16_t>(1.0 + half_ulp).bits, 0x3f80);  // exact tie: to even
  // f16: ulp of 1.0 is 2^-10.
  const double h_half = std::ldexp(1.0, -11);
  EXPECT_EQ(Store1<f16_t>(1.0 + h_half + tiny).bits, 0x3c01);
  EXPECT_EQ(Store1<f16_t>(1.0 + h_half).bits, 0x3c00);
  EXPECT_EQ(Store1<f16_t>(1e6).bits, 0x7c00);  // overflow to inf
  EXPECT_EQ(Store1<bf16_t>(std::numeric_limits<double>::infinity()).bits, 0x7f80);
  EXPECT_EQ(Store1<f16_t>(1e-30).bits, 0x0000);
  // Exact values pass unchanged.
  EXPECT_EQ(Store1<bf16_t>(3.0).bits, FloatToBF16(3.f));
}

TEST(CpuVecMathTest, ExpFIsAccurateAndKeepsNaN) {
  double worst = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.f + 175.f * static_cast<float>(i) / 2000000.f;
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(ExpF(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);  // ~2.5 ulp
  EXPECT_EQ(ExpF(0.f), 1.f);
  EXPECT_TRUE(std::isnan(ExpF(NAN)));
  EXPECT_EQ(ExpF(-1000.f), 0.f);
  EXPECT_EQ(ExpF(1000.f), INFINITY);
  EXPECT_NEAR(ExpF(88.7f) / std::exp(double{88.7f}), 1.0, 3e-7);
  EXPECT_NEAR(ExpF(-87.3f) / std::exp(double{-87.3f}), 1.0, 3e-7);
  EXPECT_EQ(Gelu(-30.f), 0.f);
  // GELU against x * sigmoid(2u) in double (= 0.5 x (1 + tanh u), without
  // the cancellation of 1 + tanh u that makes the tanh form 0 below x ~ -7).
  // Float rounding of the argument 2u alone moves exp(-2u) by |2u| ulp, so the
  // error is measured in units of (1 + |2u|) ulp.
  double gworst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -12.f + 24.f * static_cast<float>(i) / 200000.f;
    const double xd = x;
    const double u = 0.7978845608028654 * (xd + 0.044715 * xd * xd * xd);
    const double want = xd / (1 + std::exp(-2 * u));
    // Relative; results below 1e-30 (where exp flushes to 0) absolutely.
    const double err = std::fabs(Gelu(x) - want) / std::max(std::fabs(want), 1e-30);
    gworst = std::max(gworst, err / (1 + 2 * std::fabs(u)));
  }
  EXPECT_LT(gworst, 3e-7);
}

TEST(CpuVecMathTest, Avx2RowHelpersEqualTheGenericBuild) {
  if (!Avx2Usable()) GTEST_SKIP() << "this CPU has no AVX2+FMA+F16C";
  const int64_t n = 1003;
  std::vector<float> x(n), g(n);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> d(-20.f, 20.f);
  for (auto& v : x) v = d(rng);
  for (auto& v : g) v = d(rng);
  x[5] = NAN, x[6] = INFINITY, x[7] = -INFINITY, x[8] = 0.f, x[9] = -0.f;
  std::vector<float> a = x, b = x;
  GeluRowsF32Avx2(a.data(), n);
  for (int64_t i = 0; i < n; ++i) b[i] = Gelu(x[i]);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * 4)) << "gelu";
  a = g, b = g;
  GeluGradRowsF32Avx2(x.data(), a.data(), n);
  for (int64_t i = 0; i < n; ++i) b[i] *= GeluGrad(x[i]);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * 4)) << "gelu'";
  a = x, b = x;
  ExpShiftRowsF32Avx2(a.data(), n, 1.5f);
  for (int64_t i = 0; i < n; ++i) b[i] = ExpF(x[i] - 1.5f);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * 4)) << "exp";
}

TEST(CpuConvertTest, IsaChoiceIsReported) {
  EXPECT_STREQ(IsaName(Isa::kAvx2), "avx2");
  if (!Avx2Usable()) {
    EXPECT_EQ(ActiveIsa(), Isa::kGeneric);
  }
}

}  // namespace
}  // namespace strata::kernels::cpu
