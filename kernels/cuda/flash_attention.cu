// SPDX-License-Identifier: Apache-2.0
// Causal flash attention (FlashAttention-2 style), forward and backward, on
// tensor cores through mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate):
// sm_80 and later, nothing sm_90-only. This file holds the forward kernel,
// the dS-buffer backward, what every backward scheme shares (delta, the GQA
// group sum) and the launchers (ops.h), which run the kernels of a variant
// (cuda_backend.h); the two-pass backward is in
// flash_attention_bwd_two_pass.cu, the Hopper kernels in the *_sm90.cu files.
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
#include <type_traits>

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

// ---- helpers with explicit strides (the dS backward) -----------------------

// Stores a warp's kM x (16 x kN) fp32 tiles acc[kM][kN/8][4], times `mul`, as
// T into the shared matrix `s` (row stride `stride` elements) at rows row0..,
// columns col0...
template <typename T, int kM, int kN>
__device__ __forceinline__ void FragToSmem(T* s, int stride, int row0, int col0,
                                           const float (&acc)[kM][kN / 8][4], float mul) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int nt = 0; nt < kN / 8; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<uint32_t*>(s + (row0 + mt * 16 + g + h * 8) * stride + col0 + nt * 8 +
                                     2 * t4) =
            PackPair<T>(acc[mt][nt][2 * h] * mul, acc[mt][nt][2 * h + 1] * mul);
}

