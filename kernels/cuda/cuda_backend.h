// The CUDA backend's options and its per-op timer, for tests, benchmarks and
// the engine. Plain C++ (no CUDA headers): usable from code built without
// CUDA, where MakeCudaBackend returns Unavailable and the timer calls return
// FailedPrecondition.
//
// The backend itself implements kernels/backend.h: cuBLASLt GEMMs, one CUDA
// kernel file per op (kernels/cuda/ops.h lists them), all work on one
// non-blocking stream (native_stream()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tiers/status.h"

namespace strata::kernels {

enum class AttentionImpl : uint8_t {
  kAuto,    // flash where it applies (f16/bf16, head_dim % 8 == 0 and <= 128, sm_80+), else simple
  kSimple,  // batched GEMMs + fused causal softmax, T x T scores in the workspace
  kFlash,   // the fused kernels; InvalidArgument for a shape they do not cover
};

struct CudaBackendOptions {
  int device = 0;
  AttentionImpl attention = AttentionImpl::kAuto;
  bool tf32 = false;           // f32 GEMMs in TF32: faster, about 1e-3 relative error
  bool gemm_epilogues = true;  // fuse bias/GELU into cuBLASLt where it supports them
};

// MakeCudaBackend(int device) (backend.h) uses the defaults above, except that
// the environment variable STRATA_ATTENTION=simple|flash|auto picks the
// attention path (a switch for debugging without rebuilding).
Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options);

// ---- per-op timing (benchmarks) ------------------------------------------------
// While on, each op of a CUDA backend is bracketed by two CUDA events on its
// stream (a few microseconds of overhead per op; leave it off when timing a
// whole step). TakeOpTimings synchronizes, sums the times per op name in
// first-use order and clears the record.

struct OpTiming {
  std::string op;     // "layernorm_fwd", "attention_bwd", "gemm NN 16384x6144x2048 +bias", ...
  int64_t calls = 0;
  double ms = 0;      // total time of all calls
  double flops = 0;   // total floating-point operations (GEMMs and attention; else 0)
};

// FailedPrecondition when `backend` is not a CUDA backend.
Status SetOpTiming(Backend* backend, bool on);
Result<std::vector<OpTiming>> TakeOpTimings(Backend* backend);

}  // namespace strata::kernels
