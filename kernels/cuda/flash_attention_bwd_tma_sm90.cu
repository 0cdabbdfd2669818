// SPDX-License-Identifier: Apache-2.0
// The dS-buffer flash attention backward on Hopper, warp-specialized
// (sm_90a): FlashBwdKernel::kTma (cuda_backend.h), the backward of `v6`.
// Same function, products, product order and workspace size as v4's passes
// (flash_attention_bwd_sm90.cu), so the same bits; what changes is who moves
// the data, as the TMA forward (flash_attention_fwd_tma_sm90.cu) does for v3:
//
// Pass 1, dK/dV: block = (b, h, 128 keys), 384 threads. Warpgroup 0 (the
// producer) gives its registers away; one thread loads K and V once and then
// the 64-query tiles of Q and dO into two stages with TMA, and a second warp
// fills each stage's lse log2e and delta. Warpgroups 1 and 2 (64 keys each)
// wait only on the stages' mbarriers, run v4's four products and the
// softmax gradient (flash_bwd_wgmma_steps.cuh), and release a stage once the
// products that read it have completed. Neither waits for the other: there
// is no __syncthreads in the loop, so one's exp and dS run under the other's
// products. Each warpgroup writes its half of the tile's dS with stmatrix
// (transposing dS^T to [query][key]) into one of three staging buffers, and
// one of its threads copies it out with a bulk store.
//
// Pass 2, dQ = scale dS K: block = (b, h, 128 queries), 384 threads; the
// producer brings in each 128-key step's two dS tiles (bulk copies) and K
// (TMA) into three stages, the two consumer warpgroups (64 queries each)
// accumulate.
//
// The dS workspace holds v4's panels (flash_ds_panels.cuh) with each panel's
// (64 queries x 128 keys) tiles stored as the byte image of a swizzled
// shared-memory tile (DsTileImage), so that both passes move a tile with one
// bulk copy and no address arithmetic per element.
//
// Covers head_dim 64 and 128 (a box is 64 columns of one head) with 16-byte
// aligned qkv, dout and workspace; FlashAttentionBackwardTmaPasses runs v4's
// passes for other shapes.
#include <cuda.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_bwd_wgmma_steps.cuh"
#include "kernels/cuda/flash_dispatch.cuh"
#include "kernels/cuda/flash_ds_panels.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/tma_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumerThreads = 256;
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128 x 24 + 256 x 240 <= 64 K
constexpr int kKeys = kDsKeys;        // keys per dK/dV block (64 per consumer warpgroup); keys per dQ step
constexpr int kQueries = kDsQueries;  // queries per dK/dV tile = rows of a dS tile
constexpr int kDqRows = 2 * kDsQueries;
constexpr int kBox = 64;  // rows per TMA box
constexpr int kStages = 2, kDqStages = 3;
constexpr int kDsBufs = 3;  // dS staging buffers per consumer warpgroup
constexpr int kDsHalf = kDsTileImageBytes / 2;  // one warpgroup's 64 keys of a dS tile
// Named barrier ids: 1 + w consumer warpgroup w's dS staging, 3 all consumers,
// 4 + w warpgroup w's epilogue.
constexpr int kDsBarrier = 1, kConsumersBarrier = 3, kEpilogueBarrier = 4;

struct DkDvBarriers {
  uint64_t kv_full;
  uint64_t full[kStages], empty[kStages];
};
struct DqBarriers {
  uint64_t full[kDqStages], empty[kDqStages];
};

// K, V + stages of (Q, dO, lse log2e, delta) + the dS staging buffers.
template <int kD>
constexpr size_t DkDvSmemBytes() {
  return 1024 +
         static_cast<size_t>(2 * SwizzledTileBytes<kD>(kKeys) + 2 * kStages * SwizzledTileBytes<kD>(kQueries) +
                             2 * kDsBufs * kDsHalf) +
         2 * kStages * kQueries * sizeof(float) + sizeof(DkDvBarriers);
}
template <int kD>
constexpr int DqStageBytes() {
  return 2 * kDsTileImageBytes + SwizzledTileBytes<kD>(kKeys);
}
template <int kD>
constexpr size_t DqSmemBytes() {
  return 1024 + static_cast<size_t>(kDqStages) * DqStageBytes<kD>() + sizeof(DqBarriers);
}

