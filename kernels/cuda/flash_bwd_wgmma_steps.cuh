// SPDX-License-Identifier: Apache-2.0
// The steps of the wgmma flash backward that v4's kernels
// (flash_attention_bwd_sm90.cu) and the TMA-fed ones
// (flash_attention_bwd_tma_sm90.cu) share, so that both give the same bits:
// the four products of one (64 keys, 64 queries) tile of the dK/dV pass, the
// softmax gradient between them, and the step of the dQ pass. Each is one
// warpgroup's work; the kernels differ only in how the tiles reach shared
// memory and where dS goes.
//
// Shared-memory tiles are wgmma.cuh's 128-byte swizzled column blocks of 64
// 16-bit columns (kRows rows x 128 bytes each).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace strata::kernels::cuda {

// acc (64 keys x kQueries) = the warpgroup's 64 key rows at kv_addr (K or V,
// kKeyRows rows per column block) times the query rows at qd_addr (Q or dO,
// kQueries rows per column block) over the head dim, 16 at a time (column
// block kk / 4, 32 bytes into its swizzled rows per step): S^T or dP^T. One
// commit group.
template <typename T, int kD, int kKeyRows, int kQueries>
__device__ __forceinline__ void FlashBwdIssueKeysByQueries(float (&acc)[kQueries / 8][4], uint32_t kv_addr,
                                                           uint32_t qd_addr) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t off = (kk >> 2) * (kKeyRows * 128) + (kk & 3) * 32;
    const uint32_t qoff = (kk >> 2) * (kQueries * 128) + (kk & 3) * 32;
    WgmmaSS<T, kQueries>(acc, SmemDescriptor(kv_addr + off, 16, 1024), SmemDescriptor(qd_addr + qoff, 16, 1024),
                         kk > 0);
  }
  WgmmaCommit();
}

// P^T = exp2(S^T scale log2e - lse log2e) in place, causally masked: this
// thread's entries are keys key_w + 16 warp + g (+ 8), queries q_base +
// 8 nt + 2 t4 (+ 1); l_s holds lse log2e per query of the tile (+inf past T).
// The exponent is one explicit FMA, so every kernel rounds it alike.
template <int kNq>
__device__ __forceinline__ void FlashBwdProbs(float (&s)[kNq][4], const float* l_s, float scale_log2, int key_w,
                                              int warp, int q_base, int g, int t4) {
  // Some key of this warpgroup's after some query of the tile: mask.
  const bool diagonal = key_w + 63 > q_base;
#pragma unroll
  for (int nt = 0; nt < kNq; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ql = nt * 8 + 2 * t4 + (e & 1);
      float pv = exp2f(__fmaf_rn(s[nt][e], scale_log2, -l_s[ql]));
      if (diagonal && key_w + warp * 16 + g + (e >> 1) * 8 > q_base + ql) pv = 0.f;
      s[nt][e] = pv;
    }
}

// dS^T = P^T (dP^T - delta) in place of dP^T; d_s holds delta per query of
// the tile (0 past T).
template <int kNq>
__device__ __forceinline__ void FlashBwdDs(float (&dp)[kNq][4], const float (&p)[kNq][4], const float* d_s,
                                           int t4) {
#pragma unroll
  for (int nt = 0; nt < kNq; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dp[nt][e] = __fmul_rn(p[nt][e], __fsub_rn(dp[nt][e], d_s[nt * 8 + 2 * t4 + (e & 1)]));
}

// dV += P^T dO and dK += dS^T Q (A from registers, dO and Q MN-major at
// do_addr, q_addr with kQueries rows per column block). One commit group.
template <typename T, int kD, int kQueries>
__device__ __forceinline__ void FlashBwdIssueDvDk(float (&dv)[kD / 8][4], float (&dk)[kD / 8][4],
                                                  const uint32_t (&p_a)[kQueries / 16][4],
                                                  const uint32_t (&ds_a)[kQueries / 16][4], uint32_t do_addr,
                                                  uint32_t q_addr) {
#pragma unroll
  for (int kk = 0; kk < kQueries / 16; ++kk)
    WgmmaRS<T, kD>(dv, p_a[kk], SmemDescriptor(do_addr + kk * 16 * 128, kQueries * 128, 1024), 1);
#pragma unroll
  for (int kk = 0; kk < kQueries / 16; ++kk)
    WgmmaRS<T, kD>(dk, ds_a[kk], SmemDescriptor(q_addr + kk * 16 * 128, kQueries * 128, 1024), 1);
  WgmmaCommit();
}

// dq (64 queries x kD) += dS (K-major at ds_addr, kDsRows rows per column
// block of 64 keys) times the kKeys key rows of K (MN-major at k_addr,
// kKeys rows per column block). No commit.
template <typename T, int kD, int kDsRows, int kKeys>
__device__ __forceinline__ void FlashBwdIssueDq(float (&dq)[kD / 8][4], uint32_t ds_addr, uint32_t k_addr) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
    WgmmaSS<T, kD, /*kTransB=*/1>(dq, SmemDescriptor(ds_addr + (kk >> 2) * (kDsRows * 128) + (kk & 3) * 32, 16, 1024),
                                  SmemDescriptor(k_addr + kk * 16 * 128, kKeys * 128, 1024), 1);
}

}  // namespace strata::kernels::cuda
