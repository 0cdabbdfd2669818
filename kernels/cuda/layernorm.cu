// SPDX-License-Identifier: Apache-2.0
// LayerNorm forward and backward.
//
// Forward: one warp per row; mean and variance in fp32 (two passes over the
// row, which stays in L1), y written in the storage dtype, mean/rstd saved.
// Backward: one warp per row for dx (accumulated, as the interface says), and
// a separate column reduction for dweight/dbias: blocks of 32 lanes x 16-byte
// column groups x a slice of rows write fp32 partials to scratch, then one
// pass sums the slices in order. No float atomics: bitwise deterministic.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

// ---- kernels ----------------------------------------------------------------

// Loads kVec consecutive elements of row `p` at column c into f[] (fp32).
template <typename T, int kVec>
__device__ __forceinline__ void LoadF(const T* p, float (&f)[kVec]) {
  if constexpr (kVec == 1) {
    f[0] = ToF(p[0]);
  } else {
    Pack<T> v = LoadPack(p);
#pragma unroll
    for (int i = 0; i < kVec; ++i) f[i] = ToF(v.v[i]);
  }
}
template <typename T, int kVec>
__device__ __forceinline__ void StoreF(T* p, const float (&f)[kVec]) {
  if constexpr (kVec == 1) {
    p[0] = FromF<T>(f[0]);
  } else {
    Pack<T> v;
#pragma unroll
    for (int i = 0; i < kVec; ++i) v.v[i] = FromF<T>(f[i]);
    StorePack(p, v);
  }
}

// y: (N, C); mean, rstd: (N) f32; x: (N, C); w, b: (C).
// kVec > 1 needs C % kVec == 0 and 16-byte aligned x, y, w, b.
template <typename T, int kVec>
__global__ void layernorm_forward_kernel(T* __restrict__ y, float* __restrict__ mean,
                                         float* __restrict__ rstd, const T* __restrict__ x,
                                         const T* __restrict__ w, const T* __restrict__ b,
                                         int64_t N, int C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= N) return;
  const T* xr = x + row * C;
  float s = 0.f;
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float f[kVec];
    LoadF<T, kVec>(xr + c, f);
#pragma unroll
    for (int i = 0; i < kVec; ++i) s += f[i];
  }
  const float m = WarpSum(s) / C;
  float v = 0.f;
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float f[kVec];
    LoadF<T, kVec>(xr + c, f);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v += (f[i] - m) * (f[i] - m);
  }
  const float rs = rsqrtf(WarpSum(v) / C + eps);
  T* yr = y + row * C;
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float f[kVec], fw[kVec], fb[kVec];
    LoadF<T, kVec>(xr + c, f);
    LoadF<T, kVec>(w + c, fw);
    LoadF<T, kVec>(b + c, fb);
#pragma unroll
    for (int i = 0; i < kVec; ++i) f[i] = (f[i] - m) * rs * fw[i] + fb[i];
    StoreF<T, kVec>(yr + c, f);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

// dx: (N, C), accumulated; dy, x: (N, C); w: (C); mean, rstd: (N).
// dx += rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * w.
template <typename T, int kVec>
__global__ void layernorm_backward_dx_kernel(T* dx, const T* __restrict__ dy,
                                             const T* __restrict__ x, const T* __restrict__ w,
                                             const float* __restrict__ mean,
                                             const float* __restrict__ rstd, int64_t N, int C) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= N) return;
  const T* xr = x + row * C;
  const T* dyr = dy + row * C;
  const float m = mean[row], rs = rstd[row];
  float sd = 0.f, sdx = 0.f;
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float fx[kVec], fdy[kVec], fw[kVec];
    LoadF<T, kVec>(xr + c, fx);
    LoadF<T, kVec>(dyr + c, fdy);
    LoadF<T, kVec>(w + c, fw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      float d = fdy[i] * fw[i];
      sd += d;
      sdx += d * (fx[i] - m) * rs;
    }
  }
  const float md = WarpSum(sd) / C, mdx = WarpSum(sdx) / C;
  T* dxr = dx + row * C;
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float fx[kVec], fdy[kVec], fw[kVec], fo[kVec];
    LoadF<T, kVec>(xr + c, fx);
    LoadF<T, kVec>(dyr + c, fdy);
    LoadF<T, kVec>(w + c, fw);
    LoadF<T, kVec>(dxr + c, fo);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      float xhat = (fx[i] - m) * rs;
      fo[i] += rs * (fdy[i] * fw[i] - md - xhat * mdx);
    }
    StoreF<T, kVec>(dxr + c, fo);
  }
}

