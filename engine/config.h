// SPDX-License-Identifier: Apache-2.0
// Training configuration: a DeepSpeed ds_config.json, read as it is, plus
// strata's own `model`, `data` and `trainer` sections.
//
// Rules:
// - Keys strata implements are parsed and validated; a bad value is an error
//   naming the key's path, the value and what is allowed.
// - DeepSpeed keys strata does not implement are accepted with one warning
//   each, unless ignoring them would change the training result (e.g.
//   `amp.enabled: true`, `elasticity.enabled: true`): then an error says why.
// - A key neither DeepSpeed nor strata knows is an error naming the key, its
//   path and the nearest known key, so a typo is never silently ignored.
// - `train_batch_size = micro_batch × gradient_accumulation_steps × world`;
//   any two determine the third; all three inconsistent is an error stating
//   the rule and the numbers; none of them is an error (as in DeepSpeed).
// - Hugging Face-style "auto" values are resolved as the HF Trainer does,
//   from the config's `trainer` section, the run's steps, the model's width
//   and dtype (engine/config_auto.h); one error lists every "auto" that
//   nothing resolves.
// - Every error of a file is reported at once, each with its key path (one
//   error per line; a single error is just its line).
// - A file is read with limits (engine/config_json.h): a regular file of at
//   most 4 MiB, 64 levels deep, each key once per object.
// - Paths in a file (data.path, data.val_path, nvme_path) are relative to
//   the file's folder.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule_spec.h"

