// SPDX-License-Identifier: Apache-2.0
// Token + position embedding, forward and backward.
//
// Backward is deterministic: the positions of each token are gathered in
// ascending (b, t) order (a stable counting sort), each token's rows are
// summed in that order in the compute type and added to dwte once; dwpe[t]
// adds the sum over b in order.
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {
namespace {

Status CheckShape(const char* op, int64_t B, int64_t T, int64_t C) {
  RETURN_IF_ERROR(CheckNonNegative(B, op, "B"));
  RETURN_IF_ERROR(CheckNonNegative(T, op, "T"));
  return CheckPositive(C, op, "C");
}

// InvalidArgument naming the first token outside [0, limit) (limit < 0: no
// upper bound).
Status CheckTokens(const char* op, const int32_t* tokens, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || (limit >= 0 && tokens[i] >= limit)) {
      return InvalidArgument(std::string(op) + ": tokens[" + std::to_string(i) +
                             "] = " + std::to_string(tokens[i]) + " is outside [0, " +
                             (limit >= 0 ? std::to_string(limit) : std::string("vocab")) + ")");
    }
  }
  return Status::OK();
}

template <class T>
void ForwardTyped(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B, int64_t T_,
                  int64_t C) {
  using A = Acc<T>;
  ParallelBlocks(B * T_, std::max<int64_t>(1, 8192 / C), [&](int64_t r0, int64_t r1) {
    std::vector<A> a(C), p(C);
    for (int64_t r = r0; r < r1; ++r) {
      LoadN(wte + static_cast<int64_t>(tokens[r]) * C, a.data(), C);
      if (wpe) {
        LoadN(wpe + (r % T_) * C, p.data(), C);
        for (int64_t j = 0; j < C; ++j) a[j] += p[j];
      }
      StoreN(a.data(), out + r * C, C);
    }
  });
}

template <class T, class G>
void BackwardTyped(G* dwte, G* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t T_,
                   int64_t C, int64_t Vp) {
  using A = Acc<T>;
  const int64_t N = B * T_;
  // Stable counting sort of the positions by token.
  std::vector<int64_t> start(static_cast<size_t>(Vp + 1), 0);
  for (int64_t i = 0; i < N; ++i) ++start[tokens[i] + 1];
  for (int64_t v = 0; v < Vp; ++v) start[v + 1] += start[v];
  std::vector<int64_t> order(static_cast<size_t>(N)), fill(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < N; ++i) order[fill[tokens[i]]++] = i;
  std::vector<int32_t> used;
  for (int64_t v = 0; v < Vp; ++v)
    if (start[v + 1] > start[v]) used.push_back(static_cast<int32_t>(v));

  const int64_t rows_per_block = std::max<int64_t>(1, 4096 / C);
  ParallelBlocks(static_cast<int64_t>(used.size()), rows_per_block, [&](int64_t u0, int64_t u1) {
    std::vector<A> acc(C), row(C);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t v = used[u];
      std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t s = start[v]; s < start[v + 1]; ++s) {
        LoadN(dout + order[s] * C, row.data(), C);
        for (int64_t j = 0; j < C; ++j) acc[j] += row[j];
      }
      G* dst = dwte + v * C;
      LoadN(dst, row.data(), C);
      for (int64_t j = 0; j < C; ++j) row[j] += acc[j];
      StoreN(row.data(), dst, C);
    }
  });
  if (!dwpe) return;
  ParallelBlocks(T_, rows_per_block, [&](int64_t t0, int64_t t1) {
    std::vector<A> acc(C), row(C);
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t b = 0; b < B; ++b) {
        LoadN(dout + (b * T_ + t) * C, row.data(), C);
        for (int64_t j = 0; j < C; ++j) acc[j] += row[j];
      }
      G* dst = dwpe + t * C;
      LoadN(dst, row.data(), C);
      for (int64_t j = 0; j < C; ++j) row[j] += acc[j];
      StoreN(row.data(), dst, C);
    }
  });
}

}  // namespace

Status CpuBackend::EmbeddingForward(void* out, const int32_t* tokens, const void* wte,
                                    const void* wpe, int64_t B, int64_t T, int64_t C, DType dtype) {
  const char* op = "EmbeddingForward";
  RETURN_IF_ERROR(CheckShape(op, B, T, C));
  if (B * T == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(out, op, "out"));
  RETURN_IF_ERROR(CheckPtr(tokens, op, "tokens"));
  RETURN_IF_ERROR(CheckPtr(wte, op, "wte"));
  RETURN_IF_ERROR(CheckTokens(op, tokens, B * T, -1));
  return VisitFloat(dtype, op, [&](auto t) {
    using Ty = typename decltype(t)::type;
    return Run(op, [&] {
      ForwardTyped<Ty>(static_cast<Ty*>(out), tokens, static_cast<const Ty*>(wte),
                       static_cast<const Ty*>(wpe), B, T, C);
      return Status::OK();
    });
  });
}

Status CpuBackend::EmbeddingBackward(void* dwte, void* dwpe, DType grad_dtype, const void* dout,
                                     const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                                     int64_t Vp, DType dtype) {
  const char* op = "EmbeddingBackward";
  RETURN_IF_ERROR(CheckShape(op, B, T, C));
  RETURN_IF_ERROR(CheckPositive(Vp, op, "Vp"));
  if (B * T == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(dwte, op, "dwte"));
  RETURN_IF_ERROR(CheckPtr(dout, op, "dout"));
  RETURN_IF_ERROR(CheckPtr(tokens, op, "tokens"));
  RETURN_IF_ERROR(CheckTokens(op, tokens, B * T, Vp));
  return VisitFloat(dtype, op, [&](auto t) {
    using Ty = typename decltype(t)::type;
    return VisitFloat(grad_dtype, "EmbeddingBackward grad_dtype", [&](auto gt) {
      using G = typename decltype(gt)::type;
      return Run(op, [&] {
        BackwardTyped<Ty, G>(static_cast<G*>(dwte), static_cast<G*>(dwpe),
                             static_cast<const Ty*>(dout), tokens, B, T, C, Vp);
        return Status::OK();
      });
    });
  });
}

}  // namespace strata::kernels::cpu
