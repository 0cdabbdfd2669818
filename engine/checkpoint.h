// Checkpoints: model weights as safetensors under the model's Hugging Face
// names (loadable by transformers: GPT2LMHeadModel for GPT-2), optimizer
// state, and a manifest (config, step, data position, loss-scaler state).
//
//   DIR/step-000040/model.safetensors      fp32 master weights, HF names/layouts
//   DIR/step-000040/optimizer.safetensors  exp_avg.<name>, exp_avg_sq.<name> (fp32)
//   DIR/step-000040/manifest.json
//   DIR/latest                             "step-000040"
//
// Saving is atomic: everything is written into a temporary directory,
// fsynced, renamed into place, and only then does `latest` move (written to a
// temp file, fsynced, renamed). A crash at any point leaves the previous
// checkpoint and `latest` intact.
//
// Resuming restores the fp32 master weights and moments exactly; the
// low-precision parameters are the master rounded again (which is what the
// optimizer had written), so a resumed run continues bit-identically.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "models/model_spec.h"
#include "optim/loss_scaler.h"

namespace strata {

// One unit of the model as the trainer holds it (engine/model_state.h), in
// unit order: reads and writes its fp32 master, m and v as host arrays of `numel`.
struct CheckpointShard {
  int64_t numel = 0;
  std::function<Status(float* master, float* m, float* v)> read;
  std::function<Status(const float* master, const float* m, const float* v)> write;
};

struct TrainState {
  int64_t step = 0;
  uint64_t data_position = 0;
  optim::LossScaler::State scaler;
  std::string precision;
};

// Writes a checkpoint of `state` under `dir` (created if needed). `config`
// is recorded in the manifest. Progress lines go to `log` when given.
Status SaveCheckpoint(const std::string& dir, const models::ModelSpec& model,
                      const std::vector<CheckpointShard>& shards, const TrainState& state,
                      const nlohmann::json& config, std::ostream* log);

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
// `latest` names one) into the shards and `state`. A model whose shape
// differs, a missing or truncated file, a tensor of the wrong shape or dtype:
// each is an error naming the file and the tensor. Both files are validated
// whole before the first shard is written; only a failure of a shard's own
// write (the store) can stop the load part-way.
Status LoadCheckpoint(const std::string& dir, const models::ModelSpec& model,
                      const std::vector<CheckpointShard>& shards, TrainState* state, std::string* path);

}  // namespace strata
