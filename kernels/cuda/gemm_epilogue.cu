// GEMM epilogue for the cases cuBLASLt does not fuse (see gemm.h): bias add,
// GELU (saving the pre-activation) and, for k = 0, C = beta * C.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

namespace strata::kernels::cuda {
namespace {

// ---- kernels ----------------------------------------------------------------

// c, aux: (batch, m, ldc) C; bias: (n) Bt. One thread per (item, i, j), grid-stride.
template <typename C, typename Bt>
__global__ void gemm_epilogue_kernel(C* c, int64_t ldc, int64_t m, int64_t n, int64_t batch,
                                     int64_t stride_c, float c_scale, bool c_zero,
                                     const Bt* __restrict__ bias, bool gelu, C* aux) {
  const int64_t total = batch * m * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t j = idx % n;
    const int64_t i = (idx / n) % m;
    const int64_t item = idx / (m * n);
    const int64_t off = item * stride_c + i * ldc + j;
    float v = c_zero ? 0.f : c_scale * ToF(c[off]);
    if (bias) v += ToF(bias[j]);
    if (aux) aux[off] = FromF<C>(v);
    c[off] = FromF<C>(gelu ? GeluF(v) : v);
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------

Status GemmEpilogue(cudaStream_t stream, void* c, DType c_dtype, int64_t ldc, int64_t m,
                    int64_t n, int batch, int64_t stride_c, float c_scale, bool c_zero,
                    const void* bias, DType bias_dtype, bool gelu, void* aux) {
  const int64_t total = static_cast<int64_t>(batch) * m * n;
  if (total == 0) return Status::OK();
  return DispatchFloat(c_dtype, "Gemm epilogue", [&](auto ctag) -> Status {
    using C = decltype(ctag);
    return DispatchFloat(bias_dtype, "Gemm epilogue bias", [&](auto btag) -> Status {
      using Bt = decltype(btag);
      gemm_epilogue_kernel<C, Bt><<<ElementwiseGrid(total), kElementwiseThreads, 0, stream>>>(
          static_cast<C*>(c), ldc, m, n, batch, stride_c, c_scale, c_zero,
          static_cast<const Bt*>(bias), gelu, static_cast<C*>(aux));
      CUDA_RETURN_IF_LAUNCH_ERROR("gemm_epilogue_kernel");
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cuda
