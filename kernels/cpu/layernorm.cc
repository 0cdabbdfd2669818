// SPDX-License-Identifier: Apache-2.0
// LayerNorm forward and backward over rows of C columns.
//
// Forward, per row in the compute type: mean, var = mean((x-mean)^2) (two
// passes), rstd = 1/sqrt(var + eps), y = (x-mean)*rstd*w + b.
// Backward: xhat = (x-mean)*rstd, g = dy*w,
//   dx += rstd * (g - mean(g) - xhat * mean(g*xhat)),
//   dw = sum_rows dy*xhat, db = sum_rows dy — summed per block of kRowsPerBlock
//   rows, then over blocks in order (independent of the thread count).
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {
namespace {

constexpr int64_t kRowsPerBlock = 32;

Status CheckLayerNorm(const LayerNormArgs& a, const char* op) {
  RETURN_IF_ERROR(CheckNonNegative(a.rows, op, "rows"));
  RETURN_IF_ERROR(CheckPositive(a.cols, op, "cols"));
  return CheckArg(a.eps >= 0.f && std::isfinite(a.eps), op,
                  "eps = " + std::to_string(a.eps) + " must be finite and >= 0");
}

template <class T>
Status ForwardTyped(const LayerNormArgs& a, void* y_, float* mean_, float* rstd_, const void* x_,
                    const void* w_, const void* b_) {
  using A = Acc<T>;
  const int64_t N = a.rows, C = a.cols;
  const T* x = static_cast<const T*>(x_);
  T* y = static_cast<T*>(y_);
  A* mean = reinterpret_cast<A*>(mean_);  // doubles for f64 (see cpu_backend.h)
  A* rstd = reinterpret_cast<A*>(rstd_);
  std::vector<A> w(C), b(C);
  LoadN(static_cast<const T*>(w_), w.data(), C);
  LoadN(static_cast<const T*>(b_), b.data(), C);
  const A eps = static_cast<A>(a.eps);
  ParallelBlocks(N, std::max<int64_t>(1, 8192 / C), [&](int64_t r0, int64_t r1) {
    std::vector<A> row(C);
    for (int64_t r = r0; r < r1; ++r) {
      LoadN(x + r * C, row.data(), C);
      const A mu = LanesSum(row.data(), C) / static_cast<A>(C);
      for (int64_t j = 0; j < C; ++j) row[j] -= mu;
      const A var = LanesDot(row.data(), row.data(), C) / static_cast<A>(C);
      const A rs = A(1) / std::sqrt(var + eps);
      for (int64_t j = 0; j < C; ++j) row[j] = row[j] * rs * w[j] + b[j];
      StoreN(row.data(), y + r * C, C);
      if (mean) mean[r] = mu;
      if (rstd) rstd[r] = rs;
    }
  });
  return Status::OK();
}

template <class T, class G>
Status BackwardTyped(const LayerNormArgs& a, void* dx_, void* dw_, void* db_, bool accumulate,
                     const void* dy_, const void* x_, const void* w_, const float* mean_,
                     const float* rstd_) {
  using A = Acc<T>;
  const int64_t N = a.rows, C = a.cols;
  const T* dy = static_cast<const T*>(dy_);
  const T* x = static_cast<const T*>(x_);
  T* dx = static_cast<T*>(dx_);
  const A* mean = reinterpret_cast<const A*>(mean_);
  const A* rstd = reinterpret_cast<const A*>(rstd_);
  std::vector<A> w(C);
  LoadN(static_cast<const T*>(w_), w.data(), C);
  const int64_t blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<A> pdw(static_cast<size_t>(blocks * C), A(0)),
      pdb(static_cast<size_t>(blocks * C), A(0));
  ParallelBlocks(N, kRowsPerBlock, [&](int64_t r0, int64_t r1) {
    std::vector<A> g(C), xh(C), dyr(C), dxr(C);
    A* bw = pdw.data() + (r0 / kRowsPerBlock) * C;
    A* bb = pdb.data() + (r0 / kRowsPerBlock) * C;
    for (int64_t r = r0; r < r1; ++r) {
      LoadN(dy + r * C, dyr.data(), C);
      LoadN(x + r * C, xh.data(), C);
      const A mu = mean[r], rs = rstd[r];
      for (int64_t j = 0; j < C; ++j) {
        xh[j] = (xh[j] - mu) * rs;
        g[j] = dyr[j] * w[j];
        bw[j] += dyr[j] * xh[j];
        bb[j] += dyr[j];
      }
      const A mg = LanesSum(g.data(), C) / static_cast<A>(C);
      const A mgx = LanesDot(g.data(), xh.data(), C) / static_cast<A>(C);
      LoadN(dx + r * C, dxr.data(), C);
      for (int64_t j = 0; j < C; ++j) dxr[j] += rs * (g[j] - mg - xh[j] * mgx);
      StoreN(dxr.data(), dx + r * C, C);
    }
  });
  // Sum the block partials in block order, per column.
  G* dw = static_cast<G*>(dw_);
  G* db = static_cast<G*>(db_);
  ParallelBlocks(C, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t j = c0; j < c1; ++j) {
      A sw = 0, sb = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        sw += pdw[blk * C + j];
        sb += pdb[blk * C + j];
      }
      if (accumulate) {
        sw = Load1<A>(dw[j]) + sw;
        sb = Load1<A>(db[j]) + sb;
      }
      dw[j] = Store1<G>(sw);
      db[j] = Store1<G>(sb);
    }
  });
  return Status::OK();
}

}  // namespace

