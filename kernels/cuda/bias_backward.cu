// SPDX-License-Identifier: Apache-2.0
// Bias gradient: column sums of dy over its rows (rows ld elements apart;
// ld = n for BiasBackward, the GEMM's ldc for its fallback bias gradient).
//
// Blocks of 32 lanes x kVec columns (16-byte loads where the row length and
// the pointer allow) and a slice of rows, 8 warps walking the slice's rows,
// write fp32 partials to scratch; one pass sums the slices in order.
// Deterministic, no atomics. Enough slices to give every SM several blocks,
// so that many loads are in flight (the op is bound by memory bandwidth).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kRowWarps = 8;

// ---- kernels ----------------------------------------------------------------

// partial: (S, n) f32; dy: (m, ld). Block (32, kRowWarps), grid (ceil(n / (32 kVec)), S);
// slice s covers rows [s * rows_per, min(m, (s + 1) * rows_per)). Lane tx owns
// columns c0 + tx*kVec .. c0 + tx*kVec + kVec-1. kVec > 1 needs n % kVec == 0,
// ld % kVec == 0 and a 16-byte aligned dy.
template <typename T, int kVec>
__global__ void __launch_bounds__(32 * kRowWarps)
    bias_backward_partial_kernel(float* __restrict__ partial, const T* __restrict__ dy, int64_t m,
                                 int64_t n, int64_t ld, int64_t rows_per) {
  __shared__ float sacc[kRowWarps][32 * kVec];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 * kVec + tx * kVec;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per;
  const int64_t r_end = min(m, r_begin + rows_per);
  float acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = 0.f;
  if (c < n) {
#pragma unroll 4
    for (int64_t r = r_begin + ty; r < r_end; r += kRowWarps) {
      if constexpr (kVec > 1) {
        Pack<T> v = LoadPack(dy + r * ld + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] += ToF(v.v[i]);
      } else {
        acc[0] += ToF(dy[r * ld + c]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) sacc[ty][tx * kVec + i] = acc[i];
  __syncthreads();
  // Warp 0 sums the 8 row groups in order, one column per lane and step.
  if (ty == 0) {
    for (int col = tx; col < 32 * kVec; col += 32) {
      float s = 0.f;
      for (int w = 0; w < kRowWarps; ++w) s += sacc[w][col];
      const int64_t cc = static_cast<int64_t>(blockIdx.x) * 32 * kVec + col;
      if (cc < n) partial[static_cast<int64_t>(blockIdx.y) * n + cc] = s;
    }
  }
}

// dbias: (n) G; partial: (S, n) f32.
template <typename G>
__global__ void bias_backward_final_kernel(G* dbias, const float* __restrict__ partial, int S,
                                           int64_t n, bool accumulate) {
  int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  float s = 0.f;
  for (int i = 0; i < S; ++i) s += partial[static_cast<int64_t>(i) * n + c];
  if (accumulate) s += ToF(dbias[c]);
  dbias[c] = FromF<G>(s);
}

template <typename T, int kVec>
Status LaunchPartial(cudaStream_t stream, int num_sms, float* scratch, size_t scratch_bytes,
                     const T* dy, int64_t m, int64_t n, int64_t ld, int* S_out) {
  const unsigned col_blocks = CeilDiv(n, 32 * kVec);
  // About 4 blocks (32 warps) per SM.
  int64_t S = std::max<int64_t>(1, CeilDiv(4 * static_cast<int64_t>(num_sms), col_blocks));
  S = std::min<int64_t>(S, std::max<int64_t>(1, CeilDiv(m, 4 * kRowWarps)));  // >= 4 rows per warp
  S = std::min<int64_t>(S, 64);
  S = std::min<int64_t>(S, static_cast<int64_t>(scratch_bytes / (sizeof(float) * n)));
  if (S < 1)
    return InvalidArgument("BiasBackward: n " + std::to_string(n) +
                           " too large for the backend scratch");
  *S_out = static_cast<int>(S);
  if (m == 0) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch, 0, sizeof(float) * n * S, stream));
    return Status::OK();
  }
  const int64_t rows_per = (m + S - 1) / S;
  bias_backward_partial_kernel<T, kVec>
      <<<dim3(col_blocks, static_cast<unsigned>(S)), dim3(32, kRowWarps), 0, stream>>>(
          scratch, dy, m, n, ld, rows_per);
  CUDA_RETURN_IF_LAUNCH_ERROR("bias_backward_partial_kernel");
  return Status::OK();
}

}  // namespace

// ---- launchers ------------------------------------------------------------

Status BiasBackward(cudaStream_t stream, int num_sms, void* dbias, DType grad_dtype,
                    bool accumulate, const void* dy, int64_t m, int64_t n, DType dtype,
                    float* scratch, size_t scratch_bytes) {
  return BiasBackwardLd(stream, num_sms, dbias, grad_dtype, accumulate, dy, m, n, n, dtype,
                        scratch, scratch_bytes);
}

Status BiasBackwardLd(cudaStream_t stream, int num_sms, void* dbias, DType grad_dtype,
                      bool accumulate, const void* dy, int64_t m, int64_t n, int64_t ld,
                      DType dtype, float* scratch, size_t scratch_bytes) {
  if (n == 0) return Status::OK();
  return DispatchFloat(dtype, "BiasBackward", [&](auto tag) -> Status {
    using T = decltype(tag);
    constexpr int kN = Pack<T>::kN;
    const T* p = static_cast<const T*>(dy);
    int S = 0;
    if (n % kN == 0 && ld % kN == 0 && Aligned16(dy))
      RETURN_IF_ERROR(
          (LaunchPartial<T, kN>(stream, num_sms, scratch, scratch_bytes, p, m, n, ld, &S)));
    else
      RETURN_IF_ERROR(
          (LaunchPartial<T, 1>(stream, num_sms, scratch, scratch_bytes, p, m, n, ld, &S)));
    return DispatchFloat(grad_dtype, "BiasBackward grad_dtype", [&](auto gtag) -> Status {
      using G = decltype(gtag);
      bias_backward_final_kernel<G><<<CeilDiv(n, 256), 256, 0, stream>>>(
          static_cast<G*>(dbias), scratch, S, n, accumulate);
      CUDA_RETURN_IF_LAUNCH_ERROR("bias_backward_final_kernel");
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cuda
