// SPDX-License-Identifier: Apache-2.0
// The CPU backend: every op of kernels/backend.h on host memory, with Eigen
// GEMMs (kernels/cpu/gemm_kernel.h) and oneTBB parallel loops, fp32 math on
// f32/f16/bf16 storage and fp64 math on f64 storage. It is the reference the
// CUDA backend is tested against, and the backend of machines without a GPU.
//
// One op per file (kernels/cpu/<op>.cc); this header declares them all.
//
// f64 (this backend only): with dtype kF64 every buffer the interface types
// as float* (LayerNorm mean/rstd, attention lse, cross-entropy losses,
// GradStats sumsq) holds doubles instead — 8 bytes per element, passed
// through the float* parameter.
//
// Threads: ops run in a oneTBB task_arena of `threads` threads; results do
// not depend on the thread count (see common.h). Host temporaries (fp32
// panels of f16/bf16 data) are allocated per call; running out of host memory
// gives OutOfMemory, never an exception.
//
// Thread-safety: like every Backend, used by one thread at a time.
#pragma once

#include <memory>
#include <string>

#include <oneapi/tbb/task_arena.h>

#include "kernels/backend.h"

namespace strata::kernels::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads);
  ~CpuBackend() override;

  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string name() const override;
  int threads() const { return threads_; }

  Result<DeviceBuffer> Allocate(size_t bytes) override;
  void Free(void* p, size_t bytes) override;
  Status Memset(void* dst, int value, size_t bytes) override;
  Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes) override;
  Status Synchronize() override { return Status::OK(); }
  void* native_stream() const override { return nullptr; }

  Status Gemm(const GemmArgs& g) override;
  bool GemmHasBackwardEpilogues() const override { return true; }
  Status LayerNormForward(const LayerNormArgs& a, void* y, float* mean, float* rstd, const void* x,
                          const void* weight, const void* bias) override;
  Status LayerNormBackward(const LayerNormArgs& a, void* dx, void* dweight, void* dbias,
                           DType grad_dtype, bool accumulate, const void* dy, const void* x,
                           const void* weight, const float* mean, const float* rstd) override;
  Status RmsNormForward(const RmsNormArgs& a, void* y, float* rstd, const void* x, const void* weight) override;
  Status RmsNormBackward(const RmsNormArgs& a, void* dx, void* dweight, DType grad_dtype, bool accumulate,
                         const void* dy, const void* x, const void* weight, const float* rstd) override;
  Status RopeForward(const RopeArgs& a, void* out, const void* in) override;
  Status RopeBackward(const RopeArgs& a, void* dx, const void* dy) override;
  Status SwiGluForward(void* out, const void* in, int64_t rows, int64_t f, DType dtype) override;
  Status SwiGluBackward(void* din, const void* dout, const void* in, int64_t rows, int64_t f,
                        DType dtype) override;
  Status GeluForward(void* y, const void* x, int64_t n, DType dtype) override;
  Status GeluBackward(void* dx, const void* x, const void* dy, int64_t n, DType dtype) override;
  Status Add(void* out, const void* a, const void* b, int64_t n, DType dtype) override;
  Status BiasBackward(void* dbias, DType grad_dtype, bool accumulate, const void* dy, int64_t m,
                      int64_t n, DType dtype) override;
  size_t AttentionWorkspaceBytes(const AttentionShape& s) const override { return 0; }
  Status AttentionForward(const AttentionShape& s, void* out, float* lse, const void* qkv,
                          void* workspace) override;
  Status AttentionBackward(const AttentionShape& s, void* dqkv, const void* dout, const void* qkv,
                           const void* out, const float* lse, void* workspace) override;
  Status AttentionDecode(const DecodeAttentionShape& s, void* out, const void* qkv, void* k_cache,
                         void* v_cache) override;
  Status EmbeddingForward(void* out, const int32_t* tokens, const void* wte, const void* wpe,
                          int64_t B, int64_t T, int64_t C, DType dtype) override;
  Status EmbeddingBackward(void* dwte, void* dwpe, DType grad_dtype, const void* dout,
                           const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t Vp,
                           DType dtype) override;
  Status CrossEntropy(float* losses, void* dlogits, const void* logits, const int32_t* targets,
                      int64_t N, int64_t V, int64_t Vp, float dloss, DType dtype) override;
  Status Cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) override;
  Status Scale(void* x, DType dtype, int64_t n, float factor) override;
  Status GradStats(const void* x, DType dtype, int64_t n, float* sumsq,
                   int32_t* nonfinite) override;

  // Runs `body` (returning Status) inside this backend's task arena, turning
  // std::bad_alloc into OutOfMemory and any other exception into Internal,
  // both naming `op`.
  template <class Body>
  Status Run(const char* op, Body&& body);

 private:
  Status RunImpl(const char* op, void* ctx, Status (*fn)(void*));

  int threads_;
  std::unique_ptr<tbb::task_arena> arena_;
};

template <class Body>
Status CpuBackend::Run(const char* op, Body&& body) {
  return RunImpl(op, &body, [](void* ctx) -> Status { return (*static_cast<Body*>(ctx))(); });
}

}  // namespace strata::kernels::cpu