// The 128 rows from `row` of a tensor map of 64-row boxes into the swizzled
// tile at dst (kD / 64 column blocks of 128 rows), completing on bar.
template <int kD>
__device__ __forceinline__ void TmaLoadRows128(unsigned char* dst, const CUtensorMap* map, uint64_t* bar, int col,
                                               int row, int b) {
#pragma unroll
  for (int cb = 0; cb < kD / 64; ++cb)
#pragma unroll
    for (int rb = 0; rb < 128 / kBox; ++rb)
      TmaLoad3d(dst + cb * (128 * 128) + rb * (kBox * 128), map, bar, col + cb * 64, row + rb * kBox, b);
}

// grid ceil(T / 128) * B * H (FlashBlockTile): within each group of heads the
// first key block of every head (most queries) first. Needs D == kD.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_backward_dkdv_tma_kernel(const __grid_constant__ CUtensorMap qkv_map,
                                             const __grid_constant__ CUtensorMap dout_map, T* __restrict__ dkv,
                                             unsigned char* __restrict__ ds_ws, const float* __restrict__ lse,
                                             const float* __restrict__ delta, int seq, int H, int C,
                                             float scale_log2, float scale, int KV, int64_t dkv_stride,
                                             int64_t dv_off, int head_group) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kKVTile = SwizzledTileBytes<kD>(kKeys), kQTile = SwizzledTileBytes<kD>(kQueries);
  constexpr int kNq = kQueries / 8;  // accumulator column tiles of S^T, dP^T
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = AlignedSmem(smem_raw);
  unsigned char* sK = base;  // (kD/64 blocks, 128 keys, 128 B)
  unsigned char* sV = sK + kKVTile;
  unsigned char* sQ = sV + kKVTile;          // kStages x (kD/64, 64 queries, 128 B)
  unsigned char* sdO = sQ + kStages * kQTile;  // kStages
  unsigned char* sDs = sdO + kStages * kQTile;  // (2 warpgroups, kDsBufs, 64 queries x 128 B)
  float* sL = reinterpret_cast<float*>(sDs + 2 * kDsBufs * kDsHalf);  // (kStages, 64): lse log2e, +inf past T
  float* sDelta = sL + kStages * kQueries;                              // (kStages, 64): delta, 0 past T
  DkDvBarriers* bars = reinterpret_cast<DkDvBarriers*>(sDelta + kStages * kQueries);

  const int lane = threadIdx.x & 31;
  const int n_tiles = (seq + kKeys - 1) / kKeys;
  const FlashHeadTile ht = FlashBlockTile(n_tiles, head_group);
  const int bh = ht.bh, b = bh / H, h = bh % H;
  const int k0 = ht.tile * kKeys;
  const int n_qt = (seq + kQueries - 1) / kQueries;
  const int qt_begin = k0 / kQueries;  // queries before k0 see none of these keys
  const float* lse_g = lse + static_cast<int64_t>(bh) * seq;
  const float* delta_g = delta + static_cast<int64_t>(bh) * seq;

  if (threadIdx.x == 0) {
    MbarrierInit(&bars->kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      MbarrierInit(&bars->full[s], 1 + 32);  // the TMA thread + the lse/delta warp
      MbarrierInit(&bars->empty[s], kConsumerThreads);
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // ---- producer
    RegistersDecrease<kProducerRegs>();
    const int pwarp = threadIdx.x >> 5;
    if (pwarp == 0 && lane == 0) {
      const int kvh = h / (H / KV);
      TmaPrefetchDescriptor(&qkv_map);
      TmaPrefetchDescriptor(&dout_map);
      MbarrierArriveExpectTx(&bars->kv_full, 2 * kKVTile);
      TmaLoadRows128<kD>(sK, &qkv_map, &bars->kv_full, C + kvh * kD, k0, b);
      TmaLoadRows128<kD>(sV, &qkv_map, &bars->kv_full, C + (KV + kvh) * kD, k0, b);
      for (int it = qt_begin; it < n_qt; ++it) {
        const int i = it - qt_begin, s = i % kStages;
        MbarrierWait(&bars->empty[s], ((i / kStages) & 1) ^ 1);
        MbarrierArriveExpectTx(&bars->full[s], 2 * kQTile);
#pragma unroll
        for (int cb = 0; cb < kD / 64; ++cb) {
          TmaLoad3d(sQ + s * kQTile + cb * (kQueries * 128), &qkv_map, &bars->full[s], h * kD + cb * 64,
                    it * kQueries, b);
          TmaLoad3d(sdO + s * kQTile + cb * (kQueries * 128), &dout_map, &bars->full[s], h * kD + cb * 64,
                    it * kQueries, b);
        }
      }
    } else if (pwarp == 1) {
      for (int it = qt_begin; it < n_qt; ++it) {
        const int i = it - qt_begin, s = i % kStages;
        MbarrierWait(&bars->empty[s], ((i / kStages) & 1) ^ 1);
        for (int r = lane; r < kQueries; r += 32) {
          const int q = it * kQueries + r;
          sL[s * kQueries + r] = q < seq ? lse_g[q] * kLog2e : INFINITY;
          sDelta[s * kQueries + r] = q < seq ? delta_g[q] : 0.f;
        }
        MbarrierArrive(&bars->full[s]);  // release: these writes are seen by the waiters
      }
    }
    return;
  }

  // ---- consumers
  RegistersIncrease<kConsumerRegs>();
  const int cwarp = (threadIdx.x >> 5) - 4;  // 0..7: keys 16 cwarp .. of the block
  const int wg = cwarp >> 2, wwarp = cwarp & 3;
  const int wt = threadIdx.x & 127;  // thread within the warpgroup
  const int g = lane >> 2, t4 = lane & 3;
  const int key_wg = k0 + wg * 64;  // this warpgroup's first key
  const uint32_t k_addr = SmemAddr(sK) + wg * 64 * 128, v_addr = SmemAddr(sV) + wg * 64 * 128;
  unsigned char* ds_head = ds_ws + static_cast<int64_t>(bh) * DsHeadElems(seq) * 2;

  float dk[kD / 8][4], dv[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;

  MbarrierWait(&bars->kv_full, 0);
  for (int it = qt_begin; it < n_qt; ++it) {
    const int i = it - qt_begin, st = i % kStages;
    MbarrierWait(&bars->full[st], (i / kStages) & 1);
    const int q_base = it * kQueries;
    const float* l_s = sL + st * kQueries;
    const float* d_s = sDelta + st * kQueries;
    const uint32_t q_addr = SmemAddr(sQ + st * kQTile), do_addr = SmemAddr(sdO + st * kQTile);
    // As in v4: no branch on whether this warpgroup's keys reach the tile's
    // queries (ptxas would serialize the wgmmas, C7518); such a tile masks to zero.
    float s[kNq][4], dp[kNq][4];
    WgmmaFence();
    FlashBwdIssueKeysByQueries<T, kD, kKeys, kQueries>(s, k_addr, q_addr);    // S^T
    FlashBwdIssueKeysByQueries<T, kD, kKeys, kQueries>(dp, v_addr, do_addr);  // dP^T
    WgmmaWait<1>();  // S^T is done; dP^T may still run
    FenceAccumulator(s);
    FlashBwdProbs<kNq>(s, l_s, scale_log2, key_wg, wwarp, q_base, g, t4);
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
    FlashBwdIssueDvDk<T, kD, kQueries>(dv, dk, p_a, ds_a, do_addr, q_addr);  // the scale is applied at the end
    // This warpgroup's 64 keys of the tile's dS (the operand's bits) while dV
    // and dK run: ds_a[kk] holds four 8 x 8 matrices of dS^T (keys + 8 (e & 1),
    // queries 16 kk + 8 (e >> 1)), each stored transposed as 8 query rows of
    // 8 keys (one 16-byte chunk). The buffer's previous bulk store (three
    // tiles back) finished reading before this warpgroup's last barrier.
    {
      unsigned char* buf = sDs + (wg * kDsBufs + i % kDsBufs) * kDsHalf;
      const int e = lane >> 3, j = lane & 7;
#pragma unroll
      for (int kk = 0; kk < kNq / 2; ++kk)
        StMatrixX4Trans(ds_a[kk], buf + Swizzle128(kk * 16 + (e >> 1) * 8 + j, 2 * wwarp + (e & 1)));
      FenceProxyAsync();  // the bulk store (async proxy) reads what stmatrix wrote
      NamedBarrierSync(kDsBarrier + wg, 128);
      if (wt == 0) {
        BulkStore(ds_head + DsTileImageOffsetBytes(it, ht.tile) + wg * kDsHalf, buf, kDsHalf);
        BulkCommit();
        BulkWaitRead<1>();  // the store before this one has read its buffer
      }
    }
    WgmmaWait<0>();
    FenceAccumulator(dv);
    FenceAccumulator(dk);
    MbarrierArrive(&bars->empty[st]);
  }
  if (wt == 0) BulkWait<0>();  // the dS stores are done before the block (and its shared memory) goes

  // This warpgroup's own key rows of sK and sV are free: only its products,
  // all completed, read them.
  AccToSwizzled<T, kD, kKeys>(sK, dk, scale, cwarp);
  AccToSwizzled<T, kD, kKeys>(sV, dv, 1.f, cwarp);
  NamedBarrierSync(kEpilogueBarrier + wg, 128);
  T* dk_g = dkv + static_cast<int64_t>(b) * seq * dkv_stride + h * kD;
  StoreSwizzledRows<T, kD, kKeys, 128>(dk_g, sK, k0, seq, kD, dkv_stride, wg * 64, 64, wt);
  StoreSwizzledRows<T, kD, kKeys, 128>(dk_g + dv_off, sV, k0, seq, kD, dkv_stride, wg * 64, 64, wt);
#else
  __trap();
#endif
}

// grid ceil(T / 128) * B * H (FlashBlockTile), the last query block of a head
// (most keys) first. Needs D == kD.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_backward_dq_tma_kernel(const __grid_constant__ CUtensorMap qkv_map, T* __restrict__ dqkv,
                                           const unsigned char* __restrict__ ds_ws, int seq, int H, int C,
                                           float scale, int KV, int head_group) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStage = DqStageBytes<kD>();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = AlignedSmem(smem_raw);
  // Stage s at base + s kStage: the dS tiles of panels 2 mb and 2 mb + 1
  // (kDsTileImageBytes each), then K (kD/64 blocks, 128 keys, 128 B).
  DqBarriers* bars = reinterpret_cast<DqBarriers*>(base + kDqStages * kStage);

  const int n_tiles = (seq + kDqRows - 1) / kDqRows;
  const FlashHeadTile ht = FlashBlockTile(n_tiles, head_group);
  const int bh = ht.bh, b = bh / H, h = bh % H;
  const int mb = n_tiles - 1 - ht.tile;  // query block: panels 2 mb (warpgroup 0) and 2 mb + 1
  const int q0 = mb * kDqRows;
  // Keys 0 .. min(seq, q0 + 128) - 1, all inside both panels.
  const int n_steps = (min(seq, q0 + kDqRows) + kKeys - 1) / kKeys;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kDqStages; ++s) {
      MbarrierInit(&bars->full[s], 1);
      MbarrierInit(&bars->empty[s], kConsumerThreads);
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // ---- producer
    RegistersDecrease<kProducerRegs>();
    if (threadIdx.x == 0) {
      const unsigned char* ds_head = ds_ws + static_cast<int64_t>(bh) * DsHeadElems(seq) * 2;
      // The last block may hold one panel only: its second warpgroup then
      // reads the first panel's tiles again and its rows are not stored.
      const int p1 = (2 * mb + 1) * kQueries < seq ? 2 * mb + 1 : 2 * mb;
      const int col_k = C + (h / (H / KV)) * kD;
      TmaPrefetchDescriptor(&qkv_map);
      for (int j = 0; j < n_steps; ++j) {
        const int s = j % kDqStages;
        unsigned char* stage = base + s * kStage;
        MbarrierWait(&bars->empty[s], ((j / kDqStages) & 1) ^ 1);
        MbarrierArriveExpectTx(&bars->full[s], kStage);
        BulkLoad(stage, ds_head + DsTileImageOffsetBytes(2 * mb, j), kDsTileImageBytes, &bars->full[s]);
        BulkLoad(stage + kDsTileImageBytes, ds_head + DsTileImageOffsetBytes(p1, j), kDsTileImageBytes,
                 &bars->full[s]);
        TmaLoadRows128<kD>(stage + 2 * kDsTileImageBytes, &qkv_map, &bars->full[s], col_k, j * kKeys, b);
      }
    }
    return;
  }

  // ---- consumers
  RegistersIncrease<kConsumerRegs>();
  const int cwarp = (threadIdx.x >> 5) - 4;  // 0..7: queries 16 cwarp .. of the block
  const int wg = cwarp >> 2;
  const int wt = threadIdx.x & 127;
  float dq[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
  for (int j = 0; j < n_steps; ++j) {
    const int s = j % kDqStages;
    const uint32_t stage = SmemAddr(base + s * kStage);
    MbarrierWait(&bars->full[s], (j / kDqStages) & 1);
    FenceAccumulator(dq);
    WgmmaFence();
    FlashBwdIssueDq<T, kD, kQueries, kKeys>(dq, stage + wg * kDsTileImageBytes, stage + 2 * kDsTileImageBytes);
    WgmmaCommit();
    WgmmaWait<1>();  // the previous step's products are done: release its stage
    FenceAccumulator(dq);
    if (j > 0) MbarrierArrive(&bars->empty[(j - 1) % kDqStages]);
  }
  WgmmaWait<0>();
  FenceAccumulator(dq);
  // dQ through stage 0 once both warpgroups are done reading every stage.
  NamedBarrierSync(kConsumersBarrier, kConsumerThreads);
  AccToSwizzled<T, kD, kDqRows>(base, dq, scale, cwarp);
  NamedBarrierSync(kEpilogueBarrier + wg, 128);
  const int64_t row_stride = C + 2LL * KV * kD;
  StoreSwizzledRows<T, kD, kDqRows, 128>(dqkv + static_cast<int64_t>(b) * seq * row_stride + h * kD, base, q0,
                                         seq, kD, row_stride, wg * 64, 64, wt);
#else
  __trap();
#endif
}

