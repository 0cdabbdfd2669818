// SPDX-License-Identifier: Apache-2.0
// BiasBackward: dbias[n] = sum over the m rows of dy[m, n] (or +=).
// Rows are summed per block of kRowsPerBlock, then the block partials in
// block order (independent of the thread count).
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {
namespace {

constexpr int64_t kRowsPerBlock = 64;

template <class T, class G>
void BiasBackwardTyped(G* dbias, bool accumulate, const T* dy, int64_t m, int64_t n) {
  using A = Acc<T>;
  const int64_t blocks = (m + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<A> partial(static_cast<size_t>(blocks * n), A(0));
  ParallelBlocks(m, kRowsPerBlock, [&](int64_t r0, int64_t r1) {
    A* p = partial.data() + (r0 / kRowsPerBlock) * n;
    std::vector<A> row(n);
    for (int64_t r = r0; r < r1; ++r) {
      LoadN(dy + r * n, row.data(), n);
      for (int64_t j = 0; j < n; ++j) p[j] += row[j];
    }
  });
  ParallelBlocks(n, 1024, [&](int64_t c0, int64_t c1) {
    for (int64_t j = c0; j < c1; ++j) {
      A s = 0;
      for (int64_t b = 0; b < blocks; ++b) s += partial[b * n + j];
      if (accumulate) s = Load1<A>(dbias[j]) + s;
      dbias[j] = Store1<G>(s);
    }
  });
}

}  // namespace

Status CpuBackend::BiasBackward(void* dbias, DType grad_dtype, bool accumulate, const void* dy,
                                int64_t m, int64_t n, DType dtype) {
  const char* op = "BiasBackward";
  RETURN_IF_ERROR(CheckNonNegative(m, op, "m"));
  RETURN_IF_ERROR(CheckNonNegative(n, op, "n"));
  if (n == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(dbias, op, "dbias"));
  if (m > 0) RETURN_IF_ERROR(CheckPtr(dy, op, "dy"));
  return VisitFloat(dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return VisitFloat(grad_dtype, "BiasBackward grad_dtype", [&](auto gt) {
      using G = typename decltype(gt)::type;
      return Run(op, [&] {
        BiasBackwardTyped<T, G>(static_cast<G*>(dbias), accumulate, static_cast<const T*>(dy), m,
                                n);
        return Status::OK();
      });
    });
  });
}

}  // namespace strata::kernels::cpu
