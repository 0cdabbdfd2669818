// SPDX-License-Identifier: Apache-2.0
// Add: out = a + b (elementwise; out may alias a or b).
#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {

Status CpuBackend::Add(void* out, const void* a, const void* b, int64_t n, DType dtype) {
  const char* op = "Add";
  RETURN_IF_ERROR(CheckNonNegative(n, op, "n"));
  if (n == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(out, op, "out"));
  RETURN_IF_ERROR(CheckPtr(a, op, "a"));
  RETURN_IF_ERROR(CheckPtr(b, op, "b"));
  return VisitFloat(dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    using A = Acc<T>;
    return Run(op, [&] {
      ForEachChunk(n, [&](int64_t i, int64_t len) {
        A va[kChunk], vb[kChunk];
        LoadN(As<T>(a) + i, va, len);
        LoadN(As<T>(b) + i, vb, len);
        for (int64_t j = 0; j < len; ++j) va[j] += vb[j];
        StoreN(va, As<T>(out) + i, len);
      });
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cpu
