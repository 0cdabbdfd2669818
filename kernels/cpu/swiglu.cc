// SPDX-License-Identifier: Apache-2.0
// SwiGLU forward and backward (Llama's MLP activation), per row in the
// compute type: in = gate | up (2F columns), out = silu(gate) * up with
// silu(g) = g / (1 + exp(-g)); backward, with sig = 1 / (1 + exp(-g)):
//   d up = dout * silu(g),   d gate = dout * up * sig * (1 + g (1 - sig)).
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {
namespace {

Status CheckSwiGlu(int64_t rows, int64_t f, const char* op) {
  RETURN_IF_ERROR(CheckNonNegative(rows, op, "rows"));
  return CheckPositive(f, op, "f");
}

template <class A>
A Sigmoid(A g) {
  return A(1) / (A(1) + std::exp(-g));
}

template <class T>
void ForwardTyped(T* out, const T* in, int64_t rows, int64_t f) {
  using A = Acc<T>;
  ParallelBlocks(rows, std::max<int64_t>(1, 8192 / f), [&](int64_t r0, int64_t r1) {
    std::vector<A> g(static_cast<size_t>(f)), u(static_cast<size_t>(f));
    for (int64_t r = r0; r < r1; ++r) {
      LoadN(in + r * 2 * f, g.data(), f);
      LoadN(in + r * 2 * f + f, u.data(), f);
      for (int64_t j = 0; j < f; ++j) g[j] = g[j] * Sigmoid(g[j]) * u[j];
      StoreN(g.data(), out + r * f, f);
    }
  });
}

template <class T>
void BackwardTyped(T* din, const T* dout, const T* in, int64_t rows, int64_t f) {
  using A = Acc<T>;
  ParallelBlocks(rows, std::max<int64_t>(1, 8192 / f), [&](int64_t r0, int64_t r1) {
    std::vector<A> g(static_cast<size_t>(f)), u(static_cast<size_t>(f)), d(static_cast<size_t>(f));
    for (int64_t r = r0; r < r1; ++r) {
      LoadN(in + r * 2 * f, g.data(), f);
      LoadN(in + r * 2 * f + f, u.data(), f);
      LoadN(dout + r * f, d.data(), f);
      for (int64_t j = 0; j < f; ++j) {
        const A s = Sigmoid(g[j]), silu = g[j] * s;
        const A dg = d[j] * u[j] * s * (A(1) + g[j] * (A(1) - s));
        u[j] = d[j] * silu;
        g[j] = dg;
      }
      StoreN(g.data(), din + r * 2 * f, f);
      StoreN(u.data(), din + r * 2 * f + f, f);
    }
  });
}

}  // namespace

Status CpuBackend::SwiGluForward(void* out, const void* in, int64_t rows, int64_t f, DType dtype) {
  const char* op = "SwiGluForward";
  RETURN_IF_ERROR(CheckSwiGlu(rows, f, op));
  if (rows == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(out, op, "out"));
  RETURN_IF_ERROR(CheckPtr(in, op, "in"));
  return VisitFloat(dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return Run(op, [&] {
      ForwardTyped<T>(static_cast<T*>(out), static_cast<const T*>(in), rows, f);
      return Status::OK();
    });
  });
}

Status CpuBackend::SwiGluBackward(void* din, const void* dout, const void* in, int64_t rows, int64_t f,
                                  DType dtype) {
  const char* op = "SwiGluBackward";
  RETURN_IF_ERROR(CheckSwiGlu(rows, f, op));
  if (rows == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(din, op, "din"));
  RETURN_IF_ERROR(CheckPtr(dout, op, "dout"));
  RETURN_IF_ERROR(CheckPtr(in, op, "in"));
  RETURN_IF_ERROR(CheckArg(din != dout, op, "din must not alias dout"));
  return VisitFloat(dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return Run(op, [&] {
      BackwardTyped<T>(static_cast<T*>(din), static_cast<const T*>(dout), static_cast<const T*>(in), rows, f);
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cpu