Status CpuBackend::LayerNormForward(const LayerNormArgs& a, void* y, float* mean, float* rstd,
                                    const void* x, const void* weight, const void* bias) {
  const char* op = "LayerNormForward";
  RETURN_IF_ERROR(CheckLayerNorm(a, op));
  RETURN_IF_ERROR(CheckPtr(weight, op, "weight"));
  RETURN_IF_ERROR(CheckPtr(bias, op, "bias"));
  if (a.rows == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(y, op, "y"));
  RETURN_IF_ERROR(CheckPtr(x, op, "x"));
  return VisitFloat(a.dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return Run(op, [&] { return ForwardTyped<T>(a, y, mean, rstd, x, weight, bias); });
  });
}

Status CpuBackend::LayerNormBackward(const LayerNormArgs& a, void* dx, void* dweight, void* dbias,
                                     DType grad_dtype, bool accumulate, const void* dy,
                                     const void* x, const void* weight, const float* mean,
                                     const float* rstd) {
  const char* op = "LayerNormBackward";
  RETURN_IF_ERROR(CheckLayerNorm(a, op));
  RETURN_IF_ERROR(CheckPtr(dweight, op, "dweight"));
  RETURN_IF_ERROR(CheckPtr(dbias, op, "dbias"));
  RETURN_IF_ERROR(CheckPtr(weight, op, "weight"));
  if (a.rows > 0) {
    RETURN_IF_ERROR(CheckPtr(dx, op, "dx"));
    RETURN_IF_ERROR(CheckPtr(dy, op, "dy"));
    RETURN_IF_ERROR(CheckPtr(x, op, "x"));
    RETURN_IF_ERROR(CheckPtr(mean, op, "mean"));
    RETURN_IF_ERROR(CheckPtr(rstd, op, "rstd"));
  }
  return VisitFloat(a.dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return VisitFloat(grad_dtype, "LayerNormBackward grad_dtype", [&](auto gt) {
      using G = typename decltype(gt)::type;
      return Run(op, [&] {
        return BackwardTyped<T, G>(a, dx, dweight, dbias, accumulate, dy, x, weight, mean, rstd);
      });
    });
  });
}

}  // namespace strata::kernels::cpu
