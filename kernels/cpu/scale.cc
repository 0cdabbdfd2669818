// SPDX-License-Identifier: Apache-2.0
// Scale: x *= factor (elementwise, in the compute type).
#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {

Status CpuBackend::Scale(void* x, DType dtype, int64_t n, float factor) {
  const char* op = "Scale";
  RETURN_IF_ERROR(CheckNonNegative(n, op, "n"));
  if (n == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(x, op, "x"));
  return VisitFloat(dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    using A = Acc<T>;
    const A f = static_cast<A>(factor);
    return Run(op, [&] {
      ForEachChunk(n, [&](int64_t i, int64_t len) {
        A v[kChunk];
        LoadN(As<T>(x) + i, v, len);
        for (int64_t j = 0; j < len; ++j) v[j] *= f;
        StoreN(v, As<T>(x) + i, len);
      });
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cpu
