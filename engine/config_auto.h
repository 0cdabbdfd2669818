// SPDX-License-Identifier: Apache-2.0
// Hugging Face-style "auto" values (engine/config.cc's, internal), resolved
// as transformers' HfTrainerDeepSpeedConfig resolves them, from what strata
// knows in place of the HF Trainer's arguments: the config's `trainer`
// section (which takes TrainingArguments' names), the run's steps (--steps,
// else trainer.steps), the model's width (model.n_embd) and the dtype of the
// weights a run starts from (ConfigSources::model_dtype).
//
//   config key                                   resolved from
//   train_micro_batch_size_per_gpu               trainer.per_device_train_batch_size
//   gradient_accumulation_steps                  trainer.gradient_accumulation_steps
//   train_batch_size                             world × the two above (else the batch rule derives it)
//   gradient_clipping                            trainer.max_grad_norm
//   optimizer.params.lr                          trainer.learning_rate
//   optimizer.params.betas                       [trainer.adam_beta1, trainer.adam_beta2]
//   optimizer.params.eps                         trainer.adam_epsilon
//   optimizer.params.weight_decay                trainer.weight_decay
//   scheduler.params.warmup_min_lr               0
//   scheduler.params.warmup_max_lr               trainer.learning_rate, else optimizer.params.lr
//   scheduler.params.warmup_num_steps            trainer.warmup_steps, else ceil(trainer.warmup_ratio × steps)
//   scheduler.params.total_num_steps             the run's steps
//   fp16.enabled, bf16.enabled (bfloat16)        trainer.fp16 / trainer.bf16, else the weights' dtype
//   amp.enabled                                  false (strata has no Apex)
//   zero_optimization.reduce_bucket_size         n_embd²
//   zero_optimization.stage3_prefetch_bucket_size      0.9 n_embd² (stage 3)
//   zero_optimization.stage3_param_persistence_threshold  10 n_embd (stage 3)
//
// As in HF, a key given a value in the config that the trainer section also
// gives must agree (an error names both); the trainer's precision must be
// the config's. Where nothing resolves an "auto", one error lists every such
// key with what would resolve it, and the reader then takes those keys as
// absent (Ctx::unresolved) so that nothing is reported twice. Other "auto"
// values are the reader's: sizes that only tune performance keep their
// default, anything else is an error at its key.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/config.h"
#include "engine/config_reader.h"

namespace strata::config_internal {

// The `trainer` keys read here (TrainingArguments' names), which the reader
// of the trainer section takes as known.
const std::vector<std::string>& HfTrainerKeys();

// Fills the "auto" values of `j` (the whole config, an object) that the
// sources resolve; records errors and the unresolved keys in `ctx`.
void ResolveAuto(nlohmann::json* j, const ConfigSources& sources, Ctx* ctx);

}  // namespace strata::config_internal
