// SPDX-License-Identifier: Apache-2.0
// Causal flash attention forward on Hopper, warp-specialized (sm_90a): the
// forward of the `v5` and `v5pp` variants (cuda_backend.h). Same function,
// layout and products as flash_attention_sm90.cu (v3's forward); what
// changes is who moves the data:
//
//   warpgroup 0 (the producer) gives most of its registers away and has one
//   thread issue TMA copies: Q once, then K_j and V_j into two stages each;
//   warpgroups 1 and 2 (the consumers, 64 query rows each) only wait on the
//   stages' mbarriers, run the wgmma products and the softmax, and release
//   each stage as soon as the product reading it has completed.
//
// No __syncthreads in the loop and no load instructions in the consumers'
// issue slots; the producer runs up to two tiles ahead. With kPingpong the
// two consumer warpgroups take turns issuing their products (two named
// barriers), so one warpgroup's softmax runs while the other's products keep
// the tensor cores busy (FlashAttention-3's ping-pong schedule), on top of
// the overlap within a warpgroup that v3 has (S_j issued with P_{j-1} V_{j-1},
// the softmax of S_j while that product runs).
//
// Covers head_dim 64 and 128 exactly (a box is 64 columns of one head);
// FlashAttentionForwardTma falls back to v3's kernel for other shapes.
#include <cuda.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_fwd_wgmma_steps.cuh"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/tma_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumerThreads = 256;
constexpr int kBr = 128;  // query rows per block (64 per consumer warpgroup)
constexpr int kBc = 128;  // keys per K/V tile
constexpr int kStages = 2;
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128 x 24 + 256 x 240 <= 64 K
// Named barrier ids: 1 + w is consumer warpgroup w's turn to issue (ping-pong),
// 3 + w its epilogue.
constexpr int kTurnBarrier = 1, kEpilogueBarrier = 3;

struct Barriers {
  uint64_t q_full;
  uint64_t k_full[kStages], v_full[kStages];
  uint64_t k_empty[kStages], v_empty[kStages];
};

template <int kD>
constexpr size_t SmemBytes() {
  return 1024 + static_cast<size_t>(SwizzledTileBytes<kD>(kBr) + 2 * kStages * SwizzledTileBytes<kD>(kBc)) +
         sizeof(Barriers);
}

