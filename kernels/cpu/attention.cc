// SPDX-License-Identifier: Apache-2.0
// Causal self-attention, forward and backward, with grouped-query attention
// (KV key/value heads, each read by H / KV query heads, never replicated):
// the forward takes one (batch, query head) per task, the backward one
// (batch, key/value head), its group's query heads in order, so d K and d V
// are summed in a fixed order.
//
// Per (b, h), in the compute type, query rows in blocks of kQueryBlock:
//   S = scale * Q K^T over keys 0..t1-1 (GemmKernel), causal mask,
//   e = exp(S - max), lse_t = max + log(sum e), P = e / sum e, O = P V.
// Backward recomputes P from the saved lse and uses Di = sum_d dO*O (the
// stored output):
//   dV += P^T dO, dP = dO V^T, dS = P * (dP - Di), dQ = scale dS K,
//   dK += scale dS^T Q.
// No T x T matrix is kept: at most kQueryBlock x T scores per task.
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm_kernel.h"

namespace strata::kernels::cpu {
namespace {

constexpr int64_t kQueryBlock = 64;

Status CheckShape(const AttentionShape& s, const char* op) {
  RETURN_IF_ERROR(CheckNonNegative(s.batch, op, "batch"));
  RETURN_IF_ERROR(CheckNonNegative(s.seq, op, "seq"));
  RETURN_IF_ERROR(CheckPositive(s.heads, op, "heads"));
  RETURN_IF_ERROR(CheckPositive(s.head_dim, op, "head_dim"));
  RETURN_IF_ERROR(CheckNonNegative(s.kv_heads, op, "kv_heads"));
  RETURN_IF_ERROR(CheckArg(s.heads % s.kv() == 0, op,
                           "kv_heads = " + std::to_string(s.kv_heads) + " does not divide heads = " +
                               std::to_string(s.heads)));
  return CheckArg(s.scale >= 0.f && std::isfinite(s.scale), op,
                  "scale = " + std::to_string(s.scale) + " must be finite and >= 0 (0: 1/sqrt(D))");
}

template <class A>
A SoftmaxScale(const AttentionShape& s) {
  return s.scale != 0.f ? static_cast<A>(s.scale) : A(1) / std::sqrt(static_cast<A>(s.head_dim));
}

// Copies the D columns at `col` of rows t of a [T, row_stride] block
// (batch item base) into dst[T, D] in the compute type.
template <class T, class A>
void Gather(const T* base, int64_t row_stride, int64_t col, int64_t T_, int64_t D, A* dst) {
  for (int64_t t = 0; t < T_; ++t) LoadN(base + t * row_stride + col, dst + t * D, D);
}

template <class T>
void ForwardTyped(const AttentionShape& s, T* out, Acc<T>* lse, const T* qkv) {
  using A = Acc<T>;
  const int64_t B = s.batch, T_ = s.seq, H = s.heads, D = s.head_dim, C = H * D;
  const int64_t KV = s.kv(), W = s.qkv_width(), group = H / KV;
  const A scale = SoftmaxScale<A>(s);
  ParallelFor(B * H, [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H, kvh = h / group;
    const T* base = qkv + b * T_ * W;
    std::vector<A> q(T_ * D), k(T_ * D), v(T_ * D);
    Gather(base, W, h * D, T_, D, q.data());
    Gather(base, W, C + kvh * D, T_, D, k.data());
    Gather(base, W, C + KV * D + kvh * D, T_, D, v.data());
    std::vector<A> sc(std::min(kQueryBlock, T_) * T_), o(std::min(kQueryBlock, T_) * D);
    for (int64_t q0 = 0; q0 < T_; q0 += kQueryBlock) {
      const int64_t rows = std::min(kQueryBlock, T_ - q0), t1 = q0 + rows;
      GemmKernel(false, true, rows, t1, D, scale, q.data() + q0 * D, D, k.data(), D, false,
                 sc.data(), t1);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t t = q0 + i;
        A* srow = sc.data() + i * t1;
        const A mx = LanesMax(srow, t + 1);
        ExpShiftRows(srow, t + 1, mx);
        const A sum = LanesSum(srow, t + 1);
        const A l = mx + std::log(sum), inv = A(1) / sum;
        for (int64_t j = 0; j <= t; ++j) srow[j] *= inv;
        for (int64_t j = t + 1; j < t1; ++j) srow[j] = 0;
        lse[(b * H + h) * T_ + t] = l;
      }
      GemmKernel(false, false, rows, D, t1, A(1), sc.data(), t1, v.data(), D, false, o.data(), D);
      for (int64_t i = 0; i < rows; ++i)
        StoreN(o.data() + i * D, out + (b * T_ + q0 + i) * C + h * D, D);
    }
  });
}

// The backward of query head h of batch item b: its dQ stored into dqkv,
// its share of dK and dV added to dk, dv ([T, D] each, the compute type).
template <class T, class A = Acc<T>>
void HeadBackward(const AttentionShape& s, int64_t b, int64_t h, const std::vector<A>& k, const std::vector<A>& v,
                  const T* dout, const T* qkv, const T* out, const A* lse, T* dqkv, std::vector<A>* dk,
                  std::vector<A>* dv) {
  const int64_t T_ = s.seq, D = s.head_dim, C = s.heads * D, W = s.qkv_width(), n = T_ * D;
  const A scale = SoftmaxScale<A>(s);
  std::vector<A> q(n), dob(n), ob(n), dq(n), di(T_);
  Gather(qkv + b * T_ * W, W, h * D, T_, D, q.data());
  Gather(dout + b * T_ * C, C, h * D, T_, D, dob.data());
  Gather(out + b * T_ * C, C, h * D, T_, D, ob.data());
  for (int64_t t = 0; t < T_; ++t) di[t] = LanesDot(dob.data() + t * D, ob.data() + t * D, D);
  const A* l = lse + (b * s.heads + h) * T_;
  const int64_t qb = std::min(kQueryBlock, T_);
  std::vector<A> p(qb * T_), dp(qb * T_);
  for (int64_t q0 = 0; q0 < T_; q0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, T_ - q0), t1 = q0 + rows;
    GemmKernel(false, true, rows, t1, D, scale, q.data() + q0 * D, D, k.data(), D, false, p.data(), t1);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t t = q0 + i;
      A* prow = p.data() + i * t1;
      ExpShiftRows(prow, t + 1, l[t]);
      for (int64_t j = t + 1; j < t1; ++j) prow[j] = 0;
    }
    // dV[0:t1] += P^T dO
    GemmKernel(true, false, t1, D, rows, A(1), p.data(), t1, dob.data() + q0 * D, D, true, dv->data(), D);
    // dP = dO V^T, then dS = P * (dP - Di) in place.
    GemmKernel(false, true, rows, t1, D, A(1), dob.data() + q0 * D, D, v.data(), D, false, dp.data(), t1);
    for (int64_t i = 0; i < rows; ++i) {
      const A d = di[q0 + i];
      A* prow = p.data() + i * t1;
      A* dprow = dp.data() + i * t1;
      for (int64_t j = 0; j < t1; ++j) dprow[j] = prow[j] * (dprow[j] - d);
    }
    // dQ = scale dS K; dK[0:t1] += scale dS^T Q.
    GemmKernel(false, false, rows, D, t1, scale, dp.data(), t1, k.data(), D, false, dq.data() + q0 * D, D);
    GemmKernel(true, false, t1, D, rows, scale, dp.data(), t1, q.data() + q0 * D, D, true, dk->data(), D);
  }
  T* dbase = dqkv + b * T_ * W;
  for (int64_t t = 0; t < T_; ++t) StoreN(dq.data() + t * D, dbase + t * W + h * D, D);
}

