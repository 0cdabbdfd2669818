// SPDX-License-Identifier: Apache-2.0
// The Llama family, exactly as Hugging Face's LlamaForCausalLM (and the
// same block as MistralForCausalLM and Qwen2ForCausalLM, which differ in
// config only: Qwen2 has q/k/v biases, `attention_bias`): no position table,
// pre-RMSNorm blocks, rotary position embeddings on q and k, grouped-query
// causal attention, a SwiGLU MLP, a final RMSNorm and an LM head (tied to the
// token embedding or not). Linear weights are nn.Linear's [out, in]
// (y = x W^T) as transformers stores them.
//
// Its block, as ops over named tensors (models/model_spec.h):
//   h1  = RMSNorm(x)                          input_layernorm.weight [C]
//   qkv = h1 @ [q_proj | k_proj | v_proj]^T   self_attn.{q,k,v}_proj.weight [H D, C], [KV D, C], [KV D, C]
//                                             (+ .bias with attention_bias)
//   qr  = RoPE(qkv) on the H + KV q and k heads
//   att = causal GQA attention(qr)
//   x1  = x + att @ o_proj^T                  self_attn.o_proj.weight [C, H D]
//   h2  = RMSNorm(x1)                         post_attention_layernorm.weight
//   gu  = h2 @ [gate_proj | up_proj]^T        mlp.{gate,up}_proj.weight [F, C]
//   act = silu(gu[:, :F]) * gu[:, F:]
//   y   = x1 + act @ down_proj^T              mlp.down_proj.weight [C, F]
// q, k, v (and their biases) are adjacent in the unit, as are gate and up,
// so each group is one GEMM.
// Units: "emb" (model.embed_tokens [Vp, C]), "blk<l>" (model.layers.<l>.*),
// "final" (model.norm, and lm_head [Vp, C] when untied). Initialization as
// LlamaPreTrainedModel._init_weights: weights N(0, initializer_range 0.02),
// biases 0, RMSNorm weights 1.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "kernels/rope_params.h"
#include "models/model_spec.h"

namespace strata::models {

struct LlamaConfig {
  std::string hf_architecture = "LlamaForCausalLM";  // or MistralForCausalLM, Qwen2ForCausalLM
  int64_t n_layer = 0;            // num_hidden_layers
  int64_t n_embd = 0;             // hidden_size (C)
  int64_t n_head = 0;             // num_attention_heads (H); C % H == 0, head_dim C / H even
  int64_t n_kv_head = 0;          // num_key_value_heads (KV); 0 = H; H % KV == 0
  int64_t intermediate_size = 0;  // F
  int64_t vocab_size = 0;         // V
  int64_t padded_vocab_size = 0;  // Vp: multiple of 128, >= V; 0 = V rounded up to 128
  int64_t seq_len = 0;            // the longest sequence trained (<= max_position_embeddings)
  float rms_norm_eps = 1e-6f;
  kernels::RopeParams rope;       // rope_theta, rope_scaling
  bool tie_word_embeddings = false;
  bool attention_bias = false;    // q/k/v biases (Qwen2)
  int64_t sliding_window = 0;     // Mistral/Qwen2: attention within a window; 0 = none (must cover seq_len)
  double initializer_range = 0.02;

  int64_t Vp() const;
  int64_t kv() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }
  // InvalidArgument naming the field and its value when something is off.
  Status Validate() const;
};

// The Llama-family model of `config` (Validate()d first).
Result<ModelSpec> LlamaSpec(const LlamaConfig& config);

// The family's registry entries (models/family.h). config.json: the
// architecture's own fields (num_hidden_layers, hidden_size,
// num_attention_heads, num_key_value_heads, intermediate_size, vocab_size,
// max_position_embeddings, rms_norm_eps, tie_word_embeddings,
// attention_bias; Qwen2 always has q/k/v biases), RoPE from transformers 5's
// rope_parameters {rope_theta, rope_type, ...} or transformers 4's top-level
// rope_theta and rope_scaling {rope_type | type, factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings}: types default, linear,
// llama3 (others: an error naming the type). What strata's block does not
// compute is an error naming the field: hidden_act other than silu, mlp_bias,
// Llama's attention_bias (it biases o_proj too), a head_dim other than
// hidden_size / num_attention_heads. The writer writes the same fields (RoPE
// in the base's style: rope_parameters when the base has it, else
// rope_theta/rope_scaling).
struct ModelDesc;
Result<ModelSpec> LlamaFromDesc(const ModelDesc& desc);
Result<ModelDesc> LlamaReadHfConfig(const nlohmann::json& config, const std::string& path);
Result<nlohmann::json> LlamaWriteHfConfig(const ModelSpec& spec, nlohmann::json base);

}  // namespace strata::models
