// SPDX-License-Identifier: Apache-2.0
// Causal flash attention (FlashAttention-2 style), forward and backward, on
// tensor cores through mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate):
// sm_80 and later, nothing sm_90-only. This file holds the forward kernel,
// what every backward scheme shares (delta, the GQA group sum) and the
// launchers (ops.h), which run the kernels of a variant (cuda_backend.h); the
// backward schemes' passes are in flash_attention_bwd_two_pass.cu,
// flash_attention_bwd_ds.cu and, for Hopper, the *_sm90.cu files.
//
// Layout (backend.h): qkv (B, T, C + 2 KV D) with q, k, v at column offsets
// 0, C, C + KV D and query head h at h*D..h*D+D-1 of q, its key/value head
// h / (H / KV) likewise of k and v (grouped-query attention; KV = H: 3C); out (B, T, C); lse (B, H, T) f32, the
// natural-log log-sum-exp of each query row's scaled scores.
//
// Tiles: flash_mma_tiles.cuh. Softmax runs in the log2 domain (scores
// pre-multiplied by scale*log2(e)).
//
// Forward: block = (b, h, 128 queries); K/V tiles of kBc keys stream through
// a double-buffered cp.async pipeline; online softmax; a warp skips the key
// tiles entirely above its rows; O staged through shared memory for 16-byte
// stores. No T x T matrix anywhere.
// Backward: delta = rowsum(dO * O) first; then the scheme's passes (dK/dV,
// then dQ; FlashDsPasses in ops.h); then, with grouped-query attention, the
// sum of each group's per-query-head dK/dV.

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_dispatch.cuh"
#include "kernels/cuda/flash_ds_panels.cuh"
#include "kernels/cuda/flash_mma_tiles.cuh"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

using namespace flash_mma;  // flash_mma_tiles.cuh

template <typename T, int kD, int kBc>
constexpr size_t FwdSmemBytes() {  // Q + 2 x (K, V)
  return static_cast<size_t>((RowBlock<kD>::kBr + 4 * kBc) * Tile<kD>::kStride) * sizeof(T);
}

// ---- kernels ----------------------------------------------------------------

