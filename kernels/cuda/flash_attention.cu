// Causal flash attention (FlashAttention-2 style), forward and backward, on
// tensor cores through mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate):
// sm_80 and later, nothing sm_90-only.
//
// Layout (backend.h): qkv (B, T, 3C) with q, k, v at column offsets 0, C, 2C
// and head h at h*D..h*D+D-1 of each; out (B, T, C); lse (B, H, T) f32, the
// natural-log log-sum-exp of each query row's scaled scores.
//
// Tiles: 64 rows per block, 4 warps, 16 rows per warp; head dims up to kD
// (64 or 128) with the columns D..kD-1 zero-filled in shared memory, so any
// D <= 128 with D % 8 == 0 works (64 and 128 without waste). Rows past T are
// zero-filled too (no garbage reaches an exp or a product) and never stored.
// Softmax runs in the log2 domain (scores pre-multiplied by scale*log2(e)).
//
// Forward: block = (b, h, 64 queries); K/V tiles of 64 keys stream through a
// double-buffered cp.async pipeline; online softmax; O staged through shared
// memory for 16-byte stores. No T x T matrix anywhere.
// Backward, deterministic (no atomics): delta = rowsum(dO * O) first; then
// one kernel per 64-key block accumulates dK and dV over the query tiles
// (32 queries each) at or after it, and one kernel per 64-query block
// accumulates dQ over the key tiles at or before it. This recomputes P once
// more than FlashAttention-2's atomic dQ, and keeps every sum in a fixed order.
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kBlockRows = 64;  // rows of the block's own tile (queries fwd/dQ, keys dK/dV)
constexpr int kFwdKeys = 64;    // keys per streamed tile (forward, dQ)
constexpr int kBwdQueries = 32; // queries per streamed tile (dK/dV)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int kD>
struct Tile {
  static constexpr int kStride = kD + 8;  // shared row stride: conflict-free ldmatrix
  static constexpr int kChunks = kD / 8;  // 16-byte chunks per row
};

template <typename T, int kD>
constexpr size_t FwdSmemBytes() {  // Q + 2 x (K, V)
  return static_cast<size_t>(5 * kBlockRows * Tile<kD>::kStride) * sizeof(T);
}
template <typename T, int kD>
constexpr size_t DkDvSmemBytes() {  // K, V + 2 x (Q, dO) + 2 x (lse, delta)
  return static_cast<size_t>((2 * kBlockRows + 4 * kBwdQueries) * Tile<kD>::kStride) * sizeof(T) +
         4 * kBwdQueries * sizeof(float);
}
template <typename T, int kD>
constexpr size_t DqSmemBytes() {  // Q, dO + 2 x (K, V)
  return static_cast<size_t>((2 * kBlockRows + 4 * kFwdKeys) * Tile<kD>::kStride) * sizeof(T);
}

// ---- kernels ----------------------------------------------------------------

// Copies rows [row0, row0 + kRows) of a (T, row_stride) matrix, columns
// [0, kD) from `g` into the shared tile `s` (kRows, kStride) with cp.async;
// rows >= seq and columns >= D are zero-filled.
template <typename T, int kD, int kRows>
__device__ __forceinline__ void LoadTile(T* s, const T* g, int row0, int seq, int D,
                                         int64_t row_stride) {
  constexpr int kChunks = Tile<kD>::kChunks;
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = (row0 + r < seq) && (c * 8 < D);
    const T* src = valid ? g + static_cast<int64_t>(row0 + r) * row_stride + c * 8 : g;
    CpAsync16(s + r * Tile<kD>::kStride + c * 8, src, valid);
  }
}

// Writes rows [row0, row0 + 64) (only those < seq) and columns [0, D) of the
// shared tile `s` (64, kStride) to `g` (T, row_stride) with 16-byte stores.
template <typename T, int kD>
__device__ __forceinline__ void StoreTile(T* g, const T* s, int row0, int seq, int D,
                                          int64_t row_stride) {
  constexpr int kChunks = Tile<kD>::kChunks;
  for (int i = threadIdx.x; i < kBlockRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    if (row0 + r < seq && c * 8 < D)
      *reinterpret_cast<int4*>(g + static_cast<int64_t>(row0 + r) * row_stride + c * 8) =
          *reinterpret_cast<const int4*>(s + r * Tile<kD>::kStride + c * 8);
  }
}

