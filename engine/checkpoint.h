// SPDX-License-Identifier: Apache-2.0
// Checkpoints: strata's own state (fp32 master weights and Adam moments),
// beside it a Hugging Face model directory of the same weights (loadable by
// transformers.AutoModelForCausalLM.from_pretrained: GPT2LMHeadModel for
// GPT-2), and a manifest (config, step, data position, loss-scaler state, a
// crc32c of every file).
//
//   DIR/step-000040/master.safetensors       fp32 master weights, HF names/layouts (the resume's)
//   DIR/step-000040/optimizer.safetensors    exp_avg.<name>, exp_avg_sq.<name> (the moments' dtype:
//                                            fp32, or bf16 with bf16.bf16_optimizer_states)
//   DIR/step-000040/model.safetensors        the HF weights (engine/hf_weights_writer.h) in
//     or model-0000N-of-0000M.safetensors    trainer.save_dtype (bf16 by default, or fp32),
//     and model.safetensors.index.json       sharded at trainer.save_max_shard_size (5GB)
//   DIR/step-000040/config.json              the family's HF config of the trained shape
//   DIR/step-000040/generation_config.json
//   DIR/step-000040/tokenizer.json, ...      the source model's tokenizer files, when it had them
//   DIR/step-000040/manifest.json
//   DIR/latest                               "step-000040"
//
// Streaming: one unit's master/m/v is read from the store at a time and each
// of its parameters appended to the three weights files; a HF shard is open
// from its first tensor to its last, so no more than a unit's state is in
// host memory. With save_dtype fp32 the HF weights repeat the masters' bytes
// (the disk holds both: 8 bytes a parameter beside the 8 of the moments).
// A checkpoint from before master.safetensors (fp32 masters in
// model.safetensors, the manifest without files.master) still resumes.
//
// Saving is atomic: everything is written into a temporary directory
// (DIR/.step-000040.tmp.PID), fsynced, renamed into place, and only then
// does `latest` move (written to a temp file, fsynced, renamed). A crash at
// any point leaves the previous checkpoint and `latest` intact (the
// leftovers are reclaimed by the next run: engine/save_dir.h).
//
// Integrity: the manifest records each file's crc32c and size and the step
// (manifest fields "checksums" and "step"; every safetensors file carries the
// step in its metadata too), and a crc32c of itself ("manifest_crc32c":
// of the manifest without that field, as compact JSON with sorted keys).
// Loading verifies all of it before anything is loaded: a flipped byte, a
// truncated file, a file copied in from another step is DataLoss naming the
// file. A checkpoint written before checksums existed loads with a warning
// that it could not be verified.
//
// Resuming restores the fp32 master weights and moments exactly; the
// low-precision parameters are the master rounded again (which is what the
// optimizer had written), so a resumed run continues bit-identically.
// Moments saved in another dtype than the shards hold are converted: bf16
// into fp32 exactly, fp32 into bf16 rounded to nearest even (the trainer
// refuses that config change unless --allow-config-change: engine/config_change.h).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "base/status.h"
#include "models/model_spec.h"
#include "optim/loss_scaler.h"

namespace strata {

// One unit of the model as the trainer holds it (engine/model_state.h), in
// unit order: reads and writes its fp32 master, m and v as host arrays of
// `numel` (the moments widened from, and rounded to, `moment_dtype`, which
// is the dtype the checkpoint stores them in).
struct CheckpointShard {
  int64_t numel = 0;
  DType moment_dtype = DType::kF32;  // kF32 or kBF16
  std::function<Status(float* master, float* m, float* v)> read;
  std::function<Status(const float* master, const float* m, const float* v)> write;
};

struct TrainState {
  int64_t step = 0;
  uint64_t data_position = 0;
  optim::LossScaler::State scaler;
  std::string precision;
};

// What a save writes beside the state.
struct CheckpointExtras {
  nlohmann::json config;     // the run's config, recorded in the manifest
  std::string model_source;  // the directory the model came with (engine/hf_export.h); "" = none
  std::ostream* log = nullptr;  // "saved checkpoint DIR/step-N" when given
  DType hf_dtype = DType::kBF16;               // the HF weights' dtype: kBF16 or kF32
  uint64_t hf_max_shard_bytes = 5'000'000'000;  // their max_shard_size
};

// "step-000040".
std::string CheckpointStepName(int64_t step);

// The units SaveCheckpoint reads (CheckpointShard::read), in its order: the
// other ranks of a partitioned state join each read's gather in this order.
std::vector<size_t> CheckpointUnitReads(const models::ModelSpec& model);

// Writes a checkpoint of `state` under `dir` (created if needed) and returns
// the step directory's path.
Result<std::string> SaveCheckpoint(const std::string& dir, const models::ModelSpec& model,
                                   const std::vector<CheckpointShard>& shards, const TrainState& state,
                                   const CheckpointExtras& extras);

// What a checkpoint's manifest says, for the checks before a resume: the
// step directory `dir` resolves to (as LoadCheckpoint resolves it), its step,
// and the effective config it recorded (ConfigToJson's; null in a manifest
// without one).
struct CheckpointManifest {
  std::string path;
  int64_t step = 0;
  nlohmann::json config;
};
Result<CheckpointManifest> ReadCheckpointManifest(const std::string& dir);

// Reads the checkpoint at `dir` (a step directory, or a save directory whose
// `latest` names one) into the shards and `state`; `path` gets the step
// directory. First every file is verified against the manifest (DataLoss
// naming the file that does not match: its crc32c, its size, or its step),
// then a model whose shape differs, a tensor of the wrong shape or dtype is
// an error naming the file and the tensor; only a failure of a shard's own
// write (the store) can stop the load part-way. Warnings (a checkpoint
// saved without checksums) go to `log` when given.
Status LoadCheckpoint(const std::string& dir, const models::ModelSpec& model,
                      const std::vector<CheckpointShard>& shards, TrainState* state, std::string* path,
                      std::ostream* log = nullptr);

// The step directory `dir` names (itself, or what its `latest` names).
Result<std::string> ResolveCheckpoint(const std::string& dir);

}  // namespace strata
