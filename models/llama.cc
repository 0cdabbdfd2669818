// SPDX-License-Identifier: Apache-2.0
#include "models/llama.h"

#include <cmath>
#include <string>
#include <vector>

#include "models/family.h"
#include "models/hf_config_fields.h"

namespace strata::models {

namespace {

std::string Str(int64_t v) { return std::to_string(v); }

constexpr ParamInit kZeros{ParamInit::kZeros, 0};
constexpr ParamInit kOnes{ParamInit::kOnes, 0};

BlockSpec LlamaBlock(const LlamaConfig& c) {
  const int64_t C = c.n_embd, D = c.head_dim(), H = c.n_head, KV = c.kv(), F = c.intermediate_size;
  const ParamInit w{ParamInit::kNormal, c.initializer_range};
  BlockSpec b;
  b.norm_eps = c.rms_norm_eps;
  b.rope = c.rope;
  // Offsets in the unit's buffer order. q, k, v follow each other with no
  // padding between them (as do their biases, and gate and up): a group
  // starts on the slice alignment and is one GEMM.
  struct Def {
    const char* name;
    std::vector<int64_t> shape;
    ParamInit init;
  };
  using Group = std::vector<Def>;
  std::vector<Group> buffer_order{{{"input_layernorm.weight", {C}, kOnes}},
                                  {{"self_attn.q_proj.weight", {H * D, C}, w},
                                   {"self_attn.k_proj.weight", {KV * D, C}, w},
                                   {"self_attn.v_proj.weight", {KV * D, C}, w}}};
  if (c.attention_bias)
    buffer_order.push_back({{"self_attn.q_proj.bias", {H * D}, kZeros},
                            {"self_attn.k_proj.bias", {KV * D}, kZeros},
                            {"self_attn.v_proj.bias", {KV * D}, kZeros}});
  buffer_order.push_back({{"self_attn.o_proj.weight", {C, H * D}, w}});
  buffer_order.push_back({{"post_attention_layernorm.weight", {C}, kOnes}});
  buffer_order.push_back({{"mlp.gate_proj.weight", {F, C}, w}, {"mlp.up_proj.weight", {F, C}, w}});
  buffer_order.push_back({{"mlp.down_proj.weight", {C, F}, w}});
  SliceLayout l;
  std::vector<BlockParam> placed;
  for (const Group& g : buffer_order) {
    int64_t total = 0;
    for (const Def& d : g) total += ShapeNumel(d.shape);
    int64_t at = l.Take(total);
    for (const Def& d : g) {
      const int64_t n = ShapeNumel(d.shape);
      placed.push_back(BlockParam{d.name, at, d.shape, n, d.init});
      at += n;
    }
  }
  // ... listed in Hugging Face's named_parameters() order.
  std::vector<std::string> hf_order{"self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
                                    "self_attn.k_proj.bias",   "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                                    "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                                    "mlp.down_proj.weight",    "input_layernorm.weight",  "post_attention_layernorm.weight"};
  for (const std::string& name : hf_order)
    for (const BlockParam& p : placed)
      if (p.name == name) b.params.push_back(p);

  auto op = [&b](OpKind kind, const char* in, const char* out) -> BlockOp& {
    b.ops.push_back(BlockOp{kind, in, out, "", "", "", false, false, {}, {}});
    return b.ops.back();
  };
  op(OpKind::kRmsNorm, "x", "h1").weight = "input_layernorm.weight";
  BlockOp& qkv = op(OpKind::kLinear, "h1", "qkv");
  qkv.transposed = true;
  qkv.weight = "self_attn.q_proj.weight";
  qkv.concat = {"self_attn.k_proj.weight", "self_attn.v_proj.weight"};
  if (c.attention_bias) {
    qkv.bias = "self_attn.q_proj.bias";
    qkv.concat_bias = {"self_attn.k_proj.bias", "self_attn.v_proj.bias"};
  }
  op(OpKind::kRope, "qkv", "qr");
  op(OpKind::kAttention, "qr", "att");
  BlockOp& o = op(OpKind::kLinear, "att", "x1");
  o.transposed = true, o.weight = "self_attn.o_proj.weight", o.residual = "x";
  op(OpKind::kRmsNorm, "x1", "h2").weight = "post_attention_layernorm.weight";
  BlockOp& gu = op(OpKind::kLinear, "h2", "gu");
  gu.transposed = true, gu.weight = "mlp.gate_proj.weight", gu.concat = {"mlp.up_proj.weight"};
  op(OpKind::kSwiGlu, "gu", "act");
  BlockOp& down = op(OpKind::kLinear, "act", "y");
  down.transposed = true, down.weight = "mlp.down_proj.weight", down.residual = "x1";
  return b;
}

}  // namespace

int64_t LlamaConfig::Vp() const { return PaddedVocab(vocab_size, padded_vocab_size); }

Status LlamaConfig::Validate() const {
  auto bad = [](const std::string& what) { return InvalidArgument("LlamaConfig: " + what); };
  RETURN_IF_ERROR(
      CheckTransformerShape("LlamaConfig", {n_layer, n_embd, n_head, vocab_size, padded_vocab_size, seq_len}));
  if (head_dim() % 2 != 0) return bad("head_dim = n_embd / n_head = " + Str(head_dim()) + " must be even (RoPE)");
  if (n_kv_head < 0 || n_head % kv() != 0)
    return bad("n_kv_head = " + Str(n_kv_head) + " must divide n_head = " + Str(n_head));
  if (intermediate_size < 1) return bad("intermediate_size = " + Str(intermediate_size) + " must be >= 1");
  if (sliding_window > 0 && sliding_window < seq_len)
    return bad("sliding_window = " + Str(sliding_window) + " is shorter than seq_len = " + Str(seq_len) +
               ": attention within a sliding window is not supported (train sequences <= the window)");
  if (!(rms_norm_eps > 0.f) || !std::isfinite(rms_norm_eps))
    return bad("rms_norm_eps = " + std::to_string(rms_norm_eps) + " must be finite and > 0");
  if (!(rope.theta > 0.f) || !std::isfinite(rope.theta))
    return bad("rope_theta = " + std::to_string(rope.theta) + " must be finite and > 0");
  if (!(rope.factor > 0.f)) return bad("rope_scaling factor = " + std::to_string(rope.factor) + " must be > 0");
  if (rope.type == kernels::RopeParams::kLlama3 &&
      (!(rope.high_freq_factor > rope.low_freq_factor) || rope.low_freq_factor <= 0.f ||
       rope.original_max_positions < 1))
    return bad("rope_scaling llama3 needs high_freq_factor > low_freq_factor > 0 and "
               "original_max_position_embeddings >= 1");
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  if (n_embd > kMaxDim || Vp() > kMaxDim || seq_len > kMaxDim || n_layer > kMaxDim || intermediate_size > kMaxDim)
    return bad("a dimension exceeds 2^24");
  return Status::OK();
}

Result<ModelSpec> LlamaSpec(const LlamaConfig& c) {
  RETURN_IF_ERROR(c.Validate());
  const int64_t C = c.n_embd;
  ModelSpec m;
  m.family = "llama";
  m.hf_architecture = c.hf_architecture;
  m.hf_base_prefix = "model.";
  m.n_layer = c.n_layer;
  m.d_model = C;
  m.n_head = c.n_head;
  m.n_kv_head = c.kv();
  m.vocab_size = c.vocab_size;
  m.padded_vocab = c.Vp();
  m.max_seq = c.seq_len;
  m.block = LlamaBlock(c);
  const ParamInit w{ParamInit::kNormal, c.initializer_range};

  auto add = [&m](std::string name, int unit, int64_t offset, std::vector<int64_t> shape, ParamInit init) {
    const int64_t n = ShapeNumel(shape);
    m.params.push_back(ParamSpec{std::move(name), unit, offset, std::move(shape), n, init});
  };
  // Unit 0: the token embedding (no position table).
  SliceLayout emb;
  m.embedding.token_offset = emb.Take(m.padded_vocab * C);
  m.embedding.position_offset = -1;
  m.units.push_back(UnitSpec{"emb", UnitKind::kEmbedding, -1, emb.numel()});
  add("model.embed_tokens.weight", 0, m.embedding.token_offset, {c.vocab_size, C}, w);
  // Units 1..L: the blocks.
  int64_t block_numel = 0;
  for (const BlockParam& p : m.block.params) block_numel = std::max(block_numel, AlignSlice(p.offset + p.numel));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const int u = ModelSpec::block_unit(l);
    m.units.push_back(UnitSpec{"blk" + Str(l), UnitKind::kBlock, static_cast<int>(l), block_numel});
    for (const BlockParam& p : m.block.params)
      add("model.layers." + Str(l) + "." + p.name, u, p.offset, p.shape, p.init);
  }
  // The final unit: the norm, and the LM head when untied.
  SliceLayout fin;
  m.head.norm = HeadSpec::Norm::kRmsNorm;
  m.head.norm_weight_offset = fin.Take(C);
  m.head.norm_bias_offset = -1;
  m.head.norm_eps = c.rms_norm_eps;
  m.head.tied = c.tie_word_embeddings;
  if (!m.head.tied) m.head.lm_head_offset = fin.Take(m.padded_vocab * C);
  const int f = static_cast<int>(m.units.size());
  m.units.push_back(UnitSpec{"final", UnitKind::kFinal, -1, fin.numel()});
  add("model.norm.weight", f, m.head.norm_weight_offset, {C}, kOnes);
  if (!m.head.tied) add("lm_head.weight", f, m.head.lm_head_offset, {c.vocab_size, C}, w);
  return m;
}

