// SPDX-License-Identifier: Apache-2.0
// tanh-GELU forward and backward, elementwise.
//
// 16-byte packs over the aligned body, scalars for the tail (and for
// everything when a pointer is not 16-byte aligned).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

// ---- kernels ----------------------------------------------------------------

// y, x: (n). `npacks` packs of Pack<T>::kN elements are done vectorized, the
// elements from npacks * kN on one by one.
template <typename T>
__global__ void gelu_forward_kernel(T* y, const T* x, int64_t n, int64_t npacks) {
  constexpr int kN = Pack<T>::kN;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = gid; i < npacks; i += stride) {
    Pack<T> v = LoadPack(x + i * kN);
#pragma unroll
    for (int j = 0; j < kN; ++j) v.v[j] = FromF<T>(GeluF(ToF(v.v[j])));
    StorePack(y + i * kN, v);
  }
  for (int64_t i = npacks * kN + gid; i < n; i += stride) y[i] = FromF<T>(GeluF(ToF(x[i])));
}

// dx, x, dy: (n); dx may alias dy.
template <typename T>
__global__ void gelu_backward_kernel(T* dx, const T* x, const T* dy, int64_t n, int64_t npacks) {
  constexpr int kN = Pack<T>::kN;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = gid; i < npacks; i += stride) {
    Pack<T> vx = LoadPack(x + i * kN);
    Pack<T> vd = LoadPack(dy + i * kN);
#pragma unroll
    for (int j = 0; j < kN; ++j) vd.v[j] = FromF<T>(ToF(vd.v[j]) * GeluGradF(ToF(vx.v[j])));
    StorePack(dx + i * kN, vd);
  }
  for (int64_t i = npacks * kN + gid; i < n; i += stride)
    dx[i] = FromF<T>(ToF(dy[i]) * GeluGradF(ToF(x[i])));
}

}  // namespace

// ---- launchers ------------------------------------------------------------

Status GeluForward(cudaStream_t stream, void* y, const void* x, int64_t n, DType dtype) {
  if (n == 0) return Status::OK();
  return DispatchFloat(dtype, "GeluForward", [&](auto tag) -> Status {
    using T = decltype(tag);
    const int64_t npacks = (Aligned16(y) && Aligned16(x)) ? n / Pack<T>::kN : 0;
    gelu_forward_kernel<T><<<ElementwiseGrid(n), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(x), n, npacks);
    CUDA_RETURN_IF_LAUNCH_ERROR("gelu_forward_kernel");
    return Status::OK();
  });
}

Status GeluBackward(cudaStream_t stream, void* dx, const void* x, const void* dy, int64_t n,
                    DType dtype) {
  if (n == 0) return Status::OK();
  return DispatchFloat(dtype, "GeluBackward", [&](auto tag) -> Status {
    using T = decltype(tag);
    const int64_t npacks =
        (Aligned16(dx) && Aligned16(x) && Aligned16(dy)) ? n / Pack<T>::kN : 0;
    gelu_backward_kernel<T><<<ElementwiseGrid(n), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(dx), static_cast<const T*>(x), static_cast<const T*>(dy), n, npacks);
    CUDA_RETURN_IF_LAUNCH_ERROR("gelu_backward_kernel");
    return Status::OK();
  });
}

}  // namespace strata::kernels::cuda
