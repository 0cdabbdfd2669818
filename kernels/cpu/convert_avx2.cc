// SPDX-License-Identifier: Apache-2.0
// AVX2/F16C builds of the bulk fp16/bf16 <-> fp32 conversions (this file is
// compiled with -mavx2 -mfma -mf16c, see kernels/CMakeLists.txt; it is only
// called when isa.h says the CPU has them). Bitwise equal to base/half.h.
// Includes nothing with inline functions shared with other files (avx2.h).
#include "kernels/cpu/avx2.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

namespace strata::kernels::cpu::convert_impl {

void Bf16ToF32Avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
  }
  Bf16ToF32Generic(src + i, dst + i, n - i);
}

void F32ToBf16Avx2(const float* src, uint16_t* dst, int64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i r[2];
    for (int h = 0; h < 2; ++h) {
      __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i + 8 * h));
      __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
      __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), lsb), 16);
      __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
      r[h] = _mm256_blendv_epi8(rounded, nan, is_nan);
    }
    // packus works per 128-bit lane: [a0 b0 a1 b1] -> reorder to [a0 a1 b0 b1].
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  F32ToBf16Generic(src + i, dst + i, n - i);
}

void F16ToF32Avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  F16ToF32Generic(src + i, dst + i, n - i);
}

void F32ToF16Avx2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  F32ToF16Generic(src + i, dst + i, n - i);
}

}  // namespace strata::kernels::cpu::convert_impl

#else  // not built for AVX2: never called (Avx2Usable() is false)

namespace strata::kernels::cpu::convert_impl {
void Bf16ToF32Avx2(const uint16_t* src, float* dst, int64_t n) { Bf16ToF32Generic(src, dst, n); }
void F32ToBf16Avx2(const float* src, uint16_t* dst, int64_t n) { F32ToBf16Generic(src, dst, n); }
void F16ToF32Avx2(const uint16_t* src, float* dst, int64_t n) { F16ToF32Generic(src, dst, n); }
void F32ToF16Avx2(const float* src, uint16_t* dst, int64_t n) { F32ToF16Generic(src, dst, n); }
}  // namespace strata::kernels::cpu::convert_impl

#endif