constexpr int kRowWarps = 8;  // warps per block of the parameter-gradient reduction

// partial: (2, S, C) f32 — [0] dweight partials, [1] dbias partials; slice s
// covers rows [s * rows_per, min(N, (s + 1) * rows_per)).
// Block (32, kRowWarps), grid (ceil(C / (32 kVec)), S). Lane tx owns columns
// c0 + tx*kVec .. + kVec-1 (16-byte loads when kVec > 1: C % kVec == 0 and
// aligned dy, x).
template <typename T, int kVec>
__global__ void __launch_bounds__(32 * kRowWarps)
    layernorm_param_grad_partial_kernel(float* __restrict__ partial, const T* __restrict__ dy,
                                        const T* __restrict__ x, const float* __restrict__ mean,
                                        const float* __restrict__ rstd, int64_t N, int C,
                                        int64_t rows_per) {
  __shared__ float sw[kRowWarps][32 * kVec];
  __shared__ float sb[kRowWarps][32 * kVec];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 * kVec + tx * kVec;
  const int S = gridDim.y;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per;
  const int64_t r_end = min(N, r_begin + rows_per);
  float aw[kVec], ab[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) aw[i] = ab[i] = 0.f;
  if (c < C) {
#pragma unroll 2
    for (int64_t r = r_begin + ty; r < r_end; r += kRowWarps) {
      const float m = mean[r], rs = rstd[r];
      float fd[kVec], fx[kVec];
      LoadF<T, kVec>(dy + r * C + c, fd);
      LoadF<T, kVec>(x + r * C + c, fx);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        aw[i] += fd[i] * ((fx[i] - m) * rs);
        ab[i] += fd[i];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    sw[ty][tx * kVec + i] = aw[i];
    sb[ty][tx * kVec + i] = ab[i];
  }
  __syncthreads();
  if (ty == 0) {
    for (int col = tx; col < 32 * kVec; col += 32) {
      float w_sum = 0.f, b_sum = 0.f;
      for (int i = 0; i < kRowWarps; ++i) {  // fixed order
        w_sum += sw[i][col];
        b_sum += sb[i][col];
      }
      const int cc = blockIdx.x * 32 * kVec + col;
      if (cc < C) {
        partial[static_cast<int64_t>(blockIdx.y) * C + cc] = w_sum;
        partial[static_cast<int64_t>(S + blockIdx.y) * C + cc] = b_sum;
      }
    }
  }
}

// dw, db: (C) grad dtype G; partial: (2, S, C) f32.
template <typename G>
__global__ void layernorm_param_grad_final_kernel(G* dw, G* db, const float* __restrict__ partial,
                                                  int S, int C, bool accumulate) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float w_sum = 0.f, b_sum = 0.f;
  for (int s = 0; s < S; ++s) {
    w_sum += partial[static_cast<int64_t>(s) * C + c];
    b_sum += partial[static_cast<int64_t>(S + s) * C + c];
  }
  if (accumulate) {
    w_sum += ToF(dw[c]);
    b_sum += ToF(db[c]);
  }
  dw[c] = FromF<G>(w_sum);
  db[c] = FromF<G>(b_sum);
}

constexpr int kRowsPerBlock = 8;  // warps (rows) per block for the row kernels

}  // namespace

// ---- launchers ------------------------------------------------------------

Status LayerNormForward(cudaStream_t stream, const LayerNormArgs& a, void* y, float* mean,
                        float* rstd, const void* x, const void* weight, const void* bias) {
  const int64_t N = a.rows;
  const int C = static_cast<int>(a.cols);
  if (N == 0) return Status::OK();
  return DispatchFloat(a.dtype, "LayerNormForward", [&](auto tag) -> Status {
    using T = decltype(tag);
    constexpr int kN = Pack<T>::kN;
    const bool vec = C % kN == 0 && Aligned16(y) && Aligned16(x) && Aligned16(weight) &&
                     Aligned16(bias);
    dim3 grid(CeilDiv(N, kRowsPerBlock)), block(32 * kRowsPerBlock);
    if (vec)
      layernorm_forward_kernel<T, kN><<<grid, block, 0, stream>>>(
          static_cast<T*>(y), mean, rstd, static_cast<const T*>(x),
          static_cast<const T*>(weight), static_cast<const T*>(bias), N, C, a.eps);
    else
      layernorm_forward_kernel<T, 1><<<grid, block, 0, stream>>>(
          static_cast<T*>(y), mean, rstd, static_cast<const T*>(x),
          static_cast<const T*>(weight), static_cast<const T*>(bias), N, C, a.eps);
    CUDA_RETURN_IF_LAUNCH_ERROR("layernorm_forward_kernel");
    return Status::OK();
  });
}

