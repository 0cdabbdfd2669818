// SPDX-License-Identifier: Apache-2.0
// Cast between the storage dtypes (f32, f16, bf16), rounding to nearest even.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

// ---- kernels ----------------------------------------------------------------

// dst: (n) D; src: (n) S. Grid-stride, one element per thread and step.
template <typename D, typename S>
__global__ void cast_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = FromF<D>(ToF(src[i]));
}

}  // namespace

// ---- launchers ------------------------------------------------------------

Status Cast(cudaStream_t stream, void* dst, DType dst_dtype, const void* src, DType src_dtype,
            int64_t n) {
  if (n == 0) return Status::OK();
  return DispatchFloat(dst_dtype, "Cast dst", [&](auto dtag) -> Status {
    using D = decltype(dtag);
    return DispatchFloat(src_dtype, "Cast src", [&](auto stag) -> Status {
      using S = decltype(stag);
      if constexpr (std::is_same_v<D, S>) {
        if (dst == src) return Status::OK();
        CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dst, src, n * sizeof(D), cudaMemcpyDeviceToDevice, stream));
      } else {
        cast_kernel<D, S><<<ElementwiseGrid(n), kElementwiseThreads, 0, stream>>>(
            static_cast<D*>(dst), static_cast<const S*>(src), n);
        CUDA_RETURN_IF_LAUNCH_ERROR("cast_kernel");
      }
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cuda
