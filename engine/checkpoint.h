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
// Partitioned across ranks (ZeRO stages >= 1 at world size W > 1), the
// state is each rank's own: master.safetensors and optimizer.safetensors
// give way to one file per rank,
//   DIR/step-000040/zero-rank-00001-of-00002.safetensors
//                                            master.<unit>, exp_avg.<unit>, exp_avg_sq.<unit>: the
//                                            rank's slice of each unit's flat state (DeepSpeed's
//                                            flat partitions, engine/model_state.h), as the rank
//                                            holds it (moments f32 or bf16)
// which each rank writes from its own tier store, without collectives; rank
// 0 writes the Hugging Face weights (each unit's masters all-gathered from
// the slices, one unit at a time) and the manifest, whose files.zero names
// the world size and the rank files. A resume at any world size reads, for
// each unit, the slices that overlap the part it keeps (all of them at one
// rank, its own at the same W) and verifies only the files it reads.
// Several machines need the save directory on a filesystem they share.
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
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "base/status.h"
#include "engine/durable_file.h"
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
  // Partitioned across ranks: the part of the unit this rank keeps, [slice_off,
  // slice_off + slice_len) (write reads no other element of its arrays), and
  // the read of that part alone from this rank's store (no collective).
  // Unpartitioned: the whole unit and no read_own.
  int64_t slice_off = 0, slice_len = -1;  // -1: the whole unit
  std::function<Status(float* master, float* m, float* v)> read_own;
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
  // Partitioned: the ranks' state files' sums in rank order (world = size),
  // written by WriteRankStateFile into CheckpointTmpDir(dir, step, this
  // process's PID); empty: this rank writes the whole state itself.
  std::vector<FileSum> rank_files;
};

// "step-000040".
std::string CheckpointStepName(int64_t step);

// ---- partitioned saves (the ranks' protocol is the trainer's: Trainer::Save)

// Rank `rank`'s part of a unit of `numel` elements split across `world`
// ranks: slices of ceil(numel / world), the last ones short or empty.
struct FlatSlice {
  int64_t off = 0, len = 0;
};
FlatSlice FlatSliceOf(int64_t numel, int world, int rank);

// "zero-rank-00001-of-00002.safetensors".
std::string RankStateFileName(int rank, int world);

// Where the step's files are written before the rename: DIR/.step-000040.tmp.PID
// (PID: the saving rank 0's, so that engine/save_dir.h reclaims it after a crash).
std::string CheckpointTmpDir(const std::string& dir, int64_t step, int64_t pid);

// Creates `dir` if needed and an empty CheckpointTmpDir(dir, step, getpid()).
Status PrepareCheckpointTmpDir(const std::string& dir, int64_t step);

// Writes this rank's slices of every unit (CheckpointShard::read_own) into
// `tmp_dir`/RankStateFileName(rank, world), one unit in memory at a time,
// and returns the file's sum for the manifest.
Result<FileSum> WriteRankStateFile(const std::string& tmp_dir, const models::ModelSpec& model,
                                   const std::vector<CheckpointShard>& shards, int rank, int world, int64_t step);

// The units SaveCheckpoint reads (CheckpointShard::read), in its order: the
// other ranks of a partitioned state join each read's gather in this order.
std::vector<size_t> CheckpointUnitReads(const models::ModelSpec& model);

// Writes a checkpoint of `state` under `dir` (created if needed) and returns
// the step directory's path. With extras.rank_files (partitioned), the ranks'
// state files are already in the prepared temporary directory: this writes
// the rest, reading only the masters (read(master, nullptr, nullptr): at
// each unit the other ranks join the gather) and, should a write fail,
// still reads every unit so that no rank waits in a gather for it.
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

// A partitioned checkpoint's fp32 masters (dir: as LoadCheckpoint takes
// it), each unit's put together from the ranks' slices and handed to
// `take(unit, values)` in unit order, one unit in memory at a time; false
// (nothing read) when the step is not partitioned. Reads the masters alone:
// checks each rank file's step and rank and each master tensor's shape and
// dtype (an error names the file and the tensor), not the files' checksums,
// which would read the moments too.
Result<bool> ReadPartitionedMasters(const std::string& dir, const models::ModelSpec& model,
                                    const std::function<Status(size_t unit, std::span<const float>)>& take);

}  // namespace strata
