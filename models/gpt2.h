// SPDX-License-Identifier: Apache-2.0
// The GPT-2 family, exactly as Hugging Face's GPT2LMHeadModel: learned
// positions, pre-LayerNorm blocks, causal attention, a tanh-GELU MLP of width
// 4C, a final LayerNorm and an LM head tied to the token embedding; LayerNorm
// eps 1e-5; Conv1D weights stored [in, out] as transformers keeps them.
//
// Its block, as ops over named tensors (models/model_spec.h):
//   ln1 = LayerNorm(x)                       ln_1.weight, ln_1.bias
//   qkv = ln1 @ c_attn + b                   attn.c_attn.weight [C, 3C], .bias
//   att = causal attention(qkv)
//   x1  = x + att @ c_proj + b               attn.c_proj.weight [C, C], .bias
//   ln2 = LayerNorm(x1)                      ln_2.weight, ln_2.bias
//   h   = gelu(ln2 @ c_fc + b)               mlp.c_fc.weight [C, 4C], .bias
//   y   = x1 + h @ c_proj + b                mlp.c_proj.weight [4C, C], .bias
// Units: "emb" (transformer.wte [Vp, C] padded to a multiple of 128 rows,
// transformer.wpe [seq_len, C]), "blk<l>" (transformer.h.<l>.*), "lnf"
// (transformer.ln_f). Initialization as GPT2PreTrainedModel._init_weights:
// weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 n_layer)),
// biases 0, LayerNorm weights 1.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "models/model_spec.h"

namespace strata::models {

struct GptConfig {
  int64_t n_layer = 0;
  int64_t n_embd = 0;             // C
  int64_t n_head = 0;             // H; C % H == 0
  int64_t vocab_size = 0;         // V: real tokens
  int64_t padded_vocab_size = 0;  // Vp: multiple of 128, >= V; 0 = V rounded up to 128
  int64_t seq_len = 0;            // maximum T: rows of wpe (HF n_positions)
  float ln_eps = 1e-5f;

  // Vp: padded_vocab_size, or V rounded up to a multiple of 128 when 0.
  int64_t Vp() const;
  int64_t head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }
  // InvalidArgument naming the field and its value when something is off.
  Status Validate() const;
  // Trainable parameters, HF's count (tied head once, no vocab padding).
  int64_t NumParameters() const;
};

// The GPT-2 model of `config` (Validate()d first).
Result<ModelSpec> Gpt2Spec(const GptConfig& config);

// The family's registry entries (models/family.h): the spec of a
// description (n_layer, n_embd, n_head, vocab_size, seq_len, norm_eps as
// layer_norm_epsilon; the head is always tied), GPT2Config's config.json
// (n_layer, n_embd, n_head, vocab_size, n_positions, layer_norm_epsilon) and
// back (no dropout; n_positions the run's seq_len).
struct ModelDesc;
Result<ModelSpec> Gpt2FromDesc(const ModelDesc& desc);
Result<ModelDesc> Gpt2ReadHfConfig(const nlohmann::json& config, const std::string& path);
Result<nlohmann::json> Gpt2WriteHfConfig(const ModelSpec& spec, nlohmann::json base);

}  // namespace strata::models