Status LayerNormBackward(cudaStream_t stream, int num_sms, const LayerNormArgs& a, void* dx,
                         void* dweight, void* dbias, DType grad_dtype, bool accumulate,
                         const void* dy, const void* x, const void* weight, const float* mean,
                         const float* rstd, float* scratch, size_t scratch_bytes) {
  const int64_t N = a.rows;
  const int C = static_cast<int>(a.cols);
  if (C == 0) return Status::OK();
  return DispatchFloat(a.dtype, "LayerNormBackward", [&](auto tag) -> Status {
    using T = decltype(tag);
    constexpr int kN = Pack<T>::kN;
    const bool vec_params = C % kN == 0 && Aligned16(dy) && Aligned16(x);
    const int kv = vec_params ? kN : 1;
    // Slices of rows for the parameter-gradient partials: about 4 blocks per
    // SM, at least 4 rows per warp, bounded by the scratch.
    const unsigned col_blocks = CeilDiv(C, 32 * kv);
    int64_t S = std::max<int64_t>(1, CeilDiv(4 * static_cast<int64_t>(num_sms), col_blocks));
    S = std::min<int64_t>(S, std::max<int64_t>(1, CeilDiv(N, 4 * kRowWarps)));
    S = std::min<int64_t>(S, 64);
    S = std::min<int64_t>(S, static_cast<int64_t>(scratch_bytes / (2 * sizeof(float) * C)));
    if (S < 1)
      return InvalidArgument("LayerNormBackward: cols " + std::to_string(C) +
                             " too large for the backend scratch");
    if (N > 0) {
      const bool vec = C % kN == 0 && Aligned16(dx) && Aligned16(dy) && Aligned16(x) &&
                       Aligned16(weight);
      dim3 grid(CeilDiv(N, kRowsPerBlock)), block(32 * kRowsPerBlock);
      if (vec)
        layernorm_backward_dx_kernel<T, kN><<<grid, block, 0, stream>>>(
            static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x),
            static_cast<const T*>(weight), mean, rstd, N, C);
      else
        layernorm_backward_dx_kernel<T, 1><<<grid, block, 0, stream>>>(
            static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x),
            static_cast<const T*>(weight), mean, rstd, N, C);
      CUDA_RETURN_IF_LAUNCH_ERROR("layernorm_backward_dx_kernel");
      const int64_t rows_per = (N + S - 1) / S;
      dim3 pgrid(col_blocks, static_cast<unsigned>(S)), pblock(32, kRowWarps);
      if (vec_params)
        layernorm_param_grad_partial_kernel<T, kN><<<pgrid, pblock, 0, stream>>>(
            scratch, static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, N, C,
            rows_per);
      else
        layernorm_param_grad_partial_kernel<T, 1><<<pgrid, pblock, 0, stream>>>(
            scratch, static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, N, C,
            rows_per);
      CUDA_RETURN_IF_LAUNCH_ERROR("layernorm_param_grad_partial_kernel");
    } else {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch, 0, 2 * sizeof(float) * C * S, stream));
    }
    return DispatchFloat(grad_dtype, "LayerNormBackward grad_dtype", [&](auto gtag) -> Status {
      using G = decltype(gtag);
      layernorm_param_grad_final_kernel<G><<<CeilDiv(C, 256), 256, 0, stream>>>(
          static_cast<G*>(dweight), static_cast<G*>(dbias), scratch, static_cast<int>(S), C,
          accumulate);
      CUDA_RETURN_IF_LAUNCH_ERROR("layernorm_param_grad_final_kernel");
      return Status::OK();
    });
  });
}

}  // namespace strata::kernels::cuda
