// SPDX-License-Identifier: Apache-2.0
// crc32c (SSE4.2 with a slicing-by-8 fallback) and xxhash64
// (tiers/nvme/checksum.h): pure functions over the caller's bytes; the tables
// are built once by thread-safe static initializers.
#include "tiers/nvme/checksum.h"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define STRATA_CRC32C_X86 1
#else
#define STRATA_CRC32C_X86 0
#endif

namespace strata {

static_assert(std::endian::native == std::endian::little,
              "the checksum code reads words little-endian");

std::string_view ChecksumName(ChecksumKind kind) {
  switch (kind) {
    case ChecksumKind::kNone: return "none";
    case ChecksumKind::kCrc32c: return "crc32c";
    case ChecksumKind::kXxh64: return "xxh64";
  }
  return "?";
}

std::optional<ChecksumKind> ParseChecksumKind(std::string_view s) {
  if (s == "none" || s == "off" || s.empty()) return ChecksumKind::kNone;
  if (s == "crc32c") return ChecksumKind::kCrc32c;
  if (s == "xxh64" || s == "xxhash64" || s == "xxhash") return ChecksumKind::kXxh64;
  return std::nullopt;
}

namespace {

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- crc32c tables ----------------------------------------------------------
//
// All crc32c code below works on the raw register (no pre/post inversion);
// Crc32cExtend adds the inversions. One byte step of the reflected CRC with
// polynomial 0x82F63B78: crc = T0[(crc ^ b) & 0xff] ^ (crc >> 8) — the same
// step the SSE4.2 crc32 instruction performs.

constexpr uint32_t kPoly = 0x82F63B78u;
constexpr size_t kLong = 8192;  // bytes per stream, long interleave
constexpr size_t kShort = 256;  // bytes per stream, short interleave

struct Crc32cTables {
  uint32_t slice[8][256];        // slicing-by-8 for the portable path
  uint32_t shift_long[4][256];   // register after kLong zero bytes, per byte of the register
  uint32_t shift_short[4][256];  // same for kShort
};

uint32_t StepZeros(const uint32_t t0[256], uint32_t crc, size_t zeros) {
  for (size_t i = 0; i < zeros; ++i) crc = t0[crc & 0xff] ^ (crc >> 8);
  return crc;
}

// The register update by `zeros` zero bytes is linear over GF(2): compute the
// image of each of the 32 basis vectors once, then tabulate per register byte.
void BuildShift(const uint32_t t0[256], size_t zeros, uint32_t out[4][256]) {
  uint32_t col[32];
  for (int i = 0; i < 32; ++i) col[i] = StepZeros(t0, 1u << i, zeros);
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (int bit = 0; bit < 8; ++bit)
        if (b & (1u << bit)) v ^= col[8 * k + bit];
      out[k][b] = v;
    }
  }
}

const Crc32cTables& Tables() {
  static const Crc32cTables* tables = [] {
    auto* t = new Crc32cTables;
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int j = 0; j < 8; ++j) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t->slice[0][i] = c;
    }
    for (int k = 1; k < 8; ++k)
      for (uint32_t i = 0; i < 256; ++i)
        t->slice[k][i] = (t->slice[k - 1][i] >> 8) ^ t->slice[0][t->slice[k - 1][i] & 0xff];
    BuildShift(t->slice[0], kLong, t->shift_long);
    BuildShift(t->slice[0], kShort, t->shift_short);
    return t;
  }();
  return *tables;
}

inline uint32_t Shift(const uint32_t table[4][256], uint32_t crc) {
  return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
         table[3][crc >> 24];
}

uint32_t RawPortable(uint32_t crc, const uint8_t* p, size_t n) {
  const auto& t = Tables().slice;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    --n;
  }
  while (n >= 8) {
    uint64_t w = Load64(p) ^ crc;
    crc = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
          t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    --n;
  }
  return crc;
}

