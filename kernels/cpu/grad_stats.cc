// SPDX-License-Identifier: Apache-2.0
// GradStats: *sumsq += sum of x^2 over the finite elements, *nonfinite += the
// number of NaN/Inf elements. Squares are summed per block of kBlock elements
// (kStatLanes interleaved partial sums, so the loop vectorizes), then the block
// sums in block order — independent of the thread count.
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {
namespace {

constexpr int64_t kBlock = 1 << 14;
constexpr int kStatLanes = 16;

template <class T>
void GradStatsTyped(const T* x, int64_t n, Acc<T>* sumsq, int32_t* nonfinite) {
  using A = Acc<T>;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<A> sums(static_cast<size_t>(blocks));
  std::vector<int64_t> bad(static_cast<size_t>(blocks));
  ParallelBlocks(n, kBlock, [&](int64_t b, int64_t e) {
    A lanes[kStatLanes] = {};
    int64_t count = 0;
    for (int64_t i = b; i < e; i += kChunk) {
      const int64_t len = std::min(kChunk, e - i);
      A v[kChunk];
      LoadN(x + i, v, len);
      for (int64_t j = 0; j < len; ++j) {
        const A s = v[j] * v[j];
        const bool finite = std::isfinite(v[j]);
        count += !finite;
        lanes[j % kStatLanes] += finite ? s : A(0);
      }
    }
    A total = 0;
    for (int l = 0; l < kStatLanes; ++l) total += lanes[l];
    sums[b / kBlock] = total;
    bad[b / kBlock] = count;
  });
  double total = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    total += static_cast<double>(sums[b]);
    count += bad[b];
  }
  *sumsq = static_cast<A>(static_cast<double>(*sumsq) + total);
  *nonfinite += static_cast<int32_t>(count);
}

}  // namespace

Status CpuBackend::GradStats(const void* x, DType dtype, int64_t n, float* sumsq,
                             int32_t* nonfinite) {
  const char* op = "GradStats";
  RETURN_IF_ERROR(CheckNonNegative(n, op, "n"));
  RETURN_IF_ERROR(CheckPtr(sumsq, op, "sumsq"));
  RETURN_IF_ERROR(CheckPtr(nonfinite, op, "nonfinite"));
  if (n > 0) RETURN_IF_ERROR(CheckPtr(x, op, "x"));
  return VisitFloat(dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return Run(op, [&] {
      // sumsq holds a double for f64 (see cpu_backend.h).
      GradStatsTyped<T>(static_cast<const T*>(x), n, reinterpret_cast<Acc<T>*>(sumsq), nonfinite);
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cpu