namespace strata {

// Defaults: each field's initializer is its one default, what a config file
// that leaves the key out gets (ParseConfig starts from a default-constructed
// Config): DeepSpeed's, so that a DeepSpeed user's config means here what it
// means to DeepSpeed, but where a comment says otherwise. The built-in demo
// (`strata train` with no --config) is DefaultConfig(), which sets its own
// values (configs/default.json spells them out). Configs compare field by
// field (operator==).

struct Fp16Config {
  bool enabled = false;
  // The loss scaler's settings; the defaults are optim::LossScalerConfig's.
  double loss_scale = optim::LossScalerConfig{}.loss_scale;  // 0 = dynamic
  int initial_scale_power = optim::LossScalerConfig{}.initial_scale_power;
  int loss_scale_window = static_cast<int>(optim::LossScalerConfig{}.loss_scale_window);
  int hysteresis = optim::LossScalerConfig{}.hysteresis;
  bool consecutive_hysteresis = optim::LossScalerConfig{}.consecutive_hysteresis;
  double min_loss_scale = optim::LossScalerConfig{}.min_loss_scale;
  bool operator==(const Fp16Config&) const = default;
};

struct OptimizerConfig {
  // "Adam" or "AdamW" (DeepSpeed names, case-insensitive). Without an
  // "optimizer" section DeepSpeed uses the client's optimizer; strata has
  // none but its own, and uses AdamW.
  std::string type = "AdamW";
  double lr = 1e-3;               // torch's Adam default, as DeepSpeed's Adam
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool adam_w_mode = true;        // decoupled weight decay (DeepSpeed Adam's default)
  bool bias_correction = true;
  bool operator==(const OptimizerConfig&) const = default;
};

struct SchedulerConfig {
  std::string type;               // "" = constant lr; else a type of optim::LrScheduleSpecs()
  optim::LrParamValues params;    // the type's parameters given (optim/lr_schedule_spec.h)
  bool operator==(const SchedulerConfig&) const = default;
};

struct OffloadConfig {
  std::string device = "none";    // none | cpu | nvme
  std::string nvme_path;
  // DeepSpeed's default is false (pageable); strata pins its host tier
  // unless told not to: pinning changes only the speed of the copies.
  bool pin_memory = true;
  int buffer_count = 5;           // offload_param's; offload_optimizer's is 4 (ZeroConfig)
  uint64_t buffer_size = 100'000'000;
  uint64_t max_in_cpu = 1'000'000'000;
  bool pipeline_read = false, pipeline_write = false;  // offload_optimizer only
  // offload_optimizer only: DeepSpeed's partial offload (ZeRO-Offload++
  // "Twin-Flow", ZeRO stage 3; DeepSpeed: "Percentage of offloaded optimizer
  // states to CPU Adam"), in [0, 1]. The fraction of the optimizer state
  // (fp32 master, m, v) offloaded to `device` and updated there by the CPU
  // Adam; the rest stays on the GPU with its gradients and parameters and is
  // updated by the fused GPU Adam. strata keeps a forward-order prefix of
  // whole shards (embedding, block 0, 1, ..., ln_f) on the GPU: the longest
  // with at most (1 - ratio) of the parameters, so at least `ratio` is
  // offloaded (DeepSpeed likewise keeps its first sub-groups on the GPU).
  // 1 = all offloaded; 0 = all on the GPU. A ratio < 1 needs device "cpu" or
  // "nvme" (with "none" it is a config error: the planner decides there).
  // With "nvme" the offloaded part lives on NVMe. The results are the same
  // bits whatever the ratio (the GPU Adam computes the CPU Adam's bits).
  double ratio = 1.0;
  bool operator==(const OffloadConfig&) const = default;
};

// offload_optimizer's defaults: offload_param's but for buffer_count (4 in DeepSpeed).
inline OffloadConfig OptimizerOffloadDefaults() {
  OffloadConfig c;
  c.buffer_count = 4;
  return c;
}

struct ZeroConfig {
  // 0 as in DeepSpeed. On one rank stages 0-3 place the same (nothing to
  // partition across); the plan says so (engine/budgets.h ZeroStageNote).
  int stage = 0;
  OffloadConfig offload_param;
  OffloadConfig offload_optimizer = OptimizerOffloadDefaults();
  bool overlap_comm = true;
  uint64_t reduce_bucket_size = 500'000'000;
  uint64_t allgather_bucket_size = 500'000'000;
  uint64_t prefetch_bucket_size = 50'000'000;
  uint64_t max_live_parameters = 1'000'000'000;
  uint64_t max_reuse_distance = 1'000'000'000;
  uint64_t param_persistence_threshold = 100'000;
  uint64_t sub_group_size = 1'000'000'000;
  bool operator==(const ZeroConfig&) const = default;
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  int number_checkpoints = 0;     // 0 = every layer (strata checkpoints each layer's input)
  bool operator==(const ActivationCheckpointingConfig&) const = default;
};

struct AioConfig {
  uint64_t block_size = 1 << 20;
  int queue_depth = 8;
  int intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
  bool operator==(const AioConfig&) const = default;
};

// strata's own section; the defaults are the built-in demo GPT (`make run`).
// rope_scaling (Llama family): Hugging Face's fields.
struct RopeScalingConfig {
  std::string rope_type = "default";  // default | linear | llama3 ("type" is its older name)
  double factor = 1;
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  int64_t original_max_position_embeddings = 8192;   // llama3
  bool operator==(const RopeScalingConfig&) const = default;
};

// The model: its architecture (a family of models/family.h, or a Hugging
// Face class of one) and shape; the Llama family's fields under their HF names.
struct ModelConfig {
  int n_layer = 4;
  int n_embd = 128;
  int n_head = 4;
  int vocab_size = 256;
  int seq_len = 128;
  std::string arch = "gpt2";  // gpt2 | llama | GPT2LMHeadModel | LlamaForCausalLM | MistralForCausalLM | Qwen2ForCausalLM
  // llama:
  int n_kv_head = 0;              // num_key_value_heads; 0 = n_head
  int intermediate_size = 0;      // required for llama
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  RopeScalingConfig rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;    // q/k/v biases: Qwen2ForCausalLM's (always), an error for other classes
  bool operator==(const ModelConfig&) const = default;
};

struct DataConfig {
  std::string path;               // text (byte tokens), llm.c uint16/uint32 or raw uint16/uint32 token file; "" = the bundled corpus
  std::string format = "auto";    // auto | text | tokens (uint16) | tokens32 (uint32)
  std::string val_path;           // held-out file; empty = split off the tail of `path`
  double val_fraction = 0.05;
  std::string sampling = "random";  // random | sequential
  uint64_t seed = 1337;
  bool operator==(const DataConfig&) const = default;
};

struct TrainerConfig {
  int64_t steps = 40;
  uint64_t seed = 1234;
  int64_t eval_interval = 0;      // steps between validation losses; 0 = only at the end
  int eval_batches = 4;
  // Host-state optimizer shards updated on the GPU with their master/m/v
  // streamed over PCIe (beside the CPU Adam, which takes the other shards):
  // "auto" = when training on a GPU with the optimizer state in host memory
  // and resident parameters; "on" = also on the CPU backend's stand-in
  // (tests); "off". The results are the same bits either way.
  std::string gpu_assisted_optimizer = "auto";
  // With gradient accumulation: "layer-major" runs every micro-batch through
  // a layer before the next (each layer's parameters cross PCIe once per
  // step; checkpoints of all micro-batches are kept); "micro-batch-major"
  // runs each micro-batch through the whole model in turn (one micro-batch's
  // checkpoints; parameters stream once per micro-batch; each layer's fp32
  // gradient accumulator persists across the micro-batches). Same results.
  std::string schedule = "layer-major";
  // The NVMe tier's checksum of every block it writes, verified on every
  // read (tiers/nvme/nvme_tier.h): "crc32c" (the CPU's instruction, faster
  // than the drive), "xxh64", or "none" (a swap file changed under the run
  // then goes unnoticed).
  std::string nvme_checksum = "crc32c";
  // The Hugging Face weights a checkpoint carries (engine/checkpoint.h):
  // their dtype, "bf16" or "fp32" (the fp32 masters themselves, which then
  // are the resume's too), and the most bytes a safetensors shard holds, as
  // transformers' save_pretrained(max_shard_size=) counts them ("5GB" =
  // 5e9 bytes, "5GiB" = 5 x 2^30; a larger tensor gets a shard of its own).
  std::string save_dtype = "bf16";
  std::string save_max_shard_size = "5GB";
  bool operator==(const TrainerConfig&) const = default;
};

struct Config {
  std::string source;             // file name for messages
  // DeepSpeed has no default batch size (a config file must give one: an
  // error otherwise); 1 for a Config built in code. The demo's is 8.
  int64_t train_batch_size = 1;   // micro_batch × grad_accum × world_size
  int64_t micro_batch = 1;        // train_micro_batch_size_per_gpu
  int64_t grad_accum = 1;         // gradient_accumulation_steps
  int world_size = 1;
  Fp16Config fp16;
  bool bf16 = false;
  // bf16.bf16_optimizer_states (DeepSpeed's name): the Adam moments m and v
  // stored in bf16 (rounded to nearest even after each update, computed in
  // fp32); the master weights stay fp32. 8 bytes of optimizer state per
  // parameter instead of 12. Needs bf16.enabled.
  bool bf16_optimizer_states = false;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  // 0 = off: DeepSpeed's code (GRADIENT_CLIPPING_DEFAULT); its docs say 1.0.
  double gradient_clipping = 0;
  ZeroConfig zero;
  ActivationCheckpointingConfig activation_checkpointing;
  AioConfig aio;
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  ModelConfig model;
  DataConfig data;
  TrainerConfig trainer;

