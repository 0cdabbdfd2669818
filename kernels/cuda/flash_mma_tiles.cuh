// SPDX-License-Identifier: Apache-2.0
// The shared-memory tiles of the mma.sync flash attention kernels: block and
// tile shapes, cp.async tile loads, 16-byte tile stores and the m16n8k16
// products (mma.cuh) on such tiles; what the forward and the backward
// schemes have in common, so that each can keep a file of its own.
//
// Tiles: 4 warps per block, each owning kM m-tiles of 16 rows (the B
// operand fragments read from shared memory are reused across a warp's
// m-tiles: kM = 2 halves the shared-memory traffic per flop). Head dims up to
// kD (64 or 128) with the columns D..kD-1 zero-filled in shared memory, so any
// D <= 128 with D % 8 == 0 works (64 and 128 without waste). Rows past T are
// zero-filled too (no garbage reaches an exp or a product) and never stored.
#pragma once

#include <cstdint>

#include "kernels/cuda/mma.cuh"

// flash_mma: these names (kThreads, Tile, Zero, ...) are common in the other
// kernel files' anonymous namespaces.
namespace strata::kernels::cuda::flash_mma {

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = 4;
constexpr int kDkDvKeys = 64;  // keys per two-pass dK/dV block (16 per warp); bounds T (FlashAttentionSupports)

template <int kD>
struct Tile {
  static constexpr int kStride = kD + 8;  // shared row stride: conflict-free ldmatrix
  static constexpr int kChunks = kD / 8;  // 16-byte chunks per row
};

// Tile shapes of the forward and dQ kernels per head-dim tile kD: m-tiles per
// warp (kM, so kBr = 64 kM rows per block) and keys per streamed tile (kBc),
// chosen so the accumulators fit in registers without spills.
template <int kD>
struct RowBlock {
  static constexpr int kM = 2;
  static constexpr int kBr = kWarps * 16 * kM;
  static constexpr int kFwdBc = kD <= 64 ? 64 : 32;
  static constexpr int kDqBc = 32;
};

// Copies rows [row0, row0 + kRows) of a (T, row_stride) matrix, columns
// [0, kD) from `g` into the shared tile `s` (kRows, kStride) with cp.async;
// rows >= seq and columns >= D are zero-filled.
template <typename T, int kD, int kRows, int kNT = kThreads>
__device__ __forceinline__ void LoadTile(T* s, const T* g, int row0, int seq, int D,
                                         int64_t row_stride) {
  constexpr int kChunks = Tile<kD>::kChunks;
  for (int i = threadIdx.x; i < kRows * kChunks; i += kNT) {
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = (row0 + r < seq) && (c * 8 < D);
    const T* src = valid ? g + static_cast<int64_t>(row0 + r) * row_stride + c * 8 : g;
    CpAsync16(s + r * Tile<kD>::kStride + c * 8, src, valid);
  }
}

// Writes rows [row0, row0 + kRows) (only those < seq) and columns [0, D) of
// the shared tile `s` (kRows, kStride) to `g` (T, row_stride) with 16-byte
// stores.
template <typename T, int kD, int kRows, int kNT = kThreads>
__device__ __forceinline__ void StoreTile(T* g, const T* s, int row0, int seq, int D,
                                          int64_t row_stride) {
  constexpr int kChunks = Tile<kD>::kChunks;
  for (int i = threadIdx.x; i < kRows * kChunks; i += kNT) {
    const int r = i / kChunks, c = i % kChunks;
    if (row0 + r < seq && c * 8 < D)
      *reinterpret_cast<int4*>(g + static_cast<int64_t>(row0 + r) * row_stride + c * 8) =
          *reinterpret_cast<const int4*>(s + r * Tile<kD>::kStride + c * 8);
  }
}

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

// Stores a warp's kM x (16 x kD) fp32 accumulator tiles acc[kM][kD/8][4],
// times `mul`, into the shared tile `s` (rows row0 + 16 mt + .., kStride) as T.
template <typename T, int kD, int kM>
__device__ __forceinline__ void AccToSmem(T* s, int row0, const float (&acc)[kM][kD / 8][4],
                                          float mul) {
  FragToSmem<T, kM, kD>(s, Tile<kD>::kStride, row0, 0, acc, mul);
}

// acc[kM][kN/8][4] (kM x 16 x kN) += A (rows row0.., 16 kM x kD of sA,
// row-major) times B^T where sB holds B as (kN rows, kD columns) row-major:
// the "scores" product X Y^T with both operands stored row by row. Each B
// fragment is loaded once and used for all kM m-tiles.
template <typename T, int kD, int kM, int kN>
__device__ __forceinline__ void MmaABt(float (&acc)[kM][kN / 8][4], const T* sA, int row0,
                                       const T* sB) {
  const int lane = threadIdx.x & 31;
  const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
      LdMatrixX4(a[mt], sA + (row0 + mt * 16 + (lane & 15)) * Tile<kD>::kStride + ks * 16 +
                            (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t b[4];
      LdMatrixX4(b, sB + (np * 16 + (mi >> 1) * 8 + ri) * Tile<kD>::kStride + ks * 16 +
                        (mi & 1) * 8);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        Mma16816<T>(acc[mt][2 * np], a[mt], b[0], b[1]);
        Mma16816<T>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// acc[kM][kD/8][4] (kM x 16 x kD) += P (kM x 16 x kK, given as fp32
// accumulator fragments p[kM][kK/8][4], rounded to T) times V where sV holds V
// as (kK rows, kD columns) row-major.
template <typename T, int kD, int kM, int kK>
__device__ __forceinline__ void MmaPV(float (&acc)[kM][kD / 8][4],
                                      const float (&p)[kM][kK / 8][4], const T* sV) {
  const int lane = threadIdx.x & 31;
  const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      a[mt][0] = PackPair<T>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      a[mt][1] = PackPair<T>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      a[mt][2] = PackPair<T>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      a[mt][3] = PackPair<T>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < kD / 16; ++dp) {
      uint32_t b[4];
      LdMatrixX4Trans(b, sV + (kk * 16 + (mi & 1) * 8 + ri) * Tile<kD>::kStride + dp * 16 +
                             (mi >> 1) * 8);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        Mma16816<T>(acc[mt][2 * dp], a[mt], b[0], b[1]);
        Mma16816<T>(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

template <int kM, int kN>
__device__ __forceinline__ void Zero(float (&acc)[kM][kN][4]) {
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int i = 0; i < kN; ++i) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.f;
}

}  // namespace strata::kernels::cuda::flash_mma
