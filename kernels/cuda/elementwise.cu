// SPDX-License-Identifier: Apache-2.0
// Elementwise Add (the residual stream) and Scale.
//
// 16-byte packs over the aligned body, scalars for the tail (and for
// everything when a pointer is not 16-byte aligned).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

// ---- kernels ----------------------------------------------------------------

// out, a, b: (n); out may alias a or b (each element is read, then written,
// by the same thread).
template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n, int64_t npacks) {
  constexpr int kN = Pack<T>::kN;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = gid; i < npacks; i += stride) {
    Pack<T> va = LoadPack(a + i * kN);
    Pack<T> vb = LoadPack(b + i * kN);
#pragma unroll
    for (int j = 0; j < kN; ++j) va.v[j] = FromF<T>(ToF(va.v[j]) + ToF(vb.v[j]));
    StorePack(out + i * kN, va);
  }
  for (int64_t i = npacks * kN + gid; i < n; i += stride) out[i] = FromF<T>(ToF(a[i]) + ToF(b[i]));
}

// x: (n), scaled in place.
template <typename T>
__global__ void scale_kernel(T* x, int64_t n, int64_t npacks, float factor) {
  constexpr int kN = Pack<T>::kN;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = gid; i < npacks; i += stride) {
    Pack<T> v = LoadPack(x + i * kN);
#pragma unroll
    for (int j = 0; j < kN; ++j) v.v[j] = FromF<T>(ToF(v.v[j]) * factor);
    StorePack(x + i * kN, v);
  }
  for (int64_t i = npacks * kN + gid; i < n; i += stride) x[i] = FromF<T>(ToF(x[i]) * factor);
}

}  // namespace

// ---- launchers ------------------------------------------------------------

Status Add(cudaStream_t stream, void* out, const void* a, const void* b, int64_t n, DType dtype) {
  if (n == 0) return Status::OK();
  return DispatchFloat(dtype, "Add", [&](auto tag) -> Status {
    using T = decltype(tag);
    const int64_t npacks =
        (Aligned16(out) && Aligned16(a) && Aligned16(b)) ? n / Pack<T>::kN : 0;
    add_kernel<T><<<ElementwiseGrid(n), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n, npacks);
    CUDA_RETURN_IF_LAUNCH_ERROR("add_kernel");
    return Status::OK();
  });
}

Status Scale(cudaStream_t stream, void* x, DType dtype, int64_t n, float factor) {
  if (n == 0) return Status::OK();
  return DispatchFloat(dtype, "Scale", [&](auto tag) -> Status {
    using T = decltype(tag);
    const int64_t npacks = Aligned16(x) ? n / Pack<T>::kN : 0;
    scale_kernel<T><<<ElementwiseGrid(n), kElementwiseThreads, 0, stream>>>(static_cast<T*>(x), n,
                                                                              npacks, factor);
    CUDA_RETURN_IF_LAUNCH_ERROR("scale_kernel");
    return Status::OK();
  });
}

}  // namespace strata::kernels::cuda
