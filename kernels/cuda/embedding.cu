// SPDX-License-Identifier: Apache-2.0
// Token + position embedding, forward and backward.
//
// Backward is deterministic without atomics or sorting: each block owns a
// few vocabulary rows (and a slice of channels), scans the tokens in order,
// and sums the matching rows of dout into shared memory in position order;
// only rows that occurred are then added into dwte. dwpe sums the batch in
// order. (Same idea as llm.c's deterministic encoder backward: one owner per
// output row, a fixed summation order.)
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // forward: warps (rows) per block

constexpr int kVocabRows = 8;       // backward: vocabulary rows owned by a block
constexpr int kBwdThreads = 256;
constexpr int kChanPerThread = 4;   // channels c0 + threadIdx.x + j * 256, j < 4
constexpr int kChanTile = kBwdThreads * kChanPerThread;
constexpr int kTokPerThread = 4;    // positions scanned per thread and step
constexpr int kTokTile = kBwdThreads * kTokPerThread;

// ---- kernels ----------------------------------------------------------------

// out: (BT, C); tokens: (BT) i32; wte: (V, C); wpe: (T, C). One warp per row.
// A negative token gives a row of NaN (the caller promised [0, V); NaN makes
// the broken promise visible in the loss instead of reading out of bounds).
template <typename T, int kVec>
__global__ void embedding_forward_kernel(T* __restrict__ out, const int32_t* __restrict__ tokens,
                                         const T* __restrict__ wte, const T* __restrict__ wpe,
                                         int64_t BT, int64_t seq, int C) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= BT) return;
  const int64_t t = row % seq;
  const int32_t tok = tokens[row];
  T* o = out + row * C;
  if (tok < 0) {
    for (int c = lane; c < C; c += 32) o[c] = FromF<T>(NAN);
    return;
  }
  const T* e = wte + static_cast<int64_t>(tok) * C;
  const T* p = wpe ? wpe + t * C : nullptr;  // null: no position table
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    if constexpr (kVec == 1) {
      o[c] = FromF<T>(ToF(e[c]) + (p ? ToF(p[c]) : 0.f));
    } else {
      Pack<T> ve = LoadPack(e + c);
      if (p) {
        Pack<T> vp = LoadPack(p + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) ve.v[i] = FromF<T>(ToF(ve.v[i]) + ToF(vp.v[i]));
      }
      StorePack(o + c, ve);
    }
  }
}

// dwte: (Vp, C) G, accumulated; dout: (N, C) T; tokens: (N).
// Block (256), grid (ceil(Vp / kVocabRows), ceil(C / kChanTile)).
template <typename G, typename T>
__global__ void __launch_bounds__(kBwdThreads)
    embedding_backward_wte_kernel(G* __restrict__ dwte, const T* __restrict__ dout,
                                  const int32_t* __restrict__ tokens, int64_t N, int C,
                                  int64_t Vp) {
  __shared__ float acc[kVocabRows][kChanTile];
  __shared__ int32_t pos_list[kTokTile];
  __shared__ int8_t row_list[kTokTile];
  __shared__ int warp_tot[kBwdThreads / 32];
  __shared__ int touched[kVocabRows];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t v0 = static_cast<int64_t>(blockIdx.x) * kVocabRows;
  const int c0 = blockIdx.y * kChanTile;
  for (int i = tid; i < kVocabRows * kChanTile; i += kBwdThreads) (&acc[0][0])[i] = 0.f;
  if (tid < kVocabRows) touched[tid] = 0;

  for (int64_t start = 0; start < N; start += kTokTile) {
    // Which of my kTokPerThread consecutive positions fall in this block's rows.
    int r_of[kTokPerThread];
    int cnt = 0;
#pragma unroll
    for (int j = 0; j < kTokPerThread; ++j) {
      int64_t p = start + static_cast<int64_t>(tid) * kTokPerThread + j;
      r_of[j] = -1;
      if (p < N) {
        int64_t v = tokens[p];
        if (v >= v0 && v < v0 + kVocabRows && v < Vp) {
          r_of[j] = static_cast<int>(v - v0);
          ++cnt;
        }
      }
    }
    // Exclusive scan of cnt over the block, in thread order = position order.
    int incl = cnt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    __syncthreads();  // the previous tile's lists are no longer read
    if (lane == 31) warp_tot[warp] = incl;
    __syncthreads();
    int base = 0, total = 0;
    for (int w = 0; w < kBwdThreads / 32; ++w) {
      if (w < warp) base += warp_tot[w];
      total += warp_tot[w];
    }
    int off = base + incl - cnt;
#pragma unroll
    for (int j = 0; j < kTokPerThread; ++j) {
      if (r_of[j] >= 0) {
        pos_list[off] = static_cast<int32_t>(start + static_cast<int64_t>(tid) * kTokPerThread + j);
        row_list[off] = static_cast<int8_t>(r_of[j]);
        ++off;
      }
    }
    __syncthreads();
    // Sum the matched rows in position order; each thread owns its channels.
#pragma unroll 4
    for (int k = 0; k < total; ++k) {
      const int64_t p = pos_list[k];
      const int r = row_list[k];
      if (tid == 0) touched[r] = 1;
#pragma unroll
      for (int j = 0; j < kChanPerThread; ++j) {
        int c = c0 + tid + j * kBwdThreads;
        if (c < C) acc[r][tid + j * kBwdThreads] += ToF(dout[p * C + c]);
      }
    }
  }
  __syncthreads();
  for (int r = 0; r < kVocabRows; ++r) {
    if (!touched[r] || v0 + r >= Vp) continue;
    G* dst = dwte + (v0 + r) * C;
#pragma unroll
    for (int j = 0; j < kChanPerThread; ++j) {
      int c = c0 + tid + j * kBwdThreads;
      if (c < C) dst[c] = FromF<G>(ToF(dst[c]) + acc[r][tid + j * kBwdThreads]);
    }
  }
}

