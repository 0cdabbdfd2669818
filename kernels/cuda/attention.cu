// SPDX-License-Identifier: Apache-2.0
// Causal attention, the simple way: heads split into (B*H, T, D) buffers,
// batched cuBLASLt GEMMs for Q K^T and P V, and a fused causal softmax over
// the fp32 score matrix (B*H, T, T) kept in the workspace. Every dtype, every
// head dim. It is the reference for the flash kernels on the GPU and the
// fallback where they do not apply (f32, head dims that are not multiples of
// 8 or larger than 128, GPUs older than sm_80).
//
// Grouped-query attention: k and v are split per query head (each key/value
// head copied for its group into the workspace), d K and d V summed per
// group when merged back.
//
// Workspace (AttentionWorkspaceBytes): q, k, v, o, do, dq, dk, dv (B*H, T, D)
// in dtype; S (B*H, T, T) f32; P (B*H, T, T) dtype; delta (B*H, T) f32.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

// ---- kernels ----------------------------------------------------------------

// dst: (B, H, T, D); src: rows of `src_stride` elements, (B, T, ...), head h
// of row (b, t) at columns col_off + (h / group)*D (group > 1: a key/value
// head of grouped-query attention, copied for each of its query heads into
// this workspace buffer).
template <typename T>
__global__ void split_heads_kernel(T* __restrict__ dst, const T* __restrict__ src,
                                   int64_t src_stride, int64_t col_off, int64_t B, int64_t seq,
                                   int64_t H, int64_t D, int64_t group = 1) {
  const int64_t n = B * H * seq * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t d = i % D, t = (i / D) % seq, h = (i / (D * seq)) % H, b = i / (D * seq * H);
    dst[i] = src[(b * seq + t) * src_stride + col_off + (h / group) * D + d];
  }
}

// dst rows of `dst_stride` elements get, at col_off + kvh*D, the sum over the
// `group` query heads kvh*group.. of src (B, H, T, D), in fp32 in head order.
template <typename T>
__global__ void merge_heads_sum_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t dst_stride,
                                       int64_t col_off, int64_t B, int64_t seq, int64_t H, int64_t D,
                                       int64_t group) {
  const int64_t KV = H / group, n = B * KV * seq * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t d = i % D, t = (i / D) % seq, kvh = (i / (D * seq)) % KV, b = i / (D * seq * KV);
    float acc = 0.f;
    for (int64_t g = 0; g < group; ++g) acc += ToF(src[((b * H + kvh * group + g) * seq + t) * D + d]);
    dst[(b * seq + t) * dst_stride + col_off + kvh * D + d] = FromF<T>(acc);
  }
}

// The inverse: dst rows of `dst_stride` elements get head h at col_off + h*D.
template <typename T>
__global__ void merge_heads_kernel(T* __restrict__ dst, const T* __restrict__ src,
                                   int64_t dst_stride, int64_t col_off, int64_t B, int64_t seq,
                                   int64_t H, int64_t D) {
  const int64_t n = B * H * seq * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t d = i % D, t = (i / D) % seq, h = (i / (D * seq)) % H, b = i / (D * seq * H);
    dst[(b * seq + t) * dst_stride + col_off + h * D + d] = src[i];
  }
}

// p: (BH, T, T) dtype; lse: (BH, T) f32; s: (BH, T, T) f32 scaled scores.
// One block per row (bh, i): softmax over columns 0..i, zeros after.
template <typename T>
__global__ void causal_softmax_kernel(T* __restrict__ p, float* __restrict__ lse,
                                      const float* __restrict__ s, int64_t seq) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t i = row % seq;
  const float* sr = s + row * seq;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, sr[j]);
  m = BlockMax(m, scratch);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) sum += expf(sr[j] - m);
  sum = BlockSum(sum, scratch);
  const float inv = 1.f / sum;
  T* pr = p + row * seq;
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x)
    pr[j] = FromF<T>(j <= i ? expf(sr[j] - m) * inv : 0.f);
  if (threadIdx.x == 0) lse[row] = m + logf(sum);
}