// out: (B, T, C); lse: (B, H, T) f32; qkv: (B, T, 3C).
// grid (B*H, ceil(T / kBr)), the last query blocks (most keys) first.
// kBc keys per streamed K/V tile. kFma (needs scale_log2 > 0): the running
// max is kept in raw score units and each probability is exp2 of one FMA,
// s * scale_log2 - max * scale_log2 (FlashAttention-2's form), instead of a
// multiply per score before the max.
template <typename T, int kD, int kBc, bool kFma>
__global__ void __launch_bounds__(kThreads)
    flash_attention_forward_kernel(T* __restrict__ out, float* __restrict__ lse,
                                   const T* __restrict__ qkv, int seq, int H, int D, int C,
                                   float scale_log2, int KV) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kM = RowBlock<kD>::kM, kBr = RowBlock<kD>::kBr;
  constexpr int kS = Tile<kD>::kStride;
  constexpr int kKV = kBc * kS;  // one K or V stage
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (kBr, kS)
  T* sK = sQ + kBr * kS;                   // (2, kBc, kS)
  T* sV = sK + 2 * kKV;                    // (2, kBc, kS)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.x, b = bh / H, h = bh % H;
  const int qb = gridDim.y - 1 - blockIdx.y;
  const int q0 = qb * kBr;
  const int row0 = warp * 16 * kM;                  // this warp's first row in the block
  const int warp_last_query = q0 + row0 + 16 * kM - 1;
  const int64_t row_stride = C + 2LL * KV * D;  // q | k | v of KV key/value heads
  const T* q_g = qkv + static_cast<int64_t>(b) * seq * row_stride + h * D;
  const T* k_g = qkv + static_cast<int64_t>(b) * seq * row_stride + C + (h / (H / KV)) * D;
  const T* v_g = k_g + KV * D;

  LoadTile<T, kD, kBr>(sQ, q_g, q0, seq, D, row_stride);
  LoadTile<T, kD, kBc>(sK, k_g, 0, seq, D, row_stride);
  LoadTile<T, kD, kBc>(sV, v_g, 0, seq, D, row_stride);
  CpAsyncCommit();

  float o[kM][kD / 8][4];
  Zero(o);
  float m_run[kM][2], l_run[kM][2];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) m_run[mt][0] = m_run[mt][1] = -INFINITY, l_run[mt][0] = l_run[mt][1] = 0.f;
  // Causal: keys 0 .. min(seq, q0 + kBr) - 1.
  const int n_kv = (min(seq, q0 + kBr) + kBc - 1) / kBc;

  for (int j = 0; j < n_kv; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_kv) {
      LoadTile<T, kD, kBc>(sK + (stage ^ 1) * kKV, k_g, (j + 1) * kBc, seq, D, row_stride);
      LoadTile<T, kD, kBc>(sV + (stage ^ 1) * kKV, v_g, (j + 1) * kBc, seq, D, row_stride);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const int k0 = j * kBc;
    // Key 0 of tile 0 is visible to every row, so each row's running max is
    // finite after the first tile; later tiles may be wholly masked for a row
    // (row max -inf: nothing changes) or for the whole warp (skipped).
    if (k0 <= warp_last_query) {
      float s[kM][kBc / 8][4];
      Zero(s);
      MmaABt<T, kD, kM, kBc>(s, sQ, row0, sK + stage * kKV);
      const bool mask = k0 + kBc - 1 > q0 + row0;  // some key after some row of this warp
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float v = kFma ? s[mt][nt][e] : s[mt][nt][e] * scale_log2;
            if (mask) {
              const int key = k0 + nt * 8 + 2 * t4 + (e & 1);
              const int query = q0 + row0 + mt * 16 + g + (e >> 1) * 8;
              if (key > query) v = -INFINITY;
            }
            s[mt][nt][e] = v;
          }
        }
        // Online softmax; each row is spread over the 4 lanes of a quad.
        OnlineSoftmaxTile<kBc / 8, kD / 8, kFma>(s[mt], o[mt], m_run[mt], l_run[mt], scale_log2);
      }
      MmaPV<T, kD, kM, kBc>(o, s, sV + stage * kKV);
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    float row_lse[2];
    FinishSoftmaxRows<kD / 8, kFma>(o[mt], m_run[mt], l_run[mt], scale_log2, row_lse);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = q0 + row0 + mt * 16 + g + r * 8;
      if (t4 == 0 && q < seq) lse[static_cast<int64_t>(bh) * seq + q] = row_lse[r];
    }
  }
  AccToSmem<T, kD, kM>(sQ, row0, o, 1.f);  // sQ is free: every warp passed the loop's last barrier
  __syncthreads();
  StoreTile<T, kD, kBr>(out + static_cast<int64_t>(b) * seq * C + h * D, sQ, q0, seq, D, C);
#else
  __trap();
#endif
}

// delta: (B, H, T) f32 = rowsum(dO * O) per head; dout, out: (B, T, C).
// One warp per (b, t, h).
template <typename T>
__global__ void flash_attention_delta_kernel(float* __restrict__ delta, const T* __restrict__ dout,
                                             const T* __restrict__ out, int B, int seq, int H, int D,
                                             int C) {
  const int lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int64_t total = static_cast<int64_t>(B) * seq * H;
  if (w >= total) return;
  const int h = static_cast<int>(w % H);
  const int64_t bt = w / H;  // b * seq + t
  const T* po = out + bt * C + h * D;
  const T* pd = dout + bt * C + h * D;
  float s = 0.f;
  for (int d = lane; d < D; d += 32) s += ToF(po[d]) * ToF(pd[d]);
  s = WarpSum(s);
  if (lane == 0) {
    const int64_t b = bt / seq, t = bt % seq;
    delta[(b * H + h) * seq + t] = s;
  }
}

// Where the dK/dV kernels write: dqkv's k and v columns without GQA; with
// it, per query head into dkv_ws (B, T, 2C: dK | dV), summed over each
// group into dqkv by SumGroups (K and V themselves are never replicated).
template <typename T>
struct DkDvTargetT {
  T* dkv = nullptr;
  int64_t stride = 0, dv_off = 0;
};
template <typename T>
DkDvTargetT<T> DkDvTargetOf(const AttentionShape& s, void* dqkv, void* dkv_ws) {
  const int64_t C = s.heads * s.head_dim;
  DkDvTargetT<T> t;
  if (s.kv() == s.heads) {
    t.dkv = static_cast<T*>(dqkv) + C, t.stride = 3 * C, t.dv_off = C;
  } else {
    t.dkv = static_cast<T*>(dkv_ws), t.stride = 2 * C, t.dv_off = C;
  }
  return t;
}

