// The GPT-2 model against the Backend interface: config, layouts, HF names,
// the per-layer calls (GptLayers) and the resident model (GptModel).
#include "kernels/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "base/half.h"
#include "kernels/cpu/convert.h"

namespace strata::kernels {
namespace {

constexpr size_t kScratchAlign = 256;  // bytes: every scratch slot starts here
constexpr int64_t kHeadLogitsBytes = int64_t{256} << 20;

// Lays out scratch slots one after another, each kScratchAlign-aligned.
class Slots {
 public:
  size_t Take(size_t bytes) {
    const size_t at = end_;
    end_ = (end_ + bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    return at;
  }
  size_t total() const { return end_; }

 private:
  size_t end_ = 0;
};

std::string Str(int64_t v) { return std::to_string(v); }

// Byte offsets of the block's internals in its scratch. BlockForward fills all
// of them (x1 too); BlockBackward then reuses slots whose contents are dead:
// h for d h (then d pre) and later d att, ln2 for d ln2, pre for d qkv, ln1
// for d ln1.
struct BlockPlan {
  size_t ln1, mean1, rstd1, qkv, att, lse, x1, ln2, mean2, rstd2, pre, h, attn_ws, total;
};

BlockPlan PlanBlock(const Backend& backend, const GptConfig& c, int64_t B, int64_t T, DType dt) {
  const size_t N = static_cast<size_t>(B * T), C = static_cast<size_t>(c.n_embd);
  const size_t es = DTypeSize(dt), sb = StatBytes(dt);
  Slots slots;
  auto take = [&slots](size_t bytes) { return slots.Take(bytes); };
  BlockPlan p{};
  p.ln1 = take(N * C * es);                              // [N, C]
  p.mean1 = take(N * sb);                                // [N]
  p.rstd1 = take(N * sb);                                // [N]
  p.qkv = take(N * 3 * C * es);                          // [N, 3C]
  p.att = take(N * C * es);                              // [N, C]
  p.lse = take(N * static_cast<size_t>(c.n_head) * sb);  // [B, H, T]
  p.x1 = take(N * C * es);                               // [N, C] residual after attention
  p.ln2 = take(N * C * es);                              // [N, C]
  p.mean2 = take(N * sb);
  p.rstd2 = take(N * sb);
  p.pre = take(N * 4 * C * es);  // [N, 4C] pre-GELU
  p.h = take(N * 4 * C * es);    // [N, 4C] GELU output
  AttentionShape s{B, T, c.n_head, c.head_dim(), dt, 0.f};
  p.attn_ws = take(backend.AttentionWorkspaceBytes(s));
  p.total = slots.total();
  return p;
}

// Head scratch: ln_f output (then d ln_f out, chunk by chunk) [N, C], its
// statistics [N], one chunk of logits [chunk, Vp].
struct HeadPlan {
  size_t lnf, mean, rstd, logits, total;
};
HeadPlan PlanHead(const GptConfig& c, int64_t B, int64_t T, DType dt, int64_t chunk) {
  const size_t N = static_cast<size_t>(B * T), C = static_cast<size_t>(c.n_embd);
  const size_t es = DTypeSize(dt), sb = StatBytes(dt);
  Slots slots;
  auto take = [&slots](size_t bytes) { return slots.Take(bytes); };
  HeadPlan p{};
  p.lnf = take(N * C * es);
  p.mean = take(N * sb);
  p.rstd = take(N * sb);
  p.logits = take(static_cast<size_t>(chunk) * static_cast<size_t>(c.Vp()) * es);
  p.total = slots.total();
  return p;
}

// Host conversions (exact through double; RNE to the narrow types).
template <class F>
void VisitHost(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f(float{}); break;
    case DType::kF16: f(f16_t{}); break;
    case DType::kBF16: f(bf16_t{}); break;
    case DType::kF64: f(double{}); break;
    default: break;
  }
}
void HostToDouble(const void* src, DType t, double* dst, int64_t n) {
  VisitHost(t, [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = cpu::Load1<double>(s[i]);
  });
}
void DoubleToHost(const double* src, DType t, void* dst, int64_t n) {
  VisitHost(t, [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = cpu::Store1<T>(src[i]);
  });
}

}  // namespace

// ---- GptConfig ---------------------------------------------------------------

int64_t GptConfig::Vp() const {
  return padded_vocab_size > 0 ? padded_vocab_size : (vocab_size + 127) / 128 * 128;
}

Status GptConfig::Validate() const {
  auto bad = [](const std::string& what) { return InvalidArgument("GptConfig: " + what); };
  if (n_layer < 1) return bad("n_layer = " + Str(n_layer) + " must be >= 1");
  if (n_embd < 1) return bad("n_embd = " + Str(n_embd) + " must be >= 1");
  if (n_head < 1) return bad("n_head = " + Str(n_head) + " must be >= 1");
  if (n_embd % n_head != 0)
    return bad("n_embd = " + Str(n_embd) + " is not a multiple of n_head = " + Str(n_head));
  if (vocab_size < 1) return bad("vocab_size = " + Str(vocab_size) + " must be >= 1");
  if (padded_vocab_size != 0 && (padded_vocab_size % 128 != 0 || padded_vocab_size < vocab_size))
    return bad(
        "padded_vocab_size = " + Str(padded_vocab_size) +
        " must be 0 (automatic) or a multiple of 128 that is >= vocab_size = " + Str(vocab_size));
  if (seq_len < 1) return bad("seq_len = " + Str(seq_len) + " must be >= 1");
  if (!(ln_eps > 0.f) || !std::isfinite(ln_eps))
    return bad("ln_eps = " + std::to_string(ln_eps) + " must be finite and > 0");
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  if (n_embd > kMaxDim || Vp() > kMaxDim || seq_len > kMaxDim || n_layer > kMaxDim)
    return bad("a dimension exceeds 2^24");
  return Status::OK();
}

int64_t GptConfig::NumParameters() const {
  const int64_t C = n_embd;
  return vocab_size * C + seq_len * C + n_layer * (12 * C * C + 13 * C) + 2 * C;
}

std::vector<HfTensorInfo> HfTensors(const GptConfig& c) {
  const int64_t C = c.n_embd;
  std::vector<HfTensorInfo> out;
  auto add = [&](std::string name, GptBuffer buf, int layer, int64_t offset,
                 std::vector<int64_t> shape) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    out.push_back(HfTensorInfo{std::move(name), buf, layer, offset, std::move(shape), numel});
  };
  const EmbeddingLayout e = EmbeddingLayout::For(c.Vp(), c.seq_len, C);
  add("transformer.wte.weight", GptBuffer::kEmbedding, -1, e.wte, {c.vocab_size, C});
  add("transformer.wpe.weight", GptBuffer::kEmbedding, -1, e.wpe, {c.seq_len, C});
  const BlockLayout b = BlockLayout::For(C);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    add(p + "ln_1.weight", GptBuffer::kBlock, l, b.ln1_w, {C});
    add(p + "ln_1.bias", GptBuffer::kBlock, l, b.ln1_b, {C});
    add(p + "attn.c_attn.weight", GptBuffer::kBlock, l, b.attn_w, {C, 3 * C});
    add(p + "attn.c_attn.bias", GptBuffer::kBlock, l, b.attn_b, {3 * C});
    add(p + "attn.c_proj.weight", GptBuffer::kBlock, l, b.proj_w, {C, C});
    add(p + "attn.c_proj.bias", GptBuffer::kBlock, l, b.proj_b, {C});
    add(p + "ln_2.weight", GptBuffer::kBlock, l, b.ln2_w, {C});
    add(p + "ln_2.bias", GptBuffer::kBlock, l, b.ln2_b, {C});
    add(p + "mlp.c_fc.weight", GptBuffer::kBlock, l, b.fc_w, {C, 4 * C});
    add(p + "mlp.c_fc.bias", GptBuffer::kBlock, l, b.fc_b, {4 * C});
    add(p + "mlp.c_proj.weight", GptBuffer::kBlock, l, b.fcproj_w, {4 * C, C});
    add(p + "mlp.c_proj.bias", GptBuffer::kBlock, l, b.fcproj_b, {C});
  }
  const LnFLayout f = LnFLayout::For(C);
  add("transformer.ln_f.weight", GptBuffer::kLnF, -1, f.w, {C});
  add("transformer.ln_f.bias", GptBuffer::kLnF, -1, f.b, {C});
  return out;
}

