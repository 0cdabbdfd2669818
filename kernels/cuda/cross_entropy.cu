// SPDX-License-Identifier: Apache-2.0
// Fused softmax + cross-entropy, forward and backward in one kernel.
//
// One block per row of logits. Pass 1 reads the row once with an online
// max/sum (each thread keeps its own running max and sum, merged across the
// block with fixed shuffle trees); pass 2 (only when dlogits is wanted)
// re-reads the row (from L2: a row is at most a few hundred KB) and writes
// (softmax - onehot) * dloss in place, padding columns zeroed. The probability
// matrix is never stored.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 512;

// ---- kernels ----------------------------------------------------------------

__device__ __forceinline__ void OnlineAdd(float x, float& m, float& s) {
  if (x > m) {
    s = s * expf(m - x) + 1.f;  // m = -inf at first: exp(-inf) = 0
    m = x;
  } else if (x != -INFINITY) {
    s += expf(x - m);
  }
}

// losses: (N) f32; dlogits: (N, Vp) or null, may alias logits; logits: (N, Vp);
// targets: (N) i32, < 0 ignored. kVec > 1 needs Vp % kVec == 0 and 16-byte
// aligned logits/dlogits. A target >= V gives loss NaN (the caller promised
// targets < V).
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(float* __restrict__ losses, T* dlogits, const T* logits,
                         const int32_t* __restrict__ targets, int64_t V, int64_t Vp,
                         float dloss) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int32_t target = targets[row];
  const T* x = logits + row * Vp;
  T* dx = dlogits ? dlogits + row * Vp : nullptr;
  if (target < 0) {  // ignored row: loss 0, gradient 0
    if (threadIdx.x == 0) losses[row] = 0.f;
    if (dx)
      for (int64_t c = threadIdx.x; c < Vp; c += blockDim.x) dx[c] = FromF<T>(0.f);
    return;
  }
  // Read before the barriers below: with dlogits aliasing logits, other
  // threads overwrite the row once the block has passed them.
  const float target_logit = (threadIdx.x == 0 && target < V) ? ToF(x[target]) : 0.f;
  const int64_t vec_end = kVec > 1 ? (V / kVec) * kVec : 0;  // packs entirely below V
  float m = -INFINITY, s = 0.f;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * kVec; c < vec_end;
       c += static_cast<int64_t>(blockDim.x) * kVec) {
    if constexpr (kVec > 1) {
      Pack<T> v = LoadPack(x + c);
#pragma unroll
      for (int i = 0; i < kVec; ++i) OnlineAdd(ToF(v.v[i]), m, s);
    }
  }
  for (int64_t c = vec_end + threadIdx.x; c < V; c += blockDim.x) OnlineAdd(ToF(x[c]), m, s);
  const float row_max = BlockMax(m, scratch);
  const float row_sum = BlockSum(m == -INFINITY ? 0.f : s * expf(m - row_max), scratch);
  const float lse = row_max + logf(row_sum);
  if (threadIdx.x == 0)
    losses[row] = target < V ? lse - target_logit : NAN;
  if (!dx) return;
  // Every thread has read its own elements above; each element is read and then
  // written by the same thread below, so dlogits may alias logits.
  const int64_t vp_vec_end = kVec > 1 ? Vp : 0;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * kVec; c < vp_vec_end;
       c += static_cast<int64_t>(blockDim.x) * kVec) {
    if constexpr (kVec > 1) {
      Pack<T> v = LoadPack(x + c);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        int64_t col = c + i;
        float g = 0.f;
        if (col < V) g = (expf(ToF(v.v[i]) - lse) - (col == target ? 1.f : 0.f)) * dloss;
        v.v[i] = FromF<T>(g);
      }
      StorePack(dx + c, v);
    }
  }
  if constexpr (kVec == 1) {
    for (int64_t c = threadIdx.x; c < Vp; c += blockDim.x) {
      float g = 0.f;
      if (c < V) g = (expf(ToF(x[c]) - lse) - (c == target ? 1.f : 0.f)) * dloss;
      dx[c] = FromF<T>(g);
    }
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------

Status CrossEntropy(cudaStream_t stream, float* losses, void* dlogits, const void* logits,
                    const int32_t* targets, int64_t N, int64_t V, int64_t Vp, float dloss,
                    DType dtype) {
  if (N == 0) return Status::OK();
  return DispatchFloat(dtype, "CrossEntropy", [&](auto tag) -> Status {
    using T = decltype(tag);
    constexpr int kN = Pack<T>::kN;
    const bool vec = Vp % kN == 0 && Aligned16(logits) && (!dlogits || Aligned16(dlogits));
    if (vec)
      cross_entropy_kernel<T, kN><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
          losses, static_cast<T*>(dlogits), static_cast<const T*>(logits), targets, V, Vp, dloss);
    else
      cross_entropy_kernel<T, 1><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
          losses, static_cast<T*>(dlogits), static_cast<const T*>(logits), targets, V, Vp, dloss);
    CUDA_RETURN_IF_LAUNCH_ERROR("cross_entropy_kernel");
    return Status::OK();
  });
}

}  // namespace strata::kernels::cuda