// dqkv's k, v columns (B, T, KV D each) = the sums over each group's query
// heads of dkv_ws (B, T, 2C), in fp32 in head order (deterministic).
template <typename T>
__global__ void flash_gqa_sum_kernel(T* __restrict__ dqkv, const T* __restrict__ ws, int64_t rows, int H, int KV,
                                     int D) {
  const int64_t C = static_cast<int64_t>(H) * D, KVD = static_cast<int64_t>(KV) * D;
  const int64_t n = rows * 2 * KVD, W = C + 2 * KVD;
  const int group = H / KV;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / (2 * KVD), j = i % (2 * KVD);  // j: k (< KVD) or v column
    const int64_t which = j / KVD, kvh = (j % KVD) / D, d = j % D;
    const T* src = ws + r * 2 * C + which * C + kvh * group * D + d;
    float acc = 0.f;
    for (int g = 0; g < group; ++g) acc += ToF(src[static_cast<int64_t>(g) * D]);
    dqkv[r * W + C + j] = FromF<T>(acc);
  }
}

template <typename T>
Status SumGroups(cudaStream_t stream, const AttentionShape& s, void* dqkv, void* dkv_ws) {
  if (s.kv() == s.heads) return Status::OK();
  const int64_t rows = s.batch * s.seq, n = rows * 2 * s.kv() * s.head_dim;
  flash_gqa_sum_kernel<T><<<ElementwiseGrid(n), kElementwiseThreads, 0, stream>>>(
      static_cast<T*>(dqkv), static_cast<const T*>(dkv_ws), rows, static_cast<int>(s.heads),
      static_cast<int>(s.kv()), static_cast<int>(s.head_dim));
  CUDA_RETURN_IF_LAUNCH_ERROR("flash_gqa_sum_kernel");
  return Status::OK();
}

// The per-query-head dK/dV buffer's bytes (0 without GQA), 256-aligned.
size_t GqaBytes(const AttentionShape& s) {
  if (s.kv() == s.heads) return 0;
  return (static_cast<size_t>(s.batch * s.seq * 2 * s.heads * s.head_dim) * DTypeSize(s.dtype) + 255) &
         ~size_t{255};
}

// Workspace: the variant's (delta; with kDsBuffer the dS panels too), then
// with GQA the per-query-head dK/dV (GqaBytes).
size_t VariantBytes(const AttentionShape& s, const FlashVariant& variant) {
  if (variant.bwd == FlashBwdKernel::kTwoPass)
    return s.kv() == s.heads ? static_cast<size_t>(s.batch * s.heads * s.seq) * sizeof(float) : DsOffsetBytes(s);
  const size_t ds = static_cast<size_t>(s.batch * s.heads * DsHeadElems(s.seq)) * DTypeSize(s.dtype);
  return DsOffsetBytes(s) + (s.kv() == s.heads ? ds : (ds + 255) & ~size_t{255});
}

template <typename T, int kD, int kBc, bool kFma>
Status LaunchForward(cudaStream_t stream, const AttentionShape& s, float scale, void* out,
                     float* lse, const void* qkv) {
  const int H = static_cast<int>(s.heads), D = static_cast<int>(s.head_dim);
  const int seq = static_cast<int>(s.seq), C = H * D;
  constexpr size_t smem = FwdSmemBytes<T, kD, kBc>();
  auto kernel = flash_attention_forward_kernel<T, kD, kBc, kFma>;
  dim3 grid(static_cast<unsigned>(s.batch * s.heads), CeilDiv(seq, RowBlock<kD>::kBr));
  RETURN_IF_ERROR(LaunchWithSmem(kernel, grid, kThreads, smem, stream, static_cast<T*>(out), lse,
      static_cast<const T*>(qkv), seq, H, D, C, scale * kLog2e, static_cast<int>(s.kv())));
  return Status::OK();
}

// delta = rowsum(dO * O), the first (B, H, T) floats of the workspace, which
// every backward scheme's passes read.
template <typename T>
Status LaunchDelta(cudaStream_t stream, const AttentionShape& s, float* delta, const void* dout, const void* out) {
  const int B = static_cast<int>(s.batch), H = static_cast<int>(s.heads);
  const int D = static_cast<int>(s.head_dim), seq = static_cast<int>(s.seq), C = H * D;
  const int64_t rows = static_cast<int64_t>(B) * seq * H;
  flash_attention_delta_kernel<T><<<CeilDiv(rows, 8), 256, 0, stream>>>(
      delta, static_cast<const T*>(dout), static_cast<const T*>(out), B, seq, H, D, C);
  CUDA_RETURN_IF_LAUNCH_ERROR("flash_attention_delta_kernel");
  return Status::OK();
}

