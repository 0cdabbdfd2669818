// SPDX-License-Identifier: Apache-2.0
// Gradient statistics: sum of squares of the finite elements and the count of
// non-finite ones, accumulated into backend memory.
//
// Two passes with a grid size that depends only on n: per-block partials
// (fixed shuffle trees), then one block sums the partials in a fixed order.
// Same input, same bits.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kMaxBlocks = 1024;

// ---- kernels ----------------------------------------------------------------

// x: (n); partial_sum: (gridDim.x) f32; partial_cnt: (gridDim.x) i32.
template <typename T>
__global__ void grad_stats_partial_kernel(float* __restrict__ partial_sum,
                                          int* __restrict__ partial_cnt, const T* __restrict__ x,
                                          int64_t n) {
  __shared__ float scratch[32];
  __shared__ int scratch_i[32];
  float s = 0.f;
  int cnt = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float v = ToF(x[i]);
    if (isfinite(v))
      s += v * v;
    else
      ++cnt;
  }
  s = BlockSum(s, scratch);
  cnt = WarpSumInt(cnt);
  if ((threadIdx.x & 31) == 0) scratch_i[threadIdx.x >> 5] = cnt;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += scratch_i[w];
    partial_sum[blockIdx.x] = s;
    partial_cnt[blockIdx.x] = total;
  }
}

// sumsq, nonfinite: one value each, accumulated; partials: (nblocks).
__global__ void grad_stats_final_kernel(float* sumsq, int32_t* nonfinite,
                                        const float* __restrict__ partial_sum,
                                        const int* __restrict__ partial_cnt, int nblocks) {
  __shared__ float scratch[32];
  __shared__ int scratch_i[32];
  float s = 0.f;
  int cnt = 0;
  for (int i = threadIdx.x; i < nblocks; i += blockDim.x) {
    s += partial_sum[i];
    cnt += partial_cnt[i];
  }
  s = BlockSum(s, scratch);
  cnt = WarpSumInt(cnt);
  if ((threadIdx.x & 31) == 0) scratch_i[threadIdx.x >> 5] = cnt;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += scratch_i[w];
    *sumsq += s;
    *nonfinite += total;
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------

Status GradStats(cudaStream_t stream, const void* x, DType dtype, int64_t n, float* sumsq,
                 int32_t* nonfinite, void* scratch, size_t scratch_bytes) {
  if (n == 0) return Status::OK();
  const int nblocks =
      static_cast<int>(std::min<int64_t>(kMaxBlocks, (n + kThreads * 4 - 1) / (kThreads * 4)));
  if (scratch_bytes < static_cast<size_t>(kMaxBlocks) * 8)
    return Internal("GradStats: backend scratch too small");
  float* psum = static_cast<float*>(scratch);
  int* pcnt = reinterpret_cast<int*>(psum + kMaxBlocks);
  return DispatchFloat(dtype, "GradStats", [&](auto tag) -> Status {
    using T = decltype(tag);
    grad_stats_partial_kernel<T><<<nblocks, kThreads, 0, stream>>>(psum, pcnt,
                                                                    static_cast<const T*>(x), n);
    CUDA_RETURN_IF_LAUNCH_ERROR("grad_stats_partial_kernel");
    grad_stats_final_kernel<<<1, 1024, 0, stream>>>(sumsq, nonfinite, psum, pcnt, nblocks);
    CUDA_RETURN_IF_LAUNCH_ERROR("grad_stats_final_kernel");
    return Status::OK();
  });
}

}  // namespace strata::kernels::cuda
