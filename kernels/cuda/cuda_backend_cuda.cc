// SPDX-License-Identifier: Apache-2.0
// The CUDA backend: memory, the stream, argument checks, and dispatch of each
// op of kernels/backend.h to its launcher (kernels/cuda/ops.h) or to cuBLASLt
// (gemm.h). Optional per-op timing with CUDA events (cuda_backend.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "base/cuda_check.h"
#include "base/device.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"

namespace strata::kernels {
namespace {

using cuda::GemmRunner;

constexpr size_t kScratchBytes = 16u << 20;  // fp32 partials of the column reductions

bool IsStorageFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

Status CheckDType(const char* op, const char* arg, DType t) {
  if (IsStorageFloat(t)) return Status::OK();
  return InvalidArgument(std::string(op) + ": " + arg + " dtype " + std::string(DTypeName(t)) +
                         " is not supported (f32, f16, bf16)");
}
Status CheckNonNeg(const char* op, const char* arg, int64_t v) {
  if (v >= 0) return Status::OK();
  return InvalidArgument(std::string(op) + ": " + arg + " = " + std::to_string(v) + " is negative");
}
Status CheckPtr(const char* op, const char* arg, const void* p) {
  if (p) return Status::OK();
  return InvalidArgument(std::string(op) + ": " + arg + " is null");
}
Status CheckIntRange(const char* op, const char* arg, int64_t v) {
  if (v <= 0x7fffffff) return Status::OK();
  return InvalidArgument(std::string(op) + ": " + arg + " = " + std::to_string(v) +
                         " does not fit in 32 bits");
}
bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

std::string GemmName(const GemmArgs& g) {
  std::string s = std::string("gemm ") + (g.trans_a ? "T" : "N") + (g.trans_b ? "T" : "N") + " " +
                  std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k);
  if (g.batch > 1) s += " x" + std::to_string(g.batch);
  if (g.c_dtype != g.ab_dtype) s += " ->" + std::string(DTypeName(g.c_dtype));
  if (g.beta != 0.f) s += " +=";
  if (g.bias) s += " +bias";
  if (g.gelu) s += " +gelu";
  if (g.dgelu) s += " +dgelu";
  if (g.bias_grad) s += " +bgrad";
  return s;
}

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<Backend>> Make(const CudaBackendOptions& opts) {
    std::string variant = opts.flash_variant;
    if (variant.empty())
      if (const char* env = std::getenv("STRATA_FLASH_VARIANT")) variant = env;
    const FlashVariant* flash = variant.empty() ? nullptr : FindFlashVariant(variant);
    if (!variant.empty() && !flash)
      return InvalidArgument("flash attention variant '" + variant + "' (option or STRATA_FLASH_VARIANT): " +
                             "expected one of " + FlashVariantList());
    ASSIGN_OR_RETURN(GpuInfo info, QueryGpu(opts.device));
    if (!flash) {
      for (const FlashVariant& v : kFlashVariants)
        if (FlashVariantRuns(v, info.cc_major, info.cc_minor)) {
          flash = &v;
          break;
        }
      if (!flash) flash = FindFlashVariant("v2");
    }
    RETURN_IF_ERROR(CheckFlashVariantRuns(*flash, info, "flash attention variant (option or STRATA_FLASH_VARIANT)"));
    std::unique_ptr<CudaBackend> b(new CudaBackend(opts, info));
    b->flash_ = flash;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(opts.device));
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
    cuda::GemmOptions go;
    go.tf32 = opts.tf32;
    go.epilogues = opts.gemm_epilogues;
    go.tune = opts.gemm_tune;
    if (const char* e = std::getenv("STRATA_GEMM_TUNE"); e && *e) go.tune = *e != '0';
    ASSIGN_OR_RETURN(b->gemm_, GemmRunner::Make(b->stream_, go));
    CUDA_RETURN_IF_ERROR(cudaMalloc(&b->scratch_, kScratchBytes));
    return std::unique_ptr<Backend>(std::move(b));
  }

  ~CudaBackend() override {
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& p : pending_) {
      cudaEventDestroy(p.start);
      cudaEventDestroy(p.stop);
    }
    for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
    gemm_.reset();
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string name() const override { return name_; }

  // ---- memory -----------------------------------------------------------
  Result<DeviceBuffer> Allocate(size_t bytes) override {
    if (bytes == 0) return DeviceBuffer();
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      Status s = CudaStatus(err, "cudaMalloc", __FILE__, __LINE__);
      if (s.code() == StatusCode::kOutOfMemory) {
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        return OutOfMemory(TierKind::kGpu, bytes, free_b, "CUDA backend Allocate");
      }
      return s;
    }
    return DeviceBuffer(this, p, bytes);
  }
  void Free(void* p, size_t) override {
    if (p) cudaFree(p);  // synchronizes the device; errors are reported by later calls
  }
  Status Memset(void* dst, int value, size_t bytes) override {
    if (bytes == 0) return Status::OK();
    RETURN_IF_ERROR(CheckPtr("Memset", "dst", dst));
    OpScope scope(this, "memset");
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, value, bytes, stream_));
    return Status::OK();
  }
  Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes, cudaMemcpyHostToDevice, "CopyToDevice");
  }
  Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToHost, "CopyToHost");
  }
  Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return Status::OK();
    RETURN_IF_ERROR(CheckPtr("CopyDeviceToDevice", "dst", dst));
    RETURN_IF_ERROR(CheckPtr("CopyDeviceToDevice", "src", src));
    OpScope scope(this, "copy_d2d");
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return Status::OK();
  }
  Status Synchronize() override {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }
  void* native_stream() const override { return stream_; }

  // ---- ops ----------------------------------------------------------------
  Status Gemm(const GemmArgs& g) override {
    OpScope scope(this, timing_ ? GemmName(g) : std::string(),
                  2.0 * g.m * g.n * g.k * std::max(1, g.batch));
    return gemm_->Run(g);
  }
  bool GemmHasBackwardEpilogues() const override { return true; }

  Status LayerNormForward(const LayerNormArgs& a, void* y, float* mean, float* rstd,
                          const void* x, const void* weight, const void* bias) override {
    const char* op = "LayerNormForward";
    RETURN_IF_ERROR(CheckLayerNorm(op, a));
    if (a.rows > 0) {
      for (auto [n, p] : {std::pair{"y", static_cast<const void*>(y)}, std::pair{"mean", static_cast<const void*>(mean)},
                          std::pair{"rstd", static_cast<const void*>(rstd)}, std::pair{"x", x},
                          std::pair{"weight", weight}, std::pair{"bias", bias}})
        RETURN_IF_ERROR(CheckPtr(op, n, p));
    }
    OpScope scope(this, "layernorm_fwd");
    return cuda::LayerNormForward(stream_, a, y, mean, rstd, x, weight, bias);
  }

  Status LayerNormBackward(const LayerNormArgs& a, void* dx, void* dweight, void* dbias,
                           DType grad_dtype, bool accumulate, const void* dy, const void* x,
                           const void* weight, const float* mean, const float* rstd) override {
    const char* op = "LayerNormBackward";
    RETURN_IF_ERROR(CheckLayerNorm(op, a));
    RETURN_IF_ERROR(CheckDType(op, "grad", grad_dtype));
    RETURN_IF_ERROR(CheckPtr(op, "dweight", dweight));
    RETURN_IF_ERROR(CheckPtr(op, "dbias", dbias));
    if (a.rows > 0) {
      for (auto [n, p] : {std::pair{"dx", static_cast<const void*>(dx)}, std::pair{"dy", dy},
                          std::pair{"x", x}, std::pair{"weight", weight},
                          std::pair{"mean", static_cast<const void*>(mean)},
                          std::pair{"rstd", static_cast<const void*>(rstd)}})
        RETURN_IF_ERROR(CheckPtr(op, n, p));
    }
    OpScope scope(this, "layernorm_bwd");
    return cuda::LayerNormBackward(stream_, info_.sm_count, a, dx, dweight, dbias, grad_dtype, accumulate,
                                   dy, x, weight, mean, rstd, static_cast<float*>(scratch_),
                                   kScratchBytes);
  }

  Status RmsNormForward(const RmsNormArgs& a, void* y, float* rstd, const void* x, const void* weight) override {
    const char* op = "RmsNormForward";
    RETURN_IF_ERROR(CheckRmsNorm(op, a));
    if (a.rows > 0)
      for (auto [n, p] : {std::pair{"y", static_cast<const void*>(y)}, std::pair{"x", x}, std::pair{"weight", weight}})
        RETURN_IF_ERROR(CheckPtr(op, n, p));
    OpScope scope(this, "rmsnorm_fwd");
    return cuda::RmsNormForward(stream_, a, y, rstd, x, weight);
  }
  Status RmsNormBackward(const RmsNormArgs& a, void* dx, void* dweight, DType grad_dtype, bool accumulate,
                         const void* dy, const void* x, const void* weight, const float* rstd) override {
    const char* op = "RmsNormBackward";
    RETURN_IF_ERROR(CheckRmsNorm(op, a));
    RETURN_IF_ERROR(CheckDType(op, "grad", grad_dtype));
    RETURN_IF_ERROR(CheckPtr(op, "dweight", dweight));
    if (a.rows > 0)
      for (auto [n, p] : {std::pair{"dx", static_cast<const void*>(dx)}, std::pair{"dy", dy}, std::pair{"x", x},
                          std::pair{"weight", weight}, std::pair{"rstd", static_cast<const void*>(rstd)}})
        RETURN_IF_ERROR(CheckPtr(op, n, p));
    OpScope scope(this, "rmsnorm_bwd");
    return cuda::RmsNormBackward(stream_, info_.sm_count, a, dx, dweight, grad_dtype, accumulate, dy, x, weight, rstd,
                                 static_cast<float*>(scratch_), kScratchBytes);
  }
  Status RopeForward(const RopeArgs& a, void* out, const void* in) override {
    RETURN_IF_ERROR(CheckRope("RopeForward", a, out, in));
    OpScope scope(this, "rope_fwd");
    return cuda::RopeForward(stream_, a, out, in);
  }
  Status RopeBackward(const RopeArgs& a, void* dx, const void* dy) override {
    RETURN_IF_ERROR(CheckRope("RopeBackward", a, dx, dy));
    OpScope scope(this, "rope_bwd");
    return cuda::RopeBackward(stream_, a, dx, dy);
  }
  Status SwiGluForward(void* out, const void* in, int64_t rows, int64_t f, DType dtype) override {
    RETURN_IF_ERROR(CheckElementwise("SwiGluForward", rows * f, dtype, {{"out", out}, {"in", in}}));
    OpScope scope(this, "swiglu_fwd");
    return cuda::SwiGluForward(stream_, out, in, rows, f, dtype);
  }
  Status SwiGluBackward(void* din, const void* dout, const void* in, int64_t rows, int64_t f,
                        DType dtype) override {
    const char* op = "SwiGluBackward";
    RETURN_IF_ERROR(CheckElementwise(op, rows * f, dtype, {{"din", din}, {"dout", dout}, {"in", in}}));
    if (rows * f > 0 && din == dout) return InvalidArgument(std::string(op) + ": din must not alias dout");
    OpScope scope(this, "swiglu_bwd");
    return cuda::SwiGluBackward(stream_, din, dout, in, rows, f, dtype);
  }

  Status GeluForward(void* y, const void* x, int64_t n, DType dtype) override {
    RETURN_IF_ERROR(CheckElementwise("GeluForward", n, dtype, {{"y", y}, {"x", x}}));
    OpScope scope(this, "gelu_fwd");
    return cuda::GeluForward(stream_, y, x, n, dtype);
  }
  Status GeluBackward(void* dx, const void* x, const void* dy, int64_t n, DType dtype) override {
    RETURN_IF_ERROR(CheckElementwise("GeluBackward", n, dtype, {{"dx", dx}, {"x", x}, {"dy", dy}}));
    OpScope scope(this, "gelu_bwd");
    return cuda::GeluBackward(stream_, dx, x, dy, n, dtype);
  }
  Status Add(void* out, const void* a, const void* b, int64_t n, DType dtype) override {
    RETURN_IF_ERROR(CheckElementwise("Add", n, dtype, {{"out", out}, {"a", a}, {"b", b}}));
    OpScope scope(this, "add");
    return cuda::Add(stream_, out, a, b, n, dtype);
  }
  Status BiasBackward(void* dbias, DType grad_dtype, bool accumulate, const void* dy, int64_t m,
                      int64_t n, DType dtype) override {
    const char* op = "BiasBackward";
    RETURN_IF_ERROR(CheckNonNeg(op, "m", m));
    RETURN_IF_ERROR(CheckNonNeg(op, "n", n));
    RETURN_IF_ERROR(CheckDType(op, "dy", dtype));
    RETURN_IF_ERROR(CheckDType(op, "grad", grad_dtype));
    if (n > 0) RETURN_IF_ERROR(CheckPtr(op, "dbias", dbias));
    if (m > 0 && n > 0) RETURN_IF_ERROR(CheckPtr(op, "dy", dy));
    OpScope scope(this, "bias_bwd");
    return cuda::BiasBackward(stream_, info_.sm_count, dbias, grad_dtype, accumulate, dy, m, n, dtype,
                              static_cast<float*>(scratch_), kScratchBytes);
  }

  size_t AttentionWorkspaceBytes(const AttentionShape& s) const override {
    if (!CheckAttention("AttentionWorkspaceBytes", s).ok()) return 0;
    return UseFlash(s) ? cuda::FlashAttentionWorkspaceBytes(s, *flash_)
                       : cuda::SimpleAttentionWorkspaceBytes(s);
  }

  Status AttentionForward(const AttentionShape& s, void* out, float* lse, const void* qkv,
                          void* workspace) override {
    const char* op = "AttentionForward";
    RETURN_IF_ERROR(CheckAttention(op, s));
    if (s.batch * s.seq * s.heads == 0) return Status::OK();
    RETURN_IF_ERROR(CheckPtr(op, "out", out));
    RETURN_IF_ERROR(CheckPtr(op, "lse", lse));
    RETURN_IF_ERROR(CheckPtr(op, "qkv", qkv));
    const float scale = AttnScale(s);
    const double flops = 2.0 * s.batch * s.heads * s.seq * s.seq * s.head_dim;  // causal: half of 4BHT^2D
    if (UseFlash(s)) {
      RETURN_IF_ERROR(CheckFlashAligned(op, {{"out", out}, {"qkv", qkv}}));
      OpScope scope(this, timing_ ? std::string("attention_fwd (flash ") + flash_->name + ")" : std::string(), flops);
      return cuda::FlashAttentionForward(stream_, s, scale, out, lse, qkv, *flash_);
    }
    if (cuda::SimpleAttentionWorkspaceBytes(s) > 0) RETURN_IF_ERROR(CheckPtr(op, "workspace", workspace));
    OpScope scope(this, "attention_fwd (simple)", flops);
    return cuda::SimpleAttentionForward(stream_, *gemm_, s, scale, out, lse, qkv, workspace);
  }

  Status AttentionBackward(const AttentionShape& s, void* dqkv, const void* dout, const void* qkv,
                           const void* out, const float* lse, void* workspace) override {
    const char* op = "AttentionBackward";
    RETURN_IF_ERROR(CheckAttention(op, s));
    if (s.batch * s.seq * s.heads == 0) return Status::OK();
    for (auto [n, p] : {std::pair{"dqkv", static_cast<const void*>(dqkv)}, std::pair{"dout", dout},
                        std::pair{"qkv", qkv}, std::pair{"out", out},
                        std::pair{"lse", static_cast<const void*>(lse)}})
      RETURN_IF_ERROR(CheckPtr(op, n, p));
    const float scale = AttnScale(s);
    const double flops = 5.0 * s.batch * s.heads * s.seq * s.seq * s.head_dim;  // 2.5 x forward
    if (UseFlash(s)) {
      RETURN_IF_ERROR(CheckFlashAligned(op, {{"dqkv", dqkv}, {"dout", dout}, {"qkv", qkv}, {"out", out}}));
      RETURN_IF_ERROR(CheckPtr(op, "workspace", workspace));
      OpScope scope(this, timing_ ? std::string("attention_bwd (flash ") + flash_->name + ")" : std::string(), flops);
      return cuda::FlashAttentionBackward(stream_, s, scale, dqkv, dout, qkv, out, lse, workspace,
                                          *flash_);
    }
    RETURN_IF_ERROR(CheckPtr(op, "workspace", workspace));
    OpScope scope(this, "attention_bwd (simple)", flops);
    return cuda::SimpleAttentionBackward(stream_, *gemm_, s, scale, dqkv, dout, qkv, out, lse,
                                         workspace);
  }

  Status AttentionDecode(const DecodeAttentionShape& s, void* out, const void* qkv, void* k_cache,
                         void* v_cache) override {
    const char* op = "AttentionDecode";
    RETURN_IF_ERROR(CheckDecodeAttentionShape(s, op));
    RETURN_IF_ERROR(CheckDType(op, "dtype", s.dtype));
    if (s.batch * s.rows == 0) return Status::OK();
    for (auto [n, p] : {std::pair{"out", static_cast<const void*>(out)}, std::pair{"qkv", qkv},
                        std::pair{"k_cache", static_cast<const void*>(k_cache)},
                        std::pair{"v_cache", static_cast<const void*>(v_cache)}})
      RETURN_IF_ERROR(CheckPtr(op, n, p));
    const double flops = 4.0 * s.batch * s.heads * s.rows * (s.past + s.rows) * s.head_dim;
    OpScope scope(this, "attention_decode", flops);
    return cuda::AttentionDecode(stream_, s, out, qkv, k_cache, v_cache);
  }

  Status EmbeddingForward(void* out, const int32_t* tokens, const void* wte, const void* wpe,
                          int64_t B, int64_t T, int64_t C, DType dtype) override {
    const char* op = "EmbeddingForward";
    RETURN_IF_ERROR(CheckEmbedding(op, B, T, C, dtype));
    if (B * T * C > 0)
      for (auto [n, p] : {std::pair{"out", static_cast<const void*>(out)},
                          std::pair{"tokens", static_cast<const void*>(tokens)},
                          std::pair{"wte", wte}})
        RETURN_IF_ERROR(CheckPtr(op, n, p));
    OpScope scope(this, "embedding_fwd");
    return cuda::EmbeddingForward(stream_, out, tokens, wte, wpe, B, T, C, dtype);
  }

  Status EmbeddingBackward(void* dwte, void* dwpe, DType grad_dtype, const void* dout,
                           const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t Vp,
                           DType dtype) override {
    const char* op = "EmbeddingBackward";
    RETURN_IF_ERROR(CheckEmbedding(op, B, T, C, dtype));
    RETURN_IF_ERROR(CheckNonNeg(op, "Vp", Vp));
    RETURN_IF_ERROR(CheckDType(op, "grad", grad_dtype));
    if (B * T * C > 0)
      for (auto [n, p] : {std::pair{"dwte", static_cast<const void*>(dwte)},
                          std::pair{"dout", dout},
                          std::pair{"tokens", static_cast<const void*>(tokens)}})
        RETURN_IF_ERROR(CheckPtr(op, n, p));
    OpScope scope(this, "embedding_bwd");
    return cuda::EmbeddingBackward(stream_, dwte, dwpe, grad_dtype, dout, tokens, B, T, C, Vp,
                                   dtype);
  }

  Status CrossEntropy(float* losses, void* dlogits, const void* logits, const int32_t* targets,
                      int64_t N, int64_t V, int64_t Vp, float dloss, DType dtype) override {
    const char* op = "CrossEntropy";
    RETURN_IF_ERROR(CheckNonNeg(op, "N", N));
    RETURN_IF_ERROR(CheckDType(op, "logits", dtype));
    RETURN_IF_ERROR(CheckIntRange(op, "N", N));
    if (V <= 0 || V > Vp)
      return InvalidArgument("CrossEntropy: need 0 < V <= Vp, got V = " + std::to_string(V) +
                             ", Vp = " + std::to_string(Vp));
    if (N > 0)
      for (auto [n, p] : {std::pair{"losses", static_cast<const void*>(losses)},
                          std::pair{"logits", logits},
                          std::pair{"targets", static_cast<const void*>(targets)}})
        RETURN_IF_ERROR(CheckPtr(op, n, p));
    OpScope scope(this, dlogits ? "cross_entropy_fwd_bwd" : "cross_entropy_fwd");
    return cuda::CrossEntropy(stream_, losses, dlogits, logits, targets, N, V, Vp, dloss, dtype);
  }

  Status Cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) override {
    const char* op = "Cast";
    RETURN_IF_ERROR(CheckNonNeg(op, "n", n));
    RETURN_IF_ERROR(CheckDType(op, "dst", dst_dtype));
    RETURN_IF_ERROR(CheckDType(op, "src", src_dtype));
    if (n > 0) {
      RETURN_IF_ERROR(CheckPtr(op, "dst", dst));
      RETURN_IF_ERROR(CheckPtr(op, "src", src));
    }
    OpScope scope(this, "cast");
    return cuda::Cast(stream_, dst, dst_dtype, src, src_dtype, n);
  }

  Status Scale(void* x, DType dtype, int64_t n, float factor) override {
    RETURN_IF_ERROR(CheckElementwise("Scale", n, dtype, {{"x", x}}));
    OpScope scope(this, "scale");
    return cuda::Scale(stream_, x, dtype, n, factor);
  }

  Status GradStats(const void* x, DType dtype, int64_t n, float* sumsq,
                   int32_t* nonfinite) override {
    const char* op = "GradStats";
    RETURN_IF_ERROR(CheckElementwise(op, n, dtype, {{"x", x}}));
    RETURN_IF_ERROR(CheckPtr(op, "sumsq", sumsq));
    RETURN_IF_ERROR(CheckPtr(op, "nonfinite", nonfinite));
    OpScope scope(this, "grad_stats");
    return cuda::GradStats(stream_, x, dtype, n, sumsq, nonfinite, scratch_, kScratchBytes);
  }

  // ---- flash variant and timing ----------------------------------------------
  Status set_flash_variant(std::string_view name) {
    const FlashVariant* v = FindFlashVariant(name);
    if (!v)
      return InvalidArgument("SetFlashVariant: unknown variant '" + std::string(name) +
                             "': expected one of " + FlashVariantList());
    RETURN_IF_ERROR(CheckFlashVariantRuns(*v, info_, "SetFlashVariant"));
    flash_ = v;
    return Status::OK();
  }
  static Status CheckFlashVariantRuns(const FlashVariant& v, const GpuInfo& info, const char* what) {
    if (FlashVariantRuns(v, info.cc_major, info.cc_minor)) return Status::OK();
    return FailedPrecondition(std::string(what) + ": variant '" + v.name + "' needs " +
                              (cuda::FlashWgmmaBuilt() ? "" : "sm_90a code in the build (CMAKE_CUDA_ARCHITECTURES with 90a) and ") +
                              "a compute-capability 9.0 GPU; " + info.name + " is " + std::to_string(info.cc_major) +
                              "." + std::to_string(info.cc_minor));
  }
  static std::string FlashVariantList() {
    std::string s;
    for (const FlashVariant& v : kFlashVariants) s += (s.empty() ? "" : ", ") + std::string(v.name);
    return s;
  }
  void set_timing(bool on) { timing_ = on; }
  Result<std::vector<OpTiming>> TakeTimings() {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    std::vector<OpTiming> out;
    Status first;
    for (auto& p : pending_) {
      float ms = 0.f;
      cudaError_t err = cudaEventElapsedTime(&ms, p.start, p.stop);
      if (err != cudaSuccess && first.ok()) first = CudaStatus(err, "cudaEventElapsedTime", __FILE__, __LINE__);
      auto it = std::find_if(out.begin(), out.end(), [&](const OpTiming& t) { return t.op == p.op; });
      if (it == out.end()) {
        out.push_back(OpTiming{p.op, 0, 0.0, 0.0});
        it = out.end() - 1;
      }
      it->calls += 1;
      it->ms += ms;
      it->flops += p.flops;
      event_pool_.push_back(p.start);
      event_pool_.push_back(p.stop);
    }
    pending_.clear();
    RETURN_IF_ERROR(first);
    return out;
  }

 private:
  CudaBackend(const CudaBackendOptions& opts, const GpuInfo& info)
      : opts_(opts), info_(info),
        name_("cuda:" + std::to_string(opts.device) + " " + info.name) {}

  // Brackets one op with events while timing is on.
  class OpScope {
   public:
    OpScope(CudaBackend* b, std::string op, double flops = 0) : b_(b) {
      if (!b_->timing_) return;
      op_ = std::move(op);
      flops_ = flops;
      start_ = b_->TakeEvent();
      if (start_) cudaEventRecord(start_, b_->stream_);
    }
    ~OpScope() {
      if (!start_) return;
      cudaEvent_t stop = b_->TakeEvent();
      if (!stop) return;
      cudaEventRecord(stop, b_->stream_);
      b_->pending_.push_back({std::move(op_), start_, stop, flops_});
    }
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;

   private:
    CudaBackend* b_;
    std::string op_;
    double flops_ = 0;
    cudaEvent_t start_ = nullptr;
  };

  cudaEvent_t TakeEvent() {
    if (!event_pool_.empty()) {
      cudaEvent_t e = event_pool_.back();
      event_pool_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return e;
  }

  Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* op) {
    if (bytes == 0) return Status::OK();
    RETURN_IF_ERROR(CheckPtr(op, "dst", dst));
    RETURN_IF_ERROR(CheckPtr(op, "src", src));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  static Status CheckLayerNorm(const char* op, const LayerNormArgs& a) {
    RETURN_IF_ERROR(CheckNonNeg(op, "rows", a.rows));
    RETURN_IF_ERROR(CheckDType(op, "x", a.dtype));
    if (a.cols <= 0)
      return InvalidArgument(std::string(op) + ": cols = " + std::to_string(a.cols) + " must be > 0");
    RETURN_IF_ERROR(CheckIntRange(op, "cols", a.cols));
    if (!(a.eps >= 0.f)) return InvalidArgument(std::string(op) + ": eps must be >= 0");
    return Status::OK();
  }

  static Status CheckRmsNorm(const char* op, const RmsNormArgs& a) {
    RETURN_IF_ERROR(CheckNonNeg(op, "rows", a.rows));
    RETURN_IF_ERROR(CheckDType(op, "x", a.dtype));
    if (a.cols <= 0)
      return InvalidArgument(std::string(op) + ": cols = " + std::to_string(a.cols) + " must be > 0");
    RETURN_IF_ERROR(CheckIntRange(op, "cols", a.cols));
    if (!(a.eps >= 0.f)) return InvalidArgument(std::string(op) + ": eps must be >= 0");
    return Status::OK();
  }

  static Status CheckRope(const char* op, const RopeArgs& a, const void* out, const void* in) {
    RETURN_IF_ERROR(CheckNonNeg(op, "batch", a.batch));
    RETURN_IF_ERROR(CheckNonNeg(op, "seq", a.seq));
    RETURN_IF_ERROR(CheckNonNeg(op, "heads", a.heads));
    RETURN_IF_ERROR(CheckNonNeg(op, "position_offset", a.position_offset));
    RETURN_IF_ERROR(CheckDType(op, "dtype", a.dtype));
    if (a.head_dim <= 0 || a.head_dim % 2 != 0)
      return InvalidArgument(std::string(op) + ": head_dim = " + std::to_string(a.head_dim) + " must be even and > 0");
    if (a.heads * a.head_dim > a.width)
      return InvalidArgument(std::string(op) + ": heads * head_dim = " + std::to_string(a.heads * a.head_dim) +
                             " exceeds width = " + std::to_string(a.width));
    RETURN_IF_ERROR(CheckIntRange(op, "width", a.width));
    RETURN_IF_ERROR(CheckIntRange(op, "seq", a.seq));
    if (!(a.rope.theta > 0.f) || !(a.rope.factor > 0.f))
      return InvalidArgument(std::string(op) + ": rope theta and factor must be > 0");
    if (a.batch * a.seq > 0) {
      RETURN_IF_ERROR(CheckPtr(op, "out", out));
      RETURN_IF_ERROR(CheckPtr(op, "in", in));
    }
    return Status::OK();
  }

  static Status CheckElementwise(const char* op, int64_t n, DType dtype,
                                 std::initializer_list<std::pair<const char*, const void*>> ptrs) {
    RETURN_IF_ERROR(CheckNonNeg(op, "n", n));
    RETURN_IF_ERROR(CheckDType(op, "x", dtype));
    if (n > 0)
      for (auto [name, p] : ptrs) RETURN_IF_ERROR(CheckPtr(op, name, p));
    return Status::OK();
  }

  static Status CheckEmbedding(const char* op, int64_t B, int64_t T, int64_t C, DType dtype) {
    RETURN_IF_ERROR(CheckNonNeg(op, "B", B));
    RETURN_IF_ERROR(CheckNonNeg(op, "T", T));
    RETURN_IF_ERROR(CheckNonNeg(op, "C", C));
    RETURN_IF_ERROR(CheckIntRange(op, "C", C));
    return CheckDType(op, "dtype", dtype);
  }

  Status CheckAttention(const char* op, const AttentionShape& s) const {
    RETURN_IF_ERROR(CheckNonNeg(op, "batch", s.batch));
    RETURN_IF_ERROR(CheckNonNeg(op, "seq", s.seq));
    RETURN_IF_ERROR(CheckNonNeg(op, "heads", s.heads));
    RETURN_IF_ERROR(CheckDType(op, "dtype", s.dtype));
    if (s.head_dim <= 0)
      return InvalidArgument(std::string(op) + ": head_dim = " + std::to_string(s.head_dim) +
                             " must be > 0");
    RETURN_IF_ERROR(CheckIntRange(op, "seq", s.seq));
    RETURN_IF_ERROR(CheckIntRange(op, "heads * head_dim", s.heads * s.head_dim));
    if (s.kv_heads < 0 || (s.heads > 0 && s.heads % s.kv() != 0))
      return InvalidArgument(std::string(op) + ": kv_heads = " + std::to_string(s.kv_heads) +
                             " does not divide heads = " + std::to_string(s.heads));
    if (opts_.attention == AttentionImpl::kFlash && !cuda::FlashAttentionSupports(s, info_.cc_major))
      return InvalidArgument(std::string(op) +
                             ": the flash kernels need f16/bf16, head_dim % 8 == 0 and <= 128, "
                             "sm_80+ (got " + std::string(DTypeName(s.dtype)) + ", head_dim " +
                             std::to_string(s.head_dim) + ", sm_" + std::to_string(info_.cc_major) + "x)");
    return Status::OK();
  }

  static Status CheckFlashAligned(const char* op,
                                  std::initializer_list<std::pair<const char*, const void*>> ptrs) {
    for (auto [name, p] : ptrs)
      if (!Aligned16(p))
        return InvalidArgument(std::string(op) + ": " + name +
                               " must be 16-byte aligned for the flash attention kernels");
    return Status::OK();
  }

  bool UseFlash(const AttentionShape& s) const {
    return opts_.attention != AttentionImpl::kSimple && cuda::FlashAttentionSupports(s, info_.cc_major);
  }
  static float AttnScale(const AttentionShape& s) {
    return s.scale != 0.f ? s.scale : 1.f / std::sqrt(static_cast<float>(s.head_dim));
  }

  struct Pending {
    std::string op;
    cudaEvent_t start, stop;
    double flops;
  };

  CudaBackendOptions opts_;
  GpuInfo info_;
  const FlashVariant* flash_ = &kFlashVariants[0];  // never null; set by Make
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<GemmRunner> gemm_;
  void* scratch_ = nullptr;  // kScratchBytes, reused by ops in stream order
  bool timing_ = false;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> event_pool_;
};

}  // namespace

