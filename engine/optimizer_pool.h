// SPDX-License-Identifier: Apache-2.0
// OptimizerPool: the optimizer's workers and the jobs the step hands them.
//
// A job is one optimizer step's update of the offloaded shards (every shard
// from ModelState::gpu_prefix() on). Its workers — the CPU worker and, when
// on, the GPU-assisted one — claim its shards one at a time from a queue and
// update each through their ShardUpdater (engine/shard_update.h). The queue's
// order:
//   - a job posted after the backward: forward order (the next forward needs
//     the embedding first), so the next step's forward of block l waits for
//     block l only;
//   - a job posted during the backward (streaming): the backward's order
//     (the final unit, the last block ... the embedding), each shard claimed
//     once its gradient is final (MarkGradFinal), after a check that the
//     shard's own gradient is finite;
//   - speculative (streaming with clipping, on the assumption that the clip
//     coefficient will be 1): shards are updated into their other set until
//     the verdict; a hit commits them (the sets swap: nothing is copied), a
//     miss queues them to be redone in place from the untouched set, with
//     the true multiplier; the shards not claimed by then are updated in
//     place, in forward order.
// Whichever comes second of the verdict and a speculated shard's worker
// settles that shard, under the pool's lock, exactly once. Every mode gives
// the post-backward update's bits.
//
// Errors: a worker's error sticks (every later call returns it). A step that
// fails with its job posted during the backward aborts it (Abort): if some
// shard was updated in place, or the verdict was given, the in-memory state
// is part this step's, part the last's, and the error sticks; else the state
// is the last step's (a speculative update wrote only its other set and its
// parameters, which are rewritten from the untouched master).
//
// Ownership: borrows the model state, the counts, the copies counter and the
// updaters (they must outlive it); owns its threads (joined by the
// destructor). Thread-safety: the public calls are the step thread's; the
// workers run on their own threads. Lock order: the pool's lock before
// OptimizerCopies' (Post).
#pragma once

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "engine/gradient_counts.h"
#include "engine/link_bytes.h"
#include "engine/model_state.h"
#include "optim/cpu_adam.h"
#include "tiers/copy_engine.h"

namespace strata {

struct OptJob {
  int64_t step = 0;  // the step number this update produces (1-based)
  bool skip = false;  // fp16 overflow: nothing to update
  // Posted before the backward's last pass: a shard is claimed once its
  // gradient is final (MarkGradFinal), and checked finite first.
  bool streaming = false;
  // Streaming on speculation (gradient clipping): grad_multiplier assumes a
  // clip coefficient of 1; until the verdict shards are updated into their
  // other set.
  bool speculative = false;
  double grad_multiplier = 1;
  optim::AdamHyper hyper;
};

// How a shard is updated: with which gradient multiplier, and whether into
// its other set (a speculative update) or in place.
struct ShardHow {
  double multiplier = 1;
  bool speculative = false;
};

// What a worker does with a shard it has claimed. A test can fake it.
class ShardUpdater {
 public:
  virtual ~ShardUpdater() = default;
  // Updates the shard; returns the upload of its new parameters into their
  // GPU home (not valid when there is none), which the next forward waits
  // for. `last_upload` is the shard's previous one (a redo after a missed
  // speculation writes the parameters only after it).
  virtual Result<CopyTicket> Update(size_t shard, const OptJob& job, const ShardHow& how,
                                    const CopyTicket& last_upload) = 0;
  // The worker claimed the shard before `shard` in this job's claim order:
  // a chance to start reading `shard`'s state (NVMe read-ahead). Never the
  // GPU-assisted worker's.
  virtual void ReadAhead(size_t shard, const OptJob& job) {}
  // "" or " (gpu-assisted)": for messages.
  virtual const char* what() const { return ""; }
};

class OptimizerPool {
 public:
  struct Options {
    // The update mode's reason (engine/update_mode.h), for the non-finite error.
    std::string update_mode;
    // Tests: the CPU worker leaves every shard to the GPU-assisted one.
    bool assist_takes_all = false;
  };
  // `gpu` (the GPU-assisted worker's updater) may be null: one worker.
  OptimizerPool(ModelState* state, GradientCounts* counts, OptimizerCopies* copies, ShardUpdater* cpu,
                ShardUpdater* gpu, Options options);
  ~OptimizerPool();
  OptimizerPool(const OptimizerPool&) = delete;
  OptimizerPool& operator=(const OptimizerPool&) = delete;

  // Starts the workers.
  void Start();

  // ---- the step thread ---------------------------------------------------------
  // Hands a job to the workers, once every worker is done with the last one
  // (whose shards are all updated — the forward waited for them — but a
  // worker may still be on its way out).
  Status Post(const OptJob& job) EXCLUDES(mu_);
  // Streaming: shard s's gradient is final and home-bound and the step is
  // done with its parameters; `counted` is its non-finite count's copy.
  void MarkGradFinal(size_t s, const CopyTicket& counted) EXCLUDES(mu_);
  // The verdict on a speculative job once the backward is over (above).
  void Verdict(int64_t job_step, bool hit, double multiplier) EXCLUDES(mu_);
  // The step (`step` + 1) failed with its job posted during the backward (above).
  void Abort(const Status& why, int64_t step) EXCLUDES(mu_);
  // The GPU-state prefix of offload_optimizer.ratio < 1, updated on the
  // calling thread with `updater` (the workers are never given these shards).
  Status UpdateGpuPrefix(const OptJob& job, ShardUpdater* updater) EXCLUDES(mu_);

