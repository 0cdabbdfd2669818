// SPDX-License-Identifier: Apache-2.0
#include "models/head.h"

#include <algorithm>
#include <string>

#include "models/block_program.h"

namespace strata::models {

using kernels::Backend;
using kernels::GemmArgs;
using kernels::LayerNormArgs;

namespace {

constexpr size_t kScratchAlign = 256;
constexpr int64_t kLogitsBytes = int64_t{256} << 20;

struct HeadSlots {
  size_t norm, mean, rstd, logits, total;
};

HeadSlots Slots(int64_t d_model, int64_t padded_vocab, int64_t B, int64_t T, DType dt, int64_t chunk) {
  const size_t N = static_cast<size_t>(B * T), C = static_cast<size_t>(d_model);
  const size_t es = DTypeSize(dt), sb = StatBytes(dt);
  size_t end = 0;
  auto take = [&end](size_t bytes) {
    const size_t at = end;
    end = (end + bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    return at;
  };
  HeadSlots s{};
  s.norm = take(N * C * es);
  s.mean = take(N * sb);
  s.rstd = take(N * sb);
  s.logits = take(static_cast<size_t>(chunk) * static_cast<size_t>(padded_vocab) * es);
  s.total = end;
  return s;
}

int64_t DefaultRows(int64_t padded_vocab, int64_t batch, int64_t seq, DType dtype) {
  const int64_t N = batch * seq;
  const int64_t row_bytes = padded_vocab * static_cast<int64_t>(DTypeSize(dtype));
  const int64_t rows = std::max<int64_t>(1, kLogitsBytes / std::max<int64_t>(row_bytes, 1));
  if (rows >= N) return N;
  return rows >= 64 ? rows / 64 * 64 : rows;
}

}  // namespace

HeadProgram::HeadProgram(Backend* backend, const ModelSpec& spec, int64_t batch, int64_t seq, DType dtype)
    : backend_(backend),
      spec_(spec.head),
      token_offset_(spec.embedding.token_offset),
      C_(spec.d_model),
      V_(spec.vocab_size),
      Vp_(spec.padded_vocab),
      B_(batch),
      T_(seq),
      dtype_(dtype) {}

int64_t HeadProgram::DefaultChunkRows(const ModelSpec& spec, int64_t batch, int64_t seq, DType dtype) {
  return DefaultRows(spec.padded_vocab, batch, seq, dtype);
}

size_t HeadProgram::ScratchBytes(const ModelSpec& spec, int64_t batch, int64_t seq, DType dtype, int64_t chunk_rows) {
  if (chunk_rows <= 0) chunk_rows = DefaultChunkRows(spec, batch, seq, dtype);
  return Slots(spec.d_model, spec.padded_vocab, batch, seq, dtype, std::min(chunk_rows, batch * seq)).total;
}

Result<HeadProgram::Frame> HeadProgram::Prepare(const HeadArgs& a, bool backward) const {
  const char* op = backward ? "HeadForwardBackward" : "HeadForward";
  auto null = [&](const char* what) { return InvalidArgument(std::string(op) + ": `" + what + "` is null"); };
  if (!a.final_params) return null("final_params");
  if (!a.embedding_params) return null("embedding_params");
  if (!a.x) return null("x");
  if (!a.targets) return null("targets");
  if (!a.losses) return null("losses");
  if (backward) {
    if (!a.dx) return null("dx");
    if (!a.final_grads) return null("final_grads");
    if (!a.embedding_grads && spec_.tied) return null("embedding_grads");
    if (!IsFloating(a.grad_dtype))
      return InvalidArgument(std::string(op) + ": grad_dtype " + std::string(DTypeName(a.grad_dtype)) +
                             " is not a float type");
  }
  Frame f;
  f.chunk = std::min(B_ * T_, a.chunk_rows > 0 ? a.chunk_rows : DefaultRows(Vp_, B_, T_, dtype_));
  const HeadSlots p = Slots(C_, Vp_, B_, T_, dtype_, f.chunk);
  if (a.scratch_bytes < p.total)
    return InvalidArgument(std::string(op) + ": scratch of " + std::to_string(a.scratch_bytes) + " bytes, needs " +
                           std::to_string(p.total));
  if (p.total > 0 && a.scratch == nullptr) return InvalidArgument(std::string(op) + ": scratch is null");
  char* s = static_cast<char*>(a.scratch);
  f.norm = s + p.norm;
  f.mean = reinterpret_cast<float*>(s + p.mean);
  f.rstd = reinterpret_cast<float*>(s + p.rstd);
  f.logits = s + p.logits;
  f.wte = spec_.tied ? static_cast<const char*>(a.embedding_params) + token_offset_ * static_cast<int64_t>(DTypeSize(dtype_))
                     : static_cast<const char*>(a.final_params) + spec_.lm_head_offset * static_cast<int64_t>(DTypeSize(dtype_));
  return f;
}

Status HeadProgram::NormForward(const HeadArgs& a, const Frame& f) const {
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype_));
  const char* fin = static_cast<const char*>(a.final_params);
  if (spec_.norm == HeadSpec::Norm::kRmsNorm)
    return backend_->RmsNormForward(kernels::RmsNormArgs{B_ * T_, C_, dtype_, spec_.norm_eps}, f.norm, f.rstd, a.x,
                                    fin + spec_.norm_weight_offset * es);
  return backend_->LayerNormForward(LayerNormArgs{B_ * T_, C_, dtype_, spec_.norm_eps}, f.norm, f.mean, f.rstd, a.x,
                                    fin + spec_.norm_weight_offset * es, fin + spec_.norm_bias_offset * es);
}