// ---- GptLayers ---------------------------------------------------------------

Result<GptLayers> GptLayers::Make(Backend* backend, const GptConfig& config, int64_t batch,
                                  int64_t seq, DType dtype, const Options& options) {
  if (backend == nullptr) return InvalidArgument("GptLayers: backend is null");
  RETURN_IF_ERROR(config.Validate());
  if (batch < 1) return InvalidArgument("GptLayers: batch = " + Str(batch) + " must be >= 1");
  if (seq < 1 || seq > config.seq_len)
    return InvalidArgument("GptLayers: seq = " + Str(seq) +
                           " must be in [1, seq_len = " + Str(config.seq_len) + "]");
  if (!IsFloating(dtype))
    return InvalidArgument("GptLayers: dtype " + std::string(DTypeName(dtype)) +
                           " is not a float type");
  GptLayers l;
  l.backend_ = backend;
  l.config_ = config;
  l.B_ = batch;
  l.T_ = seq;
  l.dtype_ = dtype;
  l.block_scratch_bytes_ = BlockScratchBytes(*backend, config, batch, seq, dtype);
  l.fused_ = options.fused_epilogues && backend->GemmHasBackwardEpilogues();
  l.fused_dgelu_ = l.fused_ && options.fused_dgelu;
  return l;
}

size_t GptLayers::BlockScratchBytes(const Backend& backend, const GptConfig& config, int64_t batch,
                                    int64_t seq, DType dtype) {
  return PlanBlock(backend, config, batch, seq, dtype).total;
}

int64_t GptLayers::DefaultHeadChunkRows(const GptConfig& config, int64_t batch, int64_t seq,
                                        DType dtype) {
  const int64_t N = batch * seq;
  const int64_t row_bytes = config.Vp() * static_cast<int64_t>(DTypeSize(dtype));
  int64_t rows = std::max<int64_t>(1, kHeadLogitsBytes / std::max<int64_t>(row_bytes, 1));
  if (rows >= N) return N;
  return rows >= 64 ? rows / 64 * 64 : rows;
}

size_t GptLayers::HeadScratchBytes(const GptConfig& config, int64_t batch, int64_t seq, DType dtype,
                                   int64_t chunk_rows) {
  if (chunk_rows <= 0) chunk_rows = DefaultHeadChunkRows(config, batch, seq, dtype);
  return PlanHead(config, batch, seq, dtype, std::min(chunk_rows, batch * seq)).total;
}

size_t GptLayers::head_scratch_bytes(int64_t chunk_rows) const {
  return HeadScratchBytes(config_, B_, T_, dtype_, chunk_rows);
}

Status GptLayers::CheckScratch(const char* op, const void* scratch, size_t bytes,
                               size_t need) const {
  if (bytes < need)
    return InvalidArgument(std::string(op) + ": scratch of " + std::to_string(bytes) +
                           " bytes, needs " + std::to_string(need));
  if (need > 0 && scratch == nullptr) return InvalidArgument(std::string(op) + ": scratch is null");
  return Status::OK();
}

