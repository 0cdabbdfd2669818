// SPDX-License-Identifier: Apache-2.0
// Warpgroup MMA (wgmma, sm_90a only) for the Hopper kernels: PTX wrappers,
// shared-memory matrix descriptors, and the 128-byte swizzle the descriptors
// describe. Include only from code compiled for sm_90a (CMake builds the 90
// architecture as 90a) and call only under __CUDA_ARCH_FEAT_SM90_ALL.
//
// A warpgroup is 4 consecutive warps (128 threads) starting at a warp index
// divisible by 4. wgmma.m64nNk16 multiplies a 64 x 16 A by a 16 x N B into a
// 64 x N fp32 accumulator spread over the warpgroup: warp w of the group
// holds rows 16w..16w+15 in exactly mma.sync m16n8's C layout, repeated over
// the N/8 column tiles: d[nt][0..3] = C[g][8nt+2t], C[g][8nt+2t+1],
// C[g+8][8nt+2t], C[g+8][8nt+2t+1] (g = lane/4, t = lane%4). A from
// registers uses mma.sync m16n8k16's A layout per warp (mma.cuh), so an
// accumulator tile rounded to 16 bits is directly the A operand of the next
// product (FlashAttention's P).
//
// Shared-memory tiles here are "128-byte swizzled": a tile of R rows by 64
// 16-bit columns is R rows of 128 bytes; the 16-byte chunk c of row r lives at
// chunk c ^ (r % 8), so the 8 rows of each 1024-byte group spread one column's
// chunks over all banks. Wider tiles are stored as column blocks of 64, one
// after the other. Every tile starts 1024-byte aligned.
//
// Ordering (PTX ISA, "asynchronous warpgroup level matrix"): WgmmaFence before
// the first wgmma that reads registers written by ordinary instructions (the
// accumulators, a register A); WgmmaCommit then WgmmaWait<N> before reading
// the accumulators, plus FenceAccumulator so that the compiler does not move
// those reads above the wait; shared memory written by ordinary stores or
// cp.async needs FenceProxyAsync in each writing thread before the barrier
// that precedes the wgmma reading it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/mma.cuh"

namespace strata::kernels::cuda {

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The first 1024-byte aligned address of a dynamic shared-memory array
// (swizzled tiles start there; launches ask for 1024 bytes more than they use).
__device__ __forceinline__ unsigned char* AlignedSmem(unsigned char* smem_raw) {
  return smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
}
// Pins registers a wgmma reads or writes (accumulators, or a register A
// operand) at this point of the program: reads after it are not hoisted
// above it, writes before it are not sunk below it.
template <int kN>
__device__ __forceinline__ void FenceAccumulator(float (&d)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
template <int kN>
__device__ __forceinline__ void FenceAccumulator(uint32_t (&a)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 128-byte
// swizzled column block.
__device__ __forceinline__ int Swizzle128(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 4);
}

// Copies rows [row0, row0 + kRows), columns [0, kD) of a (seq, row_stride)
// matrix into the swizzled tile `s` (column blocks of 64, each kRows x 128
// bytes) with cp.async from kThreads threads; rows >= seq and columns >= D
// are zero-filled.
template <typename T, int kD, int kRows, int kThreads>
__device__ __forceinline__ void LoadSwizzled(unsigned char* s, const T* g, int row0, int seq, int D,
                                             int64_t row_stride) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = (row0 + r < seq) && (c * 8 < D);
    const T* src = valid ? g + static_cast<int64_t>(row0 + r) * row_stride + c * 8 : g;
    CpAsync16(s + (c >> 3) * (kRows * 128) + Swizzle128(r, c & 7), src, valid);
  }
}

// Bytes of one swizzled tile of `rows` rows and kCols 16-bit columns.
template <int kCols>
constexpr int SwizzledTileBytes(int rows) {
  return rows * kCols * 2;
}

// Writes warpgroup accumulators (64 x kD per warpgroup; warp w holds rows
// 16 w .. 16 w + 15 of the tile) times `mul`, rounded to T, into the
// swizzled tile `s` of kRows rows. `warp` counts from the first warp holding
// accumulators (the block's first unless a producer warpgroup comes first).
template <typename T, int kD, int kRows>
__device__ __forceinline__ void AccToSwizzled(unsigned char* s, const float (&d)[kD / 8][4], float mul, int warp) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + g + r * 8, col = nt * 8 + 2 * t4;
      *reinterpret_cast<uint32_t*>(s + (col >> 6) * (kRows * 128) + Swizzle128(row, (col & 63) >> 3) +
                                   (col & 7) * 2) = PackPair<T>(d[nt][2 * r] * mul, d[nt][2 * r + 1] * mul);
    }
}
template <typename T, int kD, int kRows>
__device__ __forceinline__ void AccToSwizzled(unsigned char* s, const float (&d)[kD / 8][4], float mul) {
  AccToSwizzled<T, kD, kRows>(s, d, mul, static_cast<int>(threadIdx.x >> 5));
}

