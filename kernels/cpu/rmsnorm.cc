// SPDX-License-Identifier: Apache-2.0
// RMSNorm forward and backward over rows of C columns (Llama's LlamaRMSNorm).
//
// Forward, per row in the compute type: rstd = 1/sqrt(mean(x^2) + eps),
// y = x * rstd * w.
// Backward: xhat = x * rstd, g = dy * w,
//   dx += rstd * (g - xhat * mean(g * xhat)),
//   dw = sum_rows dy * xhat — summed per block of kRowsPerBlock rows, then
//   over blocks in order (independent of the thread count).
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {
namespace {

constexpr int64_t kRowsPerBlock = 32;

Status CheckRmsNorm(const RmsNormArgs& a, const char* op) {
  RETURN_IF_ERROR(CheckNonNegative(a.rows, op, "rows"));
  RETURN_IF_ERROR(CheckPositive(a.cols, op, "cols"));
  return CheckArg(a.eps >= 0.f && std::isfinite(a.eps), op,
                  "eps = " + std::to_string(a.eps) + " must be finite and >= 0");
}

template <class T>
Status ForwardTyped(const RmsNormArgs& a, void* y_, float* rstd_, const void* x_, const void* w_) {
  using A = Acc<T>;
  const int64_t N = a.rows, C = a.cols;
  const T* x = static_cast<const T*>(x_);
  T* y = static_cast<T*>(y_);
  A* rstd = reinterpret_cast<A*>(rstd_);  // doubles for f64 (see cpu_backend.h)
  std::vector<A> w(C);
  LoadN(static_cast<const T*>(w_), w.data(), C);
  const A eps = static_cast<A>(a.eps);
  ParallelBlocks(N, std::max<int64_t>(1, 8192 / C), [&](int64_t r0, int64_t r1) {
    std::vector<A> row(C);
    for (int64_t r = r0; r < r1; ++r) {
      LoadN(x + r * C, row.data(), C);
      const A ms = LanesDot(row.data(), row.data(), C) / static_cast<A>(C);
      const A rs = A(1) / std::sqrt(ms + eps);
      for (int64_t j = 0; j < C; ++j) row[j] = row[j] * rs * w[j];
      StoreN(row.data(), y + r * C, C);
      if (rstd) rstd[r] = rs;
    }
  });
  return Status::OK();
}

template <class T, class G>
Status BackwardTyped(const RmsNormArgs& a, void* dx_, void* dw_, bool accumulate, const void* dy_, const void* x_,
                     const void* w_, const float* rstd_) {
  using A = Acc<T>;
  const int64_t N = a.rows, C = a.cols;
  const T* dy = static_cast<const T*>(dy_);
  const T* x = static_cast<const T*>(x_);
  T* dx = static_cast<T*>(dx_);
  const A* rstd = reinterpret_cast<const A*>(rstd_);
  std::vector<A> w(C);
  LoadN(static_cast<const T*>(w_), w.data(), C);
  const int64_t blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<A> pdw(static_cast<size_t>(blocks * C), A(0));
  ParallelBlocks(N, kRowsPerBlock, [&](int64_t r0, int64_t r1) {
    std::vector<A> g(C), xh(C), dyr(C), dxr(C);
    A* bw = pdw.data() + (r0 / kRowsPerBlock) * C;
    for (int64_t r = r0; r < r1; ++r) {
      LoadN(dy + r * C, dyr.data(), C);
      LoadN(x + r * C, xh.data(), C);
      const A rs = rstd[r];
      for (int64_t j = 0; j < C; ++j) {
        xh[j] = xh[j] * rs;
        g[j] = dyr[j] * w[j];
        bw[j] += dyr[j] * xh[j];
      }
      const A mgx = LanesDot(g.data(), xh.data(), C) / static_cast<A>(C);
      LoadN(dx + r * C, dxr.data(), C);
      for (int64_t j = 0; j < C; ++j) dxr[j] += rs * (g[j] - xh[j] * mgx);
      StoreN(dxr.data(), dx + r * C, C);
    }
  });
  G* dw = static_cast<G*>(dw_);
  ParallelBlocks(C, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t j = c0; j < c1; ++j) {
      A sw = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) sw += pdw[blk * C + j];
      if (accumulate) sw = Load1<A>(dw[j]) + sw;
      dw[j] = Store1<G>(sw);
    }
  });
  return Status::OK();
}

}  // namespace

Status CpuBackend::RmsNormForward(const RmsNormArgs& a, void* y, float* rstd, const void* x, const void* weight) {
  const char* op = "RmsNormForward";
  RETURN_IF_ERROR(CheckRmsNorm(a, op));
  RETURN_IF_ERROR(CheckPtr(weight, op, "weight"));
  if (a.rows == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(y, op, "y"));
  RETURN_IF_ERROR(CheckPtr(x, op, "x"));
  return VisitFloat(a.dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return Run(op, [&] { return ForwardTyped<T>(a, y, rstd, x, weight); });
  });
}

Status CpuBackend::RmsNormBackward(const RmsNormArgs& a, void* dx, void* dweight, DType grad_dtype, bool accumulate,
                                   const void* dy, const void* x, const void* weight, const float* rstd) {
  const char* op = "RmsNormBackward";
  RETURN_IF_ERROR(CheckRmsNorm(a, op));
  RETURN_IF_ERROR(CheckPtr(dweight, op, "dweight"));
  RETURN_IF_ERROR(CheckPtr(weight, op, "weight"));
  if (a.rows > 0) {
    RETURN_IF_ERROR(CheckPtr(dx, op, "dx"));
    RETURN_IF_ERROR(CheckPtr(dy, op, "dy"));
    RETURN_IF_ERROR(CheckPtr(x, op, "x"));
    RETURN_IF_ERROR(CheckPtr(rstd, op, "rstd"));
  }
  return VisitFloat(a.dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return VisitFloat(grad_dtype, "RmsNormBackward grad_dtype", [&](auto gt) {
      using G = typename decltype(gt)::type;
      return Run(op, [&] { return BackwardTyped<T, G>(a, dx, dweight, accumulate, dy, x, weight, rstd); });
    });
  });
}

}  // namespace strata::kernels::cpu