// grid ceil(T / 128) * B * H (FlashBlockTile), the last query block of a
// head (most keys) first. Needs scale_log2 > 0 and D == kD.
template <typename T, int kD, bool kPingpong>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_forward_tma_kernel(const __grid_constant__ CUtensorMap qkv_map, T* __restrict__ out,
                                       float* __restrict__ lse, int seq, int H, int C, float scale_log2, int KV,
                                       int head_group) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kQTile = SwizzledTileBytes<kD>(kBr), kKVTile = SwizzledTileBytes<kD>(kBc);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = AlignedSmem(smem_raw);
  unsigned char* sQ = base;  // (kD/64 blocks, kBr rows, 128 B)
  unsigned char* sK = sQ + kQTile;
  unsigned char* sV = sK + kStages * kKVTile;
  Barriers* bars = reinterpret_cast<Barriers*>(sV + kStages * kKVTile);

  const int n_tiles = (seq + kBr - 1) / kBr;
  const FlashHeadTile ht = FlashBlockTile(n_tiles, head_group);
  const int bh = ht.bh, b = bh / H, h = bh % H;
  const int q0 = (n_tiles - 1 - ht.tile) * kBr;
  // Causal: keys 0 .. min(seq, q0 + kBr) - 1; as in v3, every tile has a key
  // visible to each row of both warpgroups.
  const int n_kv = (min(seq, q0 + kBr) + kBc - 1) / kBc;

  if (threadIdx.x == 0) {
    MbarrierInit(&bars->q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      MbarrierInit(&bars->k_full[s], 1);
      MbarrierInit(&bars->v_full[s], 1);
      MbarrierInit(&bars->k_empty[s], kConsumerThreads);
      MbarrierInit(&bars->v_empty[s], kConsumerThreads);
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // ---- producer
    RegistersDecrease<kProducerRegs>();
    if (threadIdx.x == 0) {
      const int kvh = h / (H / KV);
      const int col_q = h * kD, col_k = C + kvh * kD, col_v = C + (KV + kvh) * kD;
      TmaPrefetchDescriptor(&qkv_map);
      MbarrierArriveExpectTx(&bars->q_full, kQTile);
#pragma unroll
      for (int cb = 0; cb < kD / 64; ++cb)
        TmaLoad3d(sQ + cb * (kBr * 128), &qkv_map, &bars->q_full, col_q + cb * 64, q0, b);
      for (int j = 0; j < n_kv; ++j) {
        const int s = j % kStages;
        const uint32_t empty_parity = ((j / kStages) & 1) ^ 1;
        MbarrierWait(&bars->k_empty[s], empty_parity);
        MbarrierArriveExpectTx(&bars->k_full[s], kKVTile);
#pragma unroll
        for (int cb = 0; cb < kD / 64; ++cb)
          TmaLoad3d(sK + s * kKVTile + cb * (kBc * 128), &qkv_map, &bars->k_full[s], col_k + cb * 64, j * kBc, b);
        MbarrierWait(&bars->v_empty[s], empty_parity);
        MbarrierArriveExpectTx(&bars->v_full[s], kKVTile);
#pragma unroll
        for (int cb = 0; cb < kD / 64; ++cb)
          TmaLoad3d(sV + s * kKVTile + cb * (kBc * 128), &qkv_map, &bars->v_full[s], col_v + cb * 64, j * kBc, b);
      }
    }
    return;
  }

  // ---- consumers
  RegistersIncrease<kConsumerRegs>();
  const int lane = threadIdx.x & 31;
  const int cwarp = (threadIdx.x >> 5) - 4;  // 0..7: rows 16 cwarp .. of the block
  const int wg = cwarp >> 2;                 // rows 64 wg .. 64 wg + 63
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = cwarp * 16;

  float o[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float s[kBc / 8][4];
  uint32_t p[kBc / 16][4];
  const uint32_t q_addr = SmemAddr(sQ) + wg * 64 * 128;

  // Ping-pong: this warpgroup waits for its turn before issuing a round of
  // products and hands the turn over after; the second warpgroup opens with
  // a hand-over so the first goes first, and skips its last one so that each
  // barrier sees as many arrivals as waits.
  const int rounds = n_kv + 1;  // S_0; S_j with P_{j-1} V_{j-1}; the last P V
  int round = 0;
  auto my_turn = [&] {
    if constexpr (kPingpong) NamedBarrierSync(kTurnBarrier + wg, kConsumerThreads);
  };
  auto hand_over = [&] {
    if constexpr (kPingpong) {
      ++round;
      if (wg == 0 || round < rounds) NamedBarrierArrive(kTurnBarrier + (wg ^ 1), kConsumerThreads);
    }
  };
  if constexpr (kPingpong)
    if (wg == 1) NamedBarrierArrive(kTurnBarrier + 0, kConsumerThreads);

  auto issue_s = [&](int j) {
    FlashIssueS<T, kD, kBr, kBc>(s, q_addr, SmemAddr(sK + (j % kStages) * kKVTile));
  };
  auto issue_pv = [&](int j) { FlashIssuePV<T, kD, kBc>(o, p, SmemAddr(sV + (j % kStages) * kKVTile)); };
  auto softmax = [&](int j, float (&alpha)[2]) {
    FlashCausalSoftmax<kBc>(s, m_run, l_run, scale_log2, alpha, j * kBc, q0 + wg * 64, q0 + row0 + g, t4);
  };
  auto full_parity = [](int j) { return static_cast<uint32_t>((j / kStages) & 1); };

  MbarrierWait(&bars->q_full, 0);
  MbarrierWait(&bars->k_full[0], 0);
  {
    float alpha[2];
    my_turn();
    WgmmaFence();
    issue_s(0);
    hand_over();
    WgmmaWait<0>();
    FenceAccumulator(s);
    MbarrierArrive(&bars->k_empty[0]);
    softmax(0, alpha);  // O is still zero: no rescale
    PackA<T, kBc / 8>(p, s);
  }
  for (int j = 1; j < n_kv; ++j) {
    const int sj = j % kStages, sv = (j - 1) % kStages;
    MbarrierWait(&bars->k_full[sj], full_parity(j));
    MbarrierWait(&bars->v_full[sv], full_parity(j - 1));
    float alpha[2];
    FenceAccumulator(o);
    FenceAccumulator(p);
    my_turn();
    WgmmaFence();
    issue_s(j);
    issue_pv(j - 1);
    hand_over();
    WgmmaWait<1>();  // S_j is done; P_{j-1} V_{j-1} may still run
    FenceAccumulator(s);
    MbarrierArrive(&bars->k_empty[sj]);
    softmax(j, alpha);
    WgmmaWait<0>();  // O and p are free
    FenceAccumulator(o);
    MbarrierArrive(&bars->v_empty[sv]);
    RescaleRows(o, alpha);
    PackA<T, kBc / 8>(p, s);
  }
  {
    const int sv = (n_kv - 1) % kStages;
    MbarrierWait(&bars->v_full[sv], full_parity(n_kv - 1));
    FenceAccumulator(o);
    FenceAccumulator(p);
    my_turn();
    WgmmaFence();
    issue_pv(n_kv - 1);
    hand_over();
    WgmmaWait<0>();
    FenceAccumulator(o);
  }

  float row_lse[2];
  FinishSoftmaxRows<kD / 8, true>(o, m_run, l_run, scale_log2, row_lse);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int q = q0 + row0 + g + r * 8;
    if (t4 == 0 && q < seq) lse[static_cast<int64_t>(bh) * seq + q] = row_lse[r];
  }
  // O through this warpgroup's own rows of sQ: its products (the only readers
  // of those rows) have completed.
  AccToSwizzled<T, kD, kBr>(sQ, o, 1.f, cwarp);
  NamedBarrierSync(kEpilogueBarrier + wg, 128);
  StoreSwizzledRows<T, kD, kBr, 128>(out + static_cast<int64_t>(b) * seq * C + h * kD, sQ, q0, seq, kD, C, wg * 64,
                                     64, static_cast<int>(threadIdx.x & 127));
#else
  __trap();
#endif
}

