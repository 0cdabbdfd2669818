// SPDX-License-Identifier: Apache-2.0
// Causal flash attention forward on Hopper's warpgroup MMA (wgmma, sm_90a):
// the `v3` variant's forward (cuda_backend.h). Same function and layout as
// flash_attention.cu's forward (qkv (B, T, C + 2 KV D): q of H heads, k and
// v of KV heads, query head h reading key/value head h / (H / KV); out
// (B, T, C), lse (B, H, T) natural-log, f32); the backward of `v3` is the mma.sync dS-buffer
// backward (flash_attention_bwd_ds.cu), which reads this lse.
//
// Block = (b, h, 128 queries), 2 warpgroups of 64 query rows each. K/V tiles
// of 128 keys stream through a double-buffered cp.async pipeline into
// 128-byte swizzled shared memory (wgmma.cuh). Per tile and warpgroup:
//   S = Q K^T      wgmma m64n128k16, A and B from shared memory (K-major)
//   online softmax on S in registers (flash_softmax.cuh, the FMA/exp2 form)
//   O += P V       wgmma m64nDk16, P from registers (S's accumulator layout
//                  is the A operand's), V from shared memory (N-major)
// with the softmax of tile j overlapping the P V product of tile j - 1.
// Head dims up to kD (64 or 128) with columns D..kD-1 zero-filled, rows past T
// zero-filled and never stored, as in flash_attention.cu.
//
// Built for sm_90a only (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere the kernel is a
// trap and FlashWgmmaBuilt() says whether the sm_90a code is in the binary.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_fwd_wgmma_steps.cuh"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/wgmma.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kWgThreads = 256;  // 2 warpgroups
constexpr int kBr = 128;         // query rows per block (64 per warpgroup)
constexpr int kBc = 128;         // keys per streamed K/V tile

// Q + 2 x (K, V), plus slack to align the tiles to 1024 bytes.
template <int kD>
constexpr size_t SmemBytes() {
  return 1024 + static_cast<size_t>(SwizzledTileBytes<kD>(kBr) + 4 * SwizzledTileBytes<kD>(kBc));
}

// grid ceil(T / 128) * B * H (FlashBlockTile), the last query block of a
// head (most keys) first.
// Needs scale_log2 > 0 (the FMA form keeps the running max in raw units).
template <typename T, int kD>
__global__ void __launch_bounds__(kWgThreads, 1)
    flash_attention_forward_wgmma_kernel(T* __restrict__ out, float* __restrict__ lse,
                                         const T* __restrict__ qkv, int seq, int H, int D, int C,
                                         float scale_log2, int KV, int head_group) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kQTile = SwizzledTileBytes<kD>(kBr), kKVTile = SwizzledTileBytes<kD>(kBc);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = AlignedSmem(smem_raw);
  unsigned char* sQ = base;           // (kD/64 blocks, kBr rows, 128 B)
  unsigned char* sK = sQ + kQTile;    // 2 stages
  unsigned char* sV = sK + 2 * kKVTile;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wg = warp >> 2;  // warpgroup: rows 64 wg .. 64 wg + 63 of the block
  const int g = lane >> 2, t4 = lane & 3;
  const int n_tiles = (seq + kBr - 1) / kBr;
  const FlashHeadTile ht = FlashBlockTile(n_tiles, head_group);
  const int bh = ht.bh, b = bh / H, h = bh % H;
  const int q0 = (n_tiles - 1 - ht.tile) * kBr;
  const int row0 = warp * 16;  // this warp's first row in the block
  const int64_t row_stride = C + 2LL * KV * D;  // q | k | v of KV key/value heads
  const T* q_g = qkv + static_cast<int64_t>(b) * seq * row_stride + h * D;
  const T* k_g = qkv + static_cast<int64_t>(b) * seq * row_stride + C + (h / (H / KV)) * D;
  const T* v_g = k_g + KV * D;

  // cp.async groups, one per iteration j = 0 .. n_kv: group j brings K_j
  // (and Q with it for j = 0) and V_{j-1}. Iteration j issues S_j = Q K_j^T
  // and O += P_{j-1} V_{j-1} back to back, then runs the softmax of S_j while
  // the tensor cores do the P V product (FlashAttention-3's overlap within a
  // warpgroup); O is rescaled by S_j's factor once that product is done.
  // Slots: K_j in stage j % 2, V_j in stage j % 2.
  // Causal: keys 0 .. min(seq, q0 + kBr) - 1. kBr == kBc and both tilings
  // start at 0, so every tile a warpgroup reaches has a key visible to each
  // of its rows: no tile is skipped, and each row's running max is finite
  // after tile 0 (key 0).
  const int n_kv = (min(seq, q0 + kBr) + kBc - 1) / kBc;
  LoadSwizzled<T, kD, kBr, kWgThreads>(sQ, q_g, q0, seq, D, row_stride);
  LoadSwizzled<T, kD, kBc, kWgThreads>(sK, k_g, 0, seq, D, row_stride);
  CpAsyncCommit();

  float o[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float s[kBc / 8][4];
  uint32_t p[kBc / 16][4];  // P_{j-1} in the A layout: 16 keys per wgmma (key tiles 2 kk, 2 kk + 1)
  const uint32_t q_addr = SmemAddr(sQ) + wg * 64 * 128;

  // Waits for cp.async group j (K_j, V_{j-1}) after starting group j + 1.
  auto next_tiles = [&](int j) {
    if (j + 1 < n_kv)
      LoadSwizzled<T, kD, kBc, kWgThreads>(sK + ((j + 1) & 1) * kKVTile, k_g, (j + 1) * kBc, seq, D, row_stride);
    if (j < n_kv) LoadSwizzled<T, kD, kBc, kWgThreads>(sV + (j & 1) * kKVTile, v_g, j * kBc, seq, D, row_stride);
    CpAsyncCommit();
    CpAsyncWait<1>();
    FenceProxyAsync();  // the tiles cp.async wrote are read by the tensor cores
    __syncthreads();
  };
  auto issue_s = [&](int j) { FlashIssueS<T, kD, kBr, kBc>(s, q_addr, SmemAddr(sK + (j & 1) * kKVTile)); };
  auto issue_pv = [&](int j) { FlashIssuePV<T, kD, kBc>(o, p, SmemAddr(sV + (j & 1) * kKVTile)); };
  auto softmax = [&](int j, float (&alpha)[2]) {
    FlashCausalSoftmax<kBc>(s, m_run, l_run, scale_log2, alpha, j * kBc, q0 + wg * 64, q0 + row0 + g, t4);
  };
  auto pack_p = [&] { PackA<T, kBc / 8>(p, s); };

  // Tile 0: S_0 alone.
  next_tiles(0);
  {
    float alpha[2];
    WgmmaFence();
    issue_s(0);
    WgmmaWait<0>();
    FenceAccumulator(s);
    softmax(0, alpha);  // O is still zero: no rescale
    pack_p();
  }
  __syncthreads();
  for (int j = 1; j < n_kv; ++j) {
    next_tiles(j);
    float alpha[2];
    FenceAccumulator(o);
    FenceAccumulator(p);
    WgmmaFence();
    issue_s(j);
    issue_pv(j - 1);
    WgmmaWait<1>();  // S_j is done; P_{j-1} V_{j-1} may still run
    FenceAccumulator(s);
    softmax(j, alpha);
    WgmmaWait<0>();  // O and p are free
    FenceAccumulator(o);
    RescaleRows(o, alpha);
    pack_p();
    __syncthreads();  // the slots read in this iteration are refilled by the next one
  }
  // The last product.
  next_tiles(n_kv);
  FenceAccumulator(o);
  FenceAccumulator(p);
  WgmmaFence();
  issue_pv(n_kv - 1);
  WgmmaWait<0>();
  FenceAccumulator(o);
  __syncthreads();

  float row_lse[2];
  FinishSoftmaxRows<kD / 8, true>(o, m_run, l_run, scale_log2, row_lse);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int q = q0 + row0 + g + r * 8;
    if (t4 == 0 && q < seq) lse[static_cast<int64_t>(bh) * seq + q] = row_lse[r];
  }
  // O through sQ (free: every warp passed the loop's last barrier, and the
  // wgmma reads of Q completed before it), swizzled as Q was.
  AccToSwizzled<T, kD, kBr>(sQ, o, 1.f);
  __syncthreads();
  StoreSwizzled<T, kD, kBr, kWgThreads>(out + static_cast<int64_t>(b) * seq * C + h * D, sQ, q0, seq, D, C);