// acc[kM][kN/8][4] (rows m0.. of 16 kM, columns n0.. of kN) += A B over kK,
// A stored as (m rows, k columns) at sA (stride sa), B as (k rows, n columns)
// at sB (stride sb), both row-major in shared memory.
template <typename T, int kM, int kN, int kK>
__device__ __forceinline__ void MmaAB(float (&acc)[kM][kN / 8][4], const T* sA, int sa, int m0,
                                      const T* sB, int sb, int n0) {
  const int lane = threadIdx.x & 31;
  const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
      LdMatrixX4(a[mt], sA + (m0 + mt * 16 + (lane & 15)) * sa + ks * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t b[4];
      LdMatrixX4Trans(b, sB + (ks * 16 + (mi & 1) * 8 + ri) * sb + n0 + np * 16 + (mi >> 1) * 8);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        Mma16816<T>(acc[mt][2 * np], a[mt], b[0], b[1]);
        Mma16816<T>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// acc[kM][kN/8][4] (rows m0.. of 16 kM, columns n0.. of kN) += A^T B over kK,
// A stored as (k rows, m columns) at sA (stride sa) — the transpose of the
// operand, read with ldmatrix.trans — and B as (k rows, n columns) at sB.
template <typename T, int kM, int kN, int kK>
__device__ __forceinline__ void MmaAtB(float (&acc)[kM][kN / 8][4], const T* sA, int sa, int m0,
                                       const T* sB, int sb, int n0) {
  const int lane = threadIdx.x & 31;
  const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks) {
    uint32_t a[kM][4];
    // Matrix mi of the A fragment: m rows (mi & 1) * 8.., k columns (mi >> 1) * 8..;
    // stored transposed, so its 8 stored rows are k, its columns m.
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
      LdMatrixX4Trans(a[mt], sA + (ks * 16 + (mi >> 1) * 8 + ri) * sa + m0 + mt * 16 + (mi & 1) * 8);
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t b[4];
      LdMatrixX4Trans(b, sB + (ks * 16 + (mi & 1) * 8 + ri) * sb + n0 + np * 16 + (mi >> 1) * 8);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        Mma16816<T>(acc[mt][2 * np], a[mt], b[0], b[1]);
        Mma16816<T>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

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

// ---- backward with a dS buffer (variant bwd kDsBuffer) ---------------------
//
// Pass 1, one block of 8 warps per 128 keys (FlashAttention-2's layout):
// for each 64-query tile at or after the keys, S = Q K^T and dP = dO V^T
// with each warp owning 32 queries x 32 keys (flops per shared byte 16), P
// and dS = P (dP - delta) go through shared memory, then dV += P^T dO and
// dK += dS^T Q with each warp owning 32 keys x D/2 columns (21 flops per
// shared byte). dS (unscaled, rounded to T exactly as the mma operand of dQ
// would be) is also written to the workspace. Pass 2, one block per 64
// queries: dQ = scale * dS K, streaming the dS panel and K. 5 matmul units
// instead of 7; every sum in a fixed order.
//
// Workspace: flash_ds_panels.cuh.

constexpr int kDsThreads = 256;          // 8 warps
constexpr int kDsStride = kDsKeys + 8;   // sP / sdS row stride
constexpr int kDqKeys = 64;              // keys per dQ step
constexpr int kDqStride = kDqKeys + 8;   // dS tile row stride in the dQ kernel

template <typename T, int kD>
constexpr size_t DkDvDsSmemBytes() {  // K, V + 2 x (Q, dO) + P, dS + 2 x (lse, delta)
  return static_cast<size_t>(2 * kDsKeys * Tile<kD>::kStride + 4 * kDsQueries * Tile<kD>::kStride +
                             2 * kDsQueries * kDsStride) * sizeof(T) +
         4 * kDsQueries * sizeof(float);
}
template <typename T, int kD>
constexpr size_t DqDsSmemBytes() {  // 2 x (dS tile, K tile)
  return static_cast<size_t>(2 * kDsQueries * kDqStride + 2 * kDqKeys * Tile<kD>::kStride) *
         sizeof(T);
}

// dK, dV for one block of 128 keys (dqkv columns C.. and 2C..) and the dS
// tiles of those keys. grid (B*H, ceil(T/128)), the first key blocks (most
// queries) first.
template <typename T, int kD>
__global__ void __launch_bounds__(kDsThreads, 1)
    flash_attention_backward_dkdv_ds_kernel(T* __restrict__ dkv, T* __restrict__ ds_ws,
                                            const T* __restrict__ qkv, const T* __restrict__ dout,
                                            const float* __restrict__ lse,
                                            const float* __restrict__ delta, int seq, int H, int D,
                                            int C, float scale_log2, float scale, int KV,
                                            int64_t dkv_stride, int64_t dv_off) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kS = Tile<kD>::kStride;
  constexpr int kQT = kDsQueries * kS;
  constexpr int kDh = kD / 2;  // head columns per warp in the dK/dV products
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);  // (128, kS)
  T* sV = sK + kDsKeys * kS;               // (128, kS)
  T* sQ = sV + kDsKeys * kS;               // (2, 64, kS)
  T* sdO = sQ + 2 * kQT;                   // (2, 64, kS)
  T* sP = sdO + 2 * kQT;                   // (64, kDsStride): P as T, [query][key]
  T* sdS = sP + kDsQueries * kDsStride;    // (64, kDsStride): dS as T
  float* sL = reinterpret_cast<float*>(sdS + kDsQueries * kDsStride);  // (2, 64): lse*log2e, +inf past T
  float* sDelta = sL + 2 * kDsQueries;                                  // (2, 64): delta, 0 past T

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  // S/dP: this warp's 32 queries (wm) x 32 keys (wn) of the 64 x 128 tile.
  const int wm = warp & 1, wn = warp >> 1;
  // dK/dV: this warp's 32 keys (wk) x kD/2 head columns (wd).
  const int wk = warp & 3, wd = warp >> 2;
  const int bh = blockIdx.x, b = bh / H, h = bh % H;
  const int kb = blockIdx.y;
  const int k0 = kb * kDsKeys;
  const int64_t row_stride = C + 2LL * KV * D;  // q | k | v of KV key/value heads
  const T* q_g = qkv + static_cast<int64_t>(b) * seq * row_stride + h * D;
  const T* k_g = qkv + static_cast<int64_t>(b) * seq * row_stride + C + (h / (H / KV)) * D;
  const T* v_g = k_g + KV * D;
  const T* do_g = dout + static_cast<int64_t>(b) * seq * C + h * D;
  const float* lse_g = lse + static_cast<int64_t>(bh) * seq;
  const float* delta_g = delta + static_cast<int64_t>(bh) * seq;
  T* ds_head = ds_ws + static_cast<int64_t>(bh) * DsHeadElems(seq);

  auto load_queries = [&](int stage, int tile) {
    const int r0 = tile * kDsQueries;
    LoadTile<T, kD, kDsQueries, kDsThreads>(sQ + stage * kQT, q_g, r0, seq, D, row_stride);
    LoadTile<T, kD, kDsQueries, kDsThreads>(sdO + stage * kQT, do_g, r0, seq, D, C);
    if (threadIdx.x < kDsQueries) {
      const int q = r0 + threadIdx.x;
      sL[stage * kDsQueries + threadIdx.x] = q < seq ? lse_g[q] * kLog2e : INFINITY;
      sDelta[stage * kDsQueries + threadIdx.x] = q < seq ? delta_g[q] : 0.f;
    }
  };

  const int n_qt = (seq + kDsQueries - 1) / kDsQueries;
  const int qt_begin = k0 / kDsQueries;  // queries before k0 see none of these keys
  LoadTile<T, kD, kDsKeys, kDsThreads>(sK, k_g, k0, seq, D, row_stride);
  LoadTile<T, kD, kDsKeys, kDsThreads>(sV, v_g, k0, seq, D, row_stride);
  load_queries(0, qt_begin);
  CpAsyncCommit();

  float dk[2][kDh / 8][4], dv[2][kDh / 8][4];
  Zero(dk);
  Zero(dv);

  for (int it = qt_begin; it < n_qt; ++it) {
    const int stage = (it - qt_begin) & 1;
    if (it + 1 < n_qt) {
      load_queries(stage ^ 1, it + 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const T* q_s = sQ + stage * kQT;
    const T* do_s = sdO + stage * kQT;
    const float* l_s = sL + stage * kDsQueries;
    const float* d_s = sDelta + stage * kDsQueries;
    const int q_base = it * kDsQueries;

    float p[2][4][4], dp[2][4][4];  // 32 queries x 32 keys
    Zero(p);
    Zero(dp);
    const int kw0 = k0 + wn * 32;  // the warp's first key
    // Some key of the warp's at or before some query of the warp's (else P = 0).
    if (kw0 <= q_base + wm * 32 + 31) {
      MmaABt<T, kD, 2, 32>(p, q_s, wm * 32, sK + wn * 32 * kS);
      MmaABt<T, kD, 2, 32>(dp, do_s, wm * 32, sV + wn * 32 * kS);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int ql = wm * 32 + mt * 16 + g + (e >> 1) * 8;
            const int key = kw0 + nt * 8 + 2 * t4 + (e & 1);
            float pv = exp2f(p[mt][nt][e] * scale_log2 - l_s[ql]);
            if (key > q_base + ql) pv = 0.f;
            p[mt][nt][e] = pv;
            dp[mt][nt][e] = pv * (dp[mt][nt][e] - d_s[ql]);
          }
        }
      }
    }
    FragToSmem<T, 2, 32>(sP, kDsStride, wm * 32, wn * 32, p, 1.f);
    FragToSmem<T, 2, 32>(sdS, kDsStride, wm * 32, wn * 32, dp, 1.f);
    __syncthreads();
    // dV += P^T dO, dK += dS^T Q (the scale is applied at the end).
    MmaAtB<T, 2, kDh, kDsQueries>(dv, sP, kDsStride, wk * 32, do_s, kS, wd * kDh);
    MmaAtB<T, 2, kDh, kDsQueries>(dk, sdS, kDsStride, wk * 32, q_s, kS, wd * kDh);
    // The dS tile to panel `it`, key block kb.
    {
      T* panel = ds_head + DsPanelOffset(it);
      const int64_t width = DsPanelWidth(it);
      constexpr int kChunks = kDsKeys / 8;
      for (int i = threadIdx.x; i < kDsQueries * kChunks; i += kDsThreads) {
        const int r = i / kChunks, c = i % kChunks;
        *reinterpret_cast<int4*>(panel + r * width + k0 + c * 8) =
            *reinterpret_cast<const int4*>(sdS + r * kDsStride + c * 8);
      }
    }
    __syncthreads();  // sP/sdS and this stage are rewritten by the next iteration
  }

  // sK and sV are free after the loop's last barrier.
  FragToSmem<T, 2, kDh>(sK, kS, wk * 32, wd * kDh, dk, scale);
  FragToSmem<T, 2, kDh>(sV, kS, wk * 32, wd * kDh, dv, 1.f);
  __syncthreads();
  T* dk_g = dkv + static_cast<int64_t>(b) * seq * dkv_stride + h * D;
  StoreTile<T, kD, kDsKeys, kDsThreads>(dk_g, sK, k0, seq, D, dkv_stride);
  StoreTile<T, kD, kDsKeys, kDsThreads>(dk_g + dv_off, sV, k0, seq, D, dkv_stride);
#else
  __trap();
#endif
}