// Everything the block computes from x_in, into the scratch slots (x1 too;
// the GELU pre-activation only when `gelu_aux`).
Status GptLayers::Recompute(const void* params, const void* x_in, char* s, bool gelu_aux) const {
  Backend& be = *backend_;
  const GptConfig& c = config_;
  const int64_t N = B_ * T_, C = c.n_embd;
  const size_t es = DTypeSize(dtype_);
  const BlockPlan p = PlanBlock(be, c, B_, T_, dtype_);
  const BlockLayout L = BlockLayout::For(C);
  const char* w = static_cast<const char*>(params);
  auto W = [&](int64_t off) { return static_cast<const void*>(w + off * es); };
  const LayerNormArgs ln{N, C, dtype_, c.ln_eps};

  // ln1 = LN(x_in)
  RETURN_IF_ERROR(be.LayerNormForward(ln, s + p.ln1, reinterpret_cast<float*>(s + p.mean1),
                                      reinterpret_cast<float*>(s + p.rstd1), x_in, W(L.ln1_w),
                                      W(L.ln1_b)));
  // qkv = ln1 @ W_attn + b_attn                      [N, 3C]
  GemmArgs g;
  g.ab_dtype = g.c_dtype = dtype_;
  g.m = N, g.n = 3 * C, g.k = C;
  g.a = s + p.ln1, g.lda = C, g.b = W(L.attn_w), g.ldb = 3 * C;
  g.c = s + p.qkv, g.ldc = 3 * C, g.bias = W(L.attn_b);
  RETURN_IF_ERROR(be.Gemm(g));
  // att = causal attention(qkv)                      [N, C]
  const AttentionShape as{B_, T_, c.n_head, c.head_dim(), dtype_, 0.f};
  RETURN_IF_ERROR(be.AttentionForward(as, s + p.att, reinterpret_cast<float*>(s + p.lse), s + p.qkv,
                                      s + p.attn_ws));
  // x1 = x_in + att @ W_proj + b_proj                [N, C]
  // (the residual read by the GEMM itself, or copied into x1 first)
  if (!fused_)
    RETURN_IF_ERROR(be.CopyDeviceToDevice(s + p.x1, x_in, static_cast<size_t>(N * C) * es));
  g = GemmArgs{};
  g.ab_dtype = g.c_dtype = dtype_;
  g.m = N, g.n = C, g.k = C;
  g.a = s + p.att, g.lda = C, g.b = W(L.proj_w), g.ldb = C;
  g.c = s + p.x1, g.ldc = C, g.beta = 1.f, g.bias = W(L.proj_b);
  if (fused_) g.c_in = x_in;
  RETURN_IF_ERROR(be.Gemm(g));
  // ln2 = LN(x1)
  RETURN_IF_ERROR(be.LayerNormForward(ln, s + p.ln2, reinterpret_cast<float*>(s + p.mean2),
                                      reinterpret_cast<float*>(s + p.rstd2), s + p.x1, W(L.ln2_w),
                                      W(L.ln2_b)));
  // h = gelu(pre), pre = ln2 @ W_fc + b_fc           [N, 4C]
  g = GemmArgs{};
  g.ab_dtype = g.c_dtype = dtype_;
  g.m = N, g.n = 4 * C, g.k = C;
  g.a = s + p.ln2, g.lda = C, g.b = W(L.fc_w), g.ldb = 4 * C;
  g.c = s + p.h, g.ldc = 4 * C, g.bias = W(L.fc_b), g.gelu = true;
  if (gelu_aux) g.gelu_aux = s + p.pre;
  return be.Gemm(g);
}

Status GptLayers::BlockForward(const void* params, const void* x_in, void* x_out, void* scratch,
                               size_t scratch_bytes, Internals internals) const {
  RETURN_IF_ERROR(CheckScratch("BlockForward", scratch, scratch_bytes, block_scratch_bytes_));
  if (x_out == x_in) return InvalidArgument("BlockForward: x_out must not alias x_in");
  char* s = static_cast<char*>(scratch);
  RETURN_IF_ERROR(Recompute(params, x_in, s, internals == Internals::kKept));
  const int64_t N = B_ * T_, C = config_.n_embd;
  const size_t es = DTypeSize(dtype_);
  const BlockPlan p = PlanBlock(*backend_, config_, B_, T_, dtype_);
  const BlockLayout L = BlockLayout::For(C);
  const char* w = static_cast<const char*>(params);
  // x_out = x1 + h @ W_fcproj + b_fcproj             [N, C]
  if (!fused_)
    RETURN_IF_ERROR(
        backend_->CopyDeviceToDevice(x_out, s + p.x1, static_cast<size_t>(N * C) * es));
  GemmArgs g;
  g.ab_dtype = g.c_dtype = dtype_;
  g.m = N, g.n = C, g.k = 4 * C;
  g.a = s + p.h, g.lda = 4 * C, g.b = w + L.fcproj_w * es, g.ldb = C;
  g.c = x_out, g.ldc = C, g.beta = 1.f, g.bias = w + L.fcproj_b * es;
  if (fused_) g.c_in = s + p.x1;
  return backend_->Gemm(g);
}

