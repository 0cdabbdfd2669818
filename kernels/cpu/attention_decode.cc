// SPDX-License-Identifier: Apache-2.0
// Attention of new rows against a KV cache (Backend::AttentionDecode): the
// new rows' k and v are copied into the cache, then one task per (sequence,
// query head) computes, for each new row in the compute type,
//   s_j = scale q . k_j (j <= P + i), p = softmax(s), out = sum_j p_j v_j,
// over the cached keys in order: deterministic for any thread count.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {
namespace {

template <class T>
void AppendToCache(const DecodeAttentionShape& s, const T* qkv, T* k_cache, T* v_cache) {
  const int64_t H = s.heads, Hkv = s.kv(), D = s.head_dim, W = (H + 2 * Hkv) * D, Ckv = Hkv * D;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.rows; ++i) {
      const T* row = qkv + (b * s.rows + i) * W;
      const int64_t at = (b * s.capacity + s.past + i) * Ckv;
      std::memcpy(k_cache + at, row + H * D, static_cast<size_t>(Ckv) * sizeof(T));
      std::memcpy(v_cache + at, row + H * D + Ckv, static_cast<size_t>(Ckv) * sizeof(T));
    }
}

template <class T>
void DecodeTyped(const DecodeAttentionShape& s, T* out, const T* qkv, const T* k_cache, const T* v_cache) {
  using A = Acc<T>;
  const int64_t H = s.heads, Hkv = s.kv(), D = s.head_dim, W = (H + 2 * Hkv) * D, Ckv = Hkv * D;
  const int64_t group = H / Hkv, keys = s.past + s.rows;
  const A scale = s.scale != 0.f ? static_cast<A>(s.scale) : A(1) / std::sqrt(static_cast<A>(D));
  ParallelFor(s.batch * H, [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H, g = h / group;
    std::vector<A> q(static_cast<size_t>(D)), k(static_cast<size_t>(keys * D)), sc(static_cast<size_t>(keys)),
        o(static_cast<size_t>(D));
    for (int64_t j = 0; j < keys; ++j) LoadN(k_cache + (b * s.capacity + j) * Ckv + g * D, k.data() + j * D, D);
    std::vector<A> v(static_cast<size_t>(keys * D));
    for (int64_t j = 0; j < keys; ++j) LoadN(v_cache + (b * s.capacity + j) * Ckv + g * D, v.data() + j * D, D);
    for (int64_t i = 0; i < s.rows; ++i) {
      LoadN(qkv + (b * s.rows + i) * W + h * D, q.data(), D);
      const int64_t n = s.past + i + 1;  // the keys row i sees
      A mx = -std::numeric_limits<A>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        A dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[static_cast<size_t>(d)] * k[static_cast<size_t>(j * D + d)];
        sc[static_cast<size_t>(j)] = dot * scale;
        mx = std::max(mx, sc[static_cast<size_t>(j)]);
      }
      A sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += sc[static_cast<size_t>(j)] = std::exp(sc[static_cast<size_t>(j)] - mx);
      std::fill(o.begin(), o.end(), A(0));
      for (int64_t j = 0; j < n; ++j) {
        const A p = sc[static_cast<size_t>(j)] / sum;
        for (int64_t d = 0; d < D; ++d) o[static_cast<size_t>(d)] += p * v[static_cast<size_t>(j * D + d)];
      }
      StoreN(o.data(), out + (b * s.rows + i) * H * D + h * D, D);
    }
  });
}

}  // namespace

Status CpuBackend::AttentionDecode(const DecodeAttentionShape& s, void* out, const void* qkv, void* k_cache,
                                   void* v_cache) {
  const char* op = "AttentionDecode";
  RETURN_IF_ERROR(CheckDecodeAttentionShape(s, op));
  if (s.batch * s.rows == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(out, op, "out"));
  RETURN_IF_ERROR(CheckPtr(qkv, op, "qkv"));
  RETURN_IF_ERROR(CheckPtr(k_cache, op, "k_cache"));
  RETURN_IF_ERROR(CheckPtr(v_cache, op, "v_cache"));
  return VisitFloat(s.dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return Run(op, [&] {
      AppendToCache<T>(s, static_cast<const T*>(qkv), static_cast<T*>(k_cache), static_cast<T*>(v_cache));
      DecodeTyped<T>(s, static_cast<T*>(out), static_cast<const T*>(qkv), static_cast<const T*>(k_cache),
                     static_cast<const T*>(v_cache));
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cpu
