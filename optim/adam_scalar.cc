// SPDX-License-Identifier: Apache-2.0
// The scalar path of the CPU Adam: baseline x86-64 (or any CPU), one lane.
// The reference the SIMD paths are tested against: the same template body
// (optim/adam_body.h) with std::fma where they use FMA instructions and the
// base/half.h conversions (round to nearest even) where they use
// vcvtps2ph / integer rounding. Compiled with -ffp-contract=off
// (optim/CMakeLists.txt) so that no other multiply-add gets fused.
#include <cmath>
#include <cstdint>

#include "base/half.h"

namespace strata::optim::internal {
namespace {

struct V {
  static constexpr size_t kLanes = 1;
  using F = float;

  static F Set1(float x) { return x; }
  static F LoadF32(const float* p) { return *p; }
  static F LoadF16(const uint16_t* p) { return HalfToFloat(*p); }
  static F LoadBF16(const uint16_t* p) { return BF16ToFloat(*p); }
  static void StoreF32(float* p, F x) { *p = x; }
  static void StoreF16(uint16_t* p, F x) { *p = FloatToHalf(x); }
  static void StoreBF16(uint16_t* p, F x) { *p = FloatToBF16(x); }
  // No non-temporal scalar stores for 16-bit values; plain stores for all.
  static void StreamF32(float* p, F x) { StoreF32(p, x); }
  static void StreamF16(uint16_t* p, F x) { StoreF16(p, x); }
  static void StreamBF16(uint16_t* p, F x) { StoreBF16(p, x); }
  static void StoreFence() {}

  static F Mul(F a, F b) { return a * b; }
  static F Fma(F a, F b, F c) { return std::fma(a, b, c); }
  static F Sqrt(F a) { return std::sqrt(a); }
  static F Div(F a, F b) { return a / b; }
  static uint64_t CountNonFinite(F x) { return (FloatBits(x) & 0x7f800000u) == 0x7f800000u ? 1 : 0; }

  struct Acc {
    double lane[16];
  };
  static Acc AccZero() { return Acc{}; }
  static void AccSquares(Acc& acc, size_t j, F x) {
    double d = x;
    acc.lane[j] = std::fma(d, d, acc.lane[j]);  // d*d is exact in fp64: same as the vector fmas
  }
  static void AccStore(const Acc& acc, double* lanes) {
    for (int l = 0; l < 16; ++l) lanes[l] = acc.lane[l];
  }
};

}  // namespace
}  // namespace strata::optim::internal

#include "optim/adam_body.h"

namespace strata::optim::internal {

namespace {
constexpr KernelTable kScalarTable = MakeKernelTable<V>();
}  // namespace

const KernelTable& ScalarKernels() { return kScalarTable; }

}  // namespace strata::optim::internal