// The passes of the variant's backward scheme (kDsBuffer: also any other).
Status BackwardPasses(cudaStream_t stream, const AttentionShape& s, float scale, FlashBwdKernel bwd,
                      const FlashDsPasses& p) {
  switch (bwd) {
    case FlashBwdKernel::kTwoPass: return FlashAttentionBackwardTwoPass(stream, s, scale, p);
    case FlashBwdKernel::kWgmma: return FlashAttentionBackwardWgmmaPasses(stream, s, scale, p);
    case FlashBwdKernel::kTma: return FlashAttentionBackwardTmaPasses(stream, s, scale, p);
    default: return FlashAttentionBackwardDsBufferPasses(stream, s, scale, p);
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------

bool FlashAttentionSupports(const AttentionShape& s, int cc_major) {
  return cc_major >= 8 && (s.dtype == DType::kBF16 || s.dtype == DType::kF16) &&
         s.head_dim > 0 && s.head_dim <= 128 && s.head_dim % 8 == 0 &&
         s.seq <= int64_t{65535} * kDkDvKeys && s.batch * s.heads <= (int64_t{1} << 30);
}

size_t FlashAttentionWorkspaceBytes(const AttentionShape& s, const FlashVariant& variant) {
  return VariantBytes(s, variant) + GqaBytes(s);
}

Status FlashAttentionForward(cudaStream_t stream, const AttentionShape& s, float scale, void* out,
                             float* lse, const void* qkv, const FlashVariant& variant) {
  if (s.batch == 0 || s.seq == 0 || s.heads == 0) return Status::OK();
  return DispatchFlash(s, [&](auto tag, auto dim) -> Status {
    using T = decltype(tag);
    constexpr int kD = decltype(dim)::value;
    // The wgmma kernel and the FMA form keep the max in raw score units:
    // right only for a positive scale (else the Bc 64 kernel without it).
    const bool hopper = variant.fwd == FlashFwdKernel::kWgmma || variant.fwd == FlashFwdKernel::kTma ||
                        variant.fwd == FlashFwdKernel::kTmaPingpong;
    if (hopper && scale > 0.f) {
      if (variant.fwd == FlashFwdKernel::kWgmma) return FlashAttentionForwardWgmma(stream, s, scale, out, lse, qkv);
      return FlashAttentionForwardTma(stream, s, scale, out, lse, qkv,
                                      variant.fwd == FlashFwdKernel::kTmaPingpong);
    }
    if (variant.fwd == FlashFwdKernel::kBc64 || hopper) {
      if (scale > 0.f) return LaunchForward<T, kD, 64, true>(stream, s, scale, out, lse, qkv);
      return LaunchForward<T, kD, 64, false>(stream, s, scale, out, lse, qkv);
    }
    return LaunchForward<T, kD, RowBlock<kD>::kFwdBc, false>(stream, s, scale, out, lse, qkv);
  });
}

Status FlashAttentionBackward(cudaStream_t stream, const AttentionShape& s, float scale,
                              void* dqkv, const void* dout, const void* qkv, const void* out,
                              const float* lse, void* workspace, const FlashVariant& variant) {
  if (s.batch == 0 || s.seq == 0 || s.heads == 0) return Status::OK();
  // The passes pick the tile head dim themselves.
  return DispatchFlash(s, [&](auto tag, auto) -> Status {
    using T = decltype(tag);
    float* delta = static_cast<float*>(workspace);
    void* dkv_ws = static_cast<char*>(workspace) + VariantBytes(s, variant);
    RETURN_IF_ERROR(LaunchDelta<T>(stream, s, delta, dout, out));
    const auto t = DkDvTargetOf<T>(s, dqkv, dkv_ws);
    FlashDsPasses p;
    p.dqkv = dqkv, p.dkv = t.dkv, p.dkv_stride = t.stride, p.dv_off = t.dv_off;
    if (variant.bwd != FlashBwdKernel::kTwoPass) p.ds = static_cast<char*>(workspace) + DsOffsetBytes(s);
    p.dout = dout, p.qkv = qkv, p.lse = lse, p.delta = delta;
    RETURN_IF_ERROR(BackwardPasses(stream, s, scale, variant.bwd, p));
    return SumGroups<T>(stream, s, dqkv, dkv_ws);
  });
}

}  // namespace strata::kernels::cuda
