// SPDX-License-Identifier: Apache-2.0
// The roof and STREAM passes of strata-bench adam (bench/adam_roof.h).
#include "bench/adam_roof.h"

#include <emmintrin.h>
#include <immintrin.h>

#include <cstring>

#include "optim/cpu_features.h"

namespace strata::bench {
namespace {

// One software prefetch; hint 0 = prefetcht0, else prefetcht2.
inline void Prefetch(const uint8_t* p, int hint) {
  if (hint == 0) __builtin_prefetch(p, 0, 3);
  else __builtin_prefetch(p, 0, 1);
}

// Prefetches, for the 16-element group at i, the lines of the read streams
// that start in it (a 16-bit stream's line every other group).
inline void RoofPrefetch(const RoofTile& t, size_t i) {
  Prefetch(t.p + i * 4 + t.pf, t.hint);
  if ((i * t.ss) % 64 == 0) {
    Prefetch(t.m + i * t.ss + t.pf, t.hint);
    Prefetch(t.v + i * t.ss + t.pf, t.hint);
  }
  if ((i * t.gs) % 64 == 0) Prefetch(t.g + i * t.gs + t.pf, t.hint);
}

// The elements [i, n) of a tile past its last full group, byte by byte;
// returns `folded` with the gradient bytes folded in.
inline uint64_t RoofTail(const RoofTile& t, size_t i, uint64_t folded) {
  uint8_t* const po = t.po ? t.po : t.p;
  uint8_t* const mo = t.po ? t.mo : t.m;
  uint8_t* const vo = t.po ? t.vo : t.v;
  for (; i < t.n; ++i) {
    po[i * 4] = static_cast<uint8_t>(t.p[i * 4] + 1);
    for (size_t b = 0; b < t.ss; ++b)
      mo[i * t.ss + b] = static_cast<uint8_t>(t.m[i * t.ss + b] + 1),
      vo[i * t.ss + b] = static_cast<uint8_t>(t.v[i * t.ss + b] + 1);
    for (size_t b = 0; b < t.gs; ++b) folded ^= t.g[i * t.gs + b];
    if (t.out)
      for (size_t b = 0; b < t.os; ++b) t.out[i * t.os + b] = po[i * 4 + b % 4];
  }
  return folded;
}

// 16 bytes at a time; n is a multiple of 64 except for the shard's last tile,
// whose tail goes byte by byte. The gradient is folded into an accumulator
// that is returned, so the reads cannot be optimized away.
template <int kWidth>
struct RoofOps;

template <>
struct RoofOps<16> {
  using R = __m128i;
  static R Load(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const R*>(p)); }
  static void Store(uint8_t* p, R x) { _mm_storeu_si128(reinterpret_cast<R*>(p), x); }
  static void Stream(uint8_t* p, R x) { _mm_stream_si128(reinterpret_cast<R*>(p), x); }
  static R Add1(R x) { return _mm_add_epi32(x, _mm_set1_epi32(1)); }
  static R Xor(R a, R b) { return _mm_xor_si128(a, b); }
  static R Zero() { return _mm_setzero_si128(); }
  static uint64_t Fold(R x) {
    return static_cast<uint64_t>(_mm_cvtsi128_si64(x)) ^ static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(x, x)));
  }
};

template <bool kPf>
uint64_t RoofTileSseImpl(const RoofTile& t) {
  using O = RoofOps<16>;
  constexpr size_t kGroup = 16;  // elements per iteration: 64 B of p
  O::R acc = O::Zero();
  size_t i = 0;
  const size_t full = t.n - t.n % kGroup;
  for (; i < full; i += kGroup) {
    if (kPf && i < t.pf_stop) RoofPrefetch(t, i);
    for (size_t b = 0; b < kGroup * 4; b += 16) {
      O::R x = O::Add1(O::Load(t.p + i * 4 + b));
      if (t.po) O::Stream(t.po + i * 4 + b, x);
      else O::Store(t.p + i * 4 + b, x);
      if (t.out && b < kGroup * t.os) O::Stream(t.out + i * t.os + b, x);
    }
    for (size_t b = 0; b < kGroup * t.ss; b += 16) {
      const O::R m = O::Add1(O::Load(t.m + i * t.ss + b)), v = O::Add1(O::Load(t.v + i * t.ss + b));
      if (t.po) {
        O::Stream(t.mo + i * t.ss + b, m);
        O::Stream(t.vo + i * t.ss + b, v);
      } else {
        O::Store(t.m + i * t.ss + b, m);
        O::Store(t.v + i * t.ss + b, v);
      }
    }
    for (size_t b = 0; b < kGroup * t.gs; b += 16) acc = O::Xor(acc, O::Load(t.g + i * t.gs + b));
  }
  uint64_t folded = O::Fold(acc);
  folded = RoofTail(t, i, folded);
  if (t.out || t.po) _mm_sfence();
  return folded;
}