// Stores a warp's 16 x kD fp32 accumulator tile acc[kD/8][4], times `mul`,
// into the shared tile `s` (rows warp*16.., kStride) as T.
template <typename T, int kD>
__device__ __forceinline__ void AccToSmem(T* s, const float (&acc)[kD / 8][4], float mul) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 16 + g + h * 8;
      *reinterpret_cast<uint32_t*>(s + r * Tile<kD>::kStride + nt * 8 + 2 * t4) =
          PackPair<T>(acc[nt][2 * h] * mul, acc[nt][2 * h + 1] * mul);
    }
  }
}

// acc[kN/8][4] (16 x kN) += A (16 x kD, the warp's rows of sA, row-major)
// times B^T where sB holds B as (kN rows, kD columns) row-major: the
// "scores" product X Y^T with both operands stored row by row.
template <typename T, int kD, int kN>
__device__ __forceinline__ void MmaABt(float (&acc)[kN / 8][4], const T* sA, const T* sB) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t a[4];
    LdMatrixX4(a, sA + (warp * 16 + (lane & 15)) * Tile<kD>::kStride + ks * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t b[4];
      LdMatrixX4(b, sB + (np * 16 + (mi >> 1) * 8 + ri) * Tile<kD>::kStride + ks * 16 +
                        (mi & 1) * 8);
      Mma16816<T>(acc[2 * np], a, b[0], b[1]);
      Mma16816<T>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc[kD/8][4] (16 x kD) += P (16 x kK, given as fp32 accumulator fragments
// p[kK/8][4], rounded to T) times V where sV holds V as (kK rows, kD columns)
// row-major.
template <typename T, int kD, int kK>
__device__ __forceinline__ void MmaPV(float (&acc)[kD / 8][4], const float (&p)[kK / 8][4],
                                      const T* sV) {
  const int lane = threadIdx.x & 31;
  const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t a[4];
    a[0] = PackPair<T>(p[2 * kk][0], p[2 * kk][1]);
    a[1] = PackPair<T>(p[2 * kk][2], p[2 * kk][3]);
    a[2] = PackPair<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = PackPair<T>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
    for (int dp = 0; dp < kD / 16; ++dp) {
      uint32_t b[4];
      LdMatrixX4Trans(b, sV + (kk * 16 + (mi & 1) * 8 + ri) * Tile<kD>::kStride + dp * 16 +
                             (mi >> 1) * 8);
      Mma16816<T>(acc[2 * dp], a, b[0], b[1]);
      Mma16816<T>(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// out: (B, T, C); lse: (B, H, T) f32; qkv: (B, T, 3C).
// grid (B*H, ceil(T/64)), the last query blocks (most keys) first.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_attention_forward_kernel(T* __restrict__ out, float* __restrict__ lse,
                                   const T* __restrict__ qkv, int seq, int H, int D, int C,
                                   float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kS = Tile<kD>::kStride;
  constexpr int kTile = kBlockRows * kS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (64, kS)
  T* sK = sQ + kTile;                      // (2, 64, kS)
  T* sV = sK + 2 * kTile;                  // (2, 64, kS)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.x, b = bh / H, h = bh % H;
  const int qb = gridDim.y - 1 - blockIdx.y;
  const int q0 = qb * kBlockRows;
  const int64_t row_stride = 3LL * C;
  const T* q_g = qkv + static_cast<int64_t>(b) * seq * row_stride + h * D;
  const T* k_g = q_g + C;
  const T* v_g = q_g + 2 * C;

  LoadTile<T, kD, kBlockRows>(sQ, q_g, q0, seq, D, row_stride);
  LoadTile<T, kD, kFwdKeys>(sK, k_g, 0, seq, D, row_stride);
  LoadTile<T, kD, kFwdKeys>(sV, v_g, 0, seq, D, row_stride);
  CpAsyncCommit();

  float o[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const int n_kv = qb + 1;  // causal: key tiles 0..qb (64 keys = 64 queries per tile)

  for (int j = 0; j < n_kv; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_kv) {
      LoadTile<T, kD, kFwdKeys>(sK + (stage ^ 1) * kTile, k_g, (j + 1) * kFwdKeys, seq, D,
                                row_stride);
      LoadTile<T, kD, kFwdKeys>(sV + (stage ^ 1) * kTile, v_g, (j + 1) * kFwdKeys, seq, D,
                                row_stride);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();

    float s[kFwdKeys / 8][4];
#pragma unroll
    for (int i = 0; i < kFwdKeys / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    MmaABt<T, kD, kFwdKeys>(s, sQ, sK + stage * kTile);

    const bool diag = (j == qb);
#pragma unroll
    for (int nt = 0; nt < kFwdKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[nt][e] * scale_log2;
        if (diag) {
          const int key = nt * 8 + 2 * t4 + (e & 1);       // within the tile
          const int query = warp * 16 + g + (e >> 1) * 8;  // within the block
          if (key > query) v = -INFINITY;
        }
        s[nt][e] = v;
      }
    }
    // Online softmax; each row is spread over the 4 lanes of a quad.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kFwdKeys / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[r], mx);  // finite: key 0 of each tile is never masked
      const float alpha = exp2f(m_run[r] - m_new);
      m_run[r] = m_new;
      l_run[r] *= alpha;
#pragma unroll
      for (int nt = 0; nt < kD / 8; ++nt) {
        o[nt][2 * r] *= alpha;
        o[nt][2 * r + 1] *= alpha;
      }
#pragma unroll
      for (int nt = 0; nt < kFwdKeys / 8; ++nt) {
        const float p0 = exp2f(s[nt][2 * r] - m_new), p1 = exp2f(s[nt][2 * r + 1] - m_new);
        s[nt][2 * r] = p0;
        s[nt][2 * r + 1] = p1;
        l_run[r] += p0 + p1;
      }
    }
    MmaPV<T, kD, kFwdKeys>(o, s, sV + stage * kTile);
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_run[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[r] = 1.f / l;
    const int q = q0 + warp * 16 + g + r * 8;
    if (t4 == 0 && q < seq) lse[static_cast<int64_t>(bh) * seq + q] = (m_run[r] + log2f(l)) * kLn2;
  }
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt) {
    o[nt][0] *= inv[0];
    o[nt][1] *= inv[0];
    o[nt][2] *= inv[1];
    o[nt][3] *= inv[1];
  }
  AccToSmem<T, kD>(sQ, o, 1.f);  // sQ is free: every warp passed the loop's last barrier
  __syncthreads();
  StoreTile<T, kD>(out + static_cast<int64_t>(b) * seq * C + h * D, sQ, q0, seq, D, C);
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

// dK, dV for one block of 64 keys: dqkv columns C.. and 2C.. (B, T, 3C).
// grid (B*H, ceil(T/64)); key block kb = blockIdx.y (the first blocks see the
// most queries and start first).
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_attention_backward_dkdv_kernel(T* __restrict__ dqkv, const T* __restrict__ qkv,
                                         const T* __restrict__ dout, const float* __restrict__ lse,
                                         const float* __restrict__ delta, int seq, int H, int D,
                                         int C, float scale_log2, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kS = Tile<kD>::kStride;
  constexpr int kQT = kBwdQueries * kS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);  // (64, kS)
  T* sV = sK + kBlockRows * kS;            // (64, kS)
  T* sQ = sV + kBlockRows * kS;            // (2, 32, kS)
  T* sdO = sQ + 2 * kQT;                   // (2, 32, kS)
  float* sL = reinterpret_cast<float*>(sdO + 2 * kQT);  // (2, 32): lse * log2(e), +inf past T
  float* sDelta = sL + 2 * kBwdQueries;                  // (2, 32): delta, 0 past T

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.x, b = bh / H, h = bh % H;
  const int kb = blockIdx.y;
  const int k0 = kb * kBlockRows;
  const int64_t row_stride = 3LL * C;
  const T* q_g = qkv + static_cast<int64_t>(b) * seq * row_stride + h * D;
  const T* k_g = q_g + C;
  const T* v_g = q_g + 2 * C;
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
  LoadTile<T, kD, kBlockRows>(sK, k_g, k0, seq, D, row_stride);
  LoadTile<T, kD, kBlockRows>(sV, v_g, k0, seq, D, row_stride);
  load_queries(0, qt_begin);
  CpAsyncCommit();

  float dk[kD / 8][4], dv[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) {
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.f;
    dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.f;
  }
  const int my_key0 = k0 + warp * 16 + g;  // keys of this lane's rows: my_key0, my_key0 + 8

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

    // P^T (16 keys x 32 queries) = exp2(K Q^T * scale_log2 - lse2), causal.
    float pt[kBwdQueries / 8][4];
#pragma unroll
    for (int i = 0; i < kBwdQueries / 8; ++i) pt[i][0] = pt[i][1] = pt[i][2] = pt[i][3] = 0.f;
    MmaABt<T, kD, kBwdQueries>(pt, sK, q_s);
    const int q_base = it * kBwdQueries;
#pragma unroll
    for (int nt = 0; nt < kBwdQueries / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = nt * 8 + 2 * t4 + (e & 1);
        const int key = my_key0 + (e >> 1) * 8;
        float p = exp2f(pt[nt][e] * scale_log2 - l_s[ql]);
        if (q_base + ql < key) p = 0.f;
        pt[nt][e] = p;
      }
    }
    // dP^T (16 keys x 32 queries) = V dO^T.
    float dpt[kBwdQueries / 8][4];
#pragma unroll
    for (int i = 0; i < kBwdQueries / 8; ++i) dpt[i][0] = dpt[i][1] = dpt[i][2] = dpt[i][3] = 0.f;
    MmaABt<T, kD, kBwdQueries>(dpt, sV, do_s);
    // dV += P^T dO.
    MmaPV<T, kD, kBwdQueries>(dv, pt, do_s);
    // dS^T = P^T * (dP^T - delta); dK += dS^T Q (scale applied at the end).
#pragma unroll
    for (int nt = 0; nt < kBwdQueries / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = nt * 8 + 2 * t4 + (e & 1);
        dpt[nt][e] = pt[nt][e] * (dpt[nt][e] - d_s[ql]);
      }
    }
    MmaPV<T, kD, kBwdQueries>(dk, dpt, q_s);
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  // sK and sV are free after the loop's last barrier (or were never read if
  // the loop did not run: then dk = dv = 0, which is right for keys past T).
  AccToSmem<T, kD>(sK, dk, scale);
  AccToSmem<T, kD>(sV, dv, 1.f);
  __syncthreads();
  T* dq_g = dqkv + static_cast<int64_t>(b) * seq * row_stride + h * D;
  StoreTile<T, kD>(dq_g + C, sK, k0, seq, D, row_stride);
  StoreTile<T, kD>(dq_g + 2 * C, sV, k0, seq, D, row_stride);
#else
  __trap();
#endif
}

// dQ for one block of 64 queries: dqkv columns 0.. (B, T, 3C).
// grid (B*H, ceil(T/64)), the last query blocks (most keys) first.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_attention_backward_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ qkv,
                                       const T* __restrict__ dout, const float* __restrict__ lse,
                                       const float* __restrict__ delta, int seq, int H, int D,
                                       int C, float scale_log2, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kS = Tile<kD>::kStride;
  constexpr int kTile = kBlockRows * kS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (64, kS)
  T* sdO = sQ + kTile;                     // (64, kS)
  T* sK = sdO + kTile;                     // (2, 64, kS)
  T* sV = sK + 2 * kTile;                  // (2, 64, kS)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.x, b = bh / H, h = bh % H;
  const int qb = gridDim.y - 1 - blockIdx.y;
  const int q0 = qb * kBlockRows;
  const int64_t row_stride = 3LL * C;
  const T* q_g = qkv + static_cast<int64_t>(b) * seq * row_stride + h * D;
  const T* k_g = q_g + C;
  const T* v_g = q_g + 2 * C;
  const T* do_g = dout + static_cast<int64_t>(b) * seq * C + h * D;

  LoadTile<T, kD, kBlockRows>(sQ, q_g, q0, seq, D, row_stride);
  LoadTile<T, kD, kBlockRows>(sdO, do_g, q0, seq, D, C);
  LoadTile<T, kD, kFwdKeys>(sK, k_g, 0, seq, D, row_stride);
  LoadTile<T, kD, kFwdKeys>(sV, v_g, 0, seq, D, row_stride);
  CpAsyncCommit();

  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int q = q0 + warp * 16 + g + r * 8;
    lse2[r] = q < seq ? lse[static_cast<int64_t>(bh) * seq + q] * kLog2e : INFINITY;
    dlt[r] = q < seq ? delta[static_cast<int64_t>(bh) * seq + q] : 0.f;
  }
  float dq[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
  const int n_kv = qb + 1;

  for (int j = 0; j < n_kv; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_kv) {
      LoadTile<T, kD, kFwdKeys>(sK + (stage ^ 1) * kTile, k_g, (j + 1) * kFwdKeys, seq, D,
                                row_stride);
      LoadTile<T, kD, kFwdKeys>(sV + (stage ^ 1) * kTile, v_g, (j + 1) * kFwdKeys, seq, D,
                                row_stride);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const T* k_s = sK + stage * kTile;
    const T* v_s = sV + stage * kTile;

    float p[kFwdKeys / 8][4];
#pragma unroll
    for (int i = 0; i < kFwdKeys / 8; ++i) p[i][0] = p[i][1] = p[i][2] = p[i][3] = 0.f;
    MmaABt<T, kD, kFwdKeys>(p, sQ, k_s);
    const bool diag = (j == qb);
#pragma unroll
    for (int nt = 0; nt < kFwdKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = exp2f(p[nt][e] * scale_log2 - lse2[e >> 1]);
        if (diag) {
          const int key = nt * 8 + 2 * t4 + (e & 1);
          const int query = warp * 16 + g + (e >> 1) * 8;
          if (key > query) v = 0.f;
        }
        p[nt][e] = v;
      }
    }
    float dp[kFwdKeys / 8][4];
#pragma unroll
    for (int i = 0; i < kFwdKeys / 8; ++i) dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.f;
    MmaABt<T, kD, kFwdKeys>(dp, sdO, v_s);
#pragma unroll
    for (int nt = 0; nt < kFwdKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nt][e] = p[nt][e] * (dp[nt][e] - dlt[e >> 1]);
    }
    MmaPV<T, kD, kFwdKeys>(dq, dp, k_s);  // dQ += dS K
    __syncthreads();
  }

  AccToSmem<T, kD>(sQ, dq, scale);  // sQ is free after the loop's last barrier
  __syncthreads();
  StoreTile<T, kD>(dqkv + static_cast<int64_t>(b) * seq * row_stride + h * D, sQ, q0, seq, D,
                   row_stride);