template <class T>
void BackwardTyped(const AttentionShape& s, T* dqkv, const T* dout, const T* qkv, const T* out,
                   const Acc<T>* lse) {
  using A = Acc<T>;
  const int64_t B = s.batch, T_ = s.seq, H = s.heads, D = s.head_dim, C = H * D;
  const int64_t KV = s.kv(), W = s.qkv_width(), group = H / KV, n = T_ * D;
  ParallelFor(B * KV, [&](int64_t bk) {
    const int64_t b = bk / KV, kvh = bk % KV;
    std::vector<A> k(n), v(n), dk(n, A(0)), dv(n, A(0));
    Gather(qkv + b * T_ * W, W, C + kvh * D, T_, D, k.data());
    Gather(qkv + b * T_ * W, W, C + KV * D + kvh * D, T_, D, v.data());
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
      HeadBackward<T>(s, b, h, k, v, dout, qkv, out, lse, dqkv, &dk, &dv);
    T* dbase = dqkv + b * T_ * W;
    for (int64_t t = 0; t < T_; ++t) {
      StoreN(dk.data() + t * D, dbase + t * W + C + kvh * D, D);
      StoreN(dv.data() + t * D, dbase + t * W + C + KV * D + kvh * D, D);
    }
  });
}

}  // namespace

Status CpuBackend::AttentionForward(const AttentionShape& s, void* out, float* lse, const void* qkv,
                                    void* workspace) {
  const char* op = "AttentionForward";
  RETURN_IF_ERROR(CheckShape(s, op));
  if (s.batch * s.seq == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(out, op, "out"));
  RETURN_IF_ERROR(CheckPtr(lse, op, "lse"));
  RETURN_IF_ERROR(CheckPtr(qkv, op, "qkv"));
  return VisitFloat(s.dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return Run(op, [&] {
      // lse holds doubles for f64 (see cpu_backend.h).
      ForwardTyped<T>(s, static_cast<T*>(out), reinterpret_cast<Acc<T>*>(lse),
                      static_cast<const T*>(qkv));
      return Status::OK();
    });
  });
}

Status CpuBackend::AttentionBackward(const AttentionShape& s, void* dqkv, const void* dout,
                                     const void* qkv, const void* out, const float* lse,
                                     void* workspace) {
  const char* op = "AttentionBackward";
  RETURN_IF_ERROR(CheckShape(s, op));
  if (s.batch * s.seq == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(dqkv, op, "dqkv"));
  RETURN_IF_ERROR(CheckPtr(dout, op, "dout"));
  RETURN_IF_ERROR(CheckPtr(qkv, op, "qkv"));
  RETURN_IF_ERROR(CheckPtr(out, op, "out"));
  RETURN_IF_ERROR(CheckPtr(lse, op, "lse"));
  return VisitFloat(s.dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return Run(op, [&] {
      BackwardTyped<T>(s, static_cast<T*>(dqkv), static_cast<const T*>(dout),
                       static_cast<const T*>(qkv), static_cast<const T*>(out),
                       reinterpret_cast<const Acc<T>*>(lse));
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cpu
