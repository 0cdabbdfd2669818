// SPDX-License-Identifier: Apache-2.0
// Gemm: batched C = alpha op(A) op(B) + beta C_in (+ bias) (-> GELU, or times gelu'(aux))
// (+ the column sums of the result as a bias gradient).
//
// f16/bf16 A and B are first converted to fp32 panels (once per call); then
// C is cut into fixed tiles (kTileM x kTileN per batch item) computed in
// parallel, each by one single-threaded Eigen GEMM, followed by the epilogue
// in the compute type: v = alpha*AB + beta*C_in + bias; aux = v; C = gelu(v) (or
// v *= gelu'(aux) with dgelu), the bias gradient summed per row tile.
// Tiles depend only on the shape, so results do not depend on threads.
#include <algorithm>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm_kernel.h"

namespace strata::kernels::cpu {
namespace {

constexpr int64_t kTileM = 64;
constexpr int64_t kTileN = 256;
constexpr int64_t kConvertBlock = 1 << 14;  // elements per parallel conversion block

// A [rows, cols] matrix (leading dim ld) per batch item, as compute-type
// panels: the caller's memory when it already is the compute type, else a
// converted compact copy.
template <class T, class A>
struct Panel {
  const A* base = nullptr;
  int64_t ld = 0, stride = 0;
  std::vector<A> storage;