Status GptLayers::BlockBackward(const void* params, const void* x_in, const void* d_out, void* d_in,
                                void* grads, DType grad_dtype, bool accumulate, void* scratch,
                                size_t scratch_bytes, Internals internals) const {
  RETURN_IF_ERROR(CheckScratch("BlockBackward", scratch, scratch_bytes, block_scratch_bytes_));
  if (d_in == x_in) return InvalidArgument("BlockBackward: d_in must not alias x_in");
  if (!IsFloating(grad_dtype))
    return InvalidArgument("BlockBackward: grad_dtype " + std::string(DTypeName(grad_dtype)) +
                           " is not a float type");
  char* s = static_cast<char*>(scratch);
  if (internals == Internals::kNotKept) RETURN_IF_ERROR(Recompute(params, x_in, s, true));
  Backend& be = *backend_;
  const GptConfig& c = config_;
  const int64_t N = B_ * T_, C = c.n_embd;
  const size_t es = DTypeSize(dtype_), gs = DTypeSize(grad_dtype);
  const BlockPlan p = PlanBlock(be, c, B_, T_, dtype_);
  const BlockLayout L = BlockLayout::For(C);
  const char* w = static_cast<const char*>(params);
  char* gr = static_cast<char*>(grads);
  auto W = [&](int64_t off) { return static_cast<const void*>(w + off * es); };
  auto G = [&](int64_t off) { return static_cast<void*>(gr + off * gs); };
  const float beta = accumulate ? 1.f : 0.f;
  const LayerNormArgs ln{N, C, dtype_, c.ln_eps};

  // Weight gradient dW (+)= act^T @ d, [k_in, n_out].
  auto weight_grad = [&](const void* act, int64_t k_in, const void* d, int64_t n_out,
                         int64_t w_off) {
    GemmArgs g;
    g.trans_a = true;
    g.m = k_in, g.n = n_out, g.k = N;
    g.a = act, g.lda = k_in, g.b = d, g.ldb = n_out;
    g.c = G(w_off), g.ldc = n_out;
    g.ab_dtype = dtype_, g.c_dtype = grad_dtype, g.beta = beta;
    return be.Gemm(g);
  };
  // Input gradient out = d @ W^T, W [k_in, n_out] -> out [N, k_in].
  auto input_grad = [&](const void* d, int64_t n_out, int64_t w_off, int64_t k_in, void* out) {
    GemmArgs g;
    g.trans_b = true;
    g.m = N, g.n = k_in, g.k = n_out;
    g.a = d, g.lda = n_out, g.b = W(w_off), g.ldb = n_out;
    g.c = out, g.ldc = k_in;
    g.ab_dtype = g.c_dtype = dtype_;
    return be.Gemm(g);
  };

  // MLP: x_out = x1 + h @ W_fcproj + b_fcproj
  RETURN_IF_ERROR(weight_grad(s + p.h, 4 * C, d_out, C, L.fcproj_w));
  RETURN_IF_ERROR(be.BiasBackward(G(L.fcproj_b), grad_dtype, accumulate, d_out, N, C, dtype_));
  void* dh = s + p.h;  // h is dead from here: d h, then d pre in place
  if (fused_dgelu_) {
    // d pre = (d_out @ W_fcproj^T) * gelu'(pre) and d b_fc = its column sums,
    // in the GEMM's epilogue.
    GemmArgs g;
    g.trans_b = true;
    g.m = N, g.n = 4 * C, g.k = C;
    g.a = d_out, g.lda = C, g.b = W(L.fcproj_w), g.ldb = C;
    g.c = dh, g.ldc = 4 * C;
    g.ab_dtype = g.c_dtype = dtype_;
    g.dgelu = true, g.gelu_aux = s + p.pre;
    g.bias_grad = G(L.fc_b), g.bias_grad_dtype = grad_dtype, g.bias_grad_accumulate = accumulate;
    RETURN_IF_ERROR(be.Gemm(g));
  } else {
    RETURN_IF_ERROR(input_grad(d_out, C, L.fcproj_w, 4 * C, dh));
    RETURN_IF_ERROR(be.GeluBackward(dh, s + p.pre, dh, N * 4 * C, dtype_));
    RETURN_IF_ERROR(be.BiasBackward(G(L.fc_b), grad_dtype, accumulate, dh, N, 4 * C, dtype_));
  }
  RETURN_IF_ERROR(weight_grad(s + p.ln2, C, dh, 4 * C, L.fc_w));
  void* dln2 = s + p.ln2;  // ln2 is dead from here
  RETURN_IF_ERROR(input_grad(dh, 4 * C, L.fc_w, C, dln2));
  // d x1 = d_out + LN2 backward (into d_in)
  if (d_in != d_out)
    RETURN_IF_ERROR(be.CopyDeviceToDevice(d_in, d_out, static_cast<size_t>(N * C) * es));
  RETURN_IF_ERROR(be.LayerNormBackward(
      ln, d_in, G(L.ln2_w), G(L.ln2_b), grad_dtype, accumulate, dln2, s + p.x1, W(L.ln2_w),
      reinterpret_cast<const float*>(s + p.mean2), reinterpret_cast<const float*>(s + p.rstd2)));
  // Attention: x1 = x_in + att @ W_proj + b_proj
  RETURN_IF_ERROR(weight_grad(s + p.att, C, d_in, C, L.proj_w));
  RETURN_IF_ERROR(be.BiasBackward(G(L.proj_b), grad_dtype, accumulate, d_in, N, C, dtype_));
  void* datt = s + p.h;    // [N, C] in the dead h slot
  void* dqkv = s + p.pre;  // [N, 3C] in the dead pre slot
  RETURN_IF_ERROR(input_grad(d_in, C, L.proj_w, C, datt));
  const AttentionShape as{B_, T_, c.n_head, c.head_dim(), dtype_, 0.f};
  RETURN_IF_ERROR(be.AttentionBackward(as, dqkv, datt, s + p.qkv, s + p.att,
                                       reinterpret_cast<const float*>(s + p.lse), s + p.attn_ws));
  RETURN_IF_ERROR(weight_grad(s + p.ln1, C, dqkv, 3 * C, L.attn_w));
  RETURN_IF_ERROR(be.BiasBackward(G(L.attn_b), grad_dtype, accumulate, dqkv, N, 3 * C, dtype_));
  void* dln1 = s + p.ln1;  // ln1 is dead from here
  RETURN_IF_ERROR(input_grad(dqkv, 3 * C, L.attn_w, C, dln1));
  // d x_in = d x1 + LN1 backward
  return be.LayerNormBackward(ln, d_in, G(L.ln1_w), G(L.ln1_b), grad_dtype, accumulate, dln1, x_in,
                              W(L.ln1_w), reinterpret_cast<const float*>(s + p.mean1),
                              reinterpret_cast<const float*>(s + p.rstd1));
}

Status GptLayers::EmbeddingForward(const void* emb_params, const int32_t* tokens, void* x) const {
  const EmbeddingLayout e = EmbeddingLayout::For(config_.Vp(), config_.seq_len, config_.n_embd);
  const char* p = static_cast<const char*>(emb_params);
  const size_t es = DTypeSize(dtype_);
  return backend_->EmbeddingForward(x, tokens, p + e.wte * es, p + e.wpe * es, B_, T_,
                                    config_.n_embd, dtype_);
}

