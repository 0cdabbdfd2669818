// SPDX-License-Identifier: Apache-2.0
// The decoder: compiling the block's ops for generation, running a step.
#include "models/decoder.h"

#include <algorithm>
#include <map>

#include "models/block_program.h"  // StatBytes

namespace strata::models {

using kernels::Backend;
using kernels::DecodeAttentionShape;
using kernels::DeviceBuffer;
using kernels::GemmArgs;
using kernels::LayerNormArgs;
using kernels::RmsNormArgs;
using kernels::RopeArgs;

namespace {

const char* KindName(OpKind k) {
  switch (k) {
    case OpKind::kLayerNorm: return "LayerNorm";
    case OpKind::kLinear: return "Linear";
    case OpKind::kAttention: return "Attention";
    case OpKind::kRmsNorm: return "RMSNorm";
    case OpKind::kRope: return "RoPE";
    case OpKind::kSwiGlu: return "SwiGLU";
  }
  return "?";
}

std::string Str(int64_t v) { return std::to_string(v); }

}  // namespace

Decoder::Decoder(Backend* backend, const ModelSpec& spec, DType dtype, std::vector<const void*> params)
    : backend_(backend), spec_(spec), dtype_(dtype), params_(std::move(params)) {}

Decoder::~Decoder() = default;

Result<std::unique_ptr<Decoder>> Decoder::Create(Backend* backend, const ModelSpec& spec, DType dtype,
                                                 std::vector<const void*> unit_params, const Options& options) {
  if (backend == nullptr) return InvalidArgument("Decoder: backend is null");
  if (!IsFloating(dtype)) return InvalidArgument("Decoder: dtype " + std::string(DTypeName(dtype)) + " is not a float type");
  if (static_cast<int>(unit_params.size()) != spec.num_units())
    return InvalidArgument("Decoder: " + Str(static_cast<int64_t>(unit_params.size())) + " unit buffers given, the " +
                           spec.family + " model has " + Str(spec.num_units()) + " units");
  for (size_t u = 0; u < unit_params.size(); ++u)
    if (unit_params[u] == nullptr) return InvalidArgument("Decoder: the parameters of unit " + spec.units[u].name + " are null");
  if (!spec.head.tied && spec.head.lm_head_offset < 0)
    return InvalidArgument("Decoder: the untied LM head has no place in the final unit (lm_head_offset)");
  std::unique_ptr<Decoder> d(new Decoder(backend, spec, dtype, std::move(unit_params)));
  d->capacity_ = options.capacity > 0 ? options.capacity : spec.max_seq;
  if (d->capacity_ > spec.max_seq)
    return InvalidArgument("Decoder: capacity " + Str(d->capacity_) + " exceeds the model's " + Str(spec.max_seq) +
                           " positions");
  d->max_rows_ = options.max_rows > 0 ? std::min(options.max_rows, d->capacity_) : d->capacity_;
  RETURN_IF_ERROR(d->Compile());
  return d;
}

// Names to activation indices (x 0, y 1, then in op order), each op's
// operands, parameters and widths checked; then the buffers.
Status Decoder::Compile() {
  const BlockSpec& b = spec_.block;
  const int64_t C = spec_.d_model, H = spec_.n_head, D = spec_.head_dim(), KV = spec_.kv_heads();
  const int64_t qkv_width = (H + 2 * KV) * D;
  std::map<std::string, int> index{{"x", 0}, {"y", 1}};
  std::vector<int64_t> width{C, C};
  for (size_t i = 0; i < b.ops.size(); ++i) {
    const BlockOp& bop = b.ops[i];
    Op op;
    op.kind = bop.kind;
    op.name = "op " + Str(static_cast<int64_t>(i)) + " (" + KindName(bop.kind) + " " + bop.in + " -> " + bop.out + ")";
    auto fail = [&](const std::string& what) { return InvalidArgument("Decoder: block " + op.name + ": " + what); };
    auto find = [&](const std::string& name) -> Result<int> {
      auto it = index.find(name);
      if (it == index.end() || (it->second == 1 && name == "y"))
        return fail("no op before it makes \"" + name + "\"");
      return it->second;
    };
    auto param = [&](const std::string& name, std::vector<int64_t> want) -> Result<int64_t> {
      const BlockParam* p = b.Find(name);
      if (!p) return fail("the block has no parameter \"" + name + "\"");
      if (!want.empty() && p->shape != want) return fail("parameter \"" + name + "\" has the wrong shape");
      return p->offset;
    };
    ASSIGN_OR_RETURN(op.in, find(bop.in));
    op.in_width = width[static_cast<size_t>(op.in)];
    switch (bop.kind) {
      case OpKind::kLayerNorm: {
        if (op.in_width != C) return fail("a LayerNorm over other than d_model columns");
        ASSIGN_OR_RETURN(op.weight, param(bop.weight, {C}));
        ASSIGN_OR_RETURN(op.bias, param(bop.bias, {C}));
        op.width = C;
        break;
      }
      case OpKind::kLinear: {
        const Status st = CompileLinear(bop, &op);
        if (!st.ok()) return fail(std::string(st.message()));
        if (!bop.residual.empty()) {
          ASSIGN_OR_RETURN(op.residual, find(bop.residual));
          if (width[static_cast<size_t>(op.residual)] != op.width) return fail("residual \"" + bop.residual + "\" has other width");
        }
        break;
      }
      case OpKind::kRmsNorm: {
        if (op.in_width != C) return fail("an RMSNorm over other than d_model columns");
        ASSIGN_OR_RETURN(op.weight, param(bop.weight, {C}));
        op.width = C;
        break;
      }
      case OpKind::kRope:
        if (op.in_width != qkv_width || D % 2 != 0)
          return fail("its input of " + Str(op.in_width) + " columns is not q | k | v of " + Str(H) + " + 2 x " +
                      Str(KV) + " heads of an even " + Str(D));
        op.width = op.in_width;
        break;
      case OpKind::kSwiGlu:
        if (op.in_width % 2 != 0) return fail("its input of " + Str(op.in_width) + " columns is not gate | up");
        op.width = op.in_width / 2;
        break;
      case OpKind::kAttention: {
        // q | k | v columns: H query heads, then the spec's KV key and value heads of D.
        if (op.in_width != qkv_width || H % KV != 0)
          return fail("its input of " + Str(op.in_width) + " columns is not q | k | v of " + Str(H) + " + 2 x " +
                      Str(KV) + " heads of " + Str(D));
        op.cache = caches_per_layer_++;
        op.width = H * D;
        break;
      }
      default:
        return fail("the decoder has no case for this op kind");
    }
    if (bop.out == "y") {
      if (op.width != C) return fail("the block's output is not [N, d_model]");
      op.out = 1;
    } else {
      if (index.count(bop.out)) return fail("\"" + bop.out + "\" is made twice");
      op.out = static_cast<int>(width.size());
      index[bop.out] = op.out;
      width.push_back(op.width);
    }
    ops_.push_back(op);
  }
  if (ops_.empty() || ops_.back().out != 1) return InvalidArgument("Decoder: the block's last op does not make \"y\"");
  return Allocate(width);
}

// A Linear's weights: Conv1D's [k, n] (one GEMM), or nn.Linear's [n, k]
// with further weights concatenated along the output columns (one GEMM per
// weight unless they, and their biases, lie back to back in the unit).
Status Decoder::CompileLinear(const BlockOp& bop, Op* op) const {
  const BlockSpec& b = spec_.block;
  op->gelu = bop.gelu;
  if (!bop.transposed) {
    if (!bop.concat.empty()) return InvalidArgument("concatenated weights need the nn.Linear layout (transposed)");
    const BlockParam* w = b.Find(bop.weight);
    if (!w || w->shape.size() != 2 || w->shape[0] != op->in_width)
      return InvalidArgument("weight \"" + bop.weight + "\" is missing or not [" + Str(op->in_width) + ", n]");
    op->weight = w->offset;
    op->width = w->shape[1];
    if (!bop.bias.empty()) {
      const BlockParam* p = b.Find(bop.bias);
      if (!p || p->shape != std::vector<int64_t>{op->width})
        return InvalidArgument("bias \"" + bop.bias + "\" is missing or not [" + Str(op->width) + "]");
      op->bias = p->offset;
    }
    return Status::OK();
  }
  std::vector<std::string> weights{bop.weight}, biases;
  weights.insert(weights.end(), bop.concat.begin(), bop.concat.end());
  if (!bop.bias.empty()) {
    biases.push_back(bop.bias);
    biases.insert(biases.end(), bop.concat_bias.begin(), bop.concat_bias.end());
  }
  if (bop.bias.empty() && !bop.concat_bias.empty())
    return InvalidArgument("concatenated biases without a first bias");
  if (!biases.empty() && biases.size() != weights.size())
    return InvalidArgument(Str(static_cast<int64_t>(weights.size())) + " weights but " +
                           Str(static_cast<int64_t>(biases.size())) + " biases (all or none)");
  bool adjacent = true;
  int64_t n0 = 0, w_end = -1, b_end = -1;
  for (size_t i = 0; i < weights.size(); ++i) {
    const BlockParam* w = b.Find(weights[i]);
    if (!w || w->shape.size() != 2 || w->shape[1] != op->in_width)
      return InvalidArgument("weight \"" + weights[i] + "\" is missing or not [n, " + Str(op->in_width) + "]");
    Part part{w->offset, -1, n0, w->shape[0]};
    if (i > 0 && w->offset != w_end) adjacent = false;
    w_end = w->offset + w->numel;
    if (!biases.empty()) {
      const BlockParam* p = b.Find(biases[i]);
      if (!p || p->shape != std::vector<int64_t>{part.n})
        return InvalidArgument("bias \"" + biases[i] + "\" is missing or not [" + Str(part.n) + "]");
      part.bias = p->offset;
      if (i > 0 && p->offset != b_end) adjacent = false;
      b_end = p->offset + p->numel;
    }
    op->parts.push_back(part);
    n0 += part.n;
  }
  if (adjacent) op->parts = {Part{op->parts[0].weight, op->parts[0].bias, 0, n0}};
  if (op->parts.size() > 1 && (!bop.residual.empty() || bop.gelu))
    return InvalidArgument("a residual or GELU on weights that are not adjacent in the unit (not one GEMM)");
  op->transposed = true;
  op->width = n0;
  op->weight = op->parts[0].weight;
  op->bias = op->parts[0].bias;
  return Status::OK();
}

// The activations' buffers (`width` columns each), the caches, the head's.
Status Decoder::Allocate(const std::vector<int64_t>& width) {
  const int64_t C = spec_.d_model;
  const size_t es = DTypeSize(dtype_), R = static_cast<size_t>(max_rows_);
  auto alloc = [&](size_t bytes, DeviceBuffer* out) -> Status {
    ASSIGN_OR_RETURN(*out, backend_->Allocate(std::max<size_t>(bytes, 64)));
    return backend_->Memset(out->data(), 0, out->bytes());
  };
  acts_.resize(width.size());
  for (size_t a = 0; a < width.size(); ++a) RETURN_IF_ERROR(alloc(R * static_cast<size_t>(width[a]) * es, &acts_[a]));
  const size_t layers = static_cast<size_t>(spec_.n_layer) * static_cast<size_t>(caches_per_layer_);
  k_cache_.resize(layers);
  v_cache_.resize(layers);
  for (const Op& op : ops_) {
    if (op.kind != OpKind::kAttention) continue;
    const size_t bytes = static_cast<size_t>(capacity_) * static_cast<size_t>((op.in_width - C) / 2) * es;
    for (int64_t l = 0; l < spec_.n_layer; ++l) {
      const size_t at = static_cast<size_t>(l * caches_per_layer_ + op.cache);
      RETURN_IF_ERROR(alloc(bytes, &k_cache_[at]));
      RETURN_IF_ERROR(alloc(bytes, &v_cache_[at]));
    }
  }
  RETURN_IF_ERROR(alloc(R * 4, &tokens_));
  RETURN_IF_ERROR(alloc(R * StatBytes(dtype_), &mean_));
  RETURN_IF_ERROR(alloc(R * StatBytes(dtype_), &rstd_));
  RETURN_IF_ERROR(alloc(R * static_cast<size_t>(C) * es, &norm_));
  RETURN_IF_ERROR(alloc(R * static_cast<size_t>(spec_.padded_vocab) * es, &logits_));
  return alloc(R * static_cast<size_t>(spec_.padded_vocab) * 4, &logits_f32_);
}

Status Decoder::RunOp(const Op& op, const char* params, int layer, int64_t rows) {
  Backend& be = *backend_;
  const int64_t C = spec_.d_model;
  const size_t es = DTypeSize(dtype_);
  auto W = [&](int64_t off) { return static_cast<const void*>(params + off * static_cast<int64_t>(es)); };
  switch (op.kind) {
    case OpKind::kLayerNorm:
      return be.LayerNormForward(LayerNormArgs{rows, C, dtype_, spec_.block.norm_eps}, act(op.out), mean_.as<float>(),
                                 rstd_.as<float>(), act(op.in), W(op.weight), W(op.bias));
    case OpKind::kLinear:
      return RunLinear(op, params, rows);
    case OpKind::kRmsNorm:
      return be.RmsNormForward(RmsNormArgs{rows, C, dtype_, spec_.block.norm_eps}, act(op.out), rstd_.as<float>(),
                               act(op.in), W(op.weight));
    case OpKind::kRope: {
      // The new rows are positions position_ .. position_ + rows - 1.
      RopeArgs a{1, rows, op.width, spec_.n_head + spec_.kv_heads(), spec_.head_dim(), dtype_, spec_.block.rope};
      a.position_offset = position_;
      return be.RopeForward(a, act(op.out), act(op.in));
    }
    case OpKind::kSwiGlu:
      return be.SwiGluForward(act(op.out), act(op.in), rows, op.width, dtype_);
    case OpKind::kAttention: {
      DecodeAttentionShape s;
      s.batch = 1, s.rows = rows, s.past = position_, s.capacity = capacity_;
      s.heads = spec_.n_head, s.head_dim = spec_.head_dim();
      s.kv_heads = spec_.kv_heads();
      s.dtype = dtype_;
      const size_t at = static_cast<size_t>(layer * caches_per_layer_ + op.cache);
      return be.AttentionDecode(s, act(op.out), act(op.in), k_cache_[at].data(), v_cache_[at].data());
    }
  }
  return Internal("Decoder: " + op.name + " has no case");
}

// out = in @ W (+ bias) (+ residual), then GELU; nn.Linear's layout: per
// part out[:, n0:n0+n] = in @ W_p^T (+ b_p).
Status Decoder::RunLinear(const Op& op, const char* params, int64_t rows) {
  Backend& be = *backend_;
  const size_t es = DTypeSize(dtype_);
  auto W = [&](int64_t off) { return static_cast<const void*>(params + off * static_cast<int64_t>(es)); };
  if (op.residual >= 0 && !be.GemmHasBackwardEpilogues())
    RETURN_IF_ERROR(be.CopyDeviceToDevice(act(op.out), act(op.residual), static_cast<size_t>(rows * op.width) * es));
  const std::vector<Part> conv1d{Part{op.weight, op.bias, 0, op.width}};
  for (const Part& p : op.transposed ? op.parts : conv1d) {
    GemmArgs g;
    g.ab_dtype = g.c_dtype = dtype_;
    g.trans_b = op.transposed;
    g.m = rows, g.n = p.n, g.k = op.in_width;
    g.a = act(op.in), g.lda = op.in_width;
    g.b = W(p.weight), g.ldb = op.transposed ? op.in_width : op.width;
    g.c = static_cast<char*>(act(op.out)) + p.n0 * static_cast<int64_t>(es), g.ldc = op.width;
    if (p.bias >= 0) g.bias = W(p.bias);
    if (op.residual >= 0) {  // one part (checked)
      if (be.GemmHasBackwardEpilogues()) g.c_in = act(op.residual);
      g.beta = 1.f;
    }
    g.gelu = op.gelu;
    RETURN_IF_ERROR(be.Gemm(g));
  }
  return Status::OK();
}

// x[0..n) = wte[tokens] + wpe[position .. position + n) (no wpe: no position table).
Status Decoder::Embed(const int32_t* tokens, int64_t n) {
  RETURN_IF_ERROR(backend_->CopyToDevice(tokens_.data(), tokens, static_cast<size_t>(n) * 4));
  const char* emb = static_cast<const char*>(params_[0]);
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype_)), C = spec_.d_model;
  const char* wpe =
      spec_.embedding.position_offset < 0 ? nullptr : emb + (spec_.embedding.position_offset + position_ * C) * es;
  return backend_->EmbeddingForward(act(0), tokens_.as<int32_t>(), emb + spec_.embedding.token_offset * es, wpe, 1, n,
                                    C, dtype_);
}

