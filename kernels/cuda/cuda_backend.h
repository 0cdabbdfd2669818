// SPDX-License-Identifier: Apache-2.0
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
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kernels/backend.h"

namespace strata::kernels {

enum class AttentionImpl : uint8_t {
  kAuto,    // flash where it applies (f16/bf16, head_dim % 8 == 0 and <= 128, sm_80+), else simple
  kSimple,  // batched GEMMs + fused causal softmax, T x T scores in the workspace
  kFlash,   // the fused kernels; InvalidArgument for a shape they do not cover
};

// Kernel variants of the flash path (kernels/cuda/flash_attention.cu), to be
// measured against each other on the GPU. A variant is one forward kernel and
// one backward scheme; every variant computes the same function and is
// bitwise deterministic run to run (results differ between variants only by
// rounding).
enum class FlashFwdKernel : uint8_t {
  kBc32,  // 4 warps x 32 query rows, K/V tiles of 32 keys at D = 128 (64 at D <= 64)
  kBc64,  // 4 warps x 32 query rows, K/V tiles of 64 keys, exp2 of one FMA per score
  kWgmma,  // Hopper wgmma: 2 warpgroups x 64 query rows, K/V tiles of 128 keys
           // (sm_90a code on a compute-capability 9.0 GPU only)
  kTma,    // kWgmma's products, warp-specialized: a producer warpgroup loads
           // with TMA, the 2 consumer warpgroups only compute (head_dim 64 or
           // 128; other shapes run kWgmma)
  kTmaPingpong,  // kTma with the consumer warpgroups taking turns at the tensor cores
};
enum class FlashBwdKernel : uint8_t {
  kTwoPass,  // dK/dV pass (64 keys, 16 per warp) + dQ pass, both recompute P: 7 matmuls
  kDsBuffer,  // dK/dV pass in FlashAttention-2's layout (8 warps, 128 keys, P and dS
              // through shared memory) writing dS (bf16/f16) to the workspace, then
              // dQ = dS K from it: 5 matmuls, workspace about B*H*T*T bytes
  kWgmma,  // kDsBuffer's scheme and workspace on Hopper wgmma: 2 warpgroups x 64 keys
           // per dK/dV block, 2 x 64 queries per dQ block (sm_90a on a 9.0 GPU only)
  kTma,    // kWgmma's products, warp-specialized: a producer warpgroup loads with
           // TMA, dS leaves through bulk stores (head_dim 64 or 128; other shapes
           // run kWgmma)
};
struct FlashVariant {
  const char* name;
  FlashFwdKernel fwd;
  FlashBwdKernel bwd;
  const char* summary;
};
// The default is the first entry that runs on the GPU (FlashVariantRuns):
// v6 on an H100/H200 built with sm_90a code, else v2. On an H100
// (strata-bench attention, 1.3B shape, one run) v6's backward ran at 1.52x
// v5pp's (407 vs 268 TFLOP/s; the same bits), and v5pp's forward, which v6
// keeps, at 1.6x v4's (458 vs 286; v5 without ping-pong 430). v2 measured
// fastest of the mma.sync variants on the H200 (fwd 269 vs 239 TFLOP/s, bwd
// 203 vs 173 for v1), at the cost of a dS workspace of about B*H*T*T bytes
// that the planner counts in the layer's scratch. v1 is the small-workspace
// fallback.
inline constexpr FlashVariant kFlashVariants[] = {
    {"v6", FlashFwdKernel::kTmaPingpong, FlashBwdKernel::kTma, "fwd as v5pp, bwd v4's products fed by a TMA producer warpgroup"},
    {"v5pp", FlashFwdKernel::kTmaPingpong, FlashBwdKernel::kWgmma, "v5 with ping-pong consumer warpgroups (sm_90a)"},
    {"v5", FlashFwdKernel::kTma, FlashBwdKernel::kWgmma, "fwd wgmma fed by a TMA producer warpgroup, bwd as v4"},
    {"v4", FlashFwdKernel::kWgmma, FlashBwdKernel::kWgmma, "fwd wgmma, bwd v2's scheme on wgmma (sm_90a)"},
    {"v3", FlashFwdKernel::kWgmma, FlashBwdKernel::kDsBuffer, "fwd wgmma (sm_90a), bwd as v2"},
    {"v2", FlashFwdKernel::kBc64, FlashBwdKernel::kDsBuffer, "fwd Bc 64 + FMA exp2, bwd FA2 dK/dV + dS buffer + dQ"},
    {"v1", FlashFwdKernel::kBc32, FlashBwdKernel::kTwoPass, "fwd Bc 32, bwd two passes (7 matmuls)"},
    {"fwd64", FlashFwdKernel::kBc64, FlashBwdKernel::kTwoPass, "fwd Bc 64 + FMA exp2, bwd two passes"},
    {"bwdds", FlashFwdKernel::kBc32, FlashBwdKernel::kDsBuffer, "fwd Bc 32, bwd FA2 dK/dV + dS buffer + dQ"},
};
// Whether `v` runs on a GPU of compute capability cc_major.cc_minor with
// this build (the wgmma kernels need sm_90a code and a 9.0 GPU).
bool FlashVariantRuns(const FlashVariant& v, int cc_major, int cc_minor);

// The variant called `name`, or nullptr.
inline const FlashVariant* FindFlashVariant(std::string_view name) {
  for (const FlashVariant& v : kFlashVariants)
    if (name == v.name) return &v;
  return nullptr;
}

struct CudaBackendOptions {
  int device = 0;
  AttentionImpl attention = AttentionImpl::kAuto;
  // One of kFlashVariants by name; empty: the environment variable
  // STRATA_FLASH_VARIANT (read once, when the backend is made), else the
  // default (the first of kFlashVariants that runs on the GPU). An unknown
  // name is InvalidArgument, one that cannot run on this GPU or build
  // FailedPrecondition, from MakeCudaBackend.
  std::string flash_variant;
  bool tf32 = false;           // f32 GEMMs in TF32: faster, about 1e-3 relative error
  bool gemm_epilogues = true;  // fuse bias/GELU into cuBLASLt where it supports them
  // Time cuBLASLt's candidate algorithms at a large GEMM's first call and keep
  // the fastest that gives the heuristic choice's bits (kernels/cuda/gemm.h,
  // GemmOptions::tune). STRATA_GEMM_TUNE=0/1 overrides.
  bool gemm_tune = true;
};

// MakeCudaBackend(int device) (backend.h) uses the defaults above, except that
// the environment variable STRATA_ATTENTION=simple|flash|auto picks the
// attention path (a switch for debugging without rebuilding).
Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options);

// Switches the flash kernels of a CUDA backend to the variant `name` (for
// benchmarks and tests that compare variants on one backend). Call
// AttentionWorkspaceBytes again afterwards: the workspace depends on the
// variant. InvalidArgument for an unknown name (listing the known ones),
// FailedPrecondition when `backend` is not a CUDA backend or the variant
// cannot run on its GPU (FlashVariantRuns).
Status SetFlashVariant(Backend* backend, std::string_view name);

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