  void Init(const void* src, int64_t rows, int64_t cols, int64_t ld_in, int64_t stride_in,
            int batch) {
    if constexpr (std::is_same_v<T, A>) {
      base = static_cast<const A*>(src);
      ld = ld_in;
      stride = stride_in;
    } else {
      const int items = stride_in == 0 ? 1 : batch;
      storage.resize(static_cast<size_t>(items) * rows * cols);
      const T* s = static_cast<const T*>(src);
      const int64_t total_rows = items * rows;
      ParallelBlocks(total_rows, std::max<int64_t>(1, kConvertBlock / std::max<int64_t>(cols, 1)),
                     [&](int64_t r0, int64_t r1) {
                       for (int64_t r = r0; r < r1; ++r) {
                         int64_t p = r / rows, i = r % rows;
                         LoadN(s + p * stride_in + i * ld_in, storage.data() + r * cols, cols);
                       }
                     });
      base = storage.data();
      ld = cols;
      stride = stride_in == 0 ? 0 : rows * cols;
    }
  }
};

template <class T, class TC>
Status GemmTyped(const GemmArgs& g) {
  using A = Acc<T>;
  const int64_t m = g.m, n = g.n, k = g.k;
  Panel<T, A> pa, pb;
  if (k > 0) {
    pa.Init(g.a, g.trans_a ? k : m, g.trans_a ? m : k, g.lda, g.stride_a, g.batch);
    pb.Init(g.b, g.trans_b ? n : k, g.trans_b ? k : n, g.ldb, g.stride_b, g.batch);
  }
  std::vector<A> bias;
  if (g.bias) {
    bias.resize(static_cast<size_t>(n));
    LoadN(static_cast<const T*>(g.bias), bias.data(), n);
  }
  const A alpha = static_cast<A>(g.alpha), beta = static_cast<A>(g.beta);
  const bool epilogue = g.bias != nullptr || g.gelu || g.dgelu || g.bias_grad != nullptr;
  const int64_t tiles_m = (m + kTileM - 1) / kTileM, tiles_n = (n + kTileN - 1) / kTileN;
  const int64_t tiles = tiles_m * tiles_n;
  TC* c_all = static_cast<TC*>(g.c);
  const TC* c_in_all = g.c_in ? static_cast<const TC*>(g.c_in) : c_all;
  TC* aux_all = static_cast<TC*>(g.gelu_aux);
  // Bias gradient: per row tile, the column sums of its rows (the result in
  // the compute type, before rounding to TC); then the tiles in order.
  std::vector<A> bias_partial;
  if (g.bias_grad) bias_partial.assign(static_cast<size_t>(tiles_m * n), A(0));

  ParallelFor(int64_t{g.batch} * tiles, [&](int64_t t) {
    const int64_t p = t / tiles, tm = (t % tiles) / tiles_n, tn = t % tiles_n;
    const int64_t i0 = tm * kTileM, j0 = tn * kTileN;
    const int64_t rows = std::min(kTileM, m - i0), cols = std::min(kTileN, n - j0);
    const A* ap = nullptr;
    const A* bp = nullptr;
    if (k > 0) {
      ap = pa.base + p * pa.stride + (g.trans_a ? i0 : i0 * pa.ld);
      bp = pb.base + p * pb.stride + (g.trans_b ? j0 * pb.ld : j0);
    }
    TC* cp = c_all + p * g.stride_c + i0 * g.ldc + j0;
    const TC* cinp = c_in_all + p * g.stride_c + i0 * g.ldc + j0;
    TC* auxp = aux_all ? aux_all + p * g.stride_c + i0 * g.ldc + j0 : nullptr;
    std::vector<A> pre(g.dgelu ? static_cast<size_t>(cols) : 0);
    A* colsum = g.bias_grad ? bias_partial.data() + tm * n + j0 : nullptr;
    // Epilogue on one row of v (compute type), writing C (and aux).
    auto finish_row = [&](A* v, int64_t i) {
      if (g.bias)
        for (int64_t j = 0; j < cols; ++j) v[j] += bias[j0 + j];
      if (g.dgelu) {
        LoadN(auxp + i * g.ldc, pre.data(), cols);
        GeluGradRows(pre.data(), v, cols);
      } else {
        if (auxp) StoreN(v, auxp + i * g.ldc, cols);
        if (g.gelu) GeluRows(v, cols);
      }
      if (colsum)
        for (int64_t j = 0; j < cols; ++j) colsum[j] += v[j];
    };
    if constexpr (std::is_same_v<TC, A>) {
      // C is the compute type: accumulate in place (C_in copied in first).
      if (beta != A(0) && cinp != cp)
        for (int64_t i = 0; i < rows; ++i)
          std::copy(cinp + i * g.ldc, cinp + i * g.ldc + cols, cp + i * g.ldc);
      if (beta != A(0) && beta != A(1))
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) cp[i * g.ldc + j] *= beta;
      GemmKernel(g.trans_a, g.trans_b, rows, cols, k, alpha, ap, pa.ld, bp, pb.ld, beta != A(0), cp,
                 g.ldc);
      if (epilogue)
        for (int64_t i = 0; i < rows; ++i) finish_row(cp + i * g.ldc, i);
    } else {
      std::vector<A> tmp(static_cast<size_t>(rows * cols)), old(static_cast<size_t>(cols));
      GemmKernel(g.trans_a, g.trans_b, rows, cols, k, alpha, ap, pa.ld, bp, pb.ld, false,
                 tmp.data(), cols);
      for (int64_t i = 0; i < rows; ++i) {
        A* v = tmp.data() + i * cols;
        if (beta != A(0)) {
          LoadN(cinp + i * g.ldc, old.data(), cols);
          for (int64_t j = 0; j < cols; ++j) v[j] += beta * old[j];
        }
        finish_row(v, i);
        StoreN(v, cp + i * g.ldc, cols);
      }
    }
  });
  if (g.bias_grad) {
    return VisitFloat(g.bias_grad_dtype, "Gemm bias_grad_dtype", [&](auto gt) {
      using G = typename decltype(gt)::type;
      G* db = static_cast<G*>(g.bias_grad);
      ParallelBlocks(n, 1024, [&](int64_t c0, int64_t c1) {
        for (int64_t j = c0; j < c1; ++j) {
          A s = 0;
          for (int64_t tm = 0; tm < tiles_m; ++tm) s += bias_partial[tm * n + j];
          if (g.bias_grad_accumulate) s = Load1<A>(db[j]) + s;
          db[j] = Store1<G>(s);
        }
      });
      return Status::OK();
    });
  }
  return Status::OK();
}

Status CheckGemm(const GemmArgs& g) {
  const char* op = "Gemm";
  RETURN_IF_ERROR(CheckNonNegative(g.m, op, "m"));
  RETURN_IF_ERROR(CheckNonNegative(g.n, op, "n"));
  RETURN_IF_ERROR(CheckNonNegative(g.k, op, "k"));
  RETURN_IF_ERROR(CheckPositive(g.batch, op, "batch"));
  RETURN_IF_ERROR(
      CheckArg(g.gelu_aux == nullptr || g.gelu || g.dgelu, op, "gelu_aux given without gelu"));
  RETURN_IF_ERROR(CheckArg(!(g.gelu && g.dgelu), op, "gelu and dgelu are exclusive"));
  if (g.dgelu) {
    RETURN_IF_ERROR(CheckArg(g.gelu_aux != nullptr, op, "dgelu needs gelu_aux (the pre-activation)"));
    RETURN_IF_ERROR(CheckArg(g.bias == nullptr, op, "dgelu takes no bias"));
    RETURN_IF_ERROR(CheckArg(g.gelu_aux != g.c, op, "gelu_aux must not alias c"));
  }
  if (g.bias_grad) {
    RETURN_IF_ERROR(CheckArg(g.batch == 1, op, "bias_grad needs batch = 1"));
    RETURN_IF_ERROR(CheckArg(IsFloating(g.bias_grad_dtype), op,
                             "bias_grad_dtype " + std::string(DTypeName(g.bias_grad_dtype)) +
                                 " is not a float type"));
  }
  if (g.m == 0 || g.n == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(g.c, op, "c"));
  RETURN_IF_ERROR(CheckArg(g.ldc >= g.n, op,
                           "ldc = " + std::to_string(g.ldc) + " < n = " + std::to_string(g.n)));
  if (g.k > 0) {
    RETURN_IF_ERROR(CheckPtr(g.a, op, "a"));
    RETURN_IF_ERROR(CheckPtr(g.b, op, "b"));
    const int64_t min_lda = g.trans_a ? g.m : g.k, min_ldb = g.trans_b ? g.k : g.n;
    RETURN_IF_ERROR(CheckArg(g.lda >= min_lda, op,
                             "lda = " + std::to_string(g.lda) + " < " + std::to_string(min_lda) +
                                 (g.trans_a ? " (m, A transposed)" : " (k)")));
    RETURN_IF_ERROR(CheckArg(g.ldb >= min_ldb, op,
                             "ldb = " + std::to_string(g.ldb) + " < " + std::to_string(min_ldb) +
                                 (g.trans_b ? " (k, B transposed)" : " (n)")));
  }
  if (g.batch > 1) {
    RETURN_IF_ERROR(CheckArg(g.stride_a >= 0 && g.stride_b >= 0, op, "negative batch stride"));
    const int64_t c_extent = (g.m - 1) * g.ldc + g.n;
    RETURN_IF_ERROR(CheckArg(
        g.stride_c >= c_extent, op,
        "stride_c = " + std::to_string(g.stride_c) +
            " makes the batch items of C overlap (needs >= " + std::to_string(c_extent) + ")"));
  }
  return Status::OK();
}

}  // namespace

Status CpuBackend::Gemm(const GemmArgs& g) {
  RETURN_IF_ERROR(CheckGemm(g));
  // (No rows still writes a bias gradient: the empty sum.)
  if (g.n == 0 || (g.m == 0 && g.bias_grad == nullptr)) return Status::OK();
  return VisitFloat(g.ab_dtype, "Gemm ab_dtype", [&](auto ab) {
    using T = typename decltype(ab)::type;
    return VisitFloat(g.c_dtype, "Gemm c_dtype", [&](auto cd) {
      using TC = typename decltype(cd)::type;
      return Run("Gemm", [&] { return GemmTyped<T, TC>(g); });
    });
  });
}

}  // namespace strata::kernels::cpu
