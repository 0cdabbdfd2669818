// SPDX-License-Identifier: Apache-2.0
// The generic builds of the bulk conversions and the run-time choice.
#include "kernels/cpu/convert.h"

#include "kernels/cpu/isa.h"

namespace strata::kernels::cpu::convert_impl {

void Bf16ToF32Generic(const uint16_t* src, float* dst, int64_t n) {
  // Branch-free so the compiler vectorizes it.
  for (int64_t i = 0; i < n; ++i) dst[i] = BitsFloat(static_cast<uint32_t>(src[i]) << 16);
}

void F32ToBf16Generic(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = FloatBits(src[i]);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (u >> 16) | 0x40u;
    dst[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

void F16ToF32Generic(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}

void F32ToF16Generic(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

namespace {
struct Table {
  void (*bf16_to_f32)(const uint16_t*, float*, int64_t);
  void (*f32_to_bf16)(const float*, uint16_t*, int64_t);
  void (*f16_to_f32)(const uint16_t*, float*, int64_t);
  void (*f32_to_f16)(const float*, uint16_t*, int64_t);
};
const Table& Active() {
  static const Table t =
      ActiveIsa() == Isa::kAvx2
          ? Table{Bf16ToF32Avx2, F32ToBf16Avx2, F16ToF32Avx2, F32ToF16Avx2}
          : Table{Bf16ToF32Generic, F32ToBf16Generic, F16ToF32Generic, F32ToF16Generic};
  return t;
}
}  // namespace

void Bf16ToF32(const uint16_t* src, float* dst, int64_t n) { Active().bf16_to_f32(src, dst, n); }
void F32ToBf16(const float* src, uint16_t* dst, int64_t n) { Active().f32_to_bf16(src, dst, n); }
void F16ToF32(const uint16_t* src, float* dst, int64_t n) { Active().f16_to_f32(src, dst, n); }
void F32ToF16(const float* src, uint16_t* dst, int64_t n) { Active().f32_to_f16(src, dst, n); }

}  // namespace strata::kernels::cpu::convert_impl
