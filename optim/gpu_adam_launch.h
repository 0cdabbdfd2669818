// SPDX-License-Identifier: Apache-2.0
// The fused GPU Adam/AdamW kernel's launcher, for optimizer state that lives
// in GPU memory (partial offload), with exactly the semantics of the CPU Adam
// (optim/cpu_adam.h): one pass reads the gradient (f32/f16/bf16), applies the
// gradient multiplier, updates the fp32 master weights and the moments (f32
// or bf16), writes an optional parameter copy (f32/f16/bf16) and counts
// non-finite gradient values.
//
// Internal to optim/: callers use GpuAdamStep (optim/gpu_adam.h), which
// validates the shard and derives the coefficients. This header is plain C++
// (no CUDA types): streams are `void*` (cudaStream_t). The kernel is in
// optim/cuda/adam.cu; a build without CUDA gets optim/gpu_adam_launch.cc,
// whose launcher returns Unavailable.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "base/status.h"
#include "optim/adam_coefficients.h"

namespace strata::optim {

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

}  // namespace strata::optim
