// Helpers shared by the CPU backend's op files: dtype dispatch, argument
// checks, and deterministic parallel loops.
//
// Determinism: every parallel loop here cuts its range into blocks whose
// boundaries depend only on the problem size (never on the thread count or on
// timing), each block is computed by one thread in a fixed order, and
// reductions combine per-block partials in block order. So every op gives
// bitwise the same result for any number of threads.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>

#include "kernels/cpu/convert.h"
#include "tiers/dtype.h"
#include "tiers/half.h"
#include "tiers/status.h"

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

// tanh-GELU and its derivative, in the compute type.
template <class A>
inline A Gelu(A x) {
  constexpr A k0 = A(0.7978845608028654);  // sqrt(2/pi)
  constexpr A k1 = A(0.044715);
  A u = k0 * (x + k1 * x * x * x);
  return A(0.5) * x * (A(1) + std::tanh(u));
}
template <class A>
inline A GeluGrad(A x) {
  constexpr A k0 = A(0.7978845608028654);
  constexpr A k1 = A(0.044715);
  A x2 = x * x;
  A t = std::tanh(k0 * (x + k1 * x2 * x));
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * k0 * (A(1) + A(3) * k1 * x2);
}

}  // namespace strata::kernels::cpu

namespace strata::kernels::cpu {

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