Status GptLayers::EmbeddingBackward(void* emb_grads, DType grad_dtype, bool accumulate,
                                    const int32_t* tokens, const void* dx) const {
  const EmbeddingLayout e = EmbeddingLayout::For(config_.Vp(), config_.seq_len, config_.n_embd);
  char* g = static_cast<char*>(emb_grads);
  const size_t gs = DTypeSize(grad_dtype);
  if (!accumulate)
    RETURN_IF_ERROR(backend_->Memset(g + e.wpe * gs, 0,
                                     static_cast<size_t>(config_.seq_len * config_.n_embd) * gs));
  return backend_->EmbeddingBackward(g + e.wte * gs, g + e.wpe * gs, grad_dtype, dx, tokens, B_, T_,
                                     config_.n_embd, config_.Vp(), dtype_);
}

namespace {
Status CheckHeadArgs(const GptLayers::HeadArgs& a, bool backward) {
  const char* op = backward ? "HeadForwardBackward" : "HeadForward";
  auto null = [&](const char* what) {
    return InvalidArgument(std::string(op) + ": `" + what + "` is null");
  };
  if (!a.lnf_params) return null("lnf_params");
  if (!a.emb_params) return null("emb_params");
  if (!a.x) return null("x");
  if (!a.targets) return null("targets");
  if (!a.losses) return null("losses");
  if (backward) {
    if (!a.dx) return null("dx");
    if (!a.lnf_grads) return null("lnf_grads");
    if (!a.emb_grads) return null("emb_grads");
    if (!IsFloating(a.grad_dtype))
      return InvalidArgument(std::string(op) + ": grad_dtype " +
                             std::string(DTypeName(a.grad_dtype)) + " is not a float type");
  }
  return Status::OK();
}
}  // namespace

Status GptLayers::HeadForwardBackward(const HeadArgs& a) const {
  RETURN_IF_ERROR(CheckHeadArgs(a, true));
  Backend& be = *backend_;
  const GptConfig& c = config_;
  const int64_t N = B_ * T_, C = c.n_embd, V = c.vocab_size, Vp = c.Vp();
  const int64_t chunk =
      std::min(N, a.chunk_rows > 0 ? a.chunk_rows : DefaultHeadChunkRows(c, B_, T_, dtype_));
  const HeadPlan p = PlanHead(c, B_, T_, dtype_, chunk);
  RETURN_IF_ERROR(CheckScratch("HeadForwardBackward", a.scratch, a.scratch_bytes, p.total));
  const size_t es = DTypeSize(dtype_), gs = DTypeSize(a.grad_dtype), sb = StatBytes(dtype_);
  const EmbeddingLayout e = EmbeddingLayout::For(Vp, c.seq_len, C);
  const LnFLayout f = LnFLayout::For(C);
  const char* lnf = static_cast<const char*>(a.lnf_params);
  const char* wte = static_cast<const char*>(a.emb_params) + e.wte * es;
  char* dwte = static_cast<char*>(a.emb_grads) + e.wte * gs;
  char* dlnf = static_cast<char*>(a.lnf_grads);
  char* s = static_cast<char*>(a.scratch);
  char* lnf_out = s + p.lnf;  // [N, C]: ln_f(x), then d ln_f(x) chunk by chunk
  char* logits = s + p.logits;
  const LayerNormArgs ln{N, C, dtype_, c.ln_eps};

  RETURN_IF_ERROR(be.LayerNormForward(ln, lnf_out, reinterpret_cast<float*>(s + p.mean),
                                      reinterpret_cast<float*>(s + p.rstd), a.x, lnf + f.w * es,
                                      lnf + f.b * es));
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    char* rows_lnf = lnf_out + static_cast<size_t>(r0 * C) * es;
    // logits = ln_f(x) @ wte^T                       [rows, Vp]
    GemmArgs g;
    g.trans_b = true;
    g.m = rows, g.n = Vp, g.k = C;
    g.a = rows_lnf, g.lda = C, g.b = wte, g.ldb = C;
    g.c = logits, g.ldc = Vp, g.ab_dtype = g.c_dtype = dtype_;
    RETURN_IF_ERROR(be.Gemm(g));
    // losses, and d logits in place
    RETURN_IF_ERROR(
        be.CrossEntropy(reinterpret_cast<float*>(reinterpret_cast<char*>(a.losses) + r0 * sb),
                        logits, logits, a.targets + r0, rows, V, Vp, a.dloss, dtype_));
    // d wte (+)= d logits^T @ ln_f(x)                [Vp, C]
    g = GemmArgs{};
    g.trans_a = true;
    g.m = Vp, g.n = C, g.k = rows;
    g.a = logits, g.lda = Vp, g.b = rows_lnf, g.ldb = C;
    g.c = dwte, g.ldc = C, g.ab_dtype = dtype_, g.c_dtype = a.grad_dtype;
    g.beta = (r0 == 0 && !a.accumulate) ? 0.f : 1.f;
    RETURN_IF_ERROR(be.Gemm(g));
    // d ln_f(x) = d logits @ wte, over this chunk's (now dead) rows of ln_f(x)
    g = GemmArgs{};
    g.m = rows, g.n = C, g.k = Vp;
    g.a = logits, g.lda = Vp, g.b = wte, g.ldb = C;
    g.c = rows_lnf, g.ldc = C, g.ab_dtype = g.c_dtype = dtype_;
    RETURN_IF_ERROR(be.Gemm(g));
  }
  // d x = LN_f backward (dx is overwritten: zero, then accumulated into)
  RETURN_IF_ERROR(be.Memset(a.dx, 0, static_cast<size_t>(N * C) * es));
  return be.LayerNormBackward(ln, a.dx, dlnf + f.w * gs, dlnf + f.b * gs, a.grad_dtype,
                              a.accumulate, lnf_out, a.x, lnf + f.w * es,
                              reinterpret_cast<const float*>(s + p.mean),
                              reinterpret_cast<const float*>(s + p.rstd));
}