// ---- the registry's entries ----------------------------------------------------

namespace {

using kernels::RopeParams;

// The RoPE settings of a config.json: transformers 5's rope_parameters, or
// transformers 4's rope_theta and rope_scaling.
Result<RopeParams> ReadRope(const nlohmann::json& j, const HfFields& f) {
  RopeParams r;
  const nlohmann::json* scaling = nullptr;
  double theta = 10000.0;
  if (f.Has("rope_parameters")) {
    const nlohmann::json& p = j.at("rope_parameters");
    if (!p.is_object()) return InvalidArgument(f.path() + ": \"rope_parameters\" is not an object");
    ASSIGN_OR_RETURN(theta, f.RealIn(p, "rope_theta", 10000.0));
    scaling = &p;
  } else {
    ASSIGN_OR_RETURN(theta, f.Real("rope_theta", 10000.0));
    if (f.Has("rope_scaling")) {
      scaling = &j.at("rope_scaling");
      if (!scaling->is_object()) return InvalidArgument(f.path() + ": \"rope_scaling\" is not an object");
    }
  }
  r.theta = static_cast<float>(theta);
  if (!scaling) return r;
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (scaling->contains(key) && scaling->at(key).is_string()) {
      type = scaling->at(key).get<std::string>();
      break;
    }
  if (type == "default") return r;
  if (type != "linear" && type != "llama3")
    return InvalidArgument(f.path() + ": rope type \"" + type + "\" is not supported (default, linear, llama3)");
  r.type = type == "linear" ? RopeParams::kLinear : RopeParams::kLlama3;
  ASSIGN_OR_RETURN(const double factor, f.RealIn(*scaling, "factor", -1));
  if (factor <= 0) return InvalidArgument(f.path() + ": rope type " + type + " without a \"factor\"");
  r.factor = static_cast<float>(factor);
  if (r.type == RopeParams::kLlama3) {
    ASSIGN_OR_RETURN(const double lo, f.RealIn(*scaling, "low_freq_factor", 1.0));
    ASSIGN_OR_RETURN(const double hi, f.RealIn(*scaling, "high_freq_factor", 4.0));
    ASSIGN_OR_RETURN(const double orig, f.RealIn(*scaling, "original_max_position_embeddings", 8192));
    r.low_freq_factor = static_cast<float>(lo);
    r.high_freq_factor = static_cast<float>(hi);
    r.original_max_positions = static_cast<int64_t>(orig);
  }
  return r;
}

nlohmann::json RopeScalingJson(const RopeParams& r) {
  if (r.type == RopeParams::kDefault) return nullptr;
  nlohmann::json s{{"rope_type", r.type == RopeParams::kLinear ? "linear" : "llama3"}, {"factor", ShortDecimal(r.factor)}};
  if (r.type == RopeParams::kLlama3) {
    s["low_freq_factor"] = ShortDecimal(r.low_freq_factor);
    s["high_freq_factor"] = ShortDecimal(r.high_freq_factor);
    s["original_max_position_embeddings"] = r.original_max_positions;
  }
  return s;
}

const char* ModelType(const std::string& arch) {
  if (arch == "MistralForCausalLM") return "mistral";
  if (arch == "Qwen2ForCausalLM") return "qwen2";
  return "llama";
}

}  // namespace