// p: (BH, T, T) = exp(s - lse[row]) for j <= i, else 0.
template <typename T>
__global__ void probs_from_lse_kernel(T* __restrict__ p, const float* __restrict__ s,
                                      const float* __restrict__ lse, int64_t rows, int64_t seq) {
  const int64_t n = rows * seq;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += stride) {
    const int64_t row = idx / seq, j = idx % seq, i = row % seq;
    p[idx] = FromF<T>(j <= i ? expf(s[idx] - lse[row]) : 0.f);
  }
}

// delta: (rows) = sum_d o[row, d] * dout[row, d]; o, dout: (rows, D). Warp per row.
template <typename T>
__global__ void row_dot_kernel(float* __restrict__ delta, const T* __restrict__ o,
                               const T* __restrict__ dout, int64_t rows, int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  float s = 0.f;
  for (int64_t d = lane; d < D; d += 32) s += ToF(o[row * D + d]) * ToF(dout[row * D + d]);
  s = WarpSum(s);
  if (lane == 0) delta[row] = s;
}

// p: (rows, T), overwritten with dS = P * (dP - delta[row]); dp: (rows, T) f32.
template <typename T>
__global__ void softmax_grad_kernel(T* p, const float* __restrict__ dp,
                                    const float* __restrict__ delta, int64_t rows, int64_t seq) {
  const int64_t n = rows * seq;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += stride)
    p[idx] = FromF<T>(ToF(p[idx]) * (dp[idx] - delta[idx / seq]));
}

// ---- workspace layout -------------------------------------------------------

struct Layout {
  size_t q, k, v, o, dout, dq, dk, dv, s, p, delta, total;
};

size_t Align256(size_t x) { return (x + 255) & ~size_t{255}; }

Layout MakeLayout(const AttentionShape& sh) {
  const size_t es = DTypeSize(sh.dtype);
  const size_t bh = static_cast<size_t>(sh.batch * sh.heads), T = static_cast<size_t>(sh.seq);
  const size_t btd = Align256(bh * T * static_cast<size_t>(sh.head_dim) * es);
  Layout l{};
  size_t off = 0;
  for (size_t* f : {&l.q, &l.k, &l.v, &l.o, &l.dout, &l.dq, &l.dk, &l.dv}) {
    *f = off;
    off += btd;
  }
  l.s = off;
  off += Align256(bh * T * T * sizeof(float));
  l.p = off;
  off += Align256(bh * T * T * es);
  l.delta = off;
  off += Align256(bh * T * sizeof(float));
  l.total = off;
  return l;
}

template <typename T>
T* At(void* ws, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(ws) + off);
}

}  // namespace

// ---- launchers ------------------------------------------------------------

size_t SimpleAttentionWorkspaceBytes(const AttentionShape& s) { return MakeLayout(s).total; }

Status SimpleAttentionForward(cudaStream_t stream, GemmRunner& gemm, const AttentionShape& sh,
                              float scale, void* out, float* lse, const void* qkv,
                              void* workspace) {
  const int64_t B = sh.batch, T = sh.seq, H = sh.heads, D = sh.head_dim, C = H * D;
  if (B == 0 || T == 0 || H == 0) return Status::OK();
  const Layout l = MakeLayout(sh);
  const int64_t BH = B * H;
  return DispatchFloat(sh.dtype, "AttentionForward", [&](auto tag) -> Status {
    using E = decltype(tag);
    const E* src = static_cast<const E*>(qkv);
    E* q = At<E>(workspace, l.q);
    E* k = At<E>(workspace, l.k);
    E* v = At<E>(workspace, l.v);
    E* o = At<E>(workspace, l.o);
    float* s = At<float>(workspace, l.s);
    E* p = At<E>(workspace, l.p);
    const int64_t n = BH * T * D, KV = sh.kv(), W = sh.qkv_width(), group = H / KV;
    for (auto [dst, off, grp] : {std::tuple{q, int64_t{0}, int64_t{1}}, std::tuple{k, C, group},
                                 std::tuple{v, C + KV * D, group}}) {
      split_heads_kernel<E><<<ElementwiseGrid(n), kElementwiseThreads, 0, stream>>>(
          dst, src, W, off, B, T, H, D, grp);
      CUDA_RETURN_IF_LAUNCH_ERROR("split_heads_kernel");
    }
    GemmArgs g;  // S = scale * Q K^T, (BH, T, T) f32
    g.trans_b = true;
    g.m = T, g.n = T, g.k = D;
    g.a = q, g.lda = D, g.b = k, g.ldb = D, g.c = s, g.ldc = T;
    g.ab_dtype = sh.dtype, g.c_dtype = DType::kF32;
    g.alpha = scale, g.beta = 0.f;
    g.batch = static_cast<int>(BH), g.stride_a = T * D, g.stride_b = T * D, g.stride_c = T * T;
    RETURN_IF_ERROR(gemm.Run(g));
    causal_softmax_kernel<E><<<static_cast<unsigned>(BH * T), 256, 0, stream>>>(p, lse, s, T);
    CUDA_RETURN_IF_LAUNCH_ERROR("causal_softmax_kernel");
    GemmArgs g2;  // O = P V, (BH, T, D)
    g2.m = T, g2.n = D, g2.k = T;
    g2.a = p, g2.lda = T, g2.b = v, g2.ldb = D, g2.c = o, g2.ldc = D;
    g2.ab_dtype = sh.dtype, g2.c_dtype = sh.dtype;
    g2.batch = static_cast<int>(BH), g2.stride_a = T * T, g2.stride_b = T * D, g2.stride_c = T * D;
    RETURN_IF_ERROR(gemm.Run(g2));
    merge_heads_kernel<E><<<ElementwiseGrid(n), kElementwiseThreads, 0, stream>>>(
        static_cast<E*>(out), o, C, 0, B, T, H, D);
    CUDA_RETURN_IF_LAUNCH_ERROR("merge_heads_kernel");
    return Status::OK();
  });
}

