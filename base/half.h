// SPDX-License-Identifier: Apache-2.0
// Scalar fp16 / bf16 <-> fp32 conversions, round-to-nearest-even, exact for
// NaN/Inf/subnormals. These are the reference the SIMD paths (optim/) and the
// CPU backend (kernels/) are tested against; they are plain C++ and usable on
// any x86-64 or other CPU.
#pragma once

#include <cstdint>
#include <cstring>

namespace strata {

// Storage types; arithmetic is always done in fp32.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float BF16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBF16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return BitsFloat(u);
}

inline uint16_t FloatToHalf(float f) {
  uint32_t u = FloatBits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((au >> 13) & 0x3ffu));  // NaN
  if (au >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf (RNE)
  if (au < 0x38800000u) {  // result is subnormal or zero
    if (au < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to 0
    uint32_t e = au >> 23;
    uint32_t man = (au & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 + (113 - e) -> places the value in the 10-bit field
    uint32_t r = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = au - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

inline float ToFloat(bf16_t v) { return BF16ToFloat(v.bits); }
inline float ToFloat(f16_t v) { return HalfToFloat(v.bits); }
inline float ToFloat(float v) { return v; }
template <typename T>
inline T FromFloat(float f);
template <>
inline float FromFloat<float>(float f) { return f; }
template <>
inline bf16_t FromFloat<bf16_t>(float f) { return bf16_t{FloatToBF16(f)}; }
template <>
inline f16_t FromFloat<f16_t>(float f) { return f16_t{FloatToHalf(f)}; }

}  // namespace strata