// The final norm (LayerNorm or RMSNorm) and the LM head (tied: the token table) over rows [first_row, first_row + rows) of x.
Status Decoder::Head(int64_t first_row, int64_t rows, std::vector<float>* logits) {
  Backend& be = *backend_;
  const int64_t C = spec_.d_model, V = spec_.vocab_size, Vp = spec_.padded_vocab;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype_));
  const char* fin = static_cast<const char*>(params_[static_cast<size_t>(spec_.final_unit())]);
  const char* x = static_cast<const char*>(act(0)) + first_row * C * es;
  const HeadSpec& h = spec_.head;
  if (h.norm == HeadSpec::Norm::kRmsNorm) {
    RETURN_IF_ERROR(be.RmsNormForward(RmsNormArgs{rows, C, dtype_, h.norm_eps}, norm_.data(), rstd_.as<float>(), x,
                                      fin + h.norm_weight_offset * es));
  } else {
    RETURN_IF_ERROR(be.LayerNormForward(LayerNormArgs{rows, C, dtype_, h.norm_eps}, norm_.data(), mean_.as<float>(),
                                        rstd_.as<float>(), x, fin + h.norm_weight_offset * es,
                                        fin + h.norm_bias_offset * es));
  }
  GemmArgs g;
  g.trans_b = true;
  g.m = rows, g.n = Vp, g.k = C;
  g.a = norm_.data(), g.lda = C;
  g.b = h.tied ? static_cast<const char*>(params_[0]) + spec_.embedding.token_offset * es
               : fin + h.lm_head_offset * es;
  g.ldb = C;
  g.c = logits_.data(), g.ldc = Vp, g.ab_dtype = g.c_dtype = dtype_;
  RETURN_IF_ERROR(be.Gemm(g));
  const void* src = logits_.data();
  if (dtype_ != DType::kF32) {
    RETURN_IF_ERROR(be.Cast(logits_f32_.data(), DType::kF32, logits_.data(), dtype_, rows * Vp));
    src = logits_f32_.data();
  }
  std::vector<float> all(static_cast<size_t>(rows * Vp));
  RETURN_IF_ERROR(be.Synchronize());
  RETURN_IF_ERROR(be.CopyToHost(all.data(), src, all.size() * 4));
  logits->resize(static_cast<size_t>(rows * V));
  for (int64_t r = 0; r < rows; ++r)
    std::copy(all.begin() + r * Vp, all.begin() + r * Vp + V, logits->begin() + r * V);
  return Status::OK();
}

