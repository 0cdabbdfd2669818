// SPDX-License-Identifier: Apache-2.0
// tanh-GELU forward and backward (elementwise, in the compute type).
#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {

Status CpuBackend::GeluForward(void* y, const void* x, int64_t n, DType dtype) {
  const char* op = "GeluForward";
  RETURN_IF_ERROR(CheckNonNegative(n, op, "n"));
  if (n == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(y, op, "y"));
  RETURN_IF_ERROR(CheckPtr(x, op, "x"));
  return VisitFloat(dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    using A = Acc<T>;
    return Run(op, [&] {
      ForEachChunk(n, [&](int64_t i, int64_t len) {
        A v[kChunk];
        LoadN(As<T>(x) + i, v, len);
        GeluRows(v, len);
        StoreN(v, As<T>(y) + i, len);
      });
      return Status::OK();
    });
  });
}

Status CpuBackend::GeluBackward(void* dx, const void* x, const void* dy, int64_t n, DType dtype) {
  const char* op = "GeluBackward";
  RETURN_IF_ERROR(CheckNonNegative(n, op, "n"));
  if (n == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(dx, op, "dx"));
  RETURN_IF_ERROR(CheckPtr(x, op, "x"));
  RETURN_IF_ERROR(CheckPtr(dy, op, "dy"));
  return VisitFloat(dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    using A = Acc<T>;
    return Run(op, [&] {
      ForEachChunk(n, [&](int64_t i, int64_t len) {
        A xv[kChunk], g[kChunk];
        LoadN(As<T>(x) + i, xv, len);
        LoadN(As<T>(dy) + i, g, len);
        GeluGradRows(xv, g, len);
        StoreN(g, As<T>(dx) + i, len);  // dx may alias dy: read before written
      });
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cpu
