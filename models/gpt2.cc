// SPDX-License-Identifier: Apache-2.0
#include "models/gpt2.h"

#include <cmath>
#include <string>

#include "models/family.h"
#include "models/hf_config_fields.h"

namespace strata::models {

namespace {

std::string Str(int64_t v) { return std::to_string(v); }

ParamInit Normal(double std) { return {ParamInit::kNormal, std}; }
constexpr ParamInit kZeros{ParamInit::kZeros, 0};
constexpr ParamInit kOnes{ParamInit::kOnes, 0};

BlockSpec GptBlock(const GptConfig& c) {
  const int64_t C = c.n_embd;
  const double w = 0.02, proj = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  BlockSpec b;
  b.norm_eps = c.ln_eps;
  SliceLayout l;
  auto param = [&](const char* name, std::vector<int64_t> shape, ParamInit init) {
    const int64_t n = ShapeNumel(shape);
    b.params.push_back(BlockParam{name, l.Take(n), std::move(shape), n, init});
  };
  param("ln_1.weight", {C}, kOnes);
  param("ln_1.bias", {C}, kZeros);
  param("attn.c_attn.weight", {C, 3 * C}, Normal(w));
  param("attn.c_attn.bias", {3 * C}, kZeros);
  param("attn.c_proj.weight", {C, C}, Normal(proj));
  param("attn.c_proj.bias", {C}, kZeros);
  param("ln_2.weight", {C}, kOnes);
  param("ln_2.bias", {C}, kZeros);
  param("mlp.c_fc.weight", {C, 4 * C}, Normal(w));
  param("mlp.c_fc.bias", {4 * C}, kZeros);
  param("mlp.c_proj.weight", {4 * C, C}, Normal(proj));
  param("mlp.c_proj.bias", {C}, kZeros);
  auto op = [&](OpKind kind, const char* in, const char* out, const char* weight = "", const char* bias = "",
                const char* residual = "", bool gelu = false) {
    b.ops.push_back(BlockOp{kind, in, out, weight, bias, residual, gelu, false, {}, {}});
  };
  op(OpKind::kLayerNorm, "x", "ln1", "ln_1.weight", "ln_1.bias");
  op(OpKind::kLinear, "ln1", "qkv", "attn.c_attn.weight", "attn.c_attn.bias");
  op(OpKind::kAttention, "qkv", "att");
  op(OpKind::kLinear, "att", "x1", "attn.c_proj.weight", "attn.c_proj.bias", "x");
  op(OpKind::kLayerNorm, "x1", "ln2", "ln_2.weight", "ln_2.bias");
  op(OpKind::kLinear, "ln2", "h", "mlp.c_fc.weight", "mlp.c_fc.bias", "", /*gelu=*/true);
  op(OpKind::kLinear, "h", "y", "mlp.c_proj.weight", "mlp.c_proj.bias", "x1");
  return b;
}

}  // namespace

int64_t GptConfig::Vp() const { return PaddedVocab(vocab_size, padded_vocab_size); }

Status GptConfig::Validate() const {
  auto bad = [](const std::string& what) { return InvalidArgument("GptConfig: " + what); };
  RETURN_IF_ERROR(
      CheckTransformerShape("GptConfig", {n_layer, n_embd, n_head, vocab_size, padded_vocab_size, seq_len}));
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

Result<ModelSpec> Gpt2Spec(const GptConfig& c) {
  RETURN_IF_ERROR(c.Validate());
  const int64_t C = c.n_embd;
  ModelSpec m;
  m.family = "gpt2";
  m.hf_architecture = "GPT2LMHeadModel";
  m.hf_base_prefix = "transformer.";
  m.n_layer = c.n_layer;
  m.d_model = C;
  m.n_head = c.n_head;
  m.vocab_size = c.vocab_size;
  m.padded_vocab = c.Vp();
  m.max_seq = c.seq_len;
  m.block = GptBlock(c);

  auto add = [&m](std::string name, int unit, int64_t offset, std::vector<int64_t> shape, ParamInit init) {
    const int64_t n = ShapeNumel(shape);
    m.params.push_back(ParamSpec{std::move(name), unit, offset, std::move(shape), n, init});
  };
  // Unit 0: the embedding.
  SliceLayout emb;
  m.embedding.token_offset = emb.Take(m.padded_vocab * C);
  m.embedding.position_offset = emb.Take(c.seq_len * C);
  m.units.push_back(UnitSpec{"emb", UnitKind::kEmbedding, -1, emb.numel()});
  add("transformer.wte.weight", 0, m.embedding.token_offset, {c.vocab_size, C}, Normal(0.02));
  add("transformer.wpe.weight", 0, m.embedding.position_offset, {c.seq_len, C}, Normal(0.02));
  m.params.back().extra_rows_ok = true;
  // Units 1..L: the blocks.
  int64_t block_numel = 0;
  for (const BlockParam& p : m.block.params) block_numel = AlignSlice(p.offset + p.numel);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const int u = ModelSpec::block_unit(l);
    m.units.push_back(UnitSpec{"blk" + Str(l), UnitKind::kBlock, static_cast<int>(l), block_numel});
    for (const BlockParam& p : m.block.params)
      add("transformer.h." + Str(l) + "." + p.name, u, p.offset, p.shape, p.init);
  }
  // The final unit: ln_f (the LM head is tied to wte).
  SliceLayout fin;
  m.head.norm_weight_offset = fin.Take(C);
  m.head.norm_bias_offset = fin.Take(C);
  m.head.norm_eps = c.ln_eps;
  m.head.tied = true;
  const int f = static_cast<int>(m.units.size());
  m.units.push_back(UnitSpec{"lnf", UnitKind::kFinal, -1, fin.numel()});
  add("transformer.ln_f.weight", f, m.head.norm_weight_offset, {C}, kOnes);
  add("transformer.ln_f.bias", f, m.head.norm_bias_offset, {C}, kZeros);
  return m;
}

// ---- the registry's entries ----------------------------------------------------

Result<ModelSpec> Gpt2FromDesc(const ModelDesc& d) {
  if (d.n_kv_head != 0 && d.n_kv_head != d.n_head)
    return InvalidArgument("gpt2: n_kv_head = " + Str(d.n_kv_head) + " (GPT-2 has no grouped-query attention)");
  GptConfig g;
  g.n_layer = d.n_layer;
  g.n_embd = d.n_embd;
  g.n_head = d.n_head;
  g.vocab_size = d.vocab_size;
  g.seq_len = d.seq_len;
  if (d.norm_eps > 0) g.ln_eps = static_cast<float>(d.norm_eps);
  return Gpt2Spec(g);
}

Result<ModelDesc> Gpt2ReadHfConfig(const nlohmann::json& j, const std::string& path) {
  HfFields f(j, path);
  ModelDesc d;
  d.arch = "gpt2";
  ASSIGN_OR_RETURN(d.n_layer, f.Int("n_layer", -1));
  ASSIGN_OR_RETURN(d.n_embd, f.Int("n_embd", -1));
  ASSIGN_OR_RETURN(d.n_head, f.Int("n_head", -1));
  ASSIGN_OR_RETURN(d.vocab_size, f.Int("vocab_size", -1));
  ASSIGN_OR_RETURN(d.seq_len, f.Int("n_positions", 1024));
  ASSIGN_OR_RETURN(d.norm_eps, f.Real("layer_norm_epsilon", 1e-5));
  d.tie_word_embeddings = true;
  return d;
}

Result<nlohmann::json> Gpt2WriteHfConfig(const ModelSpec& spec, nlohmann::json c) {
  if (c.empty()) {
    // GPT2Config's fields as strata trains the model: no dropout.
    c = {{"activation_function", "gelu_new"}, {"attn_pdrop", 0.0},     {"embd_pdrop", 0.0},
         {"resid_pdrop", 0.0},                {"initializer_range", 0.02}, {"n_inner", nullptr},
         {"scale_attn_weights", true},        {"use_cache", true}};
  }
  c["architectures"] = {spec.hf_architecture};
  c["model_type"] = "gpt2";
  c["vocab_size"] = spec.vocab_size;
  c["n_positions"] = spec.max_seq;
  c["n_ctx"] = spec.max_seq;
  c["n_embd"] = spec.d_model;
  c["n_layer"] = spec.n_layer;
  c["n_head"] = spec.n_head;
  c["layer_norm_epsilon"] = ShortDecimal(spec.block.norm_eps);
  c["tie_word_embeddings"] = spec.head.tied;
  return c;
}

}  // namespace strata::models
