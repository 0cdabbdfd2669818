// SPDX-License-Identifier: Apache-2.0
// Rotary position embedding, forward and backward, one row per task block.
//
// Per row (position t = position_offset + row % T) and rotated head, pair i = (i, i + D/2):
//   forward   y_i = x_i c - x_{i+D/2} s,   y_{i+D/2} = x_{i+D/2} c + x_i s
//   backward  the transpose: the same with s negated,
// with c, s = cos, sin of the fp32 angle fp32(t * inv_freq[i]) rounded to
// fp32 (as transformers computes them, also for its float64 models), so the
// f64 mode matches a float64 transformers reference. Columns past the rotated
// heads are copied.
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels::cpu {
namespace {

Status CheckRope(const RopeArgs& a, const char* op) {
  RETURN_IF_ERROR(CheckNonNegative(a.batch, op, "batch"));
  RETURN_IF_ERROR(CheckNonNegative(a.seq, op, "seq"));
  RETURN_IF_ERROR(CheckNonNegative(a.position_offset, op, "position_offset"));
  RETURN_IF_ERROR(CheckPositive(a.head_dim, op, "head_dim"));
  RETURN_IF_ERROR(CheckNonNegative(a.heads, op, "heads"));
  RETURN_IF_ERROR(CheckArg(a.head_dim % 2 == 0, op, "head_dim = " + std::to_string(a.head_dim) + " must be even"));
  RETURN_IF_ERROR(CheckArg(a.heads * a.head_dim <= a.width, op,
                           "heads * head_dim = " + std::to_string(a.heads * a.head_dim) + " exceeds width = " +
                               std::to_string(a.width)));
  return CheckArg(a.rope.theta > 0.f && std::isfinite(a.rope.theta) && a.rope.factor > 0.f, op,
                  "rope theta " + std::to_string(a.rope.theta) + " and factor " + std::to_string(a.rope.factor) +
                      " must be finite and > 0");
}

// cos and sin of [T, D/2] angles (positions position_offset ..) in the compute type.
template <class A>
void Table(const RopeArgs& a, std::vector<A>* cs, std::vector<A>* sn) {
  const int64_t half = a.head_dim / 2;
  cs->resize(static_cast<size_t>(a.seq * half));
  sn->resize(cs->size());
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[static_cast<size_t>(i)] = RopeInvFreq(a.rope, a.head_dim, i);
  for (int64_t t = 0; t < a.seq; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(a.position_offset + t) * inv[static_cast<size_t>(i)];
      (*cs)[static_cast<size_t>(t * half + i)] = static_cast<A>(static_cast<float>(std::cos(static_cast<double>(angle))));
      (*sn)[static_cast<size_t>(t * half + i)] = static_cast<A>(static_cast<float>(std::sin(static_cast<double>(angle))));
    }
}

template <class T>
void Rotate(const RopeArgs& a, T* out, const T* in, bool inverse) {
  using A = Acc<T>;
  std::vector<A> cs, sn;
  Table(a, &cs, &sn);
  const int64_t W = a.width, D = a.head_dim, half = D / 2, R = a.heads * D;
  ParallelBlocks(a.batch * a.seq, std::max<int64_t>(1, 8192 / W), [&](int64_t r0, int64_t r1) {
    std::vector<A> row(static_cast<size_t>(W));
    for (int64_t r = r0; r < r1; ++r) {
      const A* c = cs.data() + (r % a.seq) * half;
      const A* s = sn.data() + (r % a.seq) * half;
      LoadN(in + r * W, row.data(), W);
      for (int64_t h0 = 0; h0 < R; h0 += D) {
        A* x = row.data() + h0;
        for (int64_t i = 0; i < half; ++i) {
          const A si = inverse ? -s[i] : s[i];
          const A lo = x[i], hi = x[i + half];
          x[i] = lo * c[i] - hi * si;
          x[i + half] = hi * c[i] + lo * si;
        }
      }
      StoreN(row.data(), out + r * W, W);
    }
  });
}

}  // namespace

Status CpuBackend::RopeForward(const RopeArgs& a, void* out, const void* in) {
  const char* op = "RopeForward";
  RETURN_IF_ERROR(CheckRope(a, op));
  if (a.batch * a.seq == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(out, op, "out"));
  RETURN_IF_ERROR(CheckPtr(in, op, "in"));
  return VisitFloat(a.dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return Run(op, [&] {
      Rotate<T>(a, static_cast<T*>(out), static_cast<const T*>(in), false);
      return Status::OK();
    });
  });
}

Status CpuBackend::RopeBackward(const RopeArgs& a, void* dx, const void* dy) {
  const char* op = "RopeBackward";
  RETURN_IF_ERROR(CheckRope(a, op));
  if (a.batch * a.seq == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(dx, op, "dx"));
  RETURN_IF_ERROR(CheckPtr(dy, op, "dy"));
  return VisitFloat(a.dtype, op, [&](auto t) {
    using T = typename decltype(t)::type;
    return Run(op, [&] {
      Rotate<T>(a, static_cast<T*>(dx), static_cast<const T*>(dy), true);
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cpu