#else
  __trap();
#endif
}

template <typename Kernel>
Status SetSmem(Kernel k, size_t bytes) {
  CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return Status::OK();
}

template <typename T, int kD>
Status LaunchForward(cudaStream_t stream, const AttentionShape& s, float scale, void* out,
                     float* lse, const void* qkv) {
  const int H = static_cast<int>(s.heads), D = static_cast<int>(s.head_dim);
  const int seq = static_cast<int>(s.seq), C = H * D;
  constexpr size_t smem = FwdSmemBytes<T, kD>();
  auto kernel = flash_attention_forward_kernel<T, kD>;
  RETURN_IF_ERROR(SetSmem(kernel, smem));
  dim3 grid(static_cast<unsigned>(s.batch * s.heads), CeilDiv(seq, kBlockRows));
  kernel<<<grid, kThreads, smem, stream>>>(static_cast<T*>(out), lse, static_cast<const T*>(qkv),
                                           seq, H, D, C, scale * kLog2e);
  CUDA_RETURN_IF_LAUNCH_ERROR("flash_attention_forward_kernel");
  return Status::OK();
}

template <typename T, int kD>
Status LaunchBackward(cudaStream_t stream, const AttentionShape& s, float scale, void* dqkv,
                      const void* dout, const void* qkv, const void* out, const float* lse,
                      float* delta) {
  const int B = static_cast<int>(s.batch), H = static_cast<int>(s.heads);
  const int D = static_cast<int>(s.head_dim), seq = static_cast<int>(s.seq), C = H * D;
  const int64_t rows = static_cast<int64_t>(B) * seq * H;
  flash_attention_delta_kernel<T><<<CeilDiv(rows, 8), 256, 0, stream>>>(
      delta, static_cast<const T*>(dout), static_cast<const T*>(out), B, seq, H, D, C);
  CUDA_RETURN_IF_LAUNCH_ERROR("flash_attention_delta_kernel");

  dim3 grid(static_cast<unsigned>(B * H), CeilDiv(seq, kBlockRows));
  {
    constexpr size_t smem = DkDvSmemBytes<T, kD>();
    auto kernel = flash_attention_backward_dkdv_kernel<T, kD>;
    RETURN_IF_ERROR(SetSmem(kernel, smem));
    kernel<<<grid, kThreads, smem, stream>>>(static_cast<T*>(dqkv), static_cast<const T*>(qkv),
                                             static_cast<const T*>(dout), lse, delta, seq, H, D, C,
                                             scale * kLog2e, scale);
    CUDA_RETURN_IF_LAUNCH_ERROR("flash_attention_backward_dkdv_kernel");
  }
  {
    constexpr size_t smem = DqSmemBytes<T, kD>();
    auto kernel = flash_attention_backward_dq_kernel<T, kD>;
    RETURN_IF_ERROR(SetSmem(kernel, smem));
    kernel<<<grid, kThreads, smem, stream>>>(static_cast<T*>(dqkv), static_cast<const T*>(qkv),
                                             static_cast<const T*>(dout), lse, delta, seq, H, D, C,
                                             scale * kLog2e, scale);
    CUDA_RETURN_IF_LAUNCH_ERROR("flash_attention_backward_dq_kernel");
  }
  return Status::OK();
}

