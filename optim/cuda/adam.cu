// SPDX-License-Identifier: Apache-2.0
// The fused GPU Adam/AdamW step (optim/gpu_adam_launch.h): one grid-stride pass
// reads the gradient, updates master weights and moments in place, writes the
// optional parameter copy and counts non-finite gradient values.
//
// Bitwise the same as the CPU Adam: the per-element sequence of
// optim/adam_coefficients.h is written with the explicitly
// rounded intrinsics (__fmul_rn, __fmaf_rn, __fsqrt_rn, __fdiv_rn), which
// nvcc never contracts or approximates, and the conversions round to nearest
// even (__float2half_rn, __float2bfloat16_rn). Subnormals are kept (this file
// is not built with -ftz / --use_fast_math).
//
// Kernels first, then the launcher.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "base/cuda_check.h"
#include "optim/gpu_adam_launch.h"

#ifdef __USE_FAST_MATH__
#error "optim/cuda/adam.cu must not be built with --use_fast_math: it must match the CPU Adam bit for bit"
#endif

namespace strata::optim {

namespace {

enum class Kind { kF32, kF16, kBF16, kNone };

// ---- element access --------------------------------------------------------

template <Kind k>
__device__ __forceinline__ float LoadOne(const void* base, int64_t i) {
  if constexpr (k == Kind::kF32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (k == Kind::kF16) {
    return __half2float(static_cast<const __half*>(base)[i]);
  } else {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  }
}

template <Kind k>
__device__ __forceinline__ void StoreOne(void* base, int64_t i, float x) {
  if constexpr (k == Kind::kF32) {
    static_cast<float*>(base)[i] = x;
  } else if constexpr (k == Kind::kF16) {
    static_cast<__half*>(base)[i] = __float2half_rn(x);
  } else if constexpr (k == Kind::kBF16) {
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
  }
}

// Four consecutive elements at 4*j, with one 16-byte (f32) or 8-byte (16-bit)
// access; the launcher checks the alignment before choosing kVec = 4.
template <Kind k>
__device__ __forceinline__ void Load4(const void* base, int64_t j, float (&x)[4]) {
  if constexpr (k == Kind::kF32) {
    float4 v = reinterpret_cast<const float4*>(base)[j];
    x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
  } else if constexpr (k == Kind::kF16) {
    uint2 v = reinterpret_cast<const uint2*>(base)[j];
    x[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(v.x & 0xffffu)));
    x[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(v.x >> 16)));
    x[2] = __half2float(__ushort_as_half(static_cast<unsigned short>(v.y & 0xffffu)));
    x[3] = __half2float(__ushort_as_half(static_cast<unsigned short>(v.y >> 16)));
  } else {
    uint2 v = reinterpret_cast<const uint2*>(base)[j];
    // bf16 -> f32 is exact: the bits go to the top half.
    x[0] = __uint_as_float(v.x << 16);
    x[1] = __uint_as_float(v.x & 0xffff0000u);
    x[2] = __uint_as_float(v.y << 16);
    x[3] = __uint_as_float(v.y & 0xffff0000u);
  }
}

__device__ __forceinline__ uint32_t Pack2(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

template <Kind k>
__device__ __forceinline__ void Store4(void* base, int64_t j, const float (&x)[4]) {
  if constexpr (k == Kind::kF32) {
    reinterpret_cast<float4*>(base)[j] = make_float4(x[0], x[1], x[2], x[3]);
  } else if constexpr (k == Kind::kF16) {
    uint16_t h[4];
    for (int l = 0; l < 4; ++l) h[l] = __half_as_ushort(__float2half_rn(x[l]));
    reinterpret_cast<uint2*>(base)[j] = make_uint2(Pack2(h[0], h[1]), Pack2(h[2], h[3]));
  } else if constexpr (k == Kind::kBF16) {
    uint16_t h[4];
    for (int l = 0; l < 4; ++l) h[l] = __bfloat16_as_ushort(__float2bfloat16_rn(x[l]));
    reinterpret_cast<uint2*>(base)[j] = make_uint2(Pack2(h[0], h[1]), Pack2(h[2], h[3]));
  }
}

__device__ __forceinline__ uint32_t NonFinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
}

// The contract of optim/adam_coefficients.h, one rounding per operation.
__device__ __forceinline__ void AdamElement(const AdamCoefficients& c, float g, float& p, float& m, float& v) {
  g = __fmul_rn(g, c.grad_scale);
  if (c.l2_decay != 0.f) g = __fmaf_rn(p, c.l2_decay, g);
  m = __fmaf_rn(g, c.one_minus_beta1, __fmul_rn(m, c.beta1));
  v = __fmaf_rn(__fmul_rn(g, g), c.one_minus_beta2, __fmul_rn(v, c.beta2));
  const float d = __fmaf_rn(__fsqrt_rn(v), c.inv_sqrt_bc2, c.eps);
  const float u = __fdiv_rn(m, d);
  if (c.neg_lr_decay != 0.f) p = __fmaf_rn(p, c.neg_lr_decay, p);
  p = __fmaf_rn(u, c.neg_step_size, p);
}

// ---- kernel ----------------------------------------------------------------

// Grid-stride over groups of kVec elements; the n % kVec elements at the end
// are taken by the first threads of the grid. Each warp adds its non-finite
// count to the device counter once.
template <Kind G, Kind S, Kind O, int kVec>
__global__ void AdamKernel(AdamGpuShard s, AdamCoefficients c) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t groups = s.n / kVec;
  uint32_t nonfinite = 0;
  for (int64_t j = tid; j < groups; j += stride) {
    float g[kVec], p[kVec], m[kVec], v[kVec];
    if constexpr (kVec == 4) {
      Load4<G>(s.grad, j, g);
      Load4<Kind::kF32>(s.master, j, p);
      Load4<S>(s.exp_avg, j, m);
      Load4<S>(s.exp_avg_sq, j, v);
    } else {
      g[0] = LoadOne<G>(s.grad, j);
      p[0] = s.master[j];
      m[0] = LoadOne<S>(s.exp_avg, j);
      v[0] = LoadOne<S>(s.exp_avg_sq, j);
    }
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      nonfinite += NonFinite(g[l]);
      AdamElement(c, g[l], p[l], m[l], v[l]);
    }
    if constexpr (kVec == 4) {
      Store4<Kind::kF32>(s.master, j, p);
      Store4<S>(s.exp_avg, j, m);
      Store4<S>(s.exp_avg_sq, j, v);
      if constexpr (O != Kind::kNone) Store4<O>(s.param_out, j, p);
    } else {
      s.master[j] = p[0];
      StoreOne<S>(s.exp_avg, j, m[0]);
      StoreOne<S>(s.exp_avg_sq, j, v[0]);
      if constexpr (O != Kind::kNone) StoreOne<O>(s.param_out, j, p[0]);
    }
  }
  const int64_t tail = groups * kVec + tid;
  if (tail < s.n) {
    float g = LoadOne<G>(s.grad, tail), p = s.master[tail];
    float m = LoadOne<S>(s.exp_avg, tail), v = LoadOne<S>(s.exp_avg_sq, tail);
    nonfinite += NonFinite(g);
    AdamElement(c, g, p, m, v);
    s.master[tail] = p;
    StoreOne<S>(s.exp_avg, tail, m);
    StoreOne<S>(s.exp_avg_sq, tail, v);
    if constexpr (O != Kind::kNone) StoreOne<O>(s.param_out, tail, p);
  }
  if (s.nonfinite_count != nullptr) {
    // Every thread of the block reaches this point: full-warp shuffles are safe.
    for (int off = 16; off > 0; off >>= 1) nonfinite += __shfl_down_sync(0xffffffffu, nonfinite, off);
    if ((threadIdx.x & 31) == 0 && nonfinite != 0)
      atomicAdd(reinterpret_cast<unsigned long long*>(s.nonfinite_count),
                static_cast<unsigned long long>(nonfinite));
  }
}

