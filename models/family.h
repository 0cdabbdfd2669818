// SPDX-License-Identifier: Apache-2.0
// The model families and how a model is named: a small registry from an
// architecture ("gpt2", "llama", or a Hugging Face `architectures` class such
// as "LlamaForCausalLM") to the family's ModelSpec builder and its
// config.json reader and writer. Everything above models/ (the trainer,
// checkpoints, the planner, HF export) goes through these functions and
// names no family; a new family is one file (its spec and its config.json
// mapping) and a line in family.cc.
//
// Supported: gpt2 (GPT2LMHeadModel), llama (LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM). Anything else is InvalidArgument
// naming the architecture and the supported list.
//
// Thread-safety: free functions over immutable tables.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "kernels/rope_params.h"
#include "models/model_spec.h"

namespace strata::models {

// A model as a config names it, family-neutral: strata's `model` section or
// a Hugging Face config.json. Fields a family does not use are ignored.
struct ModelDesc {
  std::string arch = "gpt2";         // a family name or a HF class (FindFamily)
  std::string hf_architecture;       // the HF class; "" = the family's first
  int64_t n_layer = 0, n_embd = 0, n_head = 0;
  int64_t n_kv_head = 0;             // llama: key/value heads; 0 = n_head
  int64_t intermediate_size = 0;     // llama: F
  int64_t vocab_size = 0;
  int64_t seq_len = 0;               // the longest sequence trained
  double norm_eps = 0;               // 0 = the family's default (gpt2 1e-5, llama 1e-6)
  kernels::RopeParams rope;          // llama
  bool tie_word_embeddings = false;  // llama (gpt2 is always tied)
  bool attention_bias = false;       // llama: q/k/v biases (Qwen2 always)
  int64_t sliding_window = 0;        // llama (Mistral, Qwen2): 0 = none
};

struct Family {
  const char* name;                            // "gpt2", "llama"
  std::vector<std::string> hf_architectures;   // the first is the default class
  // The spec of a description (its arch already resolved to this family).
  Result<ModelSpec> (*build)(const ModelDesc&);
  // A HF config.json (`path` for messages) as a description; seq_len is
  // max_position_embeddings (n_positions).
  Result<ModelDesc> (*read_hf_config)(const nlohmann::json&, const std::string& path);
  // config.json of a spec of this family over `base` (the source model's
  // config.json, or empty): its class and fields replaced.
  Result<nlohmann::json> (*write_hf_config)(const ModelSpec&, nlohmann::json base);
};

// Every family, in a fixed order.
const std::vector<Family>& Families();
// The family of `arch` (a family name or any of its HF classes); else
// InvalidArgument naming it and what is supported.
Result<const Family*> FindFamily(const std::string& arch);
// "gpt2 (GPT2LMHeadModel), llama (LlamaForCausalLM, ...)".
std::string SupportedArchitectures();

Result<ModelSpec> BuildModel(const ModelDesc& desc);
// The family from `architectures` (or model_type when there is none).
Result<ModelDesc> ReadHfConfig(const nlohmann::json& config, const std::string& path);
Result<nlohmann::json> WriteHfConfig(const ModelSpec& spec, nlohmann::json base);

}  // namespace strata::models