Status HeadProgram::Logits(const Frame& f, const char* norm_rows, int64_t rows) const {
  GemmArgs g;
  g.trans_b = true;
  g.m = rows, g.n = Vp_, g.k = C_;
  g.a = norm_rows, g.lda = C_, g.b = f.wte, g.ldb = C_;
  g.c = f.logits, g.ldc = Vp_, g.ab_dtype = g.c_dtype = dtype_;
  return backend_->Gemm(g);
}

Status HeadProgram::ForwardBackward(const HeadArgs& a) const {
  ASSIGN_OR_RETURN(const Frame f, Prepare(a, true));
  Backend& be = *backend_;
  const int64_t N = B_ * T_, C = C_;
  const size_t es = DTypeSize(dtype_), gs = DTypeSize(a.grad_dtype), sb = StatBytes(dtype_);
  const char* fin = static_cast<const char*>(a.final_params);
  char* dfin = static_cast<char*>(a.final_grads);
  char* dwte = spec_.tied ? static_cast<char*>(a.embedding_grads) + token_offset_ * static_cast<int64_t>(gs)
                          : dfin + spec_.lm_head_offset * static_cast<int64_t>(gs);
  const int64_t w = spec_.norm_weight_offset, b = spec_.norm_bias_offset;

  RETURN_IF_ERROR(NormForward(a, f));
  for (int64_t r0 = 0; r0 < N; r0 += f.chunk) {
    const int64_t rows = std::min(f.chunk, N - r0);
    char* rows_norm = f.norm + static_cast<size_t>(r0 * C) * es;
    // logits = norm(x) @ wte^T                       [rows, Vp]
    RETURN_IF_ERROR(Logits(f, rows_norm, rows));
    // losses, and d logits in place
    RETURN_IF_ERROR(be.CrossEntropy(reinterpret_cast<float*>(reinterpret_cast<char*>(a.losses) + r0 * sb), f.logits,
                                    f.logits, a.targets + r0, rows, V_, Vp_, a.dloss, dtype_));
    // d wte (+)= d logits^T @ norm(x)                [Vp, C]
    GemmArgs g;
    g.trans_a = true;
    g.m = Vp_, g.n = C, g.k = rows;
    g.a = f.logits, g.lda = Vp_, g.b = rows_norm, g.ldb = C;
    g.c = dwte, g.ldc = C, g.ab_dtype = dtype_, g.c_dtype = a.grad_dtype;
    g.beta = (r0 == 0 && !a.accumulate) ? 0.f : 1.f;
    RETURN_IF_ERROR(be.Gemm(g));
    // d norm(x) = d logits @ wte, over this chunk's (now dead) rows of norm(x)
    g = GemmArgs{};
    g.m = rows, g.n = C, g.k = Vp_;
    g.a = f.logits, g.lda = Vp_, g.b = f.wte, g.ldb = C;
    g.c = rows_norm, g.ldc = C, g.ab_dtype = g.c_dtype = dtype_;
    RETURN_IF_ERROR(be.Gemm(g));
  }
  // d x = the final norm's backward (dx is overwritten: zero, then accumulated into)
  RETURN_IF_ERROR(be.Memset(a.dx, 0, static_cast<size_t>(N * C) * es));
  if (spec_.norm == HeadSpec::Norm::kRmsNorm)
    return be.RmsNormBackward(kernels::RmsNormArgs{N, C, dtype_, spec_.norm_eps}, a.dx,
                              dfin + w * static_cast<int64_t>(gs), a.grad_dtype, a.accumulate, f.norm, a.x,
                              fin + w * static_cast<int64_t>(es), f.rstd);
  return be.LayerNormBackward(LayerNormArgs{N, C, dtype_, spec_.norm_eps}, a.dx, dfin + w * static_cast<int64_t>(gs),
                              dfin + b * static_cast<int64_t>(gs), a.grad_dtype, a.accumulate, f.norm, a.x,
                              fin + w * static_cast<int64_t>(es), f.mean, f.rstd);
}

Status HeadProgram::Forward(const HeadArgs& a) const {
  ASSIGN_OR_RETURN(const Frame f, Prepare(a, false));
  const int64_t N = B_ * T_;
  const size_t es = DTypeSize(dtype_), sb = StatBytes(dtype_);
  RETURN_IF_ERROR(NormForward(a, f));
  for (int64_t r0 = 0; r0 < N; r0 += f.chunk) {
    const int64_t rows = std::min(f.chunk, N - r0);
    RETURN_IF_ERROR(Logits(f, f.norm + static_cast<size_t>(r0 * C_) * es, rows));
    RETURN_IF_ERROR(backend_->CrossEntropy(reinterpret_cast<float*>(reinterpret_cast<char*>(a.losses) + r0 * sb),
                                           nullptr, f.logits, a.targets + r0, rows, V_, Vp_, 1.f, dtype_));
  }
  return Status::OK();
}

}  // namespace strata::models
