// SPDX-License-Identifier: Apache-2.0
// Internal: the AVX-512 vector type V for optim/adam_body.h, 16 fp32 lanes.
// Included by adam_avx512.cc and adam_avx512bf16.cc (the latter defines
// STRATA_AVX512_NATIVE_BF16 to 1 first and is compiled with -mavx512bf16).
// Internal linkage only (see optim/adam_body.h).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#ifndef STRATA_AVX512_NATIVE_BF16
#define STRATA_AVX512_NATIVE_BF16 0
#endif

namespace strata::optim::internal {
namespace {

struct V {
  static constexpr size_t kLanes = 16;
  using F = __m512;

  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F LoadF32(const float* p) { return _mm512_loadu_ps(p); }
  static F LoadF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F LoadBF16(const uint16_t* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }

  static __m256i ToF16(F x) { return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

  // Round to nearest even on the bits (base/half.h FloatToBF16): NaN -> quiet NaN.
  static __m256i ToBF16Bits(F x) {
    const __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, q));
  }

  static __m256i ToBF16(F x) {
#if STRATA_AVX512_NATIVE_BF16
    // vcvtneps2bf16 rounds to nearest even and quiets NaNs like FloatToBF16,
    // but treats subnormal inputs as zero. Those (|x| < 2^-126, never seen in
    // practice) take the integer path so the result stays bitwise identical.
    const __m512i abs = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
    __mmask16 sub = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(abs, _mm512_set1_epi32(1)),
                                            _mm512_set1_epi32(0x007fffff));
    if (__builtin_expect(sub != 0, 0)) return ToBF16Bits(x);
    return (__m256i)_mm512_cvtneps_pbh(x);
#else
    return ToBF16Bits(x);
#endif
  }

  static void StoreF32(float* p, F x) { _mm512_storeu_ps(p, x); }
  static void StoreF16(uint16_t* p, F x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ToF16(x)); }
  static void StoreBF16(uint16_t* p, F x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ToBF16(x)); }
  // Non-temporal: p is 64-byte (f32) / 32-byte (16-bit) aligned (AdamTile::stream_out).
  static void StreamF32(float* p, F x) { _mm512_stream_ps(p, x); }
  static void StreamF16(uint16_t* p, F x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), ToF16(x)); }
  static void StreamBF16(uint16_t* p, F x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), ToBF16(x)); }
  static void StoreFence() { _mm_sfence(); }

  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static uint64_t CountNonFinite(F x) {
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    __mmask16 k = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), e), e);
    return static_cast<uint64_t>(_mm_popcnt_u32(static_cast<unsigned>(k)));
  }

  // Lanes 0-7 and 8-15 of a 16-element chunk.
  struct Acc {
    __m512d a[2];
  };
  static Acc AccZero() { return Acc{{_mm512_setzero_pd(), _mm512_setzero_pd()}}; }
  static void AccSquares(Acc& acc, size_t, F x) {
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
    acc.a[0] = _mm512_fmadd_pd(lo, lo, acc.a[0]);
    acc.a[1] = _mm512_fmadd_pd(hi, hi, acc.a[1]);
  }
  static void AccStore(const Acc& acc, double* lanes) {
    _mm512_storeu_pd(lanes, acc.a[0]);
    _mm512_storeu_pd(lanes + 8, acc.a[1]);
  }
};

}  // namespace
}  // namespace strata::optim::internal
