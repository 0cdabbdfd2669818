// SPDX-License-Identifier: Apache-2.0
// The steps of the wgmma flash forward that v3's kernel
// (flash_attention_sm90.cu) and the TMA-fed one (flash_attention_fwd_tma_sm90.cu)
// share: the two products of one key tile and the causal softmax between
// them. Each is one warpgroup's work on 64 query rows; the kernels differ
// only in how the tiles reach shared memory and who waits for them.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace strata::kernels::cuda {

// S = Q K^T over the head dim, 16 at a time (column block kk / 4 of the
// swizzled tiles, 32 bytes into its rows per step): the warpgroup's 64 rows of
// the Q tile at q_addr (kQRows rows per column block) against the kBc keys of
// the K tile at k_addr. One commit group.
template <typename T, int kD, int kQRows, int kBc>
__device__ __forceinline__ void FlashIssueS(float (&s)[kBc / 8][4], uint32_t q_addr, uint32_t k_addr) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t off = (kk & 3) * 32;
    WgmmaSS<T, kBc>(s, SmemDescriptor(q_addr + (kk >> 2) * (kQRows * 128) + off, 16, 1024),
                    SmemDescriptor(k_addr + (kk >> 2) * (kBc * 128) + off, 16, 1024), kk > 0);
  }
  WgmmaCommit();
}

// O += P V: P from registers (PackA's layout, 16 keys per step), V the
// N-major swizzled tile at v_addr. One commit group.
template <typename T, int kD, int kBc>
__device__ __forceinline__ void FlashIssuePV(float (&o)[kD / 8][4], const uint32_t (&p)[kBc / 16][4],
                                             uint32_t v_addr) {
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk)
    WgmmaRS<T, kD>(o, p[kk], SmemDescriptor(v_addr + kk * 16 * 128, kBc * 128, 1024), 1);
  WgmmaCommit();
}

// The causal mask and the softmax of a finished S tile of keys k0 ..
// k0 + kBc - 1: probabilities in s, the rescale factor of O in alpha
// (SoftmaxTileProbs, FMA form). wg_q0 is the warpgroup's first query,
// row_q0 this thread's first (its second is row_q0 + 8), t4 its lane in the
// quad. Only a tile with some key after some row of the warpgroup masks.
template <int kBc>
__device__ __forceinline__ void FlashCausalSoftmax(float (&s)[kBc / 8][4], float (&m_run)[2], float (&l_run)[2],
                                                   float scale_log2, float (&alpha)[2], int k0, int wg_q0,
                                                   int row_q0, int t4) {
  if (k0 + kBc - 1 > wg_q0) {
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + nt * 8 + 2 * t4 + (e & 1);
        const int query = row_q0 + (e >> 1) * 8;
        if (key > query) s[nt][e] = -INFINITY;
      }
  }
  SoftmaxTileProbs<kBc / 8, true>(s, m_run, l_run, scale_log2, alpha);
}

}  // namespace strata::kernels::cuda