Status Decoder::Step(const int32_t* tokens, int64_t n, Logits which, std::vector<float>* logits) {
  if (n < 1 || n > max_rows_)
    return InvalidArgument("Decoder::Step: " + Str(n) + " tokens; a step takes 1 to " + Str(max_rows_));
  if (position_ + n > capacity_)
    return InvalidArgument("Decoder::Step: positions " + Str(position_) + " + " + Str(n) + " tokens exceed the " +
                           Str(capacity_) + " the cache holds");
  if (tokens == nullptr || logits == nullptr) return InvalidArgument("Decoder::Step: tokens and logits must not be null");
  if (dtype_ == DType::kF64) return InvalidArgument("Decoder::Step: f64 logits are not read back");
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= spec_.vocab_size)
      return InvalidArgument("Decoder::Step: token " + Str(i) + " = " + Str(tokens[i]) + " is outside [0, " +
                             Str(spec_.vocab_size) + ")");
  RETURN_IF_ERROR(Embed(tokens, n));
  for (int64_t l = 0; l < spec_.n_layer; ++l) {
    const char* p = static_cast<const char*>(params_[static_cast<size_t>(ModelSpec::block_unit(l))]);
    for (const Op& op : ops_) {
      const Status s = RunOp(op, p, static_cast<int>(l), n);
      if (!s.ok()) return s.WithContext("Decoder layer " + Str(l) + " " + op.name);
    }
    std::swap(acts_[0], acts_[1]);  // the block's output is the next one's input
  }
  RETURN_IF_ERROR(which == Logits::kAll ? Head(0, n, logits) : Head(n - 1, 1, logits));
  position_ += n;
  return Status::OK();
}

}  // namespace strata::models