// dQ = scale * dS K for one 64-query tile (one dS panel): dqkv columns 0..
// grid (B*H, ceil(T/64)), the last query tiles (most keys) first. 4 warps,
// each 32 queries x kD/2 head columns.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_attention_backward_dq_ds_kernel(T* __restrict__ dqkv, const T* __restrict__ ds_ws,
                                          const T* __restrict__ qkv, int seq, int H, int D, int C,
                                          float scale, int KV) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kS = Tile<kD>::kStride;
  constexpr int kDh = kD / 2;
  constexpr int kDsT = kDsQueries * kDqStride;  // one dS stage
  constexpr int kKT = kDqKeys * kS;             // one K stage
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sdS = reinterpret_cast<T*>(smem_raw);  // (2, 64, kDqStride)
  T* sK = sdS + 2 * kDsT;                   // (2, 64, kS)

  const int warp = threadIdx.x >> 5;
  const int wm = warp & 1, wd = warp >> 1;
  const int bh = blockIdx.x, b = bh / H, h = bh % H;
  const int m = gridDim.y - 1 - blockIdx.y;
  const int q0 = m * kDsQueries;
  const int64_t row_stride = C + 2LL * KV * D;
  const T* k_g = qkv + static_cast<int64_t>(b) * seq * row_stride + C + (h / (H / KV)) * D;
  const T* panel = ds_ws + static_cast<int64_t>(bh) * DsHeadElems(seq) + DsPanelOffset(m);
  const int64_t width = DsPanelWidth(m);

  auto load = [&](int stage, int j) {
    LoadTile<T, kD, kDqKeys>(sK + stage * kKT, k_g, j * kDqKeys, seq, D, row_stride);
    constexpr int kChunks = kDqKeys / 8;
    for (int i = threadIdx.x; i < kDsQueries * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      CpAsync16(sdS + stage * kDsT + r * kDqStride + c * 8,
                panel + r * width + j * kDqKeys + c * 8, true);
    }
  };

  // Keys 0 .. min(seq, q0 + 64) - 1; all inside the panel's width.
  const int n_kv = (min(seq, q0 + kDsQueries) + kDqKeys - 1) / kDqKeys;
  load(0, 0);
  CpAsyncCommit();
  float dq[2][kDh / 8][4];
  Zero(dq);
  for (int j = 0; j < n_kv; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_kv) {
      load(stage ^ 1, j + 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    MmaAB<T, 2, kDh, kDqKeys>(dq, sdS + stage * kDsT, kDqStride, wm * 32, sK + stage * kKT, kS,
                              wd * kDh);
    __syncthreads();
  }
  FragToSmem<T, 2, kDh>(sK, kS, wm * 32, wd * kDh, dq, scale);  // free after the last barrier
  __syncthreads();
  StoreTile<T, kD, kDsQueries>(dqkv + static_cast<int64_t>(b) * seq * row_stride + h * D, sK, q0,
                               seq, D, row_stride);
#else
  __trap();
#endif
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

template <typename T, int kD>
Status LaunchBackwardDs(cudaStream_t stream, const AttentionShape& s, float scale, const FlashDsPasses& p) {
  const int B = static_cast<int>(s.batch), H = static_cast<int>(s.heads);
  const int D = static_cast<int>(s.head_dim), seq = static_cast<int>(s.seq), C = H * D;
  {
    dim3 grid(static_cast<unsigned>(B * H), CeilDiv(seq, kDsKeys));
    constexpr size_t smem = DkDvDsSmemBytes<T, kD>();
    auto kernel = flash_attention_backward_dkdv_ds_kernel<T, kD>;
    RETURN_IF_ERROR(LaunchWithSmem(kernel, grid, kDsThreads, smem, stream, static_cast<T*>(p.dkv),
        static_cast<T*>(p.ds), static_cast<const T*>(p.qkv), static_cast<const T*>(p.dout), p.lse, p.delta, seq, H,
        D, C, scale * kLog2e, scale, static_cast<int>(s.kv()), p.dkv_stride, p.dv_off));
  }
  {
    dim3 grid(static_cast<unsigned>(B * H), CeilDiv(seq, kDsQueries));
    constexpr size_t smem = DqDsSmemBytes<T, kD>();
    auto kernel = flash_attention_backward_dq_ds_kernel<T, kD>;
    RETURN_IF_ERROR(LaunchWithSmem(kernel, grid, kThreads, smem, stream, static_cast<T*>(p.dqkv),
        static_cast<const T*>(p.ds), static_cast<const T*>(p.qkv), seq, H, D, C, scale, static_cast<int>(s.kv())));
  }
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

// Workspace: the variant's (delta; with kDsBuffer the dS panels too), then
// with GQA the per-query-head dK/dV (GqaBytes).
size_t VariantBytes(const AttentionShape& s, const FlashVariant& variant) {
  if (variant.bwd == FlashBwdKernel::kTwoPass)
    return s.kv() == s.heads ? static_cast<size_t>(s.batch * s.heads * s.seq) * sizeof(float) : DsOffsetBytes(s);
  const size_t ds = static_cast<size_t>(s.batch * s.heads * DsHeadElems(s.seq)) * DTypeSize(s.dtype);
  return DsOffsetBytes(s) + (s.kv() == s.heads ? ds : (ds + 255) & ~size_t{255});
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
      // The FMA form keeps the max in raw score units: right only for a positive scale.
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

Status FlashAttentionBackwardDsBufferPasses(cudaStream_t stream, const AttentionShape& s, float scale,
                                            const FlashDsPasses& passes) {
  return DispatchFlash(s, [&](auto tag, auto dim) -> Status {
    return LaunchBackwardDs<decltype(tag), decltype(dim)::value>(stream, s, scale, passes);
  });
}

}  // namespace strata::kernels::cuda
