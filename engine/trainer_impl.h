// SPDX-License-Identifier: Apache-2.0
// Trainer::Impl: the trainer's pieces and the step's own state (engine/
// trainer.h's implementation, shared by trainer.cc — setup and the API —,
// trainer_step.cc — the step — and trainer_run.cc — the run). Private to
// those three files.
#pragma once

#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/trace.h"
#include "engine/budgets.h"
#include "engine/data.h"
#include "engine/data_parallel.h"
#include "engine/grad_reduce.h"
#include "engine/gradient_counts.h"
#include "engine/link_bytes.h"
#include "engine/model_state.h"
#include "engine/optimizer_pool.h"
#include "engine/param_gather.h"
#include "engine/run_log.h"
#include "engine/save_dir.h"
#include "engine/shard_update.h"
#include "engine/step_buffers.h"
#include "engine/step_env.h"
#include "engine/step_schedule.h"
#include "engine/tier_sizes.h"
#include "engine/trainer.h"
#include "kernels/backend.h"
#include "kernels/gemm_peak.h"
#include "models/model_program.h"
#include "optim/cpu_adam.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "tiers/tier_store.h"

namespace strata {

struct Trainer::Impl {
  TrainOptions opt;
  // --trace FILE (base/trace.h): destroyed after everything that records
  // into it, so the threads' last events are in the file.
  trace::Recording trace;
  // The --save directory, locked for the run (destroyed last: nothing else
  // writes there once it goes).
  std::optional<SaveDirLock> save_lock;
  std::ostream* log = &std::cerr;
  std::ostream quiet{nullptr};  // what ranks other than 0 log into: it drops everything
  models::ModelSpec spec;
  DType dtype = DType::kF32;
  StepShape shape;
  std::unique_ptr<kernels::Backend> backend;
  // With several ranks, or a launcher's one (engine/data_parallel.h; null
  // otherwise). After the backend: NCCL's scalar buffer is its memory.
  std::unique_ptr<DataParallel> dp;
  bool leads() const { return !dp || dp->leads(); }
  std::optional<models::ModelProgram> program;
  kernels::GemmPeak peak;
  RunPlan run;  // a value: the trainer does not edit it
  TierSizes tiers;  // what the store's tiers take of the budgets (engine/tier_sizes.h)
  std::unique_ptr<TierStore> store;
  // Declared after the store, destroyed before it. The pool (its threads)
  // goes first, then what its workers use.
  std::optional<StepBuffers> buffers;
  std::unique_ptr<ModelState> state;
  std::unique_ptr<optim::CpuAdam> adam;
  std::unique_ptr<OptimizerCopies> copies;
  std::unique_ptr<HostShardUpdate> host_update;
  std::unique_ptr<AssistShardUpdate> assist_update;
  std::unique_ptr<ParamGather> param_gather;  // ZeRO stage 3 across ranks, else null
  std::unique_ptr<GradReduce> grad_reduce;    // StepShape::reduce_beside, else null
  std::unique_ptr<GradientCounts> counts;  // the update during the backward's
  std::unique_ptr<OptimizerPool> pool;
  StepPrefetcher prefetch;  // the prefetcher and the traffic it will move
  std::unique_ptr<PrefetchedAccess> access;
  std::unique_ptr<StepEnv> env;
  std::optional<optim::LossScaler> scaler;
  std::optional<optim::LrSchedule> schedule;
  std::unique_ptr<DataLoader> data;
  std::vector<int32_t> tok_host, tgt_host;  // [A][B*T]
  std::vector<float> loss_host;

  // The directory the model came with (engine/hf_export.h): --init-from's,
  // or the checkpoint resumed from; "" for a fresh model.
  std::string model_source;
  std::string last_saved;      // the step directory the last Save wrote
  int64_t step = 0;            // optimizer steps taken
  int64_t prefetch_step0 = 0;  // steps taken when the prefetcher's cycle 0 began
  // The last step's clip coefficient was exactly 1 (its norm within
  // gradient_clipping); false after Create, a resume or a failed step.
  bool last_clip_one = false;
  // This step's job is posted during the backward and not settled (a
  // failure before the step's end, or before its verdict, aborts it).
  bool job_in_backward = false;
  std::vector<CopyTicket> counted;  // that job's non-finite counts' copies, per shard
  // Link counters at the end of the last step, the workers' copies then, and
  // bytes moved since by Evaluate/Save (not the step's).
  LinkBytes last_bytes, last_opt_copied, excluded_bytes;

  bool cuda() const { return backend->kind() == kernels::BackendKind::kCuda; }
  void* stream() const { return backend->native_stream(); }
  const Config& cfg() const { return opt.config; }

  // ---- the run (trainer_run.cc) ---------------------------------------------------
  Status RunSteps(int64_t total, RunLog* log);
  Trainer* owner = nullptr;  // the Trainer this is the Impl of (Run calls its Step, Evaluate, Save)

  // ---- setup (trainer.cc) ------------------------------------------------------
  Status Setup();
  Status SetUpOptimizer();
  Status InitState();
  Status StartStep();

  // ---- the step (trainer_step.cc) -------------------------------------------------
  Result<StepReport> RunStep(const int32_t* tokens, const int32_t* targets);
  Status GatherParams();
  Status ReadyForStep() const;
  Result<int64_t> UploadInputs(const int32_t* tokens, const int32_t* targets);
  Status FinishBackward();
  struct Gradients {
    double loss = 0, norm = 0;
    bool overflow = false;
  };
  Result<Gradients> ReadLossAndNorm(int64_t valid, double scale);
  Status SettleUpdate(int64_t next, const optim::LrValue& lr, double scale, const Gradients& g, OptJob* job,
                      StepReport* r);
  OptJob MakeJob(int64_t job_step, const optim::LrValue& lr, double grad_multiplier, bool streaming) const;
  bool SpeculateNow() const { return run.mode.speculative && (last_clip_one || opt.speculate_every_step); }
  Status WaitForUpdate(size_t s, double* wait_s);
  Status GradFinal(size_t s);
  void ReportBytes(const OptimizerCopies::Snapshot& now, StepReport* r);
  template <class F>
  Status Aside(F&& f);
  // The workers stop before anything they use goes.
  ~Impl() { pool.reset(); }
  Status CheckSwapFiles() const {
    NvmeTier* nv = store->nvme_tier();
    return nv ? nv->CheckFiles() : Status::OK();
  }
};

// Runs `f` (after the optimizer is done) and keeps what it moves out of the
// next step's report.
template <class F>
Status Trainer::Impl::Aside(F&& f) {
  RETURN_IF_ERROR(pool->WaitAll(step));
  const LinkBytes b = StoreLinkBytes(*store);
  Status s = f();
  const LinkBytes a = StoreLinkBytes(*store);
  excluded_bytes.h2d += a.h2d - b.h2d;
  excluded_bytes.d2h += a.d2h - b.d2h;
  excluded_bytes.nvme_read += a.nvme_read - b.nvme_read;
  excluded_bytes.nvme_write += a.nvme_write - b.nvme_write;
  return s;
}

}  // namespace strata