Status SimpleAttentionBackward(cudaStream_t stream, GemmRunner& gemm, const AttentionShape& sh,
                               float scale, void* dqkv, const void* dout, const void* qkv,
                               const void* out, const float* lse, void* workspace) {
  const int64_t B = sh.batch, T = sh.seq, H = sh.heads, D = sh.head_dim, C = H * D;
  if (B == 0 || T == 0 || H == 0) return Status::OK();
  const Layout l = MakeLayout(sh);
  const int64_t BH = B * H;
  return DispatchFloat(sh.dtype, "AttentionBackward", [&](auto tag) -> Status {
    using E = decltype(tag);
    E* q = At<E>(workspace, l.q);
    E* k = At<E>(workspace, l.k);
    E* v = At<E>(workspace, l.v);
    E* o = At<E>(workspace, l.o);
    E* dop = At<E>(workspace, l.dout);
    E* dq = At<E>(workspace, l.dq);
    E* dk = At<E>(workspace, l.dk);
    E* dv = At<E>(workspace, l.dv);
    float* s = At<float>(workspace, l.s);
    E* p = At<E>(workspace, l.p);
    float* delta = At<float>(workspace, l.delta);
    const int64_t n = BH * T * D, KV = sh.kv(), W = sh.qkv_width(), group = H / KV;
    const unsigned grid = ElementwiseGrid(n);
    const E* src = static_cast<const E*>(qkv);
    for (auto [dst, off, grp] : {std::tuple{q, int64_t{0}, int64_t{1}}, std::tuple{k, C, group},
                                 std::tuple{v, C + KV * D, group}}) {
      split_heads_kernel<E><<<grid, kElementwiseThreads, 0, stream>>>(dst, src, W, off, B, T, H, D, grp);
      CUDA_RETURN_IF_LAUNCH_ERROR("split_heads_kernel");
    }
    split_heads_kernel<E><<<grid, kElementwiseThreads, 0, stream>>>(o, static_cast<const E*>(out), C,
                                                                    0, B, T, H, D);
    CUDA_RETURN_IF_LAUNCH_ERROR("split_heads_kernel");
    split_heads_kernel<E><<<grid, kElementwiseThreads, 0, stream>>>(dop, static_cast<const E*>(dout),
                                                                    C, 0, B, T, H, D);
    CUDA_RETURN_IF_LAUNCH_ERROR("split_heads_kernel");

    const int bat = static_cast<int>(BH);
    GemmArgs gs;  // S = scale * Q K^T
    gs.trans_b = true;
    gs.m = T, gs.n = T, gs.k = D;
    gs.a = q, gs.lda = D, gs.b = k, gs.ldb = D, gs.c = s, gs.ldc = T;
    gs.ab_dtype = sh.dtype, gs.c_dtype = DType::kF32, gs.alpha = scale;
    gs.batch = bat, gs.stride_a = T * D, gs.stride_b = T * D, gs.stride_c = T * T;
    RETURN_IF_ERROR(gemm.Run(gs));
    probs_from_lse_kernel<E><<<ElementwiseGrid(BH * T * T), kElementwiseThreads, 0, stream>>>(
        p, s, lse, BH * T, T);
    CUDA_RETURN_IF_LAUNCH_ERROR("probs_from_lse_kernel");

    GemmArgs gv;  // dV = P^T dO
    gv.trans_a = true;
    gv.m = T, gv.n = D, gv.k = T;
    gv.a = p, gv.lda = T, gv.b = dop, gv.ldb = D, gv.c = dv, gv.ldc = D;
    gv.ab_dtype = sh.dtype, gv.c_dtype = sh.dtype;
    gv.batch = bat, gv.stride_a = T * T, gv.stride_b = T * D, gv.stride_c = T * D;
    RETURN_IF_ERROR(gemm.Run(gv));

    GemmArgs gp;  // dP = dO V^T, into S (f32)
    gp.trans_b = true;
    gp.m = T, gp.n = T, gp.k = D;
    gp.a = dop, gp.lda = D, gp.b = v, gp.ldb = D, gp.c = s, gp.ldc = T;
    gp.ab_dtype = sh.dtype, gp.c_dtype = DType::kF32;
    gp.batch = bat, gp.stride_a = T * D, gp.stride_b = T * D, gp.stride_c = T * T;
    RETURN_IF_ERROR(gemm.Run(gp));

    row_dot_kernel<E><<<CeilDiv(BH * T, 8), 256, 0, stream>>>(delta, o, dop, BH * T, D);
    CUDA_RETURN_IF_LAUNCH_ERROR("row_dot_kernel");
    softmax_grad_kernel<E><<<ElementwiseGrid(BH * T * T), kElementwiseThreads, 0, stream>>>(
        p, s, delta, BH * T, T);
    CUDA_RETURN_IF_LAUNCH_ERROR("softmax_grad_kernel");

    GemmArgs gq;  // dQ = scale * dS K
    gq.m = T, gq.n = D, gq.k = T;
    gq.a = p, gq.lda = T, gq.b = k, gq.ldb = D, gq.c = dq, gq.ldc = D;
    gq.ab_dtype = sh.dtype, gq.c_dtype = sh.dtype, gq.alpha = scale;
    gq.batch = bat, gq.stride_a = T * T, gq.stride_b = T * D, gq.stride_c = T * D;
    RETURN_IF_ERROR(gemm.Run(gq));

    GemmArgs gk;  // dK = scale * dS^T Q
    gk.trans_a = true;
    gk.m = T, gk.n = D, gk.k = T;
    gk.a = p, gk.lda = T, gk.b = q, gk.ldb = D, gk.c = dk, gk.ldc = D;
    gk.ab_dtype = sh.dtype, gk.c_dtype = sh.dtype, gk.alpha = scale;
    gk.batch = bat, gk.stride_a = T * T, gk.stride_b = T * D, gk.stride_c = T * D;
    RETURN_IF_ERROR(gemm.Run(gk));

    E* dst = static_cast<E*>(dqkv);
    merge_heads_kernel<E><<<grid, kElementwiseThreads, 0, stream>>>(dst, dq, W, 0, B, T, H, D);
    CUDA_RETURN_IF_LAUNCH_ERROR("merge_heads_kernel");
    for (auto [srcp, off] : {std::pair{dk, C}, std::pair{dv, C + KV * D}}) {
      if (group == 1) {
        merge_heads_kernel<E><<<grid, kElementwiseThreads, 0, stream>>>(dst, srcp, W, off, B, T, H, D);
        CUDA_RETURN_IF_LAUNCH_ERROR("merge_heads_kernel");
      } else {  // d K, d V of a key/value head: the sum over its query heads
        merge_heads_sum_kernel<E><<<ElementwiseGrid(B * KV * T * D), kElementwiseThreads, 0, stream>>>(
            dst, srcp, W, off, B, T, H, D, group);
        CUDA_RETURN_IF_LAUNCH_ERROR("merge_heads_sum_kernel");
      }
    }
    return Status::OK();
  });
}

}  // namespace strata::kernels::cuda
