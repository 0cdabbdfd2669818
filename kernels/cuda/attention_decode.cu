// SPDX-License-Identifier: Apache-2.0
// Attention of new rows against a KV cache (Backend::AttentionDecode).
//
// Two kernels on the stream: the new rows' k and v are copied into the
// cache, then one block per (sequence, query head, new row) attends over the
// cached keys 0..P+i. Each of the block's kWarps warps takes every kWarps-th
// key, its lanes holding head dims lane, lane + 32, ... (D <= 32 kMaxPerLane):
// a warp computes q . k with a fixed shuffle tree and keeps an online softmax
// (running max, sum, and the weighted sum of v); the warps' partials are then
// combined in warp order. No atomics: the same inputs give the same bits.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxPerLane = 8;  // head_dim <= 256

// k_cache, v_cache: (B, cap, Ckv); qkv: (B, R, W). One thread per column of a new row.
template <typename T>
__global__ void kv_append_kernel(T* __restrict__ k_cache, T* __restrict__ v_cache, const T* __restrict__ qkv,
                                 int64_t rows, int64_t past, int64_t cap, int W, int q_cols, int Ckv,
                                 int64_t total) {
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = idx % Ckv, r = idx / Ckv;  // r = b * rows + i
    const int64_t b = r / rows, i = r % rows;
    const T* row = qkv + r * W;
    const int64_t at = (b * cap + past + i) * Ckv + c;
    k_cache[at] = row[q_cols + c];
    v_cache[at] = row[q_cols + Ckv + c];
  }
}

// out: (B, R, H*D). Grid (B*H, R), block kWarps * 32.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    attention_decode_kernel(T* __restrict__ out, const T* __restrict__ qkv, const T* __restrict__ k_cache,
                            const T* __restrict__ v_cache, int64_t rows, int64_t past, int64_t cap, int H,
                            int group, int D, float scale) {
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][kMaxPerLane * 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t b = blockIdx.x / H, i = blockIdx.y;
  const int h = blockIdx.x % H, g = h / group;
  const int Hkv = H / group, W = (H + 2 * Hkv) * D, Ckv = Hkv * D;
  const T* qrow = qkv + (b * rows + i) * W + h * D;
  float q[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int d = lane + 32 * t;
    q[t] = d < D ? ToF(qrow[d]) * scale : 0.f;
    acc[t] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int64_t keys = past + i + 1;
  const T* kbase = k_cache + b * cap * Ckv + g * D;
  const T* vbase = v_cache + b * cap * Ckv + g * D;
  for (int64_t j = warp; j < keys; j += kWarps) {
    const T* kr = kbase + j * Ckv;
    float dot = 0.f;
#pragma unroll
    for (int t = 0; t < kMaxPerLane; ++t) {
      const int d = lane + 32 * t;
      if (d < D) dot += q[t] * ToF(kr[d]);
    }
    const float s = WarpSum(dot);
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;
    const T* vr = vbase + j * Ckv;
#pragma unroll
    for (int t = 0; t < kMaxPerLane; ++t) {
      const int d = lane + 32 * t;
      if (d < D) acc[t] = acc[t] * corr + p * ToF(vr[d]);
    }
    m = m_new;
  }
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) s_acc[warp][lane + 32 * t] = acc[t];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_m[w]);
  float L = 0.f;
  for (int w = 0; w < kWarps; ++w)
    if (s_l[w] > 0.f) L += s_l[w] * __expf(s_m[w] - M);
  T* orow = out + (b * rows + i) * H * D + h * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w)
      if (s_l[w] > 0.f) o += s_acc[w][d] * __expf(s_m[w] - M);
    orow[d] = FromF<T>(o / L);
  }
}

}  // namespace

Status AttentionDecode(cudaStream_t stream, const DecodeAttentionShape& s, void* out, const void* qkv,
                       void* k_cache, void* v_cache) {
  if (s.batch * s.rows == 0) return Status::OK();
  if (s.head_dim > 32 * kMaxPerLane)
    return InvalidArgument("AttentionDecode: head_dim = " + std::to_string(s.head_dim) + " exceeds " +
                           std::to_string(32 * kMaxPerLane));
  if (s.rows > 65535) return InvalidArgument("AttentionDecode: rows = " + std::to_string(s.rows) + " exceeds 65535");
  const int H = static_cast<int>(s.heads), Hkv = static_cast<int>(s.kv()), D = static_cast<int>(s.head_dim);
  const int W = (H + 2 * Hkv) * D, Ckv = Hkv * D;
  const float scale = s.scale != 0.f ? s.scale : 1.f / sqrtf(static_cast<float>(D));
  return DispatchFloat(s.dtype, "AttentionDecode", [&](auto tag) -> Status {
    using T = decltype(tag);
    const int64_t total = s.batch * s.rows * Ckv;
    kv_append_kernel<T><<<ElementwiseGrid(total), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(k_cache), static_cast<T*>(v_cache), static_cast<const T*>(qkv), s.rows, s.past, s.capacity, W,
        H * D, Ckv, total);
    CUDA_RETURN_IF_LAUNCH_ERROR("kv_append_kernel");
    const dim3 grid(static_cast<unsigned>(s.batch * H), static_cast<unsigned>(s.rows));
    attention_decode_kernel<T><<<grid, kWarps * 32, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(qkv), static_cast<const T*>(k_cache),
        static_cast<const T*>(v_cache), s.rows, s.past, s.capacity, H, H / Hkv, D, scale);
    CUDA_RETURN_IF_LAUNCH_ERROR("attention_decode_kernel");
    return Status::OK();
  });
}

}  // namespace strata::kernels::cuda