Status GptLayers::HeadForward(const HeadArgs& a) const {
  RETURN_IF_ERROR(CheckHeadArgs(a, false));
  Backend& be = *backend_;
  const GptConfig& c = config_;
  const int64_t N = B_ * T_, C = c.n_embd, V = c.vocab_size, Vp = c.Vp();
  const int64_t chunk =
      std::min(N, a.chunk_rows > 0 ? a.chunk_rows : DefaultHeadChunkRows(c, B_, T_, dtype_));
  const HeadPlan p = PlanHead(c, B_, T_, dtype_, chunk);
  RETURN_IF_ERROR(CheckScratch("HeadForward", a.scratch, a.scratch_bytes, p.total));
  const size_t es = DTypeSize(dtype_), sb = StatBytes(dtype_);
  const EmbeddingLayout e = EmbeddingLayout::For(Vp, c.seq_len, C);
  const LnFLayout f = LnFLayout::For(C);
  const char* lnf = static_cast<const char*>(a.lnf_params);
  const char* wte = static_cast<const char*>(a.emb_params) + e.wte * es;
  char* s = static_cast<char*>(a.scratch);
  char* lnf_out = s + p.lnf;
  char* logits = s + p.logits;
  const LayerNormArgs ln{N, C, dtype_, c.ln_eps};
  RETURN_IF_ERROR(be.LayerNormForward(ln, lnf_out, reinterpret_cast<float*>(s + p.mean),
                                      reinterpret_cast<float*>(s + p.rstd), a.x, lnf + f.w * es,
                                      lnf + f.b * es));
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    GemmArgs g;
    g.trans_b = true;
    g.m = rows, g.n = Vp, g.k = C;
    g.a = lnf_out + static_cast<size_t>(r0 * C) * es, g.lda = C, g.b = wte, g.ldb = C;
    g.c = logits, g.ldc = Vp, g.ab_dtype = g.c_dtype = dtype_;
    RETURN_IF_ERROR(be.Gemm(g));
    RETURN_IF_ERROR(
        be.CrossEntropy(reinterpret_cast<float*>(reinterpret_cast<char*>(a.losses) + r0 * sb),
                        nullptr, logits, a.targets + r0, rows, V, Vp, 1.f, dtype_));
  }
  return Status::OK();
}

// ---- GptModel ----------------------------------------------------------------

Result<std::unique_ptr<GptModel>> GptModel::Create(Backend* backend, const GptConfig& config,
                                                   const Options& options) {
  const int64_t seq = options.seq > 0 ? options.seq : config.seq_len;
  GptLayers::Options lo;
  lo.fused_epilogues = options.fused_epilogues;
  lo.fused_dgelu = options.fused_dgelu;
  ASSIGN_OR_RETURN(GptLayers layers,
                   GptLayers::Make(backend, config, options.batch, seq, options.dtype, lo));
  if (!IsFloating(options.grad_dtype))
    return InvalidArgument("GptModel: grad_dtype " + std::string(DTypeName(options.grad_dtype)) +
                           " is not a float type");
  Options o = options;
  o.seq = seq;
  std::unique_ptr<GptModel> m(new GptModel(backend, config, o, std::move(layers)));
  m->tensors_ = HfTensors(config);
  const int64_t C = config.n_embd, N = o.batch * seq;
  const size_t es = DTypeSize(o.dtype), gs = DTypeSize(o.grad_dtype);
  auto alloc = [&](size_t bytes, DeviceBuffer* out) -> Status {
    ASSIGN_OR_RETURN(*out, backend->Allocate(bytes));
    return backend->Memset(out->data(), 0, bytes);
  };
  const int64_t block_numel = BlockLayout::For(C).numel;
  const int64_t emb_numel = EmbeddingLayout::For(config.Vp(), config.seq_len, C).numel;
  const int64_t lnf_numel = LnFLayout::For(C).numel;
  m->blocks_.resize(static_cast<size_t>(config.n_layer));
  m->block_grads_.resize(static_cast<size_t>(config.n_layer));
  for (int64_t l = 0; l < config.n_layer; ++l) {
    RETURN_IF_ERROR(alloc(static_cast<size_t>(block_numel) * es, &m->blocks_[l]));
    RETURN_IF_ERROR(alloc(static_cast<size_t>(block_numel) * gs, &m->block_grads_[l]));
  }
  RETURN_IF_ERROR(alloc(static_cast<size_t>(emb_numel) * es, &m->emb_));
  RETURN_IF_ERROR(alloc(static_cast<size_t>(emb_numel) * gs, &m->emb_grads_));
  RETURN_IF_ERROR(alloc(static_cast<size_t>(lnf_numel) * es, &m->lnf_));
  RETURN_IF_ERROR(alloc(static_cast<size_t>(lnf_numel) * gs, &m->lnf_grads_));
  m->acts_.resize(static_cast<size_t>(config.n_layer + 1));
  for (auto& a : m->acts_) RETURN_IF_ERROR(alloc(static_cast<size_t>(N * C) * es, &a));
  RETURN_IF_ERROR(alloc(static_cast<size_t>(N * C) * es, &m->dx_));
  const size_t block_scratch = m->layers_.block_scratch_bytes();
  const size_t head_scratch = m->layers_.head_scratch_bytes(o.head_chunk_rows);
  if (o.keep_last_block) {
    RETURN_IF_ERROR(alloc(block_scratch, &m->scratch_));
    RETURN_IF_ERROR(alloc(head_scratch, &m->head_scratch_));
  } else {
    RETURN_IF_ERROR(alloc(std::max(block_scratch, head_scratch), &m->scratch_));
  }
  RETURN_IF_ERROR(alloc(static_cast<size_t>(N) * 4, &m->tokens_));
  RETURN_IF_ERROR(alloc(static_cast<size_t>(N) * 4, &m->targets_));
  RETURN_IF_ERROR(alloc(static_cast<size_t>(N) * StatBytes(o.dtype), &m->losses_));
  return m;
}

