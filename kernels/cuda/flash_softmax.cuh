// SPDX-License-Identifier: Apache-2.0
// The online-softmax step of the flash forward kernels (FlashAttention-2),
// shared by the mma.sync kernel (flash_attention.cu) and the wgmma kernel
// (flash_attention_sm90.cu). Both hold a 16-row slice of scores per warp in
// mma.sync's C layout (each row spread over the 4 lanes of a quad, two rows
// per thread: r = 0 for row g, r = 1 for row g + 8).
#pragma once

#include <cmath>

namespace strata::kernels::cuda {

// One key tile, the probabilities: s[kNS][4] holds the tile's scores of this
// thread's two rows (masked entries -INFINITY); with kFma raw scores (the
// running max is kept in raw units and each probability is exp2 of one FMA,
// FlashAttention-2's form), else already multiplied by scale * log2(e).
// Updates the running max m_run and sum l_run, replaces s by the
// unnormalized probabilities, and returns in alpha the factor by which the
// output accumulator of each row must be rescaled (RescaleRows). The max over
// a tile whose entries are all masked is -INFINITY, which leaves a row
// unchanged; a row's running max must be finite after its first tile.
template <int kNS, bool kFma>
__device__ __forceinline__ void SoftmaxTileProbs(float (&s)[kNS][4], float (&m_run)[2], float (&l_run)[2],
                                                 float scale_log2, float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kNS; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run[r], mx);
    alpha[r] = kFma ? exp2f((m_run[r] - m_new) * scale_log2) : exp2f(m_run[r] - m_new);
    const float m_sub = kFma ? m_new * scale_log2 : m_new;  // subtracted in the log2 domain
    m_run[r] = m_new;
    l_run[r] *= alpha[r];
#pragma unroll
    for (int nt = 0; nt < kNS; ++nt) {
      const float p0 = kFma ? exp2f(fmaf(s[nt][2 * r], scale_log2, -m_sub)) : exp2f(s[nt][2 * r] - m_sub);
      const float p1 =
          kFma ? exp2f(fmaf(s[nt][2 * r + 1], scale_log2, -m_sub)) : exp2f(s[nt][2 * r + 1] - m_sub);
      s[nt][2 * r] = p0;
      s[nt][2 * r + 1] = p1;
      l_run[r] += p0 + p1;
    }
  }
}

// o[kNO][4] (this thread's two rows) times alpha[r] per row.
template <int kNO>
__device__ __forceinline__ void RescaleRows(float (&o)[kNO][4], const float (&alpha)[2]) {
#pragma unroll
  for (int nt = 0; nt < kNO; ++nt) {
    o[nt][0] *= alpha[0];
    o[nt][1] *= alpha[0];
    o[nt][2] *= alpha[1];
    o[nt][3] *= alpha[1];
  }
}

// Both of the above: one key tile of the online softmax.
template <int kNS, int kNO, bool kFma>
__device__ __forceinline__ void OnlineSoftmaxTile(float (&s)[kNS][4], float (&o)[kNO][4],
                                                  float (&m_run)[2], float (&l_run)[2],
                                                  float scale_log2) {
  float alpha[2];
  SoftmaxTileProbs<kNS, kFma>(s, m_run, l_run, scale_log2, alpha);
  RescaleRows(o, alpha);
}

// After the last tile: the row sums over the quad, the natural-log
// log-sum-exp of each of this thread's two rows (lse_out[r]), and o divided
// by the row sum.
template <int kNO, bool kFma>
__device__ __forceinline__ void FinishSoftmaxRows(float (&o)[kNO][4], const float (&m_run)[2],
                                                  const float (&l_run)[2], float scale_log2,
                                                  float (&lse_out)[2]) {
  constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_run[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = 1.f / l;
    // Rounding spelled out (__fmaf_rn, __fadd_rn): left to ptxas, whether
    // m * scale + log2 l fuses into one FMA depended on the kernel around
    // it, and the kernels that share these products gave different lse bits.
    const float log2_l = log2f(l);
    lse_out[r] = (kFma ? __fmaf_rn(m_run[r], scale_log2, log2_l) : __fadd_rn(m_run[r], log2_l)) * kLn2;
#pragma unroll
    for (int nt = 0; nt < kNO; ++nt) {
      o[nt][2 * r] *= inv;
      o[nt][2 * r + 1] *= inv;
    }
  }
}

}  // namespace strata::kernels::cuda
