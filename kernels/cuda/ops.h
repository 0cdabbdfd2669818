// SPDX-License-Identifier: Apache-2.0
// Launchers of the CUDA kernels, one group per file of kernels/cuda/ (the
// table of contents of the CUDA backend). Each takes the stream, assumes its
// arguments were checked by the backend (cuda_backend_cuda.cc: shapes,
// nulls, dtypes), checks its launches and returns the first error.
// Shapes are row-major; see kernels/backend.h for the meaning of each op.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace strata::kernels::cuda {

class GemmRunner;  // gemm.h

// layernorm.cu — y, x, dx, dy: (N, C); weight, bias, dweight, dbias: (C);
// mean, rstd: (N) f32. scratch: >= 2 * C * 4 bytes (fp32 partials).
Status LayerNormForward(cudaStream_t stream, const LayerNormArgs& a, void* y, float* mean,
                        float* rstd, const void* x, const void* weight, const void* bias);
Status LayerNormBackward(cudaStream_t stream, int num_sms, const LayerNormArgs& a, void* dx,
                         void* dweight, void* dbias, DType grad_dtype, bool accumulate,
                         const void* dy, const void* x, const void* weight, const float* mean,
                         const float* rstd, float* scratch, size_t scratch_bytes);

// rmsnorm.cu — y, x, dx, dy: (N, C); weight, dweight: (C); rstd: (N) f32.
// scratch: >= C * 4 bytes (fp32 partials).
Status RmsNormForward(cudaStream_t stream, const RmsNormArgs& a, void* y, float* rstd, const void* x,
                      const void* weight);
Status RmsNormBackward(cudaStream_t stream, int num_sms, const RmsNormArgs& a, void* dx, void* dweight,
                       DType grad_dtype, bool accumulate, const void* dy, const void* x, const void* weight,
                       const float* rstd, float* scratch, size_t scratch_bytes);

// rope.cu — out, in, dx, dy: (B*T, width); out may alias in.
Status RopeForward(cudaStream_t stream, const RopeArgs& a, void* out, const void* in);
Status RopeBackward(cudaStream_t stream, const RopeArgs& a, void* dx, const void* dy);

// swiglu.cu — out, dout: (rows, f); in, din: (rows, 2f).
Status SwiGluForward(cudaStream_t stream, void* out, const void* in, int64_t rows, int64_t f, DType dtype);
Status SwiGluBackward(cudaStream_t stream, void* din, const void* dout, const void* in, int64_t rows, int64_t f,
                      DType dtype);

// gelu.cu — y, x, dx, dy: (n).
Status GeluForward(cudaStream_t stream, void* y, const void* x, int64_t n, DType dtype);
Status GeluBackward(cudaStream_t stream, void* dx, const void* x, const void* dy, int64_t n,
                    DType dtype);

// elementwise.cu — out, a, b, x: (n).
Status Add(cudaStream_t stream, void* out, const void* a, const void* b, int64_t n, DType dtype);
Status Scale(cudaStream_t stream, void* x, DType dtype, int64_t n, float factor);

// cast.cu — dst, src: (n).
Status Cast(cudaStream_t stream, void* dst, DType dst_dtype, const void* src, DType src_dtype,
            int64_t n);

// bias_backward.cu — dbias: (n); dy: (m, n). scratch: >= n * 4 bytes.
Status BiasBackward(cudaStream_t stream, int num_sms, void* dbias, DType grad_dtype,
                    bool accumulate, const void* dy, int64_t m, int64_t n, DType dtype,
                    float* scratch, size_t scratch_bytes);

// reduce.cu — x: (n); sumsq: one f32, nonfinite: one i32 (accumulated).
// scratch: >= 8 KiB.
Status GradStats(cudaStream_t stream, const void* x, DType dtype, int64_t n, float* sumsq,
                 int32_t* nonfinite, void* scratch, size_t scratch_bytes);

// embedding.cu — out, dout: (B, T, C); tokens: (B, T) i32; wte: (V, C);
// wpe: (T, C); dwte: (Vp, C); dwpe: (T, C).
Status EmbeddingForward(cudaStream_t stream, void* out, const int32_t* tokens, const void* wte,
                        const void* wpe, int64_t B, int64_t T, int64_t C, DType dtype);
Status EmbeddingBackward(cudaStream_t stream, void* dwte, void* dwpe, DType grad_dtype,
                         const void* dout, const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                         int64_t Vp, DType dtype);

// cross_entropy.cu — losses: (N) f32; logits, dlogits: (N, Vp); targets: (N).
Status CrossEntropy(cudaStream_t stream, float* losses, void* dlogits, const void* logits,
                    const int32_t* targets, int64_t N, int64_t V, int64_t Vp, float dloss,
                    DType dtype);

// attention_decode.cu — new rows against a KV cache (kernels/backend.h):
// qkv (B, R, (H + 2 Hkv) D); k_cache, v_cache (B, capacity, Hkv D); out (B, R, H D).
// head_dim <= 256.
Status AttentionDecode(cudaStream_t stream, const DecodeAttentionShape& s, void* out, const void* qkv,
                       void* k_cache, void* v_cache);