bool FlashVariantRuns(const FlashVariant& v, int cc_major, int cc_minor) {
  if (v.fwd == FlashFwdKernel::kWgmma || v.fwd == FlashFwdKernel::kTma ||
      v.fwd == FlashFwdKernel::kTmaPingpong || v.bwd == FlashBwdKernel::kWgmma || v.bwd == FlashBwdKernel::kTma)
    return cuda::FlashWgmmaRuns(cc_major, cc_minor);
  return cc_major >= 8;
}

Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  return CudaBackend::Make(options);
}

Result<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  CudaBackendOptions opts;
  opts.device = device;
  if (const char* env = std::getenv("STRATA_ATTENTION")) {
    std::string v = env;
    if (v == "simple")
      opts.attention = AttentionImpl::kSimple;
    else if (v == "flash")
      opts.attention = AttentionImpl::kFlash;
    else if (v != "auto" && !v.empty())
      return InvalidArgument("STRATA_ATTENTION=" + v + ": expected simple, flash or auto");
  }
  return CudaBackend::Make(opts);
}

Status SetFlashVariant(Backend* backend, std::string_view name) {
  auto* b = dynamic_cast<CudaBackend*>(backend);
  if (!b) return FailedPrecondition("SetFlashVariant: not a CUDA backend");
  return b->set_flash_variant(name);
}

Status SetOpTiming(Backend* backend, bool on) {
  auto* b = dynamic_cast<CudaBackend*>(backend);
  if (!b) return FailedPrecondition("SetOpTiming: not a CUDA backend");
  b->set_timing(on);
  return Status::OK();
}

Result<std::vector<OpTiming>> TakeOpTimings(Backend* backend) {
  auto* b = dynamic_cast<CudaBackend*>(backend);
  if (!b) return FailedPrecondition("TakeOpTimings: not a CUDA backend");
  return b->TakeTimings();
}

}  // namespace strata::kernels