// dwpe: (T, C) G, accumulated; dout: (B, T, C). One thread per (t, c), summing
// the batch in order.
template <typename G, typename T>
__global__ void embedding_backward_wpe_kernel(G* __restrict__ dwpe, const T* __restrict__ dout,
                                              int64_t B, int64_t TC) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= TC) return;
  float s = 0.f;
  for (int64_t b = 0; b < B; ++b) s += ToF(dout[b * TC + i]);
  dwpe[i] = FromF<G>(ToF(dwpe[i]) + s);
}

}  // namespace

// ---- launchers ------------------------------------------------------------

Status EmbeddingForward(cudaStream_t stream, void* out, const int32_t* tokens, const void* wte,
                        const void* wpe, int64_t B, int64_t T, int64_t C, DType dtype) {
  const int64_t BT = B * T;
  if (BT == 0 || C == 0) return Status::OK();
  return DispatchFloat(dtype, "EmbeddingForward", [&](auto tag) -> Status {
    using E = decltype(tag);
    constexpr int kN = Pack<E>::kN;
    const bool vec = C % kN == 0 && Aligned16(out) && Aligned16(wte) && (!wpe || Aligned16(wpe));
    dim3 grid(CeilDiv(BT, kRowsPerBlock)), block(32 * kRowsPerBlock);
    if (vec)
      embedding_forward_kernel<E, kN><<<grid, block, 0, stream>>>(
          static_cast<E*>(out), tokens, static_cast<const E*>(wte), static_cast<const E*>(wpe),
          BT, T, static_cast<int>(C));
    else
      embedding_forward_kernel<E, 1><<<grid, block, 0, stream>>>(
          static_cast<E*>(out), tokens, static_cast<const E*>(wte), static_cast<const E*>(wpe),
          BT, T, static_cast<int>(C));
    CUDA_RETURN_IF_LAUNCH_ERROR("embedding_forward_kernel");
    return Status::OK();
  });
}

Status EmbeddingBackward(cudaStream_t stream, void* dwte, void* dwpe, DType grad_dtype,
                         const void* dout, const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                         int64_t Vp, DType dtype) {
  const int64_t N = B * T;
  if (N == 0 || C == 0) return Status::OK();
  return DispatchFloat(grad_dtype, "EmbeddingBackward grad_dtype", [&](auto gtag) -> Status {
    using G = decltype(gtag);
    return DispatchFloat(dtype, "EmbeddingBackward", [&](auto tag) -> Status {
      using E = decltype(tag);
      if (Vp > 0) {
        dim3 grid(CeilDiv(Vp, kVocabRows), CeilDiv(C, kChanTile));
        embedding_backward_wte_kernel<G, E><<<grid, kBwdThreads, 0, stream>>>(
            static_cast<G*>(dwte), static_cast<const E*>(dout), tokens, N, static_cast<int>(C),
            Vp);
        CUDA_RETURN_IF_LAUNCH_ERROR("embedding_backward_wte_kernel");
      }
      if (dwpe) {  // null: no position table
        embedding_backward_wpe_kernel<G, E><<<CeilDiv(T * C, 256), 256, 0, stream>>>(
            static_cast<G*>(dwpe), static_cast<const E*>(dout), B, T * C);
        CUDA_RETURN_IF_LAUNCH_ERROR("embedding_backward_wpe_kernel");
      }
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cuda