#if STRATA_CRC32C_X86
// Three independent streams of `stride` bytes each, joined by shifting the
// earlier streams' registers over the later streams' lengths: the crc32
// instruction has a latency of 3 cycles and a throughput of 1, so three
// streams keep it busy. Consumes whole groups of 3 x stride bytes.
__attribute__((target("sse4.2"))) uint64_t Interleave3(uint64_t crc, const uint8_t** pp, size_t* np,
                                                       size_t stride,
                                                       const uint32_t table[4][256]) {
  const uint8_t* p = *pp;
  size_t n = *np;
  while (n >= 3 * stride) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t* end = p + stride;
    do {
      crc = _mm_crc32_u64(crc, Load64(p));
      c1 = _mm_crc32_u64(c1, Load64(p + stride));
      c2 = _mm_crc32_u64(c2, Load64(p + 2 * stride));
      p += 8;
    } while (p < end);
    crc = Shift(table, static_cast<uint32_t>(crc)) ^ static_cast<uint32_t>(c1);
    crc = Shift(table, static_cast<uint32_t>(crc)) ^ static_cast<uint32_t>(c2);
    p += 2 * stride;
    n -= 3 * stride;
  }
  *pp = p;
  *np = n;
  return crc;
}

__attribute__((target("sse4.2"))) uint32_t RawHardware(uint32_t crc32, const uint8_t* p, size_t n) {
  const Crc32cTables& t = Tables();
  uint64_t crc = crc32;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = _mm_crc32_u8(static_cast<uint32_t>(crc), *p++);
    --n;
  }
  crc = Interleave3(crc, &p, &n, kLong, t.shift_long);
  crc = Interleave3(crc, &p, &n, kShort, t.shift_short);
  while (n >= 8) {
    crc = _mm_crc32_u64(crc, Load64(p));
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    crc = _mm_crc32_u8(static_cast<uint32_t>(crc), *p++);
    --n;
  }
  return static_cast<uint32_t>(crc);
}
#endif

using RawFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);

RawFn ChooseRaw() {
#if STRATA_CRC32C_X86
  if (__builtin_cpu_supports("sse4.2")) return RawHardware;
#endif
  return RawPortable;
}

// ---- xxhash64 -----------------------------------------------------------------

constexpr uint64_t kP1 = 11400714785074694791ull;
constexpr uint64_t kP2 = 14029467366897019727ull;
constexpr uint64_t kP3 = 1609587929392839161ull;
constexpr uint64_t kP4 = 9650029242287828579ull;
constexpr uint64_t kP5 = 2870177450012600261ull;

inline uint64_t XxRound(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  acc = std::rotl(acc, 31);
  return acc * kP1;
}
inline uint64_t XxMerge(uint64_t acc, uint64_t v) {
  acc ^= XxRound(0, v);
  return acc * kP1 + kP4;
}

}  // namespace

namespace checksum_internal {

bool Crc32cHardwareAvailable() {
#if STRATA_CRC32C_X86
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n) {
  return ~RawPortable(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32cExtendHardware(uint32_t crc, const void* data, size_t n) {
#if STRATA_CRC32C_X86
  return ~RawHardware(~crc, static_cast<const uint8_t*>(data), n);
#else
  return Crc32cExtendPortable(crc, data, n);
#endif
}

}  // namespace checksum_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  static const RawFn raw = ChooseRaw();
  return ~raw(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

uint64_t XxHash64(const void* data, size_t n, uint64_t seed) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint8_t* const end = p + n;
  uint64_t h;
  if (n >= 32) {
    uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
    const uint8_t* const limit = end - 32;
    do {
      v1 = XxRound(v1, Load64(p));
      v2 = XxRound(v2, Load64(p + 8));
      v3 = XxRound(v3, Load64(p + 16));
      v4 = XxRound(v4, Load64(p + 24));
      p += 32;
    } while (p <= limit);
    h = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    h = XxMerge(h, v1);
    h = XxMerge(h, v2);
    h = XxMerge(h, v3);
    h = XxMerge(h, v4);
  } else {
    h = seed + kP5;
  }
  h += static_cast<uint64_t>(n);
  while (end - p >= 8) {
    h ^= XxRound(0, Load64(p));
    h = std::rotl(h, 27) * kP1 + kP4;
    p += 8;
  }
  if (end - p >= 4) {
    h ^= static_cast<uint64_t>(Load32(p)) * kP1;
    h = std::rotl(h, 23) * kP2 + kP3;
    p += 4;
  }
  while (p < end) {
    h ^= static_cast<uint64_t>(*p++) * kP5;
    h = std::rotl(h, 11) * kP1;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t ComputeChecksum(ChecksumKind kind, const void* data, size_t n) {
  switch (kind) {
    case ChecksumKind::kNone: return 0;
    case ChecksumKind::kCrc32c: return Crc32c(data, n);
    case ChecksumKind::kXxh64: return XxHash64(data, n, 0);
  }
  return 0;
}

}  // namespace strata