// attention.cu — the simple path (batched GEMMs + fused causal softmax).
// qkv, dqkv: (B, T, 3C); out, dout: (B, T, C); lse: (B, H, T) f32.
size_t SimpleAttentionWorkspaceBytes(const AttentionShape& s);
Status SimpleAttentionForward(cudaStream_t stream, GemmRunner& gemm, const AttentionShape& s,
                              float scale, void* out, float* lse, const void* qkv,
                              void* workspace);
Status SimpleAttentionBackward(cudaStream_t stream, GemmRunner& gemm, const AttentionShape& s,
                               float scale, void* dqkv, const void* dout, const void* qkv,
                               const void* out, const float* lse, void* workspace);

// flash_attention.cu — the fused path (same buffers). Needs 16-byte aligned
// qkv, out, dout, dqkv and C % 8 == 0 (implied by head_dim % 8 == 0).
// `variant` picks the kernels (cuda_backend.h, kFlashVariants); the
// workspace depends on its backward scheme.
bool FlashAttentionSupports(const AttentionShape& s, int cc_major);
size_t FlashAttentionWorkspaceBytes(const AttentionShape& s, const FlashVariant& variant);
Status FlashAttentionForward(cudaStream_t stream, const AttentionShape& s, float scale, void* out,
                             float* lse, const void* qkv, const FlashVariant& variant);
Status FlashAttentionBackward(cudaStream_t stream, const AttentionShape& s, float scale,
                              void* dqkv, const void* dout, const void* qkv, const void* out,
                              const float* lse, void* workspace, const FlashVariant& variant);

// The passes of a flash backward scheme, which FlashAttentionBackward runs
// once delta = rowsum(dO * O) is in place: dK/dV (into dkv, row stride
// dkv_stride, dV dv_off elements after dK), then dQ into dqkv's q columns.
// The dS-buffer schemes write the dS panels of `ds` (flash_ds_panels.cuh) in
// the first pass and read them in the second.
struct FlashDsPasses {
  void* dqkv = nullptr;
  void* dkv = nullptr;
  int64_t dkv_stride = 0, dv_off = 0;
  void* ds = nullptr;
  const void* dout = nullptr;
  const void* qkv = nullptr;
  const float* lse = nullptr;
  const float* delta = nullptr;
};

// flash_attention_bwd_two_pass.cu — the two-pass backward on mma.sync
// (FlashBwdKernel::kTwoPass): both passes recompute P; `ds` is not used.
Status FlashAttentionBackwardTwoPass(cudaStream_t stream, const AttentionShape& s, float scale,
                                     const FlashDsPasses& passes);

// flash_attention_bwd_ds.cu — the two passes of the dS-buffer backward on
// mma.sync (FlashBwdKernel::kDsBuffer).
Status FlashAttentionBackwardDsBufferPasses(cudaStream_t stream, const AttentionShape& s, float scale,
                                            const FlashDsPasses& passes);

// flash_attention_sm90.cu — the wgmma forward (FlashFwdKernel::kWgmma). It,
// and the wgmma backward below, run only where FlashWgmmaRuns: the binary
// has sm_90a code (CMake builds the 90 architecture as 90a) and the GPU is
// compute capability 9.0 exactly (sm_90a code runs nowhere else). The
// forward needs scale > 0 (FlashAttentionForward falls back to the Bc 64
// kernel otherwise).
bool FlashWgmmaBuilt();
inline bool FlashWgmmaRuns(int cc_major, int cc_minor) {
  return FlashWgmmaBuilt() && cc_major == 9 && cc_minor == 0;
}
Status FlashAttentionForwardWgmma(cudaStream_t stream, const AttentionShape& s, float scale, void* out,
                                  float* lse, const void* qkv);

// flash_attention_fwd_tma_sm90.cu — the warp-specialized forward
// (FlashFwdKernel::kTma, kTmaPingpong with `pingpong`), where FlashWgmmaRuns
// and scale > 0. FlashTmaCovers says which shapes it takes (head_dim 64 or
// 128, 16-byte aligned qkv); it runs FlashAttentionForwardWgmma for others.
bool FlashTmaCovers(const AttentionShape& s, const void* qkv);
Status FlashAttentionForwardTma(cudaStream_t stream, const AttentionShape& s, float scale, void* out,
                                float* lse, const void* qkv, bool pingpong);

// flash_attention_bwd_sm90.cu — the two passes of the dS-buffer backward on
// wgmma (FlashBwdKernel::kWgmma), where FlashWgmmaRuns.
Status FlashAttentionBackwardWgmmaPasses(cudaStream_t stream, const AttentionShape& s, float scale,
                                         const FlashDsPasses& passes);

// flash_attention_bwd_tma_sm90.cu — the same two passes warp-specialized
// (FlashBwdKernel::kTma), where FlashWgmmaRuns: a TMA producer warpgroup
// feeds both; the same products in the same order, so the same dqkv bits.
// `ds` holds the panels as tile images (flash_ds_panels.cuh). Shapes the TMA
// kernels do not take (FlashTmaCovers, or dout / ds not 16-byte aligned) run
// FlashAttentionBackwardWgmmaPasses.
Status FlashAttentionBackwardTmaPasses(cudaStream_t stream, const AttentionShape& s, float scale,
                                       const FlashDsPasses& passes);

}  // namespace strata::kernels::cuda
