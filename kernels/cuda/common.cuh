// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the CUDA kernels (kernels/cuda/*.cu): storage-type
// conversions, 16-byte vector packs, warp/block reductions, dtype dispatch
// and argument checks that return Status.
//
// Storage types are float, __nv_bfloat16 and __half; arithmetic is fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "base/cuda_check.h"
#include "base/dtype.h"
#include "base/status.h"
#include "kernels/flash_block_order.h"

namespace strata::kernels::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

// ---- element conversions ---------------------------------------------------

__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToF(f16 x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromF(float x);
template <>
__device__ __forceinline__ float FromF<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 FromF<bf16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ f16 FromF<f16>(float x) { return __float2half_rn(x); }

// ---- 16-byte packs -----------------------------------------------------------

// kN elements of T in 16 bytes, loaded/stored with one 128-bit access.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  T v[kN];
};

template <typename T>
__device__ __forceinline__ Pack<T> LoadPack(const T* p) {
  return *reinterpret_cast<const Pack<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void StorePack(T* p, const Pack<T>& v) {
  *reinterpret_cast<Pack<T>*>(p) = v;
}

// True when `p` is 16-byte aligned (host side).
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- math ----------------------------------------------------------------

// log2(e): the flash kernels keep scores and lse in the log2 domain (exp2).
constexpr float kLog2e = 1.4426950408889634f;

// tanh-GELU and its derivative (the same formula as the CPU backend).
__device__ __forceinline__ float GeluF(float x) {
  constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
  float u = kS * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.f + tanhf(u));
}
__device__ __forceinline__ float GeluGradF(float x) {
  constexpr float kS = 0.7978845608028654f;
  float x2 = x * x;
  float u = kS * (x + 0.044715f * x2 * x);
  float t = tanhf(u);
  float du = kS * (1.f + 3.f * 0.044715f * x2);
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du;
}

// ---- reductions --------------------------------------------------------------
// Fixed shuffle trees: the same inputs give bitwise the same sums.

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int WarpSumInt(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets
// the result. `scratch` holds 32 floats of shared memory; the call contains
// the barriers it needs and may be called repeatedly with the same scratch.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  return WarpSum(v);
}
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return WarpMax(v);
}

// The (batch * head, tile) this flash-attention block works on, from a grid
// of n_tiles * (B * H) blocks in one dimension (kernels/flash_block_order.h).
__device__ __forceinline__ FlashHeadTile FlashBlockTile(int n_tiles, int group) {
  return FlashBlockOrder(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x), n_tiles, group);
}

// ---- host-side helpers ----------------------------------------------------

inline unsigned CeilDiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Grid-stride elementwise kernels: 256 threads, about 8 elements per thread,
// at most 65536 blocks (each element is computed by exactly one thread, so
// the grid size never changes a result).
constexpr int kElementwiseThreads = 256;
inline unsigned ElementwiseGrid(int64_t n) {
  int64_t blocks = (n + kElementwiseThreads * 8 - 1) / (kElementwiseThreads * 8);
  if (blocks < 1) blocks = 1;
  if (blocks > 65536) blocks = 65536;
  return static_cast<unsigned>(blocks);
}

// Heads per launch group of the sm_90a flash kernels (FlashBlockTile).
// STRATA_FLASH_HEAD_GROUP (a positive integer) overrides it, for measuring;
// any other value is an error of every launch that reads it.
constexpr int kFlashHeadGroup = 8;
inline Result<int> FlashHeadGroup() {
  static const Result<int> group = []() -> Result<int> {
    const char* env = std::getenv("STRATA_FLASH_HEAD_GROUP");
    if (env == nullptr || *env == '\0') return kFlashHeadGroup;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 1 || v > 4096)
      return InvalidArgument(std::string("STRATA_FLASH_HEAD_GROUP: '") + env +
                             "' is not a head count (an integer from 1 to 4096)");
    return static_cast<int>(v);
  }();
  return group;
}

// Lets `kernel` launch with `bytes` of dynamic shared memory (past the 48 KiB
// a launch gets without asking).
template <typename Kernel>
Status SetSmem(Kernel kernel, size_t bytes) {
  CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return Status::OK();
}

// Launches `kernel` on `stream` with `smem` bytes of dynamic shared memory
// (SetSmem first) and returns the launch's error, if any.
template <typename... Params, typename... Args>
Status LaunchWithSmem(void (*kernel)(Params...), dim3 grid, int threads, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  RETURN_IF_ERROR(SetSmem(kernel, smem));
  kernel<<<grid, threads, smem, stream>>>(std::forward<Args>(args)...);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::OK();
}

// Calls f(T{}) with T the CUDA storage type of `dt` (float, bf16, f16);
// InvalidArgument naming `what` for any other dtype.
template <typename F>
Status DispatchFloat(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::kF32: return f(float{});
    case DType::kBF16: return f(bf16{});
    case DType::kF16: return f(f16{});
    default:
      return InvalidArgument(std::string(what) + ": dtype " + std::string(DTypeName(dt)) +
                             " is not supported (f32, f16, bf16)");
  }
}

}  // namespace strata::kernels::cuda
