// SPDX-License-Identifier: Apache-2.0
// The two-pass backward of the mma.sync flash attention
// (FlashBwdKernel::kTwoPass, cuda_backend.h), deterministic (no atomics):
// one kernel per 64-key block (16 keys per warp) accumulates dK and dV over
// the query tiles (32 queries each) at or after it, and one kernel per
// 128-query block accumulates dQ over the key tiles at or before it. This
// recomputes P once more than FlashAttention-2's atomic dQ, and keeps every
// sum in a fixed order. Layout as flash_attention.cu's, tiles
// flash_mma_tiles.cuh; delta = rowsum(dO * O) comes from flash_attention.cu
// first, and with grouped-query attention the per-query-head dK/dV are summed
// there afterwards.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_dispatch.cuh"
#include "kernels/cuda/flash_mma_tiles.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

using namespace flash_mma;  // flash_mma_tiles.cuh

constexpr int kBwdQueries = 32;  // queries per streamed tile (dK/dV)

template <typename T, int kD>
constexpr size_t DkDvSmemBytes() {  // K, V + 2 x (Q, dO) + 2 x (lse, delta)
  return static_cast<size_t>((2 * kDkDvKeys + 4 * kBwdQueries) * Tile<kD>::kStride) * sizeof(T) +
         4 * kBwdQueries * sizeof(float);
}
template <typename T, int kD>
constexpr size_t DqSmemBytes() {  // Q, dO + 2 x (K, V)
  return static_cast<size_t>((2 * RowBlock<kD>::kBr + 4 * RowBlock<kD>::kDqBc) *
                             Tile<kD>::kStride) *
         sizeof(T);
}

// dK, dV for one block of 64 keys: dqkv columns C.. and 2C.. (B, T, 3C).
// grid (B*H, ceil(T/64)); key block kb = blockIdx.y (the first blocks see the
// most queries and start first).
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_attention_backward_dkdv_kernel(T* __restrict__ dkv, const T* __restrict__ qkv,
                                         const T* __restrict__ dout, const float* __restrict__ lse,
                                         const float* __restrict__ delta, int seq, int H, int D,
                                         int C, float scale_log2, float scale, int KV,
                                         int64_t dkv_stride, int64_t dv_off) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kS = Tile<kD>::kStride;
  constexpr int kQT = kBwdQueries * kS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);  // (64, kS)
  T* sV = sK + kDkDvKeys * kS;             // (64, kS)
  T* sQ = sV + kDkDvKeys * kS;             // (2, 32, kS)
  T* sdO = sQ + 2 * kQT;                   // (2, 32, kS)
  float* sL = reinterpret_cast<float*>(sdO + 2 * kQT);  // (2, 32): lse * log2(e), +inf past T
  float* sDelta = sL + 2 * kBwdQueries;                  // (2, 32): delta, 0 past T

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.x, b = bh / H, h = bh % H;
  const int kb = blockIdx.y;
  const int k0 = kb * kDkDvKeys;
  const int row0 = warp * 16;  // this warp's 16 keys in the block
  const int64_t row_stride = C + 2LL * KV * D;  // q | k | v of KV key/value heads
  const T* q_g = qkv + static_cast<int64_t>(b) * seq * row_stride + h * D;
  const T* k_g = qkv + static_cast<int64_t>(b) * seq * row_stride + C + (h / (H / KV)) * D;
  const T* v_g = k_g + KV * D;
  const T* do_g = dout + static_cast<int64_t>(b) * seq * C + h * D;
  const float* lse_g = lse + static_cast<int64_t>(bh) * seq;
  const float* delta_g = delta + static_cast<int64_t>(bh) * seq;

  auto load_queries = [&](int stage, int tile) {
    const int r0 = tile * kBwdQueries;
    LoadTile<T, kD, kBwdQueries>(sQ + stage * kQT, q_g, r0, seq, D, row_stride);
    LoadTile<T, kD, kBwdQueries>(sdO + stage * kQT, do_g, r0, seq, D, C);
    if (threadIdx.x < kBwdQueries) {
      const int q = r0 + threadIdx.x;
      sL[stage * kBwdQueries + threadIdx.x] = q < seq ? lse_g[q] * kLog2e : INFINITY;
      sDelta[stage * kBwdQueries + threadIdx.x] = q < seq ? delta_g[q] : 0.f;
    }
  };

  const int n_qt = (seq + kBwdQueries - 1) / kBwdQueries;
  const int qt_begin = k0 / kBwdQueries;  // queries before k0 see none of these keys
  LoadTile<T, kD, kDkDvKeys>(sK, k_g, k0, seq, D, row_stride);
  LoadTile<T, kD, kDkDvKeys>(sV, v_g, k0, seq, D, row_stride);
  load_queries(0, qt_begin);
  CpAsyncCommit();

  float dk[1][kD / 8][4], dv[1][kD / 8][4];
  Zero(dk);
  Zero(dv);
  const int my_key0 = k0 + row0 + g;  // keys of this lane's rows: my_key0, my_key0 + 8

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
    const float* l_s = sL + stage * kBwdQueries;
    const float* d_s = sDelta + stage * kBwdQueries;
    const int q_base = it * kBwdQueries;

    // The warp's keys are all after the tile's last query: nothing to add.
    if (q_base + kBwdQueries - 1 >= k0 + row0) {
      // P^T (16 keys x 32 queries) = exp2(K Q^T * scale_log2 - lse2), causal.
      float pt[1][kBwdQueries / 8][4];
      Zero(pt);
      MmaABt<T, kD, 1, kBwdQueries>(pt, sK, row0, q_s);
#pragma unroll
      for (int nt = 0; nt < kBwdQueries / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ql = nt * 8 + 2 * t4 + (e & 1);
          const int key = my_key0 + (e >> 1) * 8;
          float p = exp2f(pt[0][nt][e] * scale_log2 - l_s[ql]);
          if (q_base + ql < key) p = 0.f;
          pt[0][nt][e] = p;
        }
      }
      // dP^T (16 keys x 32 queries) = V dO^T.
      float dpt[1][kBwdQueries / 8][4];
      Zero(dpt);
      MmaABt<T, kD, 1, kBwdQueries>(dpt, sV, row0, do_s);
      // dV += P^T dO.
      MmaPV<T, kD, 1, kBwdQueries>(dv, pt, do_s);
      // dS^T = P^T * (dP^T - delta); dK += dS^T Q (scale applied at the end).
