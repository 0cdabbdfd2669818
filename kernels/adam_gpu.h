// The fused GPU Adam/AdamW step, for optimizer state that lives in GPU memory
// (partial offload), with exactly the semantics of the CPU Adam
// (optim/cpu_adam.h): one pass reads the gradient (f32/f16/bf16), applies the
// gradient multiplier, updates the fp32 master weights and the moments (f32
// or bf16), writes an optional parameter copy (f32/f16/bf16) and counts
// non-finite gradient values.
//
// This header is plain C++ (no CUDA types): streams are `void*`
// (cudaStream_t). The kernel is in kernels/cuda/adam.cu; a build without CUDA
// gets kernels/adam_gpu.cc, whose launcher returns Unavailable.
//
// Also here, because kernels/ sits below optim/ and both sides need it:
// AdamCoefficients, the fp32 per-element constants of one step. The engine
// and tests do not fill it by hand: optim::MakeAdamCoefficients derives it
// from the hyperparameters (optim/cpu_adam.h), and optim::GpuAdamStep
// (optim/gpu_adam.h) is the usual entry point to the launcher below.
#pragma once

#include <cstdint>

#include "tiers/dtype.h"
#include "tiers/status.h"

namespace strata::kernels {

// The per-element constants of one Adam step, each a double rounded once to
// fp32. With them, every implementation (CPU scalar, AVX2, AVX-512, GPU)
// computes, per element and in fp32 with one IEEE rounding per operation:
//
//   g  = grad * grad_scale
//   g  = fma(p, l2_decay, g)                      only if l2_decay != 0
//   m  = fma(g, one_minus_beta1, m * beta1)
//   v  = fma(g * g, one_minus_beta2, v * beta2)
//   d  = fma(sqrt(v), inv_sqrt_bc2, eps)
//   u  = m / d
//   p  = fma(p, neg_lr_decay, p)                  only if neg_lr_decay != 0
//   p  = fma(u, neg_step_size, p)
//   out = round_to_nearest_even(p)                in the output dtype
//
// which is also the operation order of DeepSpeed's AVX cpu_adam.
struct AdamCoefficients {
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float neg_step_size = 0.f;  // -lr / (1 - beta1^t); -lr without bias correction
  float inv_sqrt_bc2 = 1.f;   // 1 / sqrt(1 - beta2^t); 1 without bias correction
  float neg_lr_decay = 0.f;   // -lr * weight_decay in decoupled (AdamW) mode, else 0
  float l2_decay = 0.f;       // weight_decay in L2 (classic Adam) mode, else 0
  float grad_scale = 1.f;     // 1/loss_scale x clip coefficient
};
static_assert(sizeof(AdamCoefficients) == 10 * sizeof(float), "AdamCoefficients is passed by value to kernels");

// One shard in GPU memory. All pointers are device pointers to n elements,
// naturally aligned for their dtype (wider alignment makes the kernel use
// 16-byte vector accesses; it works either way). The arrays must not overlap.
struct AdamGpuShard {
  int64_t n = 0;
  float* master = nullptr;              // (n) fp32 master weights, updated in place
  void* exp_avg = nullptr;              // (n) state_dtype: first moment m
  void* exp_avg_sq = nullptr;           // (n) state_dtype: second moment v
  DType state_dtype = DType::kF32;      // kF32 or kBF16
  const void* grad = nullptr;           // (n) grad_dtype
  DType grad_dtype = DType::kF32;       // kF32, kF16 or kBF16
  void* param_out = nullptr;            // (n) param_out_dtype, or nullptr for no copy
  DType param_out_dtype = DType::kF16;  // kF32, kF16 or kBF16
  // Device counter that the kernel adds the number of non-finite gradient
  // values (before scaling) to; nullptr to skip counting. The caller zeroes it.
  uint64_t* nonfinite_count = nullptr;
};

// Queues the step on `stream` (a cudaStream_t; nullptr is the legacy default
// stream). Returns InvalidArgument for a bad shard (null pointer, unsupported
// dtype, misaligned pointer), CudaError when the launch fails, and
// Unavailable in a build without CUDA. Like every CUDA op, it is
// asynchronous: errors of the running kernel surface at the next
// synchronizing call.
Status LaunchAdamGpu(const AdamGpuShard& shard, const AdamCoefficients& c, void* stream);

}  // namespace strata::kernels
