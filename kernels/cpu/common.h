// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the CPU backend's op files: dtype dispatch, argument
// checks, deterministic parallel loops, and the elementwise math
// (vecmath.inc: exp, GELU, lane reductions).
//
// Determinism: every parallel loop here cuts its range into blocks whose
// boundaries depend only on the problem size (never on the thread count or on
// timing), each block is computed by one thread in a fixed order, and
// reductions combine per-block partials in block order. So every op gives
// bitwise the same result for any number of threads.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>

#include "base/dtype.h"
#include "base/half.h"
#include "base/status.h"
#include "kernels/cpu/convert.h"

namespace strata::kernels::cpu {

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the storage type of `dtype` (f32, f16, bf16,
// f64); InvalidArgument naming `what` for any other dtype.
template <class F>
Status VisitFloat(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kF32: return f(TypeTag<float>{});
    case DType::kF16: return f(TypeTag<f16_t>{});
    case DType::kBF16: return f(TypeTag<bf16_t>{});
    case DType::kF64: return f(TypeTag<double>{});
    default: break;
  }
  return InvalidArgument(std::string(what) + ": dtype " + std::string(DTypeName(dtype)) +
                         " is not supported (f32, f16, bf16 or f64)");
}

// Storage element of dtype `t` at index i of an untyped buffer.
template <class T>
inline const T* As(const void* p) {
  return static_cast<const T*>(p);
}
template <class T>
inline T* As(void* p) {
  return static_cast<T*>(p);
}

// Runs body(begin, end) over [0, n) in blocks of `block` (the last one
// shorter), in parallel. Blocks depend only on n and block.
template <class Body>
void ParallelBlocks(int64_t n, int64_t block, Body&& body) {
  if (n <= 0) return;
  if (block < 1) block = 1;
  const int64_t nblocks = (n + block - 1) / block;
  if (nblocks == 1) {
    body(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, nblocks, 1),
      [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t b = r.begin(); b < r.end(); ++b) body(b * block, std::min(n, (b + 1) * block));
      },
      tbb::simple_partitioner());
}

// Runs body(i) for each i in [0, n) in parallel (each index independent).
template <class Body>
void ParallelFor(int64_t n, Body&& body) {
  ParallelBlocks(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) body(i);
  });
}

// Argument checks: InvalidArgument "<op>: <what>".
inline Status CheckArg(bool ok, const char* op, const std::string& what) {
  return ok ? Status::OK() : InvalidArgument(std::string(op) + ": " + what);
}
inline Status CheckPtr(const void* p, const char* op, const char* name) {
  return p ? Status::OK() : InvalidArgument(std::string(op) + ": `" + name + "` is null");
}
inline Status CheckNonNegative(int64_t v, const char* op, const char* name) {
  return v >= 0 ? Status::OK()
                : InvalidArgument(std::string(op) + ": `" + name + "` = " + std::to_string(v) +
                                  " is negative");
}
inline Status CheckPositive(int64_t v, const char* op, const char* name) {
  return v > 0 ? Status::OK()
               : InvalidArgument(std::string(op) + ": `" + name + "` = " + std::to_string(v) +
                                 " must be positive");
}

#include "kernels/cpu/vecmath.inc"

// Row helpers over contiguous float arrays, AVX2 builds when the CPU has
// them (vecmath.cc / vecmath_avx2.cc); double arrays use the scalar code.
//   GeluRows:      v = gelu(v)
//   GeluGradRows:  g *= gelu'(x)
//   ExpShiftRows:  v = exp(v - shift)
void GeluRowsF32(float* v, int64_t n);
void GeluGradRowsF32(const float* x, float* g, int64_t n);
void ExpShiftRowsF32(float* v, int64_t n, float shift);

template <class A>
void GeluRows(A* v, int64_t n) {
  if constexpr (std::is_same_v<A, float>) {
    GeluRowsF32(v, n);
  } else {
    for (int64_t i = 0; i < n; ++i) v[i] = Gelu(v[i]);
  }
}
template <class A>
void GeluGradRows(const A* x, A* g, int64_t n) {
  if constexpr (std::is_same_v<A, float>) {
    GeluGradRowsF32(x, g, n);
  } else {
    for (int64_t i = 0; i < n; ++i) g[i] *= GeluGrad(x[i]);
  }
}
template <class A>
void ExpShiftRows(A* v, int64_t n, A shift) {
  if constexpr (std::is_same_v<A, float>) {
    ExpShiftRowsF32(v, n, shift);
  } else {
    for (int64_t i = 0; i < n; ++i) v[i] = std::exp(v[i] - shift);
  }
}

// Elements per parallel block of the elementwise ops, and per chunk converted
// to the compute type on the stack.
inline constexpr int64_t kElementwiseBlock = 1 << 14;
inline constexpr int64_t kChunk = 512;

// Elementwise helper: for each chunk [i, i+len) of [0, n), calls
// body(i, len) in parallel; body converts and computes with buffers of at
// most kChunk elements.
template <class Body>
void ForEachChunk(int64_t n, Body&& body) {
  ParallelBlocks(n, kElementwiseBlock, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i += kChunk) body(i, std::min(kChunk, e - i));
  });
}

}  // namespace strata::kernels::cpu
