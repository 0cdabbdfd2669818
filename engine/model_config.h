// SPDX-License-Identifier: Apache-2.0
// The model and the dtypes a training config describes: the family's spec
// (models/model_spec.h) from the config's `model` section, the compute dtype
// from its precision, and the dtype the optimizer reads gradients in.
//
// Thread-safety: free functions.
#pragma once

#include <string>

#include "base/dtype.h"
#include "base/status.h"
#include "engine/config.h"
#include "models/family.h"
#include "models/model_spec.h"

namespace strata {

// InvalidArgument naming "<source>: model" and the field when the section is off.
Result<models::ModelSpec> ModelSpecFor(const Config& c);

// The model that Hugging Face GPT-2 weights are (a safetensors file, or a
// model directory, sharded or not: engine/hf_weights.h; for a
// config without a "model" section and --init-from): the layers, width,
// vocabulary and positions from the tensors' shapes (wte, wpe, h.<l>.*, with
// or without the "transformer." prefix), the heads from the config.json
// beside the file ("n_head" or "num_attention_heads": without it an error,
// as the heads change no shape and a guess would train another model), and
// the weights' dtype ("bf16", "fp16", "fp32"). `n_head_from` says where the
// heads came from. Errors name the file and the tensor.
//
// A config.json in the model's directory (of `path`, or `path` itself when
// it is a directory) whose "architectures" names a family other than GPT-2
// (models/family.h: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)
// gives the whole model instead, seq_len its max_position_embeddings; an
// architecture no family has is an error naming it and the supported ones.
struct WeightsModel {
  ModelConfig model;
  std::string dtype;
  std::string n_head_from;
  bool from_config_json = false;  // the model is the config.json's
};
Result<WeightsModel> ModelFromHfWeights(const std::string& path);

// The run's sequence length against the model it starts from: with
// --init-from a model directory (or a file in one) whose config.json gives
// the positions the model was made for (max_position_embeddings; GPT-2's
// n_positions), the config's model.seq_len must be at most that many. A
// config without a model section takes max_position_embeddings
// (ModelFromHfWeights); one with a model section may set a shorter
// seq_len, never a longer one: InvalidArgument naming both fields, their
// values and the file. No config.json, or one without either field: OK
// (the weights' shapes are checked when they load).
Status CheckSeqLenWithinSource(const Config& c, const std::string& init_from);

// The model strata's `model` section describes, family-neutral, and back.
models::ModelDesc DescOf(const ModelConfig& m);
ModelConfig ConfigOf(const models::ModelDesc& d);

// bf16, fp16 or fp32: the parameters' and activations' dtype.
DType ComputeDType(const Config& c);

// The gradients the optimizer reads: bf16 in bf16 training (as DeepSpeed's
// bf16 ZeRO-3), fp32 otherwise. Whatever this is, every gradient is
// accumulated over the micro-batches in fp32 on the GPU and rounded once, so
// all placements compute the same update.
inline DType GradDType(DType compute) { return compute == DType::kBF16 ? DType::kBF16 : DType::kF32; }

// The Adam moments' storage dtype: bf16 with bf16.bf16_optimizer_states,
// else fp32. (The master weights are fp32 either way.)
inline DType MomentDType(const Config& c) { return c.bf16_optimizer_states ? DType::kBF16 : DType::kF32; }

// FLOPs per trained token as the MFU convention counts them: 6 N for the
// parameter GEMMs forward and backward, plus 12 L d T for attention.
double ModelFlopsPerToken(const models::ModelSpec& m, int64_t seq);

}  // namespace strata