  // "bf16", "fp16" or "fp32".
  std::string precision() const { return bf16 ? "bf16" : fp16.enabled ? "fp16" : "fp32"; }
  bool operator==(const Config&) const = default;
};

// What a run knows beside its config file: for the batch rule, for "auto"
// values (engine/config_auto.h) and for a config without a model.
struct ConfigSources {
  int world_size = 1;                    // from the launcher
  int64_t steps = -1;                    // the command line's --steps (-1: none; then trainer.steps)
  std::string model_dtype;               // "bf16", "fp16" or "fp32": the dtype of the weights a run starts
                                         // from (--init-from), "" unknown
  // The model of a config without a "model" section (e.g. the shape of the
  // --init-from weights); unset: such a config gets ModelConfig's defaults,
  // or the error below.
  std::optional<ModelConfig> model;
  bool require_model = false;            // no "model" section and no `model`: an error saying how to give one
};

// Parses `j` (the whole config). Warnings for accepted-but-ignored DeepSpeed
// keys are appended to `warnings`. Every error is reported in one
// InvalidArgument, one per line.
Result<Config> ParseConfig(const nlohmann::json& j, const std::string& source, const ConfigSources& sources,
                           std::vector<std::string>* warnings);
// The same with only the launcher's world size known.
Result<Config> ParseConfig(const nlohmann::json& j, const std::string& source, int world_size,
                           std::vector<std::string>* warnings);

// Reads (engine/config_json.h's limits: errors name the file, line and
// column) and parses a file; relative paths in it are made relative to its
// folder.
Result<Config> LoadConfig(const std::string& path, const ConfigSources& sources, std::vector<std::string>* warnings);
Result<Config> LoadConfig(const std::string& path, int world_size, std::vector<std::string>* warnings);

// The world size a launcher gave this process: WORLD_SIZE (torchrun, the
// deepspeed launcher, accelerate), else OMPI_COMM_WORLD_SIZE (Open MPI's
// mpirun), else PMI_SIZE (MPICH / Hydra), else 1. `getenv` is the lookup
// (tests pass their own). InvalidArgument naming the variable and its value
// when it is not a positive integer.
Result<int> LauncherWorldSize(const std::function<const char*(const char*)>& getenv);

// The effective configuration as DeepSpeed-style JSON (what checkpoints
// record); ParseConfig of the result gives the same Config back.
nlohmann::json ConfigToJson(const Config& c);

// The built-in demo (`strata train` without --config, `make run`): the small
// GPT on the bundled corpus with GPT training's usual values where they are
// not DeepSpeed's defaults: micro batch 8, AdamW betas (0.9, 0.95), weight
// decay 0.1, gradient clipping 1.0, a log line every 5 steps (what
// configs/default.json writes out).
Config DefaultConfig();

// Levenshtein distance (for "did you mean" suggestions).
size_t EditDistance(const std::string& a, const std::string& b);

}  // namespace strata
