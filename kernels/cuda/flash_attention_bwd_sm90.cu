// SPDX-License-Identifier: Apache-2.0
// The two passes of the dS-buffer flash attention backward on Hopper's
// warpgroup MMA (wgmma, sm_90a): FlashBwdKernel::kWgmma (cuda_backend.h).
// Same function, workspace and determinism rule as the mma.sync passes of
// flash_attention_bwd_ds.cu (every sum in a fixed order, no atomics); delta =
// rowsum(dO * O) comes from flash_attention.cu first, and with grouped-query
// attention the per-query-head dK/dV are summed there afterwards.
//
// Pass 1, dK/dV: block = (b, h, 128 keys), 2 warpgroups of 64 keys each. K
// and V of the block stay in 128-byte swizzled shared memory (wgmma.cuh); the
// 64-query tiles at or after the keys stream through a double-buffered
// cp.async pipeline (Q, dO, lse, delta). Per tile and warpgroup, with the
// keys as the M side so that P^T and dS^T come out of the accumulators in the
// A operand's layout:
//   S^T  = K Q^T     wgmma m64n64k16, A and B from shared memory (K-major)
//   dP^T = V dO^T    the same, issued right behind it
//   P^T  = exp2(S^T scale log2e - lse log2e), masked;  dS^T = P^T (dP^T - delta)
//                    (the exp of P runs while the tensor cores do dP)
//   dV  += P^T dO    wgmma m64nDk16, P^T from registers, dO MN-major
//   dK  += dS^T Q    the same with dS^T and Q
// dS^T, rounded to T as the operand, goes through shared memory (two
// buffers) to its panel of the workspace (flash_ds_panels.cuh) as dS
// [query][key]; a tile's copy out runs while the next tile's S^T and dP^T
// occupy the tensor cores.
//
// Pass 2, dQ = scale dS K: block = (b, h, 128 queries), one panel per
// warpgroup; 128-key steps of both panels' dS (K-major A) and of K (MN-major
// B) stream through a double-buffered pipeline.
//
// Built for sm_90a only (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere the kernels
// trap and FlashWgmmaBuilt() (flash_attention_sm90.cu) says so.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_bwd_wgmma_steps.cuh"
#include "kernels/cuda/flash_dispatch.cuh"
#include "kernels/cuda/flash_ds_panels.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/wgmma.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 256;                // 2 warpgroups
constexpr int kKeys = kDsKeys;               // keys per dK/dV block (64 per warpgroup); keys per dQ step
constexpr int kQueries = kDsQueries;         // queries per streamed dK/dV tile = rows of a panel
constexpr int kDqRows = 2 * kDsQueries;      // queries per dQ block: two panels
constexpr int kSdsStride = kKeys + 8;        // dS staging row stride (elements)

// K, V + 2 x (Q, dO) + 2 dS staging tiles + 2 x (lse, delta), plus slack to
// align the tiles to 1024 bytes.
template <int kD>
constexpr size_t DkDvSmemBytes() {
  return 1024 + static_cast<size_t>(2 * SwizzledTileBytes<kD>(kKeys) + 4 * SwizzledTileBytes<kD>(kQueries)) +
         2 * kQueries * kSdsStride * 2 + 4 * kQueries * sizeof(float);
}
// 2 x (dS of two panels, K).
template <int kD>
constexpr size_t DqSmemBytes() {
  return 1024 + 2 * static_cast<size_t>(SwizzledTileBytes<kKeys>(kDqRows) + SwizzledTileBytes<kD>(kKeys));
}