#pragma unroll
      for (int nt = 0; nt < kBwdQueries / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ql = nt * 8 + 2 * t4 + (e & 1);
          dpt[0][nt][e] = pt[0][nt][e] * (dpt[0][nt][e] - d_s[ql]);
        }
      }
      MmaPV<T, kD, 1, kBwdQueries>(dk, dpt, q_s);
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  // sK and sV are free after the loop's last barrier (or were never read if
  // the loop did not run: then dk = dv = 0, which is right for keys past T).
  AccToSmem<T, kD, 1>(sK, row0, dk, scale);
  AccToSmem<T, kD, 1>(sV, row0, dv, 1.f);
  __syncthreads();
  T* dk_g = dkv + static_cast<int64_t>(b) * seq * dkv_stride + h * D;
  StoreTile<T, kD, kDkDvKeys>(dk_g, sK, k0, seq, D, dkv_stride);
  StoreTile<T, kD, kDkDvKeys>(dk_g + dv_off, sV, k0, seq, D, dkv_stride);
#else
  __trap();
#endif
}

// dQ for one block of kBr queries: dqkv columns 0.. (B, T, 3C).
// grid (B*H, ceil(T / kBr)), the last query blocks (most keys) first.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_attention_backward_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ qkv,
                                       const T* __restrict__ dout, const float* __restrict__ lse,
                                       const float* __restrict__ delta, int seq, int H, int D,
                                       int C, float scale_log2, float scale, int KV) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kM = RowBlock<kD>::kM, kBr = RowBlock<kD>::kBr, kBc = RowBlock<kD>::kDqBc;
  constexpr int kS = Tile<kD>::kStride;
  constexpr int kKV = kBc * kS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (kBr, kS)
  T* sdO = sQ + kBr * kS;                  // (kBr, kS)
  T* sK = sdO + kBr * kS;                  // (2, kBc, kS)
  T* sV = sK + 2 * kKV;                    // (2, kBc, kS)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.x, b = bh / H, h = bh % H;
  const int qb = gridDim.y - 1 - blockIdx.y;
  const int q0 = qb * kBr;
  const int row0 = warp * 16 * kM;
  const int warp_last_query = q0 + row0 + 16 * kM - 1;
  const int64_t row_stride = C + 2LL * KV * D;  // q | k | v of KV key/value heads
  const T* q_g = qkv + static_cast<int64_t>(b) * seq * row_stride + h * D;
  const T* k_g = qkv + static_cast<int64_t>(b) * seq * row_stride + C + (h / (H / KV)) * D;
  const T* v_g = k_g + KV * D;
  const T* do_g = dout + static_cast<int64_t>(b) * seq * C + h * D;

  LoadTile<T, kD, kBr>(sQ, q_g, q0, seq, D, row_stride);
  LoadTile<T, kD, kBr>(sdO, do_g, q0, seq, D, C);
  LoadTile<T, kD, kBc>(sK, k_g, 0, seq, D, row_stride);
  LoadTile<T, kD, kBc>(sV, v_g, 0, seq, D, row_stride);
  CpAsyncCommit();

  float lse2[kM][2], dlt[kM][2];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = q0 + row0 + mt * 16 + g + r * 8;
      lse2[mt][r] = q < seq ? lse[static_cast<int64_t>(bh) * seq + q] * kLog2e : INFINITY;
      dlt[mt][r] = q < seq ? delta[static_cast<int64_t>(bh) * seq + q] : 0.f;
    }
  }
  float dq[kM][kD / 8][4];
  Zero(dq);
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
    if (k0 <= warp_last_query) {
      const T* k_s = sK + stage * kKV;
      const T* v_s = sV + stage * kKV;
      float p[kM][kBc / 8][4];
      Zero(p);
      MmaABt<T, kD, kM, kBc>(p, sQ, row0, k_s);
      const bool mask = k0 + kBc - 1 > q0 + row0;
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float v = exp2f(p[mt][nt][e] * scale_log2 - lse2[mt][e >> 1]);
            if (mask) {
              const int key = k0 + nt * 8 + 2 * t4 + (e & 1);
              const int query = q0 + row0 + mt * 16 + g + (e >> 1) * 8;
              if (key > query) v = 0.f;
            }
            p[mt][nt][e] = v;
          }
        }
      }
      float dp[kM][kBc / 8][4];
      Zero(dp);
      MmaABt<T, kD, kM, kBc>(dp, sdO, row0, v_s);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) dp[mt][nt][e] = p[mt][nt][e] * (dp[mt][nt][e] - dlt[mt][e >> 1]);
      MmaPV<T, kD, kM, kBc>(dq, dp, k_s);  // dQ += dS K
    }
    __syncthreads();
  }

  AccToSmem<T, kD, kM>(sQ, row0, dq, scale);  // sQ is free after the loop's last barrier
  __syncthreads();
  StoreTile<T, kD, kBr>(dqkv + static_cast<int64_t>(b) * seq * row_stride + h * D, sQ, q0, seq,
                        D, row_stride);