// Calls f(T{}, std::integral_constant<int, kD>{}) for the shape's dtype and tile head dim.
template <typename F>
Status DispatchFlash(const AttentionShape& s, F&& f) {
  const int64_t D = s.head_dim;
  auto with_dtype = [&](auto dim) -> Status {
    switch (s.dtype) {
      case DType::kBF16: return f(bf16{}, dim);
      case DType::kF16: return f(f16{}, dim);
      default: return InvalidArgument("flash attention: dtype must be f16 or bf16");
    }
  };
  if (D <= 64) return with_dtype(std::integral_constant<int, 64>{});
  return with_dtype(std::integral_constant<int, 128>{});
}

}  // namespace

// ---- launchers ------------------------------------------------------------

bool FlashAttentionSupports(const AttentionShape& s, int cc_major) {
  return cc_major >= 8 && (s.dtype == DType::kBF16 || s.dtype == DType::kF16) &&
         s.head_dim > 0 && s.head_dim <= 128 && s.head_dim % 8 == 0 &&
         s.seq <= int64_t{65535} * kBlockRows && s.batch * s.heads <= (int64_t{1} << 30);
}

size_t FlashAttentionWorkspaceBytes(const AttentionShape& s) {
  return static_cast<size_t>(s.batch * s.heads * s.seq) * sizeof(float);  // delta
}

Status FlashAttentionForward(cudaStream_t stream, const AttentionShape& s, float scale, void* out,
                             float* lse, const void* qkv) {
  if (s.batch == 0 || s.seq == 0 || s.heads == 0) return Status::OK();
  return DispatchFlash(s, [&](auto tag, auto dim) -> Status {
    return LaunchForward<decltype(tag), decltype(dim)::value>(stream, s, scale, out, lse, qkv);
  });
}

Status FlashAttentionBackward(cudaStream_t stream, const AttentionShape& s, float scale,
                              void* dqkv, const void* dout, const void* qkv, const void* out,
                              const float* lse, void* workspace) {
  if (s.batch == 0 || s.seq == 0 || s.heads == 0) return Status::OK();
  return DispatchFlash(s, [&](auto tag, auto dim) -> Status {
    return LaunchBackward<decltype(tag), decltype(dim)::value>(
        stream, s, scale, dqkv, dout, qkv, out, lse, static_cast<float*>(workspace));
  });
}

}  // namespace strata::kernels::cuda
