// SPDX-License-Identifier: Apache-2.0
// The dS-buffer backward of the mma.sync flash attention
// (FlashBwdKernel::kDsBuffer, cuda_backend.h); kWgmma and kTma run the same
// passes on wgmma (flash_attention_bwd_sm90.cu,
// flash_attention_bwd_tma_sm90.cu). Layout as flash_attention.cu's, tiles
// flash_mma_tiles.cuh; delta = rowsum(dO * O) comes from flash_attention.cu
// first, and with grouped-query attention the per-query-head dK/dV are
// summed there afterwards.
//
// Pass 1, one block of 8 warps per 128 keys (FlashAttention-2's layout):
// for each 64-query tile at or after the keys, S = Q K^T and dP = dO V^T
// with each warp owning 32 queries x 32 keys (flops per shared byte 16), P
// and dS = P (dP - delta) go through shared memory, then dV += P^T dO and
// dK += dS^T Q with each warp owning 32 keys x D/2 columns (21 flops per
// shared byte). dS (unscaled, rounded to T exactly as the mma operand of dQ
// would be) is also written to the workspace. Pass 2, one block per 64
// queries: dQ = scale * dS K, streaming the dS panel and K. 5 matmul units
// instead of the two-pass backward's 7 (flash_attention_bwd_two_pass.cu);
// every sum in a fixed order.
//
// Workspace: flash_ds_panels.cuh.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_dispatch.cuh"
#include "kernels/cuda/flash_ds_panels.cuh"
#include "kernels/cuda/flash_mma_tiles.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

using namespace flash_mma;  // flash_mma_tiles.cuh

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

// ---- helpers with explicit strides (the P and dS tiles) --------------------

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

}  // namespace

Status FlashAttentionBackwardDsBufferPasses(cudaStream_t stream, const AttentionShape& s, float scale,
                                            const FlashDsPasses& passes) {
  return DispatchFlash(s, [&](auto tag, auto dim) -> Status {
    return LaunchBackwardDs<decltype(tag), decltype(dim)::value>(stream, s, scale, passes);
  });
}

}  // namespace strata::kernels::cuda