#else
  __trap();
#endif
}

template <typename T, int kD>
Status LaunchBackward(cudaStream_t stream, const AttentionShape& s, float scale, const FlashDsPasses& p) {
  const int B = static_cast<int>(s.batch), H = static_cast<int>(s.heads);
  const int D = static_cast<int>(s.head_dim), seq = static_cast<int>(s.seq), C = H * D;
  {
    dim3 grid(static_cast<unsigned>(B * H), CeilDiv(seq, kDkDvKeys));
    constexpr size_t smem = DkDvSmemBytes<T, kD>();
    auto kernel = flash_attention_backward_dkdv_kernel<T, kD>;
    RETURN_IF_ERROR(LaunchWithSmem(kernel, grid, kThreads, smem, stream, static_cast<T*>(p.dkv),
        static_cast<const T*>(p.qkv), static_cast<const T*>(p.dout), p.lse, p.delta, seq, H, D, C, scale * kLog2e,
        scale, static_cast<int>(s.kv()), p.dkv_stride, p.dv_off));
  }
  {
    dim3 grid(static_cast<unsigned>(B * H), CeilDiv(seq, RowBlock<kD>::kBr));
    constexpr size_t smem = DqSmemBytes<T, kD>();
    auto kernel = flash_attention_backward_dq_kernel<T, kD>;
    RETURN_IF_ERROR(LaunchWithSmem(kernel, grid, kThreads, smem, stream, static_cast<T*>(p.dqkv),
        static_cast<const T*>(p.qkv), static_cast<const T*>(p.dout), p.lse, p.delta, seq, H, D, C, scale * kLog2e,
        scale, static_cast<int>(s.kv())));
  }
  return Status::OK();
}

}  // namespace

Status FlashAttentionBackwardTwoPass(cudaStream_t stream, const AttentionShape& s, float scale,
                                     const FlashDsPasses& passes) {
  return DispatchFlash(s, [&](auto tag, auto dim) -> Status {
    return LaunchBackward<decltype(tag), decltype(dim)::value>(stream, s, scale, passes);
  });
}

}  // namespace strata::kernels::cuda
