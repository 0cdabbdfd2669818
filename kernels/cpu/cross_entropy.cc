// SPDX-License-Identifier: Apache-2.0
// Fused softmax + cross-entropy over logits[N, Vp] whose first V columns are
// real. Per row, in the compute type: m = max, e = exp(x - m),
// lse = m + log(sum e), loss = lse - x[target], and
// dlogits = (e / sum e - onehot) * dloss on the V real columns, 0 on the
// padding. Rows with target < 0 are ignored (loss 0, dlogits row 0). The row
// is converted before anything is written, so dlogits may alias logits.
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {
namespace {

template <class T>
void CrossEntropyTyped(Acc<T>* losses, T* dlogits, const T* logits, const int32_t* targets,
                       int64_t N, int64_t V, int64_t Vp, Acc<T> dloss) {
  using A = Acc<T>;
  ParallelBlocks(N, std::max<int64_t>(1, 16384 / Vp), [&](int64_t r0, int64_t r1) {
    std::vector<A> x(Vp);
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t target = targets[r];
      if (target < 0) {
        losses[r] = 0;
        if (dlogits) {
          std::fill(x.begin(), x.end(), A(0));
          StoreN(x.data(), dlogits + r * Vp, Vp);
        }
        continue;
      }
      LoadN(logits + r * Vp, x.data(), Vp);
      const A mx = LanesMax(x.data(), V);
      const A x_target = x[target];
      ExpShiftRows(x.data(), V, mx);  // x = exp(x - max)
      const A sum = LanesSum(x.data(), V);
      const A lse = mx + std::log(sum);
      losses[r] = lse - x_target;
      if (dlogits) {
        const A scale = dloss / sum;  // softmax = exp(x - max) / sum
        for (int64_t j = 0; j < V; ++j) x[j] *= scale;
        x[target] -= dloss;
        for (int64_t j = V; j < Vp; ++j) x[j] = 0;
        StoreN(x.data(), dlogits + r * Vp, Vp);
      }
    }
  });
}

}  // namespace

Status CpuBackend::CrossEntropy(float* losses, void* dlogits, const void* logits,
                                const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                                float dloss, DType dtype) {
  const char* op = "CrossEntropy";
  RETURN_IF_ERROR(CheckNonNegative(N, op, "N"));
  RETURN_IF_ERROR(CheckPositive(V, op, "V"));
  RETURN_IF_ERROR(
      CheckArg(Vp >= V, op, "Vp = " + std::to_string(Vp) + " < V = " + std::to_string(V)));
  if (N == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(losses, op, "losses"));
  RETURN_IF_ERROR(CheckPtr(logits, op, "logits"));
  RETURN_IF_ERROR(CheckPtr(targets, op, "targets"));
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] >= V) {
      return InvalidArgument(
          std::string(op) + ": targets[" + std::to_string(i) + "] = " + std::to_string(targets[i]) +
          " is not below V = " + std::to_string(V) + " (negative targets mean ignored)");
    }
  }
  return VisitFloat(dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    using A = Acc<T>;
    return Run(op, [&] {
      // losses holds doubles for f64 (see cpu_backend.h).
      CrossEntropyTyped<T>(reinterpret_cast<A*>(losses), static_cast<T*>(dlogits),
                           static_cast<const T*>(logits), targets, N, V, Vp, static_cast<A>(dloss));
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cpu
