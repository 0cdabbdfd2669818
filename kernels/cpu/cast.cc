// SPDX-License-Identifier: Apache-2.0
// Cast: dst (dst_dtype) = src (src_dtype), rounding to nearest even.
#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {

Status CpuBackend::Cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) {
  const char* op = "Cast";
  RETURN_IF_ERROR(CheckNonNegative(n, op, "n"));
  if (n == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(dst, op, "dst"));
  RETURN_IF_ERROR(CheckPtr(src, op, "src"));
  return VisitFloat(src_dtype, "Cast src_dtype", [&](auto s) {
    using S = typename decltype(s)::type;
    return VisitFloat(dst_dtype, "Cast dst_dtype", [&](auto d) {
      using D = typename decltype(d)::type;
      // Through double when either side is f64 (exact), else through float.
      using A =
          std::conditional_t<std::is_same_v<S, double> || std::is_same_v<D, double>, double, float>;
      return Run(op, [&] {
        ForEachChunk(n, [&](int64_t i, int64_t len) {
          A v[kChunk];
          LoadN(As<S>(src) + i, v, len);
          StoreN(v, As<D>(dst) + i, len);
        });
        return Status::OK();
      });
    });
  });
}

}  // namespace strata::kernels::cpu