// Stores the tile rows [first, first + count) of the swizzled tile `s`
// (kRows rows) to rows row0 + first .. of a (seq, row_stride) matrix, those
// below seq and columns [0, D), from kThreads threads numbered from tid.
template <typename T, int kD, int kRows, int kThreads>
__device__ __forceinline__ void StoreSwizzledRows(T* g, const unsigned char* s, int row0, int seq, int D,
                                                  int64_t row_stride, int first, int count, int tid) {
  constexpr int kChunks = kD / 8;
  for (int i = tid; i < count * kChunks; i += kThreads) {
    const int r = first + i / kChunks, c = i % kChunks;
    if (row0 + r < seq && c * 8 < D)
      *reinterpret_cast<int4*>(g + static_cast<int64_t>(row0 + r) * row_stride + c * 8) =
          *reinterpret_cast<const int4*>(s + (c >> 3) * (kRows * 128) + Swizzle128(r, c & 7));
  }
}
// The whole tile, rows [row0, row0 + kRows) of [0, seq), from the block's
// first kThreads threads.
template <typename T, int kD, int kRows, int kThreads>
__device__ __forceinline__ void StoreSwizzled(T* g, const unsigned char* s, int row0, int seq, int D,
                                              int64_t row_stride) {
  StoreSwizzledRows<T, kD, kRows, kThreads>(g, s, row0, seq, D, row_stride, 0, kRows,
                                            static_cast<int>(threadIdx.x));
}

// Rounds an accumulator tile d (64 x 8 kN per warpgroup) into the A-operand
// layout of the next product, 16 K-columns per entry (column tiles 2 kk and
// 2 kk + 1): FlashAttention's P.
template <typename T, int kN>
__device__ __forceinline__ void PackA(uint32_t (&a)[kN / 2][4], const float (&d)[kN][4]) {
#pragma unroll
  for (int kk = 0; kk < kN / 2; ++kk) {
    a[kk][0] = PackPair<T>(d[2 * kk][0], d[2 * kk][1]);
    a[kk][1] = PackPair<T>(d[2 * kk][2], d[2 * kk][3]);
    a[kk][2] = PackPair<T>(d[2 * kk + 1][0], d[2 * kk + 1][1]);
    a[kk][3] = PackPair<T>(d[2 * kk + 1][2], d[2 * kk + 1][3]);
  }
}

// Shared-memory matrix descriptor, 128-byte swizzle. `addr` is a shared-space
// byte address. K-major operands (rows along M/N, 64 K-elements per 128-byte
// row): lbo is unused, sbo = 1024 (the next 8 rows). MN-major (transposed)
// operands (rows along K, 64 M/N-elements per row): lbo = the byte distance
// between 64-column blocks, sbo = 1024 (the next 8 K rows).
__device__ __forceinline__ uint64_t SmemDescriptor(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t{1} << 62);
}

// d (64 x N per warpgroup) = A B + (scale_d ? d : 0), both operands in shared
// memory (descriptors): A (64 x 16) K-major; B (N x 16) K-major, or with
// kTransB = 1 (16 x N) MN-major (transposed: rows along K).
template <typename T, int N, int kTransB>
struct WgmmaSSOp;  // Run(d, desc_a, desc_b, scale_d), specialized below
template <typename T, int N, int kTransB = 0>
__device__ __forceinline__ void WgmmaSS(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  WgmmaSSOp<T, N, kTransB>::Run(d, desc_a, desc_b, scale_d);
}
// d = A B + (scale_d ? d : 0): A (64 x 16) from registers (mma.sync's A layout
// per warp), B (16 x N) MN-major in shared memory (transposed: rows along K).
template <typename T, int N>
__device__ __forceinline__ void WgmmaRS(float (&d)[N / 8][4], const uint32_t (&a)[4],
                                        uint64_t desc_b, int scale_d);

// The operand lists below are spelled out (N/2 accumulator registers each).
template <int kTransB>
struct WgmmaSSOp<__nv_bfloat16, 128, kTransB> {
  static __device__ __forceinline__ void Run(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, %67;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
  }
};
template <>
__device__ __forceinline__ void WgmmaRS<__nv_bfloat16, 128>(float (&d)[16][4], const uint32_t (&a)[4],
                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

template <int kTransB>
struct WgmmaSSOp<__half, 128, kTransB> {
  static __device__ __forceinline__ void Run(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, %67;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
  }
};
template <>
__device__ __forceinline__ void WgmmaRS<__half, 128>(float (&d)[16][4], const uint32_t (&a)[4],
                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

template <int kTransB>
struct WgmmaSSOp<__nv_bfloat16, 64, kTransB> {
  static __device__ __forceinline__ void Run(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, %35;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
  }
};
template <>
__device__ __forceinline__ void WgmmaRS<__nv_bfloat16, 64>(float (&d)[8][4], const uint32_t (&a)[4],
                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

template <int kTransB>
struct WgmmaSSOp<__half, 64, kTransB> {
  static __device__ __forceinline__ void Run(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, %35;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
  }
};
template <>
__device__ __forceinline__ void WgmmaRS<__half, 64>(float (&d)[8][4], const uint32_t (&a)[4],
                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

}  // namespace strata::kernels::cuda