// ---- dispatch --------------------------------------------------------------

using KernelFn = void (*)(AdamGpuShard, AdamCoefficients);

template <Kind G, Kind S, Kind O>
KernelFn Pick(bool vec) {
  return vec ? &AdamKernel<G, S, O, 4> : &AdamKernel<G, S, O, 1>;
}

template <Kind G, Kind S>
KernelFn PickOut(bool has_out, DType out, bool vec) {
  if (!has_out) return Pick<G, S, Kind::kNone>(vec);
  switch (out) {
    case DType::kF32: return Pick<G, S, Kind::kF32>(vec);
    case DType::kF16: return Pick<G, S, Kind::kF16>(vec);
    case DType::kBF16: return Pick<G, S, Kind::kBF16>(vec);
    default: return nullptr;
  }
}

template <Kind G>
KernelFn PickState(DType state, bool has_out, DType out, bool vec) {
  switch (state) {
    case DType::kF32: return PickOut<G, Kind::kF32>(has_out, out, vec);
    case DType::kBF16: return PickOut<G, Kind::kBF16>(has_out, out, vec);
    default: return nullptr;
  }
}

KernelFn PickKernel(const AdamGpuShard& s, bool vec) {
  const bool has_out = s.param_out != nullptr;
  switch (s.grad_dtype) {
    case DType::kF32: return PickState<Kind::kF32>(s.state_dtype, has_out, s.param_out_dtype, vec);
    case DType::kF16: return PickState<Kind::kF16>(s.state_dtype, has_out, s.param_out_dtype, vec);
    case DType::kBF16: return PickState<Kind::kBF16>(s.state_dtype, has_out, s.param_out_dtype, vec);
    default: return nullptr;
  }
}

bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

// ---- launcher --------------------------------------------------------------

Status LaunchAdamGpu(const AdamGpuShard& s, const AdamCoefficients& c, void* stream) {
  static_assert(sizeof(uint64_t) == sizeof(unsigned long long), "the counter is used with atomicAdd(ull)");
  if (s.n < 0) return InvalidArgument("GPU Adam: n must be >= 0, got " + std::to_string(s.n));
  if (s.n == 0) return Status::OK();
  if (!s.master || !s.exp_avg || !s.exp_avg_sq || !s.grad)
    return InvalidArgument("GPU Adam: master, exp_avg, exp_avg_sq and grad must be non-null");
  const size_t ss = DTypeSize(s.state_dtype), gs = DTypeSize(s.grad_dtype);
  const size_t os = s.param_out ? DTypeSize(s.param_out_dtype) : 0;
  if (PickKernel(s, false) == nullptr)
    return InvalidArgument("GPU Adam: unsupported dtypes (grad " + std::string(DTypeName(s.grad_dtype)) +
                           ", state " + std::string(DTypeName(s.state_dtype)) + ", param_out " +
                           std::string(DTypeName(s.param_out_dtype)) + ")");
  if (!Aligned(s.master, 4) || !Aligned(s.exp_avg, ss) || !Aligned(s.exp_avg_sq, ss) || !Aligned(s.grad, gs) ||
      (s.param_out && !Aligned(s.param_out, os)))
    return InvalidArgument("GPU Adam: a pointer is not aligned to its element size");
  // 4 elements per access when every array allows it (4 x element size).
  const bool vec = Aligned(s.master, 16) && Aligned(s.exp_avg, 4 * ss) && Aligned(s.exp_avg_sq, 4 * ss) &&
                   Aligned(s.grad, 4 * gs) && (!s.param_out || Aligned(s.param_out, 4 * os));
  KernelFn fn = PickKernel(s, vec);

  int device = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  constexpr int kThreads = 256;
  const int64_t groups = vec ? s.n / 4 : s.n;
  const int64_t want = (groups + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(sms > 0 ? sms : 1) * 8;  // enough blocks to fill the GPU
  const int blocks = static_cast<int>(want < 1 ? 1 : want < cap ? want : cap);
  fn<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(s, c);
  CUDA_RETURN_IF_LAUNCH_ERROR("adam");
  return Status::OK();
}

}  // namespace strata::optim