template <typename T, int kD, bool kPingpong>
Status Launch(cudaStream_t stream, const AttentionShape& s, float scale, void* out, float* lse,
              const void* qkv) {
  ASSIGN_OR_RETURN(const int head_group, FlashHeadGroup());
  const int H = static_cast<int>(s.heads), KV = static_cast<int>(s.kv());
  const int seq = static_cast<int>(s.seq), C = H * kD;
  const uint64_t row_stride = static_cast<uint64_t>(C) + 2ULL * KV * kD;
  CUtensorMap map;
  RETURN_IF_ERROR(EncodeSequenceTmaMap(&map, qkv, row_stride, seq, s.batch, kBr, s.dtype == DType::kBF16));
  constexpr size_t smem = SmemBytes<kD>();
  auto kernel = flash_attention_forward_tma_kernel<T, kD, kPingpong>;
  const unsigned grid = static_cast<unsigned>(s.batch * s.heads) * CeilDiv(seq, kBr);
  RETURN_IF_ERROR(LaunchWithSmem(kernel, grid, kThreads, smem, stream, map, static_cast<T*>(out), lse, seq, H,
      C, scale * kLog2e, KV, head_group));
  return Status::OK();
}

template <bool kPingpong>
Status Dispatch(cudaStream_t stream, const AttentionShape& s, float scale, void* out, float* lse,
                const void* qkv) {
  const bool small = s.head_dim == 64;
  switch (s.dtype) {
    case DType::kBF16:
      return small ? Launch<bf16, 64, kPingpong>(stream, s, scale, out, lse, qkv)
                   : Launch<bf16, 128, kPingpong>(stream, s, scale, out, lse, qkv);
    case DType::kF16:
      return small ? Launch<f16, 64, kPingpong>(stream, s, scale, out, lse, qkv)
                   : Launch<f16, 128, kPingpong>(stream, s, scale, out, lse, qkv);
    default:
      return InvalidArgument("flash attention (TMA): dtype must be f16 or bf16");
  }
}

}  // namespace

bool FlashTmaCovers(const AttentionShape& s, const void* qkv) {
  return (s.head_dim == 64 || s.head_dim == 128) && (reinterpret_cast<uintptr_t>(qkv) & 15) == 0 &&
         (s.dtype == DType::kBF16 || s.dtype == DType::kF16);
}

Status FlashAttentionForwardTma(cudaStream_t stream, const AttentionShape& s, float scale, void* out,
                                float* lse, const void* qkv, bool pingpong) {
  if (!FlashWgmmaBuilt())
    return FailedPrecondition("flash attention (TMA): this build has no sm_90a code "
                              "(CMAKE_CUDA_ARCHITECTURES without 90a)");
  if (!(scale > 0.f)) return InvalidArgument("flash attention (TMA): scale must be positive");
  if (s.batch == 0 || s.seq == 0 || s.heads == 0) return Status::OK();
  if (!FlashTmaCovers(s, qkv)) return FlashAttentionForwardWgmma(stream, s, scale, out, lse, qkv);
  return pingpong ? Dispatch<true>(stream, s, scale, out, lse, qkv)
                  : Dispatch<false>(stream, s, scale, out, lse, qkv);
}

}  // namespace strata::kernels::cuda