std::vector<DeviceBuffer*> GptModel::ParameterBuffers() {
  std::vector<DeviceBuffer*> v{&emb_};
  for (auto& b : blocks_) v.push_back(&b);
  v.push_back(&lnf_);
  return v;
}

std::vector<DeviceBuffer*> GptModel::GradientBuffers() {
  std::vector<DeviceBuffer*> v{&emb_grads_};
  for (auto& b : block_grads_) v.push_back(&b);
  v.push_back(&lnf_grads_);
  return v;
}

Status GptModel::InitRandom(uint64_t seed) {
  const GptConfig& c = config_;
  const double std_w = 0.02, std_proj = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  // One generator per tensor (seeded from seed and the tensor's index), so
  // each tensor's values do not depend on the others' sizes. Box-Muller on
  // mt19937_64 is the same with every standard library.
  uint64_t index = 0;
  for (const HfTensorInfo& t : tensors_) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + (++index) * 0xBF58476D1CE4E5B9ull);
    auto uniform = [&rng] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
    std::vector<double> v(static_cast<size_t>(t.numel));
    const std::string& n = t.name;
    auto ends_with = [&n](const char* suffix) {
      size_t k = std::strlen(suffix);
      return n.size() >= k && n.compare(n.size() - k, k, suffix) == 0;
    };
    if (ends_with(".bias")) {
      std::fill(v.begin(), v.end(), 0.0);
    } else if (n.find(".ln_") != std::string::npos) {
      std::fill(v.begin(), v.end(), 1.0);
    } else {
      const double sd = ends_with("c_proj.weight") ? std_proj : std_w;
      for (size_t i = 0; i < v.size(); i += 2) {
        double r = std::sqrt(-2.0 * std::log(uniform())), th = 2.0 * M_PI * uniform();
        v[i] = sd * r * std::cos(th);
        if (i + 1 < v.size()) v[i + 1] = sd * r * std::sin(th);
      }
    }
    RETURN_IF_ERROR(SetParameter(t.name, v.data(), DType::kF64, t.numel));
  }
  return Status::OK();
}

Result<const HfTensorInfo*> GptModel::Find(const std::string& hf_name) const {
  for (const HfTensorInfo& t : tensors_)
    if (t.name == hf_name) return &t;
  return NotFound("GptModel: no parameter named \"" + hf_name + "\"");
}

const DeviceBuffer& GptModel::BufferOf(const HfTensorInfo& t, bool grads) const {
  switch (t.buffer) {
    case GptBuffer::kEmbedding: return grads ? emb_grads_ : emb_;
    case GptBuffer::kLnF: return grads ? lnf_grads_ : lnf_;
    case GptBuffer::kBlock: break;
  }
  return grads ? block_grads_[t.layer] : blocks_[t.layer];
}

Status GptModel::SetParameter(const std::string& hf_name, const void* data, DType dtype,
                              int64_t numel) {
  ASSIGN_OR_RETURN(const HfTensorInfo* t, Find(hf_name));
  if (numel != t->numel)
    return InvalidArgument("GptModel::SetParameter " + hf_name + ": " + Str(numel) +
                           " elements given, the tensor has " + Str(t->numel));
  if (!IsFloating(dtype))
    return InvalidArgument("GptModel::SetParameter " + hf_name + ": dtype " +
                           std::string(DTypeName(dtype)) + " is not a float type");
  if (numel > 0 && data == nullptr)
    return InvalidArgument("GptModel::SetParameter " + hf_name + ": data is null");
  std::vector<double> v(static_cast<size_t>(numel));
  HostToDouble(data, dtype, v.data(), numel);
  const size_t es = DTypeSize(options_.dtype);
  std::vector<uint8_t> bytes(static_cast<size_t>(numel) * es);
  DoubleToHost(v.data(), options_.dtype, bytes.data(), numel);
  char* dst = static_cast<char*>(BufferOf(*t, false).data()) + t->offset * es;
  return backend_->CopyToDevice(dst, bytes.data(), bytes.size());
}

Result<std::vector<double>> GptModel::Read(const HfTensorInfo& t, bool grads) const {
  const DType dt = grads ? options_.grad_dtype : options_.dtype;
  const size_t es = DTypeSize(dt);
  std::vector<uint8_t> bytes(static_cast<size_t>(t.numel) * es);
  RETURN_IF_ERROR(backend_->Synchronize());
  const char* src = static_cast<const char*>(BufferOf(t, grads).data()) + t.offset * es;
  RETURN_IF_ERROR(backend_->CopyToHost(bytes.data(), src, bytes.size()));
  std::vector<double> v(static_cast<size_t>(t.numel));
  HostToDouble(bytes.data(), dt, v.data(), t.numel);
  return v;
}

Result<std::vector<double>> GptModel::GetParameter(const std::string& hf_name) const {
  ASSIGN_OR_RETURN(const HfTensorInfo* t, Find(hf_name));
  return Read(*t, false);
}

Result<std::vector<double>> GptModel::GetGradient(const std::string& hf_name) const {
  ASSIGN_OR_RETURN(const HfTensorInfo* t, Find(hf_name));
  return Read(*t, true);
}

Result<std::vector<GptModel::HostTensor>> GptModel::Export(DType dtype, bool gradients) const {
  if (!IsFloating(dtype))
    return InvalidArgument("GptModel::Export: dtype " + std::string(DTypeName(dtype)) +
                           " is not a float type");
  std::vector<HostTensor> out;
  for (const HfTensorInfo& t : tensors_) {
    ASSIGN_OR_RETURN(std::vector<double> v, Read(t, gradients));
    HostTensor h{t, dtype, std::vector<uint8_t>(static_cast<size_t>(t.numel) * DTypeSize(dtype))};
    DoubleToHost(v.data(), dtype, h.bytes.data(), t.numel);
    out.push_back(std::move(h));
  }
  return out;
}

