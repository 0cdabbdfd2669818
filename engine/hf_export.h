// SPDX-License-Identifier: Apache-2.0
// What a step directory carries beside the weights so that Hugging Face
// loads it as a model directory (AutoModelForCausalLM.from_pretrained,
// AutoTokenizer.from_pretrained): the family's config.json, a
// generation_config.json, and the tokenizer files of the model the run
// started from.
//
//   config.json             the family's (models/family.h: GPT2LMHeadModel,
//                           LlamaForCausalLM, MistralForCausalLM,
//                           Qwen2ForCausalLM) with the trained shape; the
//                           source model's own config.json is the base when
//                           it has one (its token ids, dropouts, ...), the
//                           shape fields replaced (GPT-2: n_positions is the
//                           run's seq_len, the rows of the position table
//                           the weights hold), the family's style kept
//                           (Llama: RoPE as rope_parameters or
//                           rope_theta/rope_scaling, as the source wrote
//                           it), the weights' dtype under the source's key
//                           (transformers 5's "dtype", else "torch_dtype")
//   generation_config.json  the source model's, else transformers'
//                           GenerationConfig fields from the config
//                           (bos/eos token ids when known, else omitted)
//   tokenizer files         tokenizer.json, tokenizer_config.json,
//                           special_tokens_map.json, vocab.json, merges.txt,
//                           added_tokens.json, ... copied when the source has them
//
// The source is the model directory of --init-from (or the directory of an
// --init-from file), or, after --resume, the checkpoint resumed from, so a
// fine-tuning run's every checkpoint keeps what the model came with.
//
// Thread-safety: free functions.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "models/model_spec.h"

namespace strata {

// config.json for `spec` (over `source_dir`'s config.json when it has one;
// "" = none), its torch_dtype ("bfloat16", "float32") that of the weights
// beside it. Unavailable for a family transformers has no class for here.
Result<nlohmann::json> HfConfigJson(const models::ModelSpec& spec, const std::string& source_dir,
                                    const std::string& torch_dtype);

// generation_config.json: `source_dir`'s when it has one, else built from `config`.
Result<nlohmann::json> HfGenerationConfig(const nlohmann::json& config, const std::string& source_dir);

// The tokenizer files (names) `source_dir` holds, in a fixed order; none for "".
std::vector<std::string> TokenizerFiles(const std::string& source_dir);

// The directory a model's files come with: `init_from` itself when it is a
// directory, else the directory of the file; "" for "".
std::string ModelSourceDir(const std::string& init_from);

}  // namespace strata
