// SPDX-License-Identifier: Apache-2.0
// GEMM epilogue for the cases cuBLASLt does not fuse (see gemm.h): bias add,
// GELU (saving the pre-activation), the GELU derivative and, for k = 0,
// C = beta * C_in; and the cast/add of a bias gradient cuBLASLt computed.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

namespace strata::kernels::cuda {
namespace {

// ---- kernels ----------------------------------------------------------------

// c, c_in, aux: (batch, m, ldc) C; bias: (n) Bt. One thread per (item, i, j),
// grid-stride. c_in may equal c (each element is read before it is written).
template <typename C, typename Bt>
__global__ void gemm_epilogue_kernel(C* c, const C* c_in, int64_t ldc, int64_t m, int64_t n,
                                     int64_t batch, int64_t stride_c, float c_scale, bool c_zero,
                                     const Bt* __restrict__ bias, bool gelu, bool dgelu, C* aux) {
  const int64_t total = batch * m * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t j = idx % n;
    const int64_t i = (idx / n) % m;
    const int64_t item = idx / (m * n);
    const int64_t off = item * stride_c + i * ldc + j;
    float v = c_zero ? 0.f : c_scale * ToF(c_in[off]);
    if (bias) v += ToF(bias[j]);
    if (dgelu) {
      v *= GeluGradF(ToF(aux[off]));
    } else if (aux) {
      aux[off] = FromF<C>(v);
    }
    c[off] = FromF<C>(gelu ? GeluF(v) : v);
  }
}

// dst: (n) G; src: (n) S.
template <typename G, typename S>
__global__ void bias_grad_finish_kernel(G* dst, const S* __restrict__ src, int64_t n,
                                        bool accumulate) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float v = ToF(src[j]);
  if (accumulate) v = ToF(dst[j]) + v;
  dst[j] = FromF<G>(v);
}

}  // namespace

// ---- launchers ------------------------------------------------------------

Status GemmEpilogue(cudaStream_t stream, void* c, const void* c_in, DType c_dtype, int64_t ldc,
                    int64_t m, int64_t n, int batch, int64_t stride_c, float c_scale, bool c_zero,
                    const void* bias, DType bias_dtype, bool gelu, bool dgelu, void* aux) {
  const int64_t total = static_cast<int64_t>(batch) * m * n;
  if (total == 0) return Status::OK();
  return DispatchFloat(c_dtype, "Gemm epilogue", [&](auto ctag) -> Status {
    using C = decltype(ctag);
    return DispatchFloat(bias_dtype, "Gemm epilogue bias", [&](auto btag) -> Status {
      using Bt = decltype(btag);
      gemm_epilogue_kernel<C, Bt><<<ElementwiseGrid(total), kElementwiseThreads, 0, stream>>>(
          static_cast<C*>(c), static_cast<const C*>(c_in ? c_in : c), ldc, m, n, batch, stride_c,
          c_scale, c_zero, static_cast<const Bt*>(bias), gelu, dgelu, static_cast<C*>(aux));
      CUDA_RETURN_IF_LAUNCH_ERROR("gemm_epilogue_kernel");
      return Status::OK();
    });
  });
}

Status BiasGradFinish(cudaStream_t stream, void* dst, DType dst_dtype, bool accumulate,
                      const void* src, DType src_dtype, int64_t n) {
  if (n == 0) return Status::OK();
  return DispatchFloat(dst_dtype, "Gemm bias_grad", [&](auto gtag) -> Status {
    using G = decltype(gtag);
    return DispatchFloat(src_dtype, "Gemm bias_grad (cuBLASLt)", [&](auto stag) -> Status {
      using S = decltype(stag);
      bias_grad_finish_kernel<G, S><<<CeilDiv(n, 256), 256, 0, stream>>>(
          static_cast<G*>(dst), static_cast<const S*>(src), n, accumulate);
      CUDA_RETURN_IF_LAUNCH_ERROR("bias_grad_finish_kernel");
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cuda
