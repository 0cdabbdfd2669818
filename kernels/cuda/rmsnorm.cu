// SPDX-License-Identifier: Apache-2.0
// RMSNorm forward and backward (Llama).
//
// Forward: one warp per row; mean(x^2) in fp32, y = x * rstd * w in the
// storage dtype, rstd saved. Backward: one warp per row for dx (accumulated,
// as the interface says), and a column reduction for dweight: blocks of 32
// lanes x a slice of rows write fp32 partials to scratch, then one pass sums
// the slices in order. No float atomics: bitwise deterministic.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps (rows) per block of the row kernels
constexpr int kRowWarps = 8;      // warps per block of the weight-gradient reduction

// y: (N, C); rstd: (N) f32 or null; x: (N, C); w: (C).
template <typename T>
__global__ void rmsnorm_forward_kernel(T* __restrict__ y, float* __restrict__ rstd, const T* __restrict__ x,
                                       const T* __restrict__ w, int64_t N, int C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= N) return;
  const T* xr = x + row * C;
  float s = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float f = ToF(xr[c]);
    s += f * f;
  }
  const float rs = rsqrtf(WarpSum(s) / C + eps);
  T* yr = y + row * C;
  for (int c = lane; c < C; c += 32) yr[c] = FromF<T>(ToF(xr[c]) * rs * ToF(w[c]));
  if (lane == 0 && rstd) rstd[row] = rs;
}

// dx += rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd.
template <typename T>
__global__ void rmsnorm_backward_dx_kernel(T* dx, const T* __restrict__ dy, const T* __restrict__ x,
                                           const T* __restrict__ w, const float* __restrict__ rstd, int64_t N,
                                           int C) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= N) return;
  const T* xr = x + row * C;
  const T* dyr = dy + row * C;
  const float rs = rstd[row];
  float sgx = 0.f;
  for (int c = lane; c < C; c += 32) sgx += ToF(dyr[c]) * ToF(w[c]) * ToF(xr[c]) * rs;
  const float mgx = WarpSum(sgx) / C;
  T* dxr = dx + row * C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = ToF(xr[c]) * rs;
    dxr[c] = FromF<T>(ToF(dxr[c]) + rs * (ToF(dyr[c]) * ToF(w[c]) - xhat * mgx));
  }
}

// partial: (S, C) f32; slice s covers rows [s * rows_per, min(N, (s + 1) * rows_per)).
// Block (32, kRowWarps), grid (ceil(C / 32), S).
template <typename T>
__global__ void __launch_bounds__(32 * kRowWarps)
    rmsnorm_weight_grad_partial_kernel(float* __restrict__ partial, const T* __restrict__ dy,
                                       const T* __restrict__ x, const float* __restrict__ rstd, int64_t N, int C,
                                       int64_t rows_per) {
  __shared__ float sw[kRowWarps][32];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per;
  const int64_t r_end = min(N, r_begin + rows_per);
  float acc = 0.f;
  if (c < C)
    for (int64_t r = r_begin + ty; r < r_end; r += kRowWarps) acc += ToF(dy[r * C + c]) * (ToF(x[r * C + c]) * rstd[r]);
  sw[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < C) {
    float s = 0.f;
    for (int i = 0; i < kRowWarps; ++i) s += sw[i][tx];  // fixed order
    partial[static_cast<int64_t>(blockIdx.y) * C + c] = s;
  }
}

template <typename G>
__global__ void rmsnorm_weight_grad_final_kernel(G* dw, const float* __restrict__ partial, int S, int C,
                                                 bool accumulate) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.f;
  for (int i = 0; i < S; ++i) s += partial[static_cast<int64_t>(i) * C + c];
  if (accumulate) s += ToF(dw[c]);
  dw[c] = FromF<G>(s);
}

}  // namespace

Status RmsNormForward(cudaStream_t stream, const RmsNormArgs& a, void* y, float* rstd, const void* x,
                      const void* weight) {
  const int64_t N = a.rows;
  const int C = static_cast<int>(a.cols);
  if (N == 0) return Status::OK();
  return DispatchFloat(a.dtype, "RmsNormForward", [&](auto tag) -> Status {
    using T = decltype(tag);
    rmsnorm_forward_kernel<T><<<CeilDiv(N, kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(
        static_cast<T*>(y), rstd, static_cast<const T*>(x), static_cast<const T*>(weight), N, C, a.eps);
    CUDA_RETURN_IF_LAUNCH_ERROR("rmsnorm_forward_kernel");
    return Status::OK();
  });
}

Status RmsNormBackward(cudaStream_t stream, int num_sms, const RmsNormArgs& a, void* dx, void* dweight,
                       DType grad_dtype, bool accumulate, const void* dy, const void* x, const void* weight,
                       const float* rstd, float* scratch, size_t scratch_bytes) {
  const int64_t N = a.rows;
  const int C = static_cast<int>(a.cols);
  if (C == 0) return Status::OK();
  return DispatchFloat(a.dtype, "RmsNormBackward", [&](auto tag) -> Status {
    using T = decltype(tag);
    const unsigned col_blocks = CeilDiv(C, 32);
    int64_t S = std::max<int64_t>(1, CeilDiv(4 * static_cast<int64_t>(num_sms), col_blocks));
    S = std::min<int64_t>(S, std::max<int64_t>(1, CeilDiv(N, 4 * kRowWarps)));
    S = std::min<int64_t>(S, 64);
    S = std::min<int64_t>(S, static_cast<int64_t>(scratch_bytes / (sizeof(float) * C)));
    if (S < 1) return InvalidArgument("RmsNormBackward: cols " + std::to_string(C) + " too large for the scratch");
    if (N > 0) {
      rmsnorm_backward_dx_kernel<T><<<CeilDiv(N, kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(
          static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(weight),
          rstd, N, C);
      CUDA_RETURN_IF_LAUNCH_ERROR("rmsnorm_backward_dx_kernel");
      rmsnorm_weight_grad_partial_kernel<T><<<dim3(col_blocks, static_cast<unsigned>(S)), dim3(32, kRowWarps), 0,
                                              stream>>>(scratch, static_cast<const T*>(dy),
                                                        static_cast<const T*>(x), rstd, N, C, (N + S - 1) / S);
      CUDA_RETURN_IF_LAUNCH_ERROR("rmsnorm_weight_grad_partial_kernel");
    } else {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch, 0, sizeof(float) * C * S, stream));
    }
    return DispatchFloat(grad_dtype, "RmsNormBackward grad_dtype", [&](auto gtag) -> Status {
      using G = decltype(gtag);
      rmsnorm_weight_grad_final_kernel<G><<<CeilDiv(C, 256), 256, 0, stream>>>(static_cast<G*>(dweight), scratch,
                                                                              static_cast<int>(S), C, accumulate);
      CUDA_RETURN_IF_LAUNCH_ERROR("rmsnorm_weight_grad_final_kernel");
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cuda