Status GptModel::UploadTokens(const int32_t* tokens, const int32_t* targets, int64_t* valid) {
  const int64_t N = options_.batch * options_.seq, V = config_.vocab_size;
  if (tokens == nullptr || targets == nullptr)
    return InvalidArgument("GptModel: tokens and targets must not be null");
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      return InvalidArgument("GptModel: tokens[" + Str(i) + "] = " + Str(tokens[i]) +
                             " is outside [0, vocab_size = " + Str(V) + ")");
    if (targets[i] >= V)
      return InvalidArgument("GptModel: targets[" + Str(i) + "] = " + Str(targets[i]) +
                             " is not below vocab_size = " + Str(V) + " (negative = ignored)");
    count += targets[i] >= 0;
  }
  *valid = count;
  RETURN_IF_ERROR(backend_->CopyToDevice(tokens_.data(), tokens, static_cast<size_t>(N) * 4));
  return backend_->CopyToDevice(targets_.data(), targets, static_cast<size_t>(N) * 4);
}

namespace {
// Sum of n per-token losses (f32, or f64 for f64 models) copied to the host.
Result<double> SumLosses(Backend* be, const void* losses, int64_t n, DType dtype) {
  RETURN_IF_ERROR(be->Synchronize());
  double sum = 0;
  if (dtype == DType::kF64) {
    std::vector<double> v(static_cast<size_t>(n));
    RETURN_IF_ERROR(be->CopyToHost(v.data(), losses, v.size() * 8));
    for (double x : v) sum += x;
  } else {
    std::vector<float> v(static_cast<size_t>(n));
    RETURN_IF_ERROR(be->CopyToHost(v.data(), losses, v.size() * 4));
    for (float x : v) sum += x;
  }
  return sum;
}
}  // namespace

Result<double> GptModel::ForwardBackward(const int32_t* tokens, const int32_t* targets,
                                         bool accumulate) {
  int64_t valid = 0;
  RETURN_IF_ERROR(UploadTokens(tokens, targets, &valid));
  const int L = static_cast<int>(config_.n_layer);
  const DType gd = options_.grad_dtype;
  const int32_t* tok = tokens_.as<int32_t>();
  RETURN_IF_ERROR(layers_.EmbeddingForward(emb_.data(), tok, acts_[0].data()));
  using Internals = GptLayers::Internals;
  const bool keep = options_.keep_last_block;
  auto kept = [&](int l) { return keep && l == L - 1 ? Internals::kKept : Internals::kNotKept; };
  for (int l = 0; l < L; ++l)
    RETURN_IF_ERROR(layers_.BlockForward(blocks_[l].data(), acts_[l].data(), acts_[l + 1].data(),
                                         scratch_.data(), scratch_.bytes(), kept(l)));
  DeviceBuffer& hs = keep ? head_scratch_ : scratch_;
  GptLayers::HeadArgs h;
  h.lnf_params = lnf_.data();
  h.emb_params = emb_.data();
  h.x = acts_[L].data();
  h.targets = targets_.as<int32_t>();
  h.losses = losses_.as<float>();
  h.dloss = valid > 0 ? static_cast<float>(1.0 / static_cast<double>(valid)) : 0.f;
  h.dx = dx_.data();
  h.lnf_grads = lnf_grads_.data();
  h.emb_grads = emb_grads_.data();
  h.grad_dtype = gd;
  h.accumulate = accumulate;
  h.chunk_rows = options_.head_chunk_rows;
  h.scratch = hs.data();
  h.scratch_bytes = hs.bytes();
  RETURN_IF_ERROR(layers_.HeadForwardBackward(h));
  for (int l = L - 1; l >= 0; --l)
    RETURN_IF_ERROR(layers_.BlockBackward(blocks_[l].data(), acts_[l].data(), dx_.data(),
                                          dx_.data(), block_grads_[l].data(), gd, accumulate,
                                          scratch_.data(), scratch_.bytes(), kept(l)));
  RETURN_IF_ERROR(layers_.EmbeddingBackward(emb_grads_.data(), gd, accumulate, tok, dx_.data()));
  ASSIGN_OR_RETURN(double sum, SumLosses(backend_, losses_.data(), options_.batch * options_.seq,
                                         options_.dtype));
  return valid > 0 ? sum / static_cast<double>(valid) : 0.0;
}

Result<double> GptModel::Evaluate(const int32_t* tokens, const int32_t* targets) {
  int64_t valid = 0;
  RETURN_IF_ERROR(UploadTokens(tokens, targets, &valid));
  const int L = static_cast<int>(config_.n_layer);
  const int32_t* tok = tokens_.as<int32_t>();
  RETURN_IF_ERROR(layers_.EmbeddingForward(emb_.data(), tok, acts_[0].data()));
  for (int l = 0; l < L; ++l)
    RETURN_IF_ERROR(layers_.BlockForward(blocks_[l].data(), acts_[l].data(), acts_[l + 1].data(),
                                         scratch_.data(), scratch_.bytes()));
  GptLayers::HeadArgs h;
  h.lnf_params = lnf_.data();
  h.emb_params = emb_.data();
  h.x = acts_[L].data();
  h.targets = targets_.as<int32_t>();
  h.losses = losses_.as<float>();
  h.chunk_rows = options_.head_chunk_rows;
  DeviceBuffer& hs = options_.keep_last_block ? head_scratch_ : scratch_;
  h.scratch = hs.data();
  h.scratch_bytes = hs.bytes();
  RETURN_IF_ERROR(layers_.HeadForward(h));
  ASSIGN_OR_RETURN(double sum, SumLosses(backend_, losses_.data(), options_.batch * options_.seq,
                                         options_.dtype));
  return valid > 0 ? sum / static_cast<double>(valid) : 0.0;
}

}  // namespace strata::kernels