template <typename T, int kD>
Status Launch(cudaStream_t stream, const AttentionShape& s, float scale, const FlashDsPasses& p) {
  ASSIGN_OR_RETURN(const int head_group, FlashHeadGroup());
  const int H = static_cast<int>(s.heads), KV = static_cast<int>(s.kv());
  const int seq = static_cast<int>(s.seq), C = H * kD;
  const uint64_t row_stride = static_cast<uint64_t>(C) + 2ULL * KV * kD;
  const bool bf = s.dtype == DType::kBF16;
  CUtensorMap qkv_map, dout_map;
  RETURN_IF_ERROR(EncodeSequenceTmaMap(&qkv_map, p.qkv, row_stride, seq, s.batch, kBox, bf));
  RETURN_IF_ERROR(EncodeSequenceTmaMap(&dout_map, p.dout, C, seq, s.batch, kBox, bf));
  const unsigned grid = static_cast<unsigned>(s.batch * s.heads) * CeilDiv(seq, kKeys);
  {
    constexpr size_t smem = DkDvSmemBytes<kD>();
    auto kernel = flash_attention_backward_dkdv_tma_kernel<T, kD>;
    RETURN_IF_ERROR(LaunchWithSmem(kernel, grid, kThreads, smem, stream, qkv_map, dout_map,
        static_cast<T*>(p.dkv), static_cast<unsigned char*>(p.ds), p.lse, p.delta, seq, H, C, scale * kLog2e,
        scale, KV, p.dkv_stride, p.dv_off, head_group));
  }
  {
    static_assert(kDqRows == kKeys, "the dQ blocks and the dK/dV blocks tile the sequence alike");
    constexpr size_t smem = DqSmemBytes<kD>();
    auto kernel = flash_attention_backward_dq_tma_kernel<T, kD>;
    RETURN_IF_ERROR(LaunchWithSmem(kernel, grid, kThreads, smem, stream, qkv_map, static_cast<T*>(p.dqkv),
        static_cast<const unsigned char*>(p.ds), seq, H, C, scale, KV, head_group));
  }
  return Status::OK();
}

}  // namespace

Status FlashAttentionBackwardTmaPasses(cudaStream_t stream, const AttentionShape& s, float scale,
                                       const FlashDsPasses& passes) {
  if (!FlashWgmmaBuilt())
    return FailedPrecondition("flash attention backward (TMA): this build has no sm_90a code "
                              "(CMAKE_CUDA_ARCHITECTURES without 90a)");
  if (s.batch == 0 || s.seq == 0 || s.heads == 0) return Status::OK();
  const bool covered = FlashTmaCovers(s, passes.qkv) && Aligned16(passes.dout) && Aligned16(passes.ds);
  if (!covered) return FlashAttentionBackwardWgmmaPasses(stream, s, scale, passes);
  return DispatchFlash(s, [&](auto tag, auto dim) -> Status {
    return Launch<decltype(tag), decltype(dim)::value>(stream, s, scale, passes);
  });
}

}  // namespace strata::kernels::cuda
