// SPDX-License-Identifier: Apache-2.0
// The dS workspace of the dS-buffer flash attention backward (variants with
// FlashBwdKernel::kDsBuffer or kWgmma): the layout both of its passes agree
// on, shared by the mma.sync kernels (flash_attention_bwd_ds.cu) and the
// wgmma ones (flash_attention_bwd_sm90.cu).
//
// The workspace holds delta (B, H, T) f32 first, rounded up to 256 bytes,
// then per (b, h) the dS panels of the 64-query tiles m = 0, 1, ...; panel m
// is (64, (m/2 + 1) * 128) row-major [query][key]: the key blocks of 128 that
// tile m sees, every entry written by the dK/dV pass (masked ones as 0), so
// the dQ pass may read whole 128-key blocks of any panel.
//
// The TMA-fed passes (FlashBwdKernel::kTma) keep the same panels in the same
// place but store each panel's (64 x 128) tiles one after the other, each as
// the byte image of a 128-byte swizzled shared-memory tile (wgmma.cuh):
// keys 0..63 of the tile in its first 8 KiB, keys 64..127 in the second,
// 16-byte chunk c of query row r at Swizzle128(r, c) of its half. A tile then
// moves between global and shared memory as one bulk copy.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"

namespace strata::kernels::cuda {

constexpr int kDsKeys = 128;    // keys per dK/dV block = columns of one panel block
constexpr int kDsQueries = 64;  // queries per streamed tile = rows of a dS panel

// Elements before panel m of one head: sum over i < m of (i/2 + 1) blocks.
__host__ __device__ __forceinline__ int64_t DsPanelOffset(int64_t m) {
  const int64_t blocks = m + (m >= 1 ? (m - 1) * (m - 1) / 4 : 0);
  return blocks * kDsQueries * kDsKeys;
}
// Elements of one head's panels.
__host__ __device__ __forceinline__ int64_t DsHeadElems(int64_t seq) {
  return DsPanelOffset((seq + kDsQueries - 1) / kDsQueries);
}
// Row length (elements) of panel m.
__host__ __device__ __forceinline__ int64_t DsPanelWidth(int64_t m) { return (m / 2 + 1) * kDsKeys; }
// The tile images (kTma): bytes of one, and where tile (m, key block kb) of
// one head starts (16-bit elements).
constexpr int kDsTileImageBytes = kDsQueries * kDsKeys * 2;
__host__ __device__ __forceinline__ int64_t DsTileImageOffsetBytes(int64_t m, int64_t kb) {
  return DsPanelOffset(m) * 2 + kb * kDsTileImageBytes;
}
// Where the panels start in the workspace: after delta, 256-byte aligned.
inline size_t DsOffsetBytes(const AttentionShape& s) {
  return (static_cast<size_t>(s.batch * s.heads * s.seq) * sizeof(float) + 255) & ~size_t{255};
}

}  // namespace strata::kernels::cuda
