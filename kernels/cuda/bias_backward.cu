// Bias gradient: column sums of dy over its rows.
//
// Blocks of 64 columns x a slice of rows write fp32 partials to scratch, one
// pass sums the slices in order: deterministic, no atomics.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kColTile = 64;
constexpr int kRowWarps = 8;

// ---- kernels ----------------------------------------------------------------

// partial: (S, n) f32; dy: (m, n). Block (32, kRowWarps), grid (ceil(n / 64), S);
// slice s covers rows [s * rows_per, min(m, (s + 1) * rows_per)).
template <typename T>
__global__ void bias_backward_partial_kernel(float* __restrict__ partial,
                                             const T* __restrict__ dy, int64_t m, int64_t n,
                                             int64_t rows_per) {
  __shared__ float sacc[kRowWarps][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kColTile;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per;
  const int64_t r_end = min(m, r_begin + rows_per);
  float acc[2] = {0.f, 0.f};
  for (int64_t r = r_begin + ty; r < r_end; r += kRowWarps) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      int64_t c = c0 + j * 32 + tx;
      if (c < n) acc[j] += ToF(dy[r * n + c]);
    }
  }
  sacc[ty][tx] = acc[0];
  sacc[ty][32 + tx] = acc[1];
  __syncthreads();
  if (ty == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float s = 0.f;
      for (int i = 0; i < kRowWarps; ++i) s += sacc[i][j * 32 + tx];  // fixed order
      int64_t c = c0 + j * 32 + tx;
      if (c < n) partial[static_cast<int64_t>(blockIdx.y) * n + c] = s;
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

}  // namespace

// ---- launchers ------------------------------------------------------------

Status BiasBackward(cudaStream_t stream, int num_sms, void* dbias, DType grad_dtype,
                    bool accumulate, const void* dy, int64_t m, int64_t n, DType dtype,
                    float* scratch, size_t scratch_bytes) {
  if (n == 0) return Status::OK();
  const unsigned col_blocks = CeilDiv(n, kColTile);
  int64_t S = std::max<int64_t>(1, CeilDiv(2 * static_cast<int64_t>(num_sms), col_blocks));
  S = std::min<int64_t>(S, std::max<int64_t>(1, m));
  S = std::min<int64_t>(S, 64);
  S = std::min<int64_t>(S, static_cast<int64_t>(scratch_bytes / (sizeof(float) * n)));
  if (S < 1)
    return InvalidArgument("BiasBackward: n " + std::to_string(n) +
                           " too large for the backend scratch");
  const int64_t rows_per = m == 0 ? 1 : (m + S - 1) / S;
  return DispatchFloat(dtype, "BiasBackward", [&](auto tag) -> Status {
    using T = decltype(tag);
    if (m > 0) {
      bias_backward_partial_kernel<T>
          <<<dim3(col_blocks, static_cast<unsigned>(S)), dim3(32, kRowWarps), 0, stream>>>(
              scratch, static_cast<const T*>(dy), m, n, rows_per);
      CUDA_RETURN_IF_LAUNCH_ERROR("bias_backward_partial_kernel");
    } else {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch, 0, sizeof(float) * n * S, stream));
    }
    return DispatchFloat(grad_dtype, "BiasBackward grad_dtype", [&](auto gtag) -> Status {
      using G = decltype(gtag);
      bias_backward_final_kernel<G><<<CeilDiv(n, 256), 256, 0, stream>>>(
          static_cast<G*>(dbias), scratch, static_cast<int>(S), n, accumulate);
      CUDA_RETURN_IF_LAUNCH_ERROR("bias_backward_final_kernel");
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cuda