Result<ModelSpec> LlamaFromDesc(const ModelDesc& d) {
  LlamaConfig c;
  c.hf_architecture = d.hf_architecture.empty() ? "LlamaForCausalLM" : d.hf_architecture;
  c.n_layer = d.n_layer;
  c.n_embd = d.n_embd;
  c.n_head = d.n_head;
  c.n_kv_head = d.n_kv_head;
  c.intermediate_size = d.intermediate_size;
  c.vocab_size = d.vocab_size;
  c.seq_len = d.seq_len;
  c.rms_norm_eps = d.norm_eps > 0 ? static_cast<float>(d.norm_eps) : 1e-6f;
  c.rope = d.rope;
  c.tie_word_embeddings = d.tie_word_embeddings;
  // q/k/v biases alone are Qwen2's block (Llama's attention_bias biases
  // o_proj too, which this block does not compute).
  if (d.attention_bias && c.hf_architecture != "Qwen2ForCausalLM")
    return InvalidArgument("attention_bias (q/k/v biases) is Qwen2ForCausalLM's block, not " + c.hf_architecture +
                           "'s: give arch Qwen2ForCausalLM");
  c.attention_bias = c.hf_architecture == "Qwen2ForCausalLM";
  c.sliding_window = d.sliding_window;
  return LlamaSpec(c);
}