// grid ceil(T / 128) * B * H (FlashBlockTile): within each group of heads the
// first key block of every head (most queries) first.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_backward_dkdv_wgmma_kernel(T* __restrict__ dkv, T* __restrict__ ds_ws,
                                               const T* __restrict__ qkv, const T* __restrict__ dout,
                                               const float* __restrict__ lse,
                                               const float* __restrict__ delta, int seq, int H, int D,
                                               int C, float scale_log2, float scale, int KV,
                                               int64_t dkv_stride, int64_t dv_off, int head_group) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kKVTile = SwizzledTileBytes<kD>(kKeys), kQTile = SwizzledTileBytes<kD>(kQueries);
  constexpr int kNq = kQueries / 8;  // accumulator column tiles of S^T, dP^T
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = AlignedSmem(smem_raw);
  unsigned char* sK = base;              // (kD/64 blocks, 128 keys, 128 B)
  unsigned char* sV = sK + kKVTile;
  unsigned char* sQ = sV + kKVTile;      // 2 stages of (kD/64, 64 queries, 128 B)
  unsigned char* sdO = sQ + 2 * kQTile;  // 2 stages
  uint16_t* sdS = reinterpret_cast<uint16_t*>(sdO + 2 * kQTile);          // 2 x (64, kSdsStride): T bits, [query][key]
  float* sL = reinterpret_cast<float*>(sdS + 2 * kQueries * kSdsStride);  // (2, 64): lse log2e, +inf past T
  float* sDelta = sL + 2 * kQueries;                                   // (2, 64): delta, 0 past T

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wg = warp >> 2;  // warpgroup: keys 64 wg .. 64 wg + 63 of the block
  const int g = lane >> 2, t4 = lane & 3;
  const int n_tiles = (seq + kKeys - 1) / kKeys;
  const FlashHeadTile ht = FlashBlockTile(n_tiles, head_group);
  const int bh = ht.bh, b = bh / H, h = bh % H;
  const int k0 = ht.tile * kKeys;
  const int key_wg = k0 + wg * 64;  // this warpgroup's first key
  const int64_t row_stride = C + 2LL * KV * D;
  const T* q_g = qkv + static_cast<int64_t>(b) * seq * row_stride + h * D;
  const T* k_g = qkv + static_cast<int64_t>(b) * seq * row_stride + C + (h / (H / KV)) * D;
  const T* v_g = k_g + KV * D;
  const T* do_g = dout + static_cast<int64_t>(b) * seq * C + h * D;
  const float* lse_g = lse + static_cast<int64_t>(bh) * seq;
  const float* delta_g = delta + static_cast<int64_t>(bh) * seq;
  T* ds_head = ds_ws + static_cast<int64_t>(bh) * DsHeadElems(seq);
  const uint32_t k_addr = SmemAddr(sK) + wg * 64 * 128, v_addr = SmemAddr(sV) + wg * 64 * 128;

  auto load_queries = [&](int stage, int tile) {
    const int r0 = tile * kQueries;
    LoadSwizzled<T, kD, kQueries, kThreads>(sQ + stage * kQTile, q_g, r0, seq, D, row_stride);
    LoadSwizzled<T, kD, kQueries, kThreads>(sdO + stage * kQTile, do_g, r0, seq, D, C);
    if (threadIdx.x < kQueries) {
      const int q = r0 + threadIdx.x;
      sL[stage * kQueries + threadIdx.x] = q < seq ? lse_g[q] * kLog2e : INFINITY;
      sDelta[stage * kQueries + threadIdx.x] = q < seq ? delta_g[q] : 0.f;
    }
  };

  // dS of query tile `tile` from staging buffer `buf` to its panel, key block k0.
  auto copy_ds = [&](int buf, int tile) {
    T* panel = ds_head + DsPanelOffset(tile);
    const int64_t width = DsPanelWidth(tile);
    const uint16_t* src = sdS + buf * kQueries * kSdsStride;
    constexpr int kChunks = kKeys / 8;
    for (int i = threadIdx.x; i < kQueries * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      *reinterpret_cast<int4*>(panel + r * width + k0 + c * 8) =
          *reinterpret_cast<const int4*>(src + r * kSdsStride + c * 8);
    }
  };

  const int n_qt = (seq + kQueries - 1) / kQueries;
  const int qt_begin = k0 / kQueries;  // queries before k0 see none of these keys
  LoadSwizzled<T, kD, kKeys, kThreads>(sK, k_g, k0, seq, D, row_stride);
  LoadSwizzled<T, kD, kKeys, kThreads>(sV, v_g, k0, seq, D, row_stride);
  load_queries(0, qt_begin);
  CpAsyncCommit();

  float dk[kD / 8][4], dv[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;

  for (int it = qt_begin; it < n_qt; ++it) {
    const int stage = (it - qt_begin) & 1;
    if (it + 1 < n_qt) {
      load_queries(stage ^ 1, it + 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    FenceProxyAsync();  // the tiles cp.async wrote are read by the tensor cores
    __syncthreads();
    const int q_base = it * kQueries;
    const float* l_s = sL + stage * kQueries;
    const float* d_s = sDelta + stage * kQueries;
    const uint32_t q_addr = SmemAddr(sQ + stage * kQTile), do_addr = SmemAddr(sdO + stage * kQTile);
    // No branch on whether this warpgroup's keys reach the tile's queries at
    // all (the first tile of warpgroup 1 does not): ptxas cannot prove such a
    // branch warpgroup-uniform and then serializes every wgmma of the kernel
    // (C7518). The products of such a tile are masked to zero, the same bits.
    float s[kNq][4], dp[kNq][4];
    WgmmaFence();
    FlashBwdIssueKeysByQueries<T, kD, kKeys, kQueries>(s, k_addr, q_addr);    // S^T
    FlashBwdIssueKeysByQueries<T, kD, kKeys, kQueries>(dp, v_addr, do_addr);  // dP^T
    // The previous tile's dS out while S^T and dP^T run (its buffer was
    // completed before the previous iteration's last barrier).
    if (it > qt_begin) copy_ds(stage ^ 1, it - 1);
    WgmmaWait<1>();  // S^T is done; dP^T may still run
    FenceAccumulator(s);
    FlashBwdProbs<kNq>(s, l_s, scale_log2, key_wg, warp & 3, q_base, g, t4);
    WgmmaWait<0>();
    FenceAccumulator(dp);
    FlashBwdDs<kNq>(dp, s, d_s, t4);
    uint32_t p_a[kNq / 2][4], ds_a[kNq / 2][4];
    PackA<T, kNq>(p_a, s);
    PackA<T, kNq>(ds_a, dp);
    FenceAccumulator(p_a);
    FenceAccumulator(ds_a);
    FenceAccumulator(dv);
    FenceAccumulator(dk);
    WgmmaFence();
    // dV += P^T dO, dK += dS^T Q (the scale is applied at the end).
    FlashBwdIssueDvDk<T, kD, kQueries>(dv, dk, p_a, ds_a, do_addr, q_addr);
    // dS^T (the operand's bits) into sdS as [query][key] while dV and dK run.
    {
      uint16_t* dst = sdS + stage * kQueries * kSdsStride;
      const int key_l = wg * 64 + (warp & 3) * 16 + g;
#pragma unroll
      for (int kk = 0; kk < kNq / 2; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ql = kk * 16 + (e >> 1) * 8 + 2 * t4, kl = key_l + (e & 1) * 8;
          dst[ql * kSdsStride + kl] = static_cast<uint16_t>(ds_a[kk][e] & 0xFFFFu);  // PackPair: lo first
          dst[(ql + 1) * kSdsStride + kl] = static_cast<uint16_t>(ds_a[kk][e] >> 16);
        }
    }
    WgmmaWait<0>();
    FenceAccumulator(dv);
    FenceAccumulator(dk);
    __syncthreads();  // this dS buffer is whole; every read of this stage is done (refilled next)
  }
  copy_ds((n_qt - 1 - qt_begin) & 1, n_qt - 1);

  // sK and sV are free: every wgmma completed before the loop's last barrier.
  AccToSwizzled<T, kD, kKeys>(sK, dk, scale);
  AccToSwizzled<T, kD, kKeys>(sV, dv, 1.f);
  __syncthreads();
  T* dk_g = dkv + static_cast<int64_t>(b) * seq * dkv_stride + h * D;
  StoreSwizzled<T, kD, kKeys, kThreads>(dk_g, sK, k0, seq, D, dkv_stride);
  StoreSwizzled<T, kD, kKeys, kThreads>(dk_g + dv_off, sV, k0, seq, D, dkv_stride);
#else
  __trap();
#endif
}

// grid ceil(T / 128) * B * H (FlashBlockTile), the last query block of a head
// (most keys) first.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_backward_dq_wgmma_kernel(T* __restrict__ dqkv, const T* __restrict__ ds_ws,
                                             const T* __restrict__ qkv, int seq, int H, int D, int C,
                                             float scale, int KV, int head_group) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kDsTile = SwizzledTileBytes<kKeys>(kDqRows), kKTile = SwizzledTileBytes<kD>(kKeys);
  constexpr int kStage = kDsTile + kKTile;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = AlignedSmem(smem_raw);
  // Stage s: dS (2 blocks of 64 keys, 128 queries, 128 B) at base + s kStage, K right after it.

  const int warp = threadIdx.x >> 5, wg = warp >> 2;
  const int n_tiles = (seq + kDqRows - 1) / kDqRows;
  const FlashHeadTile ht = FlashBlockTile(n_tiles, head_group);
  const int bh = ht.bh, b = bh / H, h = bh % H;
  const int mb = n_tiles - 1 - ht.tile;  // query block: panels 2 mb (warpgroup 0) and 2 mb + 1
  const int q0 = mb * kDqRows;
  const int64_t row_stride = C + 2LL * KV * D;
  const T* k_g = qkv + static_cast<int64_t>(b) * seq * row_stride + C + (h / (H / KV)) * D;
  const T* ds_head = ds_ws + static_cast<int64_t>(bh) * DsHeadElems(seq);
  const int64_t width = DsPanelWidth(2 * mb);  // = that of panel 2 mb + 1

  auto load = [&](int stage, int j) {
    unsigned char* s_ds = base + stage * kStage;
    LoadSwizzled<T, kD, kKeys, kThreads>(s_ds + kDsTile, k_g, j * kKeys, seq, D, row_stride);
    constexpr int kChunks = kKeys / 8;
    for (int i = threadIdx.x; i < kDqRows * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const int panel = 2 * mb + r / kQueries;
      const bool valid = panel * kQueries < seq;  // the last block may hold one panel only
      const T* src = valid ? ds_head + DsPanelOffset(panel) + (r % kQueries) * width + j * kKeys + c * 8 : ds_head;
      CpAsync16(s_ds + (c >> 3) * (kDqRows * 128) + Swizzle128(r, c & 7), src, valid);
    }
  };

  // Keys 0 .. min(seq, q0 + 128) - 1, all inside both panels' width.
  const int n_steps = (min(seq, q0 + kDqRows) + kKeys - 1) / kKeys;
  load(0, 0);
  CpAsyncCommit();
  float dq[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
  for (int j = 0; j < n_steps; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_steps) {
      load(stage ^ 1, j + 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    FenceProxyAsync();
    __syncthreads();
    const uint32_t ds_addr = SmemAddr(base + stage * kStage) + wg * 64 * 128;
    const uint32_t k_addr = SmemAddr(base + stage * kStage + kDsTile);
    FenceAccumulator(dq);
    WgmmaFence();
    FlashBwdIssueDq<T, kD, kDqRows, kKeys>(dq, ds_addr, k_addr);
    WgmmaCommit();
    WgmmaWait<0>();
    FenceAccumulator(dq);
    __syncthreads();  // this stage is refilled by the next iteration
  }
  // Stage 0's dS tile is free after the last barrier: dQ through it.
  AccToSwizzled<T, kD, kDqRows>(base, dq, scale);
  __syncthreads();
  StoreSwizzled<T, kD, kDqRows, kThreads>(dqkv + static_cast<int64_t>(b) * seq * row_stride + h * D, base, q0, seq, D,
                                row_stride);
#else
  __trap();
#endif
}

template <typename T, int kD>
Status Launch(cudaStream_t stream, const AttentionShape& s, float scale, const FlashDsPasses& p) {
  ASSIGN_OR_RETURN(const int head_group, FlashHeadGroup());
  const int H = static_cast<int>(s.heads), D = static_cast<int>(s.head_dim);
  const int seq = static_cast<int>(s.seq), C = H * D, KV = static_cast<int>(s.kv());
  const unsigned grid = static_cast<unsigned>(s.batch * s.heads) * CeilDiv(seq, kKeys);
  {
    constexpr size_t smem = DkDvSmemBytes<kD>();
    auto kernel = flash_attention_backward_dkdv_wgmma_kernel<T, kD>;
    RETURN_IF_ERROR(LaunchWithSmem(kernel, grid, kThreads, smem, stream, static_cast<T*>(p.dkv),
        static_cast<T*>(p.ds), static_cast<const T*>(p.qkv), static_cast<const T*>(p.dout), p.lse, p.delta, seq,
        H, D, C, scale * kLog2e, scale, KV, p.dkv_stride, p.dv_off, head_group));
  }
  {
    static_assert(kDqRows == kKeys, "the dQ blocks and the dK/dV blocks tile the sequence alike");
    constexpr size_t smem = DqSmemBytes<kD>();
    auto kernel = flash_attention_backward_dq_wgmma_kernel<T, kD>;
    RETURN_IF_ERROR(LaunchWithSmem(kernel, grid, kThreads, smem, stream, static_cast<T*>(p.dqkv),
        static_cast<const T*>(p.ds), static_cast<const T*>(p.qkv), seq, H, D, C, scale, KV, head_group));
  }
  return Status::OK();
}

}  // namespace

Status FlashAttentionBackwardWgmmaPasses(cudaStream_t stream, const AttentionShape& s, float scale,
                                         const FlashDsPasses& passes) {
  if (!FlashWgmmaBuilt())
    return FailedPrecondition("flash attention backward (wgmma): this build has no sm_90a code "
                              "(CMAKE_CUDA_ARCHITECTURES without 90a)");
  if (s.batch == 0 || s.seq == 0 || s.heads == 0) return Status::OK();
  if (s.head_dim > 128 || s.head_dim % 8 != 0)
    return InvalidArgument("flash attention backward (wgmma): head_dim " + std::to_string(s.head_dim) +
                           " (needs a multiple of 8, at most 128)");
  return DispatchFlash(s, [&](auto tag, auto dim) -> Status {
    return Launch<decltype(tag), decltype(dim)::value>(stream, s, scale, passes);
  });
}

}  // namespace strata::kernels::cuda