  // Waits until shard s has step `step`'s update (or an error); its
  // parameters' upload ticket in *upload, the wait's seconds added to *wait_s.
  Status WaitForShard(size_t s, int64_t step, double* wait_s, CopyTicket* upload) EXCLUDES(mu_);
  // Waits until no job runs and every shard has step `step`'s update, and
  // for every upload.
  Status WaitAll(int64_t step) EXCLUDES(mu_);
  // Waits until no job runs (whatever failed).
  void WaitIdle() EXCLUDES(mu_);
  // Whether shard s has step `step`'s update (the prefetcher's readiness).
  bool Updated(size_t s, int64_t step) const EXCLUDES(mu_);
  // After a resume: every shard is at `step`.
  void SetAllUpdated(int64_t step) EXCLUDES(mu_);

  Status error() const EXCLUDES(mu_);
  // `s` becomes the sticky error unless one is there already.
  void SetError(const Status& s) EXCLUDES(mu_);

  // The upload of shard s's newest parameters.
  CopyTicket Upload(size_t s) const EXCLUDES(mu_);

  // Of the job of step `job_step` (the last two are kept): its time, from
  // its posting to its last shard, and the GPU-assisted worker's share of
  // the parameters it updated.
  struct JobStats {
    double seconds = 0, assist_share = 0;
  };
  JobStats Stats(int64_t job_step) const EXCLUDES(mu_);

 private:
  enum class ShardState : uint8_t {
    kWaiting,     // not claimed (or handed back: its speculative claim met a non-finite gradient)
    kRunning,     // a worker holds it
    kSpeculated,  // its other set holds its speculative update, its parameters are written: awaits the verdict
    kFinal,       // done for this job (updated_[s] says so)
  };
  enum class Judged : uint8_t { kPending, kCommit, kMiss };  // a speculative job's verdict

  void Loop(bool gpu_worker);
  void RunJob(const OptJob& j, bool gpu_worker);
  // One claimed shard, updated and settled.
  void Settle(const OptJob& j, size_t s, ShardHow how, const CopyTicket& counted, bool ok, bool gpu_worker);
  void Commit(size_t s, int64_t job_step) REQUIRES(mu_);
  Status NonFiniteError(int64_t job_step, const std::string& what) const;

  ModelState* const state_;
  GradientCounts* const counts_;
  OptimizerCopies* const copies_;
  ShardUpdater* const cpu_;
  ShardUpdater* const gpu_;
  const Options options_;
  // The shards the workers update in forward order, and reversed.
  std::vector<size_t> forward_order_, backward_order_;
  std::thread cpu_thread_, gpu_thread_;

  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  bool has_job_ GUARDED_BY(mu_) = false;  // reset when every worker is done with it
  OptJob job_ GUARDED_BY(mu_);
  int64_t job_seq_ GUARDED_BY(mu_) = 0;         // jobs posted
  std::vector<size_t> queue_ GUARDED_BY(mu_);  // the job's shards in claim order (rebuilt by a verdict)
  size_t next_claim_ GUARDED_BY(mu_) = 0;
  std::vector<ShardState> shard_state_ GUARDED_BY(mu_);
  Judged verdict_ GUARDED_BY(mu_) = Judged::kPending;
  double job_multiplier_ GUARDED_BY(mu_) = 1;  // what claims use: the job's, after a verdict the true one
  uint64_t job_params_ GUARDED_BY(mu_) = 0;    // parameters updated this job (redone ones twice)
  uint64_t assist_params_ GUARDED_BY(mu_) = 0;  // ... of them by the GPU-assisted worker
  int job_workers_ GUARDED_BY(mu_) = 0;        // workers still on the job
  double job_t0_ GUARDED_BY(mu_) = 0;
  int64_t job_writes_ GUARDED_BY(mu_) = 0;     // shards this job updated in place (not speculatively)
  bool job_abort_ GUARDED_BY(mu_) = false;     // the step failed with its job in the backward: claim no more
  std::vector<char> grad_final_ GUARDED_BY(mu_);          // streaming: per shard, its gradient is final
  std::vector<CopyTicket> grad_counted_ GUARDED_BY(mu_);  // ... and the copy of its non-finite count
  std::vector<CopyTicket> uploads_ GUARDED_BY(mu_);       // per shard, the upload of its new parameters
  std::vector<int64_t> updated_ GUARDED_BY(mu_);          // optimizer steps applied per shard
  Status error_ GUARDED_BY(mu_);                          // sticky
  JobStats stats_[2] GUARDED_BY(mu_);                     // by the job's step parity
};

}  // namespace strata
