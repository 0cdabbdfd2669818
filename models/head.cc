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

Status HeadProgram::Check(const HeadArgs& a, bool backward, int64_t* chunk) const {
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
    if (!a.embedding_grads) return null("embedding_grads");
    if (!IsFloating(a.grad_dtype))
      return InvalidArgument(std::string(op) + ": grad_dtype " + std::string(DTypeName(a.grad_dtype)) +
                             " is not a float type");
  }
  const int64_t N = B_ * T_;
  *chunk = std::min(N, a.chunk_rows > 0 ? a.chunk_rows : DefaultRows(Vp_, B_, T_, dtype_));
  const size_t need = Slots(C_, Vp_, B_, T_, dtype_, *chunk).total;
  if (a.scratch_bytes < need)
    return InvalidArgument(std::string(op) + ": scratch of " + std::to_string(a.scratch_bytes) + " bytes, needs " +
                           std::to_string(need));
  if (need > 0 && a.scratch == nullptr) return InvalidArgument(std::string(op) + ": scratch is null");
  return Status::OK();
}

Status HeadProgram::ForwardBackward(const HeadArgs& a) const {
  int64_t chunk = 0;
  RETURN_IF_ERROR(Check(a, true, &chunk));
  Backend& be = *backend_;
  const int64_t N = B_ * T_, C = C_;
  const HeadSlots p = Slots(C_, Vp_, B_, T_, dtype_, chunk);
  const size_t es = DTypeSize(dtype_), gs = DTypeSize(a.grad_dtype), sb = StatBytes(dtype_);
  const char* fin = static_cast<const char*>(a.final_params);
  const char* wte = static_cast<const char*>(a.embedding_params) + token_offset_ * static_cast<int64_t>(es);
  char* dwte = static_cast<char*>(a.embedding_grads) + token_offset_ * static_cast<int64_t>(gs);
  char* dfin = static_cast<char*>(a.final_grads);
  char* s = static_cast<char*>(a.scratch);
  char* norm = s + p.norm;  // [N, C]: norm(x), then d norm(x) chunk by chunk
  char* logits = s + p.logits;
  const LayerNormArgs ln{N, C, dtype_, spec_.norm_eps};
  const int64_t w = spec_.norm_weight_offset, b = spec_.norm_bias_offset;

  RETURN_IF_ERROR(be.LayerNormForward(ln, norm, reinterpret_cast<float*>(s + p.mean),
                                      reinterpret_cast<float*>(s + p.rstd), a.x, fin + w * static_cast<int64_t>(es),
                                      fin + b * static_cast<int64_t>(es)));
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    char* rows_norm = norm + static_cast<size_t>(r0 * C) * es;
    // logits = norm(x) @ wte^T                       [rows, Vp]
    GemmArgs g;
    g.trans_b = true;
    g.m = rows, g.n = Vp_, g.k = C;
    g.a = rows_norm, g.lda = C, g.b = wte, g.ldb = C;
    g.c = logits, g.ldc = Vp_, g.ab_dtype = g.c_dtype = dtype_;
    RETURN_IF_ERROR(be.Gemm(g));
    // losses, and d logits in place
    RETURN_IF_ERROR(be.CrossEntropy(reinterpret_cast<float*>(reinterpret_cast<char*>(a.losses) + r0 * sb), logits,
                                    logits, a.targets + r0, rows, V_, Vp_, a.dloss, dtype_));
    // d wte (+)= d logits^T @ norm(x)                [Vp, C]
    g = GemmArgs{};
    g.trans_a = true;
    g.m = Vp_, g.n = C, g.k = rows;
    g.a = logits, g.lda = Vp_, g.b = rows_norm, g.ldb = C;
    g.c = dwte, g.ldc = C, g.ab_dtype = dtype_, g.c_dtype = a.grad_dtype;
    g.beta = (r0 == 0 && !a.accumulate) ? 0.f : 1.f;
    RETURN_IF_ERROR(be.Gemm(g));
    // d norm(x) = d logits @ wte, over this chunk's (now dead) rows of norm(x)
    g = GemmArgs{};
    g.m = rows, g.n = C, g.k = Vp_;
    g.a = logits, g.lda = Vp_, g.b = wte, g.ldb = C;
    g.c = rows_norm, g.ldc = C, g.ab_dtype = g.c_dtype = dtype_;
    RETURN_IF_ERROR(be.Gemm(g));
  }
  // d x = the final norm's backward (dx is overwritten: zero, then accumulated into)
  RETURN_IF_ERROR(be.Memset(a.dx, 0, static_cast<size_t>(N * C) * es));
  return be.LayerNormBackward(ln, a.dx, dfin + w * static_cast<int64_t>(gs), dfin + b * static_cast<int64_t>(gs),
                              a.grad_dtype, a.accumulate, norm, a.x, fin + w * static_cast<int64_t>(es),
                              reinterpret_cast<const float*>(s + p.mean), reinterpret_cast<const float*>(s + p.rstd));
}

Status HeadProgram::Forward(const HeadArgs& a) const {
  int64_t chunk = 0;
  RETURN_IF_ERROR(Check(a, false, &chunk));
  Backend& be = *backend_;
  const int64_t N = B_ * T_, C = C_;
  const HeadSlots p = Slots(C_, Vp_, B_, T_, dtype_, chunk);
  const size_t es = DTypeSize(dtype_), sb = StatBytes(dtype_);
  const char* fin = static_cast<const char*>(a.final_params);
  const char* wte = static_cast<const char*>(a.embedding_params) + token_offset_ * static_cast<int64_t>(es);
  char* s = static_cast<char*>(a.scratch);
  char* norm = s + p.norm;
  char* logits = s + p.logits;
  const LayerNormArgs ln{N, C, dtype_, spec_.norm_eps};
  RETURN_IF_ERROR(be.LayerNormForward(ln, norm, reinterpret_cast<float*>(s + p.mean),
                                      reinterpret_cast<float*>(s + p.rstd), a.x,
                                      fin + spec_.norm_weight_offset * static_cast<int64_t>(es),
                                      fin + spec_.norm_bias_offset * static_cast<int64_t>(es)));
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    GemmArgs g;
    g.trans_b = true;
    g.m = rows, g.n = Vp_, g.k = C;
    g.a = norm + static_cast<size_t>(r0 * C) * es, g.lda = C, g.b = wte, g.ldb = C;
    g.c = logits, g.ldc = Vp_, g.ab_dtype = g.c_dtype = dtype_;
    RETURN_IF_ERROR(be.Gemm(g));
    RETURN_IF_ERROR(be.CrossEntropy(reinterpret_cast<float*>(reinterpret_cast<char*>(a.losses) + r0 * sb), nullptr,
                                    logits, a.targets + r0, rows, V_, Vp_, 1.f, dtype_));
  }
  return Status::OK();
}

}  // namespace strata::models
