// SPDX-License-Identifier: Apache-2.0
// TrainOptions: what a training run is asked to do beyond its config (the
// `strata train` command line, and the knobs tests set).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"

namespace strata {

class IoEnv;

struct TrainOptions {
  Config config = DefaultConfig();
  std::string default_data;            // used when config.data.path is empty
  int64_t steps = -1;                  // -1: config.trainer.steps
  std::string save_dir;                // checkpoints written under it ("" = none)
  int64_t save_every = 0;              // steps between checkpoints (0: only at the end)
  std::string resume_dir;              // a checkpoint (or a --save dir: its latest)
  std::string init_from;               // HF GPT-2 weights (safetensors) to start from
  std::string init_prefix;             // prefix of the tensor names in init_from ("" for HF files)
  uint64_t gpu_memory_limit = 0;       // 0: the card's free memory (stand-in: 4 GiB)
  uint64_t host_memory_limit = 0;      // 0: 80% of the available host memory
  std::string backend = "auto";        // auto | cpu | cuda
  std::string log_json;                // the JSON log (engine/run_log.h), appended to
  // A Chrome trace-event timeline of the run (base/trace.h), written when
  // Run ends (or FinishTrace); with several ranks each writes its own,
  // TracePathOfRank's.
  std::string trace_path;
  std::vector<std::string> argv;       // the command line, for the JSON log's "run" record
  bool progress = false;               // a progress line on a terminal
  int cpu_threads = 0;                 // CPU backend / CPU Adam threads (0: all)
  // Started by a launcher (RANK/WORLD_SIZE or Open MPI's variables set;
  // `strata train` sets it): the ranks' path (engine/data_parallel.h) even
  // at world size 1, which config world_size > 1 takes anyway.
  bool launched = false;
  // A launched run at world size 1 with zero_optimization.stage >= 1 takes
  // the partitioned path too, as DeepSpeed does (each slice is then the
  // whole unit): the reduce-scatter, the slices' updates, the gathers (at
  // stage 3 at each use). Off, such a run is stage 0's (nothing to
  // partition across, and nothing to gather); on, it measures and tests
  // the partitioned path on one GPU.
  bool partition_at_world_one = false;
  // With several ranks (config world_size > 1, engine/data_parallel.h): the
  // longest one collective may take before the rank gives up on its peers.
  double comm_timeout_s = 300;
  // The ranks on this machine (engine/data_parallel.h ShareTheMachine):
  // the default host budget and CPU threads are each one's share.
  int local_ranks = 1;
  IoEnv* nvme_env = nullptr;           // the NVMe tier's OS seam (tests inject faults); not owned
  uint64_t assist_chunk_params = 0;    // GPU-assisted optimizer chunk (0: 4 Mi parameters; tests use small ones)
  uint64_t host_piece_params = 0;      // the CPU worker's pipelining piece (0: 8 Mi parameters; tests use small ones)
  bool assist_takes_all = false;       // tests: the CPU worker leaves every shard to the GPU-assisted one
  // Update the optimizer state after the backward even when it could run
  // during it (no clipping, no dynamic loss scale): the mode of a run with
  // gradient clipping. Both give the same bits; the post-backward mode adds
  // the update's time after the backward, but a step that meets a non-finite
  // gradient (bf16/fp32: an error) then leaves the state untouched, where
  // during the backward the shards taken before it may already be updated
  // (the error says so; the last checkpoint is the one to resume from).
  bool optimizer_after_backward = false;
  // With gradient clipping, update during the backward on speculation
  // (trainer.h's header comment) when the plan has host room for the second
  // set; false: after the backward, as without room. Same bits either way.
  bool speculative_update = true;
  // Tests: speculate at every step, the first and those after a clipped one
  // included (so that misses happen).
  bool speculate_every_step = false;
  // Tests: a NaN is put into shard `inject_nonfinite_shard`'s gradient
  // ("emb", "blk<l>", "lnf") as it is finished in optimizer step
  // `inject_nonfinite_step` (1-based).
  std::string inject_nonfinite_shard;
  int64_t inject_nonfinite_step = 0;
};

// The steps a run trains: --steps, else the config's trainer.steps.
inline int64_t TotalSteps(const TrainOptions& o) { return o.steps >= 0 ? o.steps : o.config.trainer.steps; }

// The trace file of rank `rank` of `world`: `path` itself at world size 1,
// else with "-rank<r>" before its extension (run.json -> run-rank1.json).
inline std::string TracePathOfRank(const std::string& path, int rank, int world) {
  if (world <= 1) return path;
  const size_t slash = path.find_last_of('/'), dot = path.find_last_of('.');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;  // (a dot-file's dot is no extension)
  const bool ext = dot != std::string::npos && dot > base;
  const std::string tag = "-rank" + std::to_string(rank);
  return ext ? path.substr(0, dot) + tag + path.substr(dot) : path + tag;
}

// Whether the run takes the ranks' path (engine/data_parallel.h): several
// ranks, or one started by a launcher.
inline bool TakesRanksPath(const TrainOptions& o) { return o.config.world_size != 1 || o.launched; }
// Whether its state is partitioned (ZeRO stage >= 1 over several ranks, or
// at world size 1 with partition_at_world_one; engine/model_state.h).
inline bool PartitionsRanksState(const TrainOptions& o) {
  return TakesRanksPath(o) && o.config.zero.stage >= 1 && (o.config.world_size > 1 || o.partition_at_world_one);
}

}  // namespace strata
