// SPDX-License-Identifier: Apache-2.0
// SwiGLU forward and backward, elementwise over rows of gate | up (Llama's
// MLP activation; the same formulas as the CPU backend, kernels/cpu/swiglu.cc).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

__device__ __forceinline__ float SigmoidF(float g) { return 1.f / (1.f + expf(-g)); }

// out: (rows, F); in: (rows, 2F).
template <typename T>
__global__ void swiglu_forward_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t rows, int64_t F) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * F; i += stride) {
    const int64_t r = i / F, j = i % F;
    const float g = ToF(in[r * 2 * F + j]), u = ToF(in[r * 2 * F + F + j]);
    out[i] = FromF<T>(g * SigmoidF(g) * u);
  }
}

// din: (rows, 2F), may alias in (each thread reads its pair before writing it); dout: (rows, F).
template <typename T>
__global__ void swiglu_backward_kernel(T* din, const T* __restrict__ dout, const T* in,
                                       int64_t rows, int64_t F) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * F; i += stride) {
    const int64_t r = i / F, j = i % F;
    const float g = ToF(in[r * 2 * F + j]), u = ToF(in[r * 2 * F + F + j]), d = ToF(dout[i]);
    const float s = SigmoidF(g);
    din[r * 2 * F + j] = FromF<T>(d * u * s * (1.f + g * (1.f - s)));
    din[r * 2 * F + F + j] = FromF<T>(d * g * s);
  }
}

}  // namespace

Status SwiGluForward(cudaStream_t stream, void* out, const void* in, int64_t rows, int64_t f, DType dtype) {
  if (rows * f == 0) return Status::OK();
  return DispatchFloat(dtype, "SwiGluForward", [&](auto tag) -> Status {
    using T = decltype(tag);
    swiglu_forward_kernel<T><<<ElementwiseGrid(rows * f), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(in), rows, f);
    CUDA_RETURN_IF_LAUNCH_ERROR("swiglu_forward_kernel");
    return Status::OK();
  });
}

Status SwiGluBackward(cudaStream_t stream, void* din, const void* dout, const void* in, int64_t rows, int64_t f,
                      DType dtype) {
  if (rows * f == 0) return Status::OK();
  return DispatchFloat(dtype, "SwiGluBackward", [&](auto tag) -> Status {
    using T = decltype(tag);
    swiglu_backward_kernel<T><<<ElementwiseGrid(rows * f), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(din), static_cast<const T*>(dout), static_cast<const T*>(in), rows, f);
    CUDA_RETURN_IF_LAUNCH_ERROR("swiglu_backward_kernel");
    return Status::OK();
  });
}

}  // namespace strata::kernels::cuda
