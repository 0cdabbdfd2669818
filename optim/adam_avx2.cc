// SPDX-License-Identifier: Apache-2.0
// The AVX2 + FMA + F16C path of the CPU Adam (Haswell / Zen 1 and later),
// 8 fp32 lanes. Compiled with -mavx2 -mfma -mf16c (optim/CMakeLists.txt, this
// file only) and called only after cpu_features.cc has confirmed the CPU and
// OS support them. See optim/adam_body.h for what V must provide.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace strata::optim::internal {
namespace {

struct V {
  static constexpr size_t kLanes = 8;
  using F = __m256;

  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F LoadF32(const float* p) { return _mm256_loadu_ps(p); }
  static F LoadF16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F LoadBF16(const uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }

  static __m128i ToF16(F x) { return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // Round to nearest even on the bits (base/half.h FloatToBF16): NaN -> quiet NaN.
  static __m128i ToBF16(F x) {
    const __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    // 8 x u32 (each <= 0xffff) -> 8 x u16: pack within 128-bit lanes, then
    // gather the two low quadwords.
    __m256i packed = _mm256_packus_epi32(r, r);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
  }

  static void StoreF32(float* p, F x) { _mm256_storeu_ps(p, x); }
  static void StoreF16(uint16_t* p, F x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), ToF16(x)); }
  static void StoreBF16(uint16_t* p, F x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), ToBF16(x)); }
  // Non-temporal: p is 32-byte (f32) / 16-byte (16-bit) aligned (AdamTile::stream_out).
  static void StreamF32(float* p, F x) { _mm256_stream_ps(p, x); }
  static void StreamF16(uint16_t* p, F x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), ToF16(x)); }
  static void StreamBF16(uint16_t* p, F x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), ToBF16(x)); }
  static void StoreFence() { _mm_sfence(); }

  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static uint64_t CountNonFinite(F x) {
    const __m256i e = _mm256_set1_epi32(0x7f800000);
    __m256i is = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), e), e);
    return static_cast<uint64_t>(_mm_popcnt_u32(static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(is)))));
  }

  // Lanes 0-3, 4-7, 8-11, 12-15 of a 16-element chunk.
  struct Acc {
    __m256d a[4];
  };
  static Acc AccZero() { return Acc{{_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}}; }
  static void AccSquares(Acc& acc, size_t j, F x) {
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    acc.a[2 * j] = _mm256_fmadd_pd(lo, lo, acc.a[2 * j]);
    acc.a[2 * j + 1] = _mm256_fmadd_pd(hi, hi, acc.a[2 * j + 1]);
  }
  static void AccStore(const Acc& acc, double* lanes) {
    for (int q = 0; q < 4; ++q) _mm256_storeu_pd(lanes + 4 * q, acc.a[q]);
  }
};

}  // namespace
}  // namespace strata::optim::internal

#include "optim/adam_body.h"

namespace strata::optim::internal {

namespace {
constexpr KernelTable kAvx2Table = MakeKernelTable<V>();
}  // namespace

const KernelTable& Avx2Kernels() { return kAvx2Table; }

}  // namespace strata::optim::internal
