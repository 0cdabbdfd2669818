// SPDX-License-Identifier: Apache-2.0
// Storage <-> compute conversions for the CPU backend.
//
// Storage types: float (f32), f16_t, bf16_t, double (f64). Compute type:
// double for f64 storage, float for the others (Acc<T>). Rounding to a
// narrower type is round-to-nearest-even everywhere; double -> f16/bf16 goes
// through a round-to-odd float so that it is rounded once, exactly.
//
// The bulk f16/bf16 <-> f32 loops use F16C/AVX2 when the CPU has them
// (convert_avx2.cc, chosen at run time, see isa.h) and give bitwise the same
// results as the scalar conversions of base/half.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "base/half.h"
#include "kernels/cpu/avx2.h"

namespace strata::kernels::cpu {

template <class T>
struct ComputeOf {
  using type = float;
};
template <>
struct ComputeOf<double> {
  using type = double;
};
// fp64 math for f64 storage, fp32 for f32/f16/bf16.
template <class T>
using Acc = typename ComputeOf<T>::type;

// `d` rounded to float with round-to-odd: an inexact result gets its last
// mantissa bit set. Rounding that float to f16/bf16 (>= 2 fewer bits) then
// equals rounding `d` directly.
inline float RoundToOddFloat(double d) {
  float f = static_cast<float>(d);
  if (std::isfinite(f) && static_cast<double>(f) != d) {
    uint32_t bits = FloatBits(f);
    if (std::fabs(static_cast<double>(f)) > std::fabs(d)) bits -= 1;  // truncate toward zero
    f = BitsFloat(bits | 1u);
  }
  return f;
}

// One element, storage -> compute.
template <class A, class T>
inline A Load1(T v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return static_cast<A>(v);
  } else {
    return static_cast<A>(ToFloat(v));
  }
}

// One element, compute -> storage (round to nearest even).
template <class T, class A>
inline T Store1(A v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return static_cast<T>(v);
  } else if constexpr (std::is_same_v<A, double>) {
    return FromFloat<T>(RoundToOddFloat(v));
  } else {
    return FromFloat<T>(v);
  }
}

// The bulk loops: the builds chosen by ActiveIsa(). Both builds are declared
// in avx2.h (the *Generic and *Avx2 functions) so tests can compare them.
namespace convert_impl {
void Bf16ToF32(const uint16_t* src, float* dst, int64_t n);
void F32ToBf16(const float* src, uint16_t* dst, int64_t n);
void F16ToF32(const uint16_t* src, float* dst, int64_t n);
void F32ToF16(const float* src, uint16_t* dst, int64_t n);
}  // namespace convert_impl

// n elements, storage -> compute type A (float or double).
template <class T, class A>
inline void LoadN(const T* src, A* dst, int64_t n) {
  if constexpr (std::is_same_v<T, A>) {
    if (n > 0 && static_cast<const void*>(src) != static_cast<const void*>(dst))
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(A));
  } else if constexpr (std::is_same_v<T, bf16_t> && std::is_same_v<A, float>) {
    convert_impl::Bf16ToF32(reinterpret_cast<const uint16_t*>(src), dst, n);
  } else if constexpr (std::is_same_v<T, f16_t> && std::is_same_v<A, float>) {
    convert_impl::F16ToF32(reinterpret_cast<const uint16_t*>(src), dst, n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = Load1<A>(src[i]);
  }
}

// n elements, compute type A -> storage (round to nearest even).
template <class T, class A>
inline void StoreN(const A* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, A>) {
    if (n > 0 && static_cast<const void*>(src) != static_cast<const void*>(dst))
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(A));
  } else if constexpr (std::is_same_v<T, bf16_t> && std::is_same_v<A, float>) {
    convert_impl::F32ToBf16(src, reinterpret_cast<uint16_t*>(dst), n);
  } else if constexpr (std::is_same_v<T, f16_t> && std::is_same_v<A, float>) {
    convert_impl::F32ToF16(src, reinterpret_cast<uint16_t*>(dst), n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = Store1<T>(src[i]);
  }
}

}  // namespace strata::kernels::cpu