template <bool kPf>
__attribute__((target("avx2"))) uint64_t RoofTileAvx2Impl(const RoofTile& t) {
  constexpr size_t kGroup = 16;  // 64 B of p
  __m256i acc = _mm256_setzero_si256();
  const __m256i one = _mm256_set1_epi32(1);
  size_t i = 0;
  const size_t full = t.n - t.n % kGroup;
  for (; i < full; i += kGroup) {
    if (kPf && i < t.pf_stop) RoofPrefetch(t, i);
    for (size_t b = 0; b < kGroup * 4; b += 32) {
      __m256i x = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.p + i * 4 + b)), one);
      if (t.po) _mm256_stream_si256(reinterpret_cast<__m256i*>(t.po + i * 4 + b), x);
      else _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.p + i * 4 + b), x);
      if (t.out && b < kGroup * t.os) _mm256_stream_si256(reinterpret_cast<__m256i*>(t.out + i * t.os + b), x);
    }
    for (size_t b = 0; b < kGroup * t.ss; b += 32) {
      const __m256i m = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.m + i * t.ss + b)), one);
      const __m256i v = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.v + i * t.ss + b)), one);
      if (t.po) {
        _mm256_stream_si256(reinterpret_cast<__m256i*>(t.mo + i * t.ss + b), m);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(t.vo + i * t.ss + b), v);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.m + i * t.ss + b), m);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.v + i * t.ss + b), v);
      }
    }
    for (size_t b = 0; b < kGroup * t.gs; b += 32)
      acc = _mm256_xor_si256(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.g + i * t.gs + b)));
  }
  uint64_t folded = static_cast<uint64_t>(_mm256_extract_epi64(acc, 0)) ^ static_cast<uint64_t>(_mm256_extract_epi64(acc, 3));
  folded = RoofTail(t, i, folded);
  if (t.out || t.po) _mm_sfence();
  return folded;
}

// AVX-512 with the byte widths fixed at compile time (state SS, gradient GS,
// copy OS bytes per element; OS 0: no copy): per 16 elements one full-width
// load and store per stream, as the Adam kernel does, so the roof is never
// slower than the pass it bounds for want of instructions (the AVX2 loop
// above, with run-time widths, measured 135 GB/s on the H200 host where the
// AVX-512 Adam moved 164).
// (GCC 12 reports its own 512->256-bit casts in avx512fintrin.h as reading
// an uninitialized value: a known false positive, silenced here only.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// OOP: out of place, the new p, m and v streamed to po, mo and vo.
template <int SS, int GS, int OS, bool OOP>
__attribute__((target("avx512f,avx512bw"), always_inline)) inline void RoofVec512(const RoofTile& t, size_t i,
                                                                                  __m512i& acc) {
  const __m512i one = _mm512_set1_epi32(1);
  const __m256i one8 = _mm256_set1_epi32(1);
  __m512i g;
  if constexpr (GS == 4) g = _mm512_loadu_si512(t.g + i * 4);
  else g = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.g + i * 2)));
  const __m512i x = _mm512_add_epi32(_mm512_loadu_si512(t.p + i * 4), one);
  if constexpr (OOP) _mm512_stream_si512(reinterpret_cast<__m512i*>(t.po + i * 4), x);
  else _mm512_storeu_si512(t.p + i * 4, x);
  if constexpr (SS == 4) {
    const __m512i m = _mm512_add_epi32(_mm512_loadu_si512(t.m + i * 4), one);
    const __m512i v = _mm512_add_epi32(_mm512_loadu_si512(t.v + i * 4), one);
    if constexpr (OOP) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(t.mo + i * 4), m);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(t.vo + i * 4), v);
    } else {
      _mm512_storeu_si512(t.m + i * 4, m);
      _mm512_storeu_si512(t.v + i * 4, v);
    }
  } else {
    const __m256i m = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.m + i * 2)), one8);
    const __m256i v = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.v + i * 2)), one8);
    if constexpr (OOP) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(t.mo + i * 2), m);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(t.vo + i * 2), v);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.m + i * 2), m);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.v + i * 2), v);
    }
  }
  acc = _mm512_xor_si512(acc, g);
  if constexpr (OS == 4) _mm512_stream_si512(reinterpret_cast<__m512i*>(t.out + i * 4), x);
  if constexpr (OS == 2) _mm256_stream_si256(reinterpret_cast<__m256i*>(t.out + i * 2), _mm512_castsi512_si256(x));
}