Result<ModelDesc> LlamaReadHfConfig(const nlohmann::json& j, const std::string& path) {
  HfFields f(j, path);
  ModelDesc d;
  d.arch = "llama";
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    d.hf_architecture = j["architectures"][0].get<std::string>();
  const bool qwen2 = d.hf_architecture == "Qwen2ForCausalLM";
  ASSIGN_OR_RETURN(d.n_layer, f.Int("num_hidden_layers", -1));
  ASSIGN_OR_RETURN(d.n_embd, f.Int("hidden_size", -1));
  ASSIGN_OR_RETURN(d.n_head, f.Int("num_attention_heads", -1));
  ASSIGN_OR_RETURN(d.n_kv_head, f.Int("num_key_value_heads", d.n_head));
  ASSIGN_OR_RETURN(d.intermediate_size, f.Int("intermediate_size", -1));
  ASSIGN_OR_RETURN(d.vocab_size, f.Int("vocab_size", -1));
  ASSIGN_OR_RETURN(d.seq_len, f.Int("max_position_embeddings", -1));
  ASSIGN_OR_RETURN(d.norm_eps, f.Real("rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(d.tie_word_embeddings, f.Bool("tie_word_embeddings", false));
  ASSIGN_OR_RETURN(const bool attention_bias, f.Bool("attention_bias", false));
  if (attention_bias && !qwen2)
    return InvalidArgument(path + ": \"attention_bias\": true (biases on q, k, v and o_proj) is not supported");
  d.attention_bias = qwen2;
  ASSIGN_OR_RETURN(const bool mlp_bias, f.Bool("mlp_bias", false));
  if (mlp_bias) return InvalidArgument(path + ": \"mlp_bias\": true is not supported");
  ASSIGN_OR_RETURN(const std::string act, f.Text("hidden_act", "silu"));
  if (act != "silu") return InvalidArgument(path + ": \"hidden_act\" \"" + act + "\" is not supported (silu)");
  ASSIGN_OR_RETURN(const int64_t head_dim, f.Int("head_dim", d.n_embd / d.n_head));
  if (head_dim * d.n_head != d.n_embd)
    return InvalidArgument(path + ": \"head_dim\" " + std::to_string(head_dim) + " is not hidden_size / "
                           "num_attention_heads (" + std::to_string(d.n_embd / d.n_head) + "): not supported");
  ASSIGN_OR_RETURN(const bool use_sliding, f.Bool("use_sliding_window", !qwen2));
  if (use_sliding) {
    ASSIGN_OR_RETURN(d.sliding_window, f.Int("sliding_window", 0));
  }
  ASSIGN_OR_RETURN(d.rope, ReadRope(j, f));
  return d;
}

Result<nlohmann::json> LlamaWriteHfConfig(const ModelSpec& spec, nlohmann::json c) {
  const bool transformers5 = c.contains("rope_parameters");
  const bool fresh = c.empty();  // (then transformers 4's style, which both read)
  if (fresh) c = {{"attention_dropout", 0.0}, {"initializer_range", 0.02}, {"use_cache", true}};
  const BlockParam* gate = spec.block.Find("mlp.gate_proj.weight");
  if (!gate) return Internal("llama config.json: the block has no mlp.gate_proj.weight");
  c["architectures"] = {spec.hf_architecture};
  c["model_type"] = ModelType(spec.hf_architecture);
  c["hidden_act"] = "silu";
  c["vocab_size"] = spec.vocab_size;
  c["hidden_size"] = spec.d_model;
  c["intermediate_size"] = gate->shape[0];
  c["num_hidden_layers"] = spec.n_layer;
  c["num_attention_heads"] = spec.n_head;
  c["num_key_value_heads"] = spec.kv_heads();
  c["head_dim"] = spec.head_dim();
  // RoPE has no table: the source's longer context stays the model's.
  const int64_t base_max = c.contains("max_position_embeddings") && c["max_position_embeddings"].is_number_integer()
                               ? c["max_position_embeddings"].get<int64_t>() : 0;
  c["max_position_embeddings"] = std::max(base_max, spec.max_seq);
  c["rms_norm_eps"] = ShortDecimal(spec.block.norm_eps);
  c["tie_word_embeddings"] = spec.head.tied;
  if (spec.hf_architecture != "Qwen2ForCausalLM") {
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
  }
  // RoPE in the source's style, so that a model round-trips with its
  // config's shape: transformers 5's rope_parameters, or transformers 4's
  // rope_theta and rope_scaling (the latter left out when the source left
  // it out and the scaling is the default). A transformers 5 file that
  // kept a top-level rope_theta beside rope_parameters gets both.
  const RopeParams& r = spec.block.rope;
  if (transformers5) {
    nlohmann::json p = RopeScalingJson(r);
    if (p.is_null()) p = {{"rope_type", "default"}};
    p["rope_theta"] = ShortDecimal(r.theta);
    c["rope_parameters"] = p;
    if (c.contains("rope_theta")) c["rope_theta"] = ShortDecimal(r.theta);
    if (c.contains("rope_scaling")) c["rope_scaling"] = RopeScalingJson(r);
  } else {
    c["rope_theta"] = ShortDecimal(r.theta);
    if (fresh || c.contains("rope_scaling") || r.type != RopeParams::kDefault) c["rope_scaling"] = RopeScalingJson(r);
  }
  return c;
}

}  // namespace strata::models