#else
  __trap();
#endif
}

template <typename T, int kD>
Status Launch(cudaStream_t stream, const AttentionShape& s, float scale, void* out, float* lse,
              const void* qkv) {
  ASSIGN_OR_RETURN(const int head_group, FlashHeadGroup());
  const int H = static_cast<int>(s.heads), D = static_cast<int>(s.head_dim);
  const int seq = static_cast<int>(s.seq), C = H * D;
  constexpr size_t smem = SmemBytes<kD>();
  auto kernel = flash_attention_forward_wgmma_kernel<T, kD>;
  const unsigned grid = static_cast<unsigned>(s.batch * s.heads) * CeilDiv(seq, kBr);
  RETURN_IF_ERROR(LaunchWithSmem(kernel, grid, kWgThreads, smem, stream, static_cast<T*>(out), lse,
      static_cast<const T*>(qkv), seq, H, D, C, scale * kLog2e, static_cast<int>(s.kv()), head_group));
  return Status::OK();
}

}  // namespace

bool FlashWgmmaBuilt() {
#if defined(STRATA_CUDA_SM90A)
  return true;
#else
  return false;
#endif
}

Status FlashAttentionForwardWgmma(cudaStream_t stream, const AttentionShape& s, float scale, void* out,
                                  float* lse, const void* qkv) {
  if (!FlashWgmmaBuilt())
    return FailedPrecondition("flash attention (wgmma): this build has no sm_90a code "
                              "(CMAKE_CUDA_ARCHITECTURES without 90a)");
  if (!(scale > 0.f)) return InvalidArgument("flash attention (wgmma): scale must be positive");
  if (s.batch == 0 || s.seq == 0 || s.heads == 0) return Status::OK();
  if (s.head_dim > 128 || s.head_dim % 8 != 0)
    return InvalidArgument("flash attention (wgmma): head_dim " + std::to_string(s.head_dim) +
                           " (needs a multiple of 8, at most 128)");
  const bool small = s.head_dim <= 64;
  switch (s.dtype) {
    case DType::kBF16:
      return small ? Launch<bf16, 64>(stream, s, scale, out, lse, qkv) : Launch<bf16, 128>(stream, s, scale, out, lse, qkv);
    case DType::kF16:
      return small ? Launch<f16, 64>(stream, s, scale, out, lse, qkv) : Launch<f16, 128>(stream, s, scale, out, lse, qkv);
    default:
      return InvalidArgument("flash attention (wgmma): dtype must be f16 or bf16");
  }
}

}  // namespace strata::kernels::cuda