template <int SS, int GS, int OS, bool OOP, bool kPf>
__attribute__((target("avx512f,avx512bw"))) uint64_t RoofTileAvx512Impl(const RoofTile& t) {
  // The Adam loop's shape (optim/adam_body.h): groups of 32 elements, each
  // read stream's lines of the group prefetched t.pf bytes ahead first; then
  // per 16 elements the gradient, master, m and v loaded, a trivial update,
  // master, m and v stored and the copy streamed out.
  __m512i acc = _mm512_setzero_si512();
  size_t i = 0;
  if constexpr (kPf) {
    constexpr size_t kGroup = 32;
    const int hint = t.hint;
    auto lines = [&](const uint8_t* base, size_t bytes) {
      for (size_t o = 0; o < bytes; o += 64) Prefetch(base + t.pf + o, hint);
    };
    // Groups whose prefetches stay inside the shard (t.pf_stop counts 16s).
    for (; i + kGroup <= t.n && i + kGroup <= t.pf_stop; i += kGroup) {
      lines(t.p + i * 4, kGroup * 4);
      lines(t.m + i * SS, kGroup * SS);
      lines(t.v + i * SS, kGroup * SS);
      lines(t.g + i * GS, kGroup * GS);
      RoofVec512<SS, GS, OS, OOP>(t, i, acc);
      RoofVec512<SS, GS, OS, OOP>(t, i + 16, acc);
    }
  }
  const size_t full = t.n - t.n % 16;
  for (; i < full; i += 16) RoofVec512<SS, GS, OS, OOP>(t, i, acc);
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, acc);  // (no _mm512_reduce_*: GCC 12 warns inside it)
  uint64_t folded = 0;
  for (uint64_t l : lanes) folded ^= l;
  folded = RoofTail(t, i, folded);
  if (OS || OOP) _mm_sfence();
  return folded;
}
#pragma GCC diagnostic pop

template <int SS, int GS, int OS, bool OOP>
uint64_t RoofTileAvx512Pf(const RoofTile& t) {
  return t.pf ? RoofTileAvx512Impl<SS, GS, OS, OOP, true>(t) : RoofTileAvx512Impl<SS, GS, OS, OOP, false>(t);
}
template <int SS, int GS, int OS>
uint64_t RoofTileAvx512Os(const RoofTile& t) {
  return t.po ? RoofTileAvx512Pf<SS, GS, OS, true>(t) : RoofTileAvx512Pf<SS, GS, OS, false>(t);
}
template <int SS, int GS>
uint64_t RoofTileAvx512Gs(const RoofTile& t) {
  const size_t os = t.out ? t.os : 0;
  return os == 4 ? RoofTileAvx512Os<SS, GS, 4>(t) : os == 2 ? RoofTileAvx512Os<SS, GS, 2>(t) : RoofTileAvx512Os<SS, GS, 0>(t);
}

}  // namespace

size_t PrefetchStop(size_t rest, size_t pf, size_t min_es, size_t group) {
  const size_t ahead = group + (pf + min_es - 1) / min_es;
  return rest > ahead ? rest - ahead + 1 : 0;
}

// The loop without prefetch has no prefetch test in it.
uint64_t RoofTileSse(const RoofTile& t) { return t.pf ? RoofTileSseImpl<true>(t) : RoofTileSseImpl<false>(t); }
__attribute__((target("avx2"))) uint64_t RoofTileAvx2(const RoofTile& t) {
  return t.pf ? RoofTileAvx2Impl<true>(t) : RoofTileAvx2Impl<false>(t);
}

uint64_t RoofTileAvx512(const RoofTile& t) {
  if (t.ss == 4) return t.gs == 4 ? RoofTileAvx512Gs<4, 4>(t) : RoofTileAvx512Gs<4, 2>(t);
  return t.gs == 4 ? RoofTileAvx512Gs<2, 4>(t) : RoofTileAvx512Gs<2, 2>(t);
}

RoofKernel BestRoofKernel() {
  if (optim::IsaSupported(optim::Isa::kAvx512)) return RoofKernel::kAvx512;
  if (optim::IsaSupported(optim::Isa::kAvx2)) return RoofKernel::kAvx2;
  return RoofKernel::kSse2;
}

const char* RoofKernelName(RoofKernel k) {
  return k == RoofKernel::kAvx512 ? "avx512" : k == RoofKernel::kAvx2 ? "avx2" : "sse2";
}

// ---- plain STREAM figures: read, copy (non-temporal), update in place ---------

uint64_t StreamTile(StreamKind k, uint8_t* a, uint8_t* b, size_t n, size_t pf, size_t pf_stop, int hint) {
  __m128i acc = _mm_setzero_si128();
  const __m128i one = _mm_set1_epi32(1);
  size_t i = 0;
  const size_t full = n - n % 16;
  for (; i < full; i += 16) {  // 64 bytes of a
    if (pf && i < pf_stop) Prefetch(a + i * 4 + pf, hint);
    for (size_t o = 0; o < 64; o += 16) {
      __m128i x = _mm_load_si128(reinterpret_cast<const __m128i*>(a + i * 4 + o));
      switch (k) {
        case StreamKind::kRead: acc = _mm_xor_si128(acc, x); break;
        case StreamKind::kCopy: _mm_stream_si128(reinterpret_cast<__m128i*>(b + i * 4 + o), x); break;
        case StreamKind::kUpdate: _mm_store_si128(reinterpret_cast<__m128i*>(a + i * 4 + o), _mm_add_epi32(x, one)); break;
      }
    }
  }
  uint64_t folded = static_cast<uint64_t>(_mm_cvtsi128_si64(acc)) ^
                    static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(acc, acc)));
  for (; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, a + i * 4, 4);
    if (k == StreamKind::kRead) folded ^= x;
    else if (k == StreamKind::kCopy) std::memcpy(b + i * 4, &x, 4);
    else ++x, std::memcpy(a + i * 4, &x, 4);
  }
  if (k == StreamKind::kCopy) _mm_sfence();
  return folded;
}

}  // namespace strata::bench
