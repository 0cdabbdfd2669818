// SPDX-License-Identifier: Apache-2.0
// StepEnv: the offloaded step's PassEnv (models/pass_env.h). It maps the
// passes' tensors to the model's tensors in the tier store (ModelState) and
// their GPU accesses to a StepAccess: the prefetcher when the step runs, a
// recorder when the step's access schedule is derived from the passes
// (engine/step_schedule.h) — the same calls either way, so the schedule
// cannot drift from the step.
//
// Its gradient policy: every gradient accumulates over the step's
// micro-batches in fp32 on the GPU — in the store's fp32 gradient itself
// when the optimizer reads fp32 and the gradient is whole
// (ModelState::Layout::grad_is_accumulator), else in fp32 scratch (one block's, the
// embedding's, the final unit's; micro-batch-major with accumulation: a
// block's persistent accumulator in the store) — and is finished once, when
// the step's last micro-batch is done with it: its squared norm (summed over
// all units in the backward's order) and non-finite count are taken on the
// GPU, it is rounded into the store's gradient (ZeRO stage >= 2: its
// slice alone, Shard::grad_slice), which leaves for its home at
// once (the prefetcher queues the write-back at its release), and the
// optimizer is told (Hooks::grad_final); with several ranks it is first
// summed over them (Hooks::reduce_grad, on the compute stream; or beside
// the backward, StepShape::reduce_beside: a unit's sum is submitted to a
// GradReduce as its gradient is complete and the rest of its finish waits
// for the next unit's, so the sum runs under that unit's backward, and the
// block accumulator alternates). Before the step's first use of a
// unit's parameters it waits for the optimizer's update of the unit
// (Hooks::before_params): never a stale weight.
//
// Ownership: borrows everything it is given. Thread-safety: the step thread's.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/grad_reduce.h"
#include "engine/model_state.h"
#include "engine/step_buffers.h"
#include "kernels/backend.h"
#include "models/model_program.h"
#include "models/pass_env.h"
#include "swap/prefetcher.h"

namespace strata {

// Where the step's GPU accesses go.
class StepAccess {
 public:
  virtual ~StepAccess() = default;
  // True for the recorder: nothing is computed.
  virtual bool records() const = 0;
  virtual Result<void*> Acquire(TensorId id, Access access) = 0;
  virtual Status Release(TensorId id, bool dirty) = 0;
};

// Through the prefetcher, releases ordered on the compute stream.
class PrefetchedAccess final : public StepAccess {
 public:
  PrefetchedAccess(Prefetcher* prefetcher, void* stream) : pf_(prefetcher), stream_(stream) {}
  bool records() const override { return false; }
  Result<void*> Acquire(TensorId id, Access access) override;
  Status Release(TensorId id, bool dirty) override;

 private:
  Prefetcher* pf_;
  void* stream_;
};

// What one training step's passes are: the micro-batches, and how they are
// grouped into passes (layer-major: all in one; else one per pass).
struct StepShape {
  int64_t micro_batches = 1;
  bool layer_major = true;
  // The ranks' sums of the gradients run beside the backward
  // (ReducesBesideBackward, engine/data_parallel.h): each unit's gradient
  // is finished one unit later, once its sum has run under the next unit's
  // backward (StepEnv below; recorded so too, so the schedule is the step's).
  bool reduce_beside = false;
};

// The passes of one step (models/passes.h): forward and backward per pass,
// `before_last_backward` just before the last backward (the update that
// runs during the backward is posted there), `around_forward` timing each
// forward (called before with `done` false, after with true).
struct StepHooks {
  std::function<Status(bool done)> around_forward;
  std::function<Status()> before_last_backward;
};
class StepEnv;
Status RunStepPasses(const models::ModelProgram& model, StepEnv& env, const StepShape& shape,
                     const StepHooks& hooks);

class StepEnv final : public models::PassEnv {
 public:
  struct Hooks {
    // Before the step's first acquire of unit u's parameters; adds its wait to *wait_s.
    std::function<Status(size_t unit, double* wait_s)> before_params;
    // Unit u's gradient is final and home-bound, and the step is done with
    // its parameters (streaming updates may take it).
    std::function<Status(size_t unit)> grad_final;
    // Data parallelism (engine/data_parallel.h), when set: unit u's fp32
    // gradient (`numel` values in the backend's memory), complete for this
    // rank's micro-batches, is summed over the ranks in place, before its
    // statistics are taken and it is rounded into the store. Partitioned
    // (engine/model_state.h), only the rank's slice need hold the sum
    // (reduce-scattered): the statistics are taken over that slice alone.
    std::function<Status(size_t unit, void* f32, int64_t numel)> reduce_grad;
    // ZeRO stage 3 (ModelState::Layout::gathers_params): unit u's
    // parameters, gathered from the ranks (engine/param_gather.h), instead
    // of the store's; and their release.
    std::function<Result<void*>(size_t unit)> acquire_params;
    std::function<Status(size_t unit)> release_params;
    // StepShape::reduce_beside, computing: where the sums run (not owned).
    GradReduce* grad_reduce = nullptr;
  };
  struct Options {
    // Tests: a NaN is put into unit `inject_nonfinite_shard`'s gradient as it
    // is finished in optimizer step `inject_nonfinite_step` (1-based).
    std::string inject_nonfinite_shard;
    int64_t inject_nonfinite_step = 0;
  };
  StepEnv(ModelState* state, StepBuffers* buffers, kernels::Backend* backend, StepAccess* access,
          const StepShape& shape, Hooks hooks, Options options);

  // A new step: d loss / d losses, and the optimizer step it takes (1-based).
  void BeginStep(float dloss, int64_t step);
  // Seconds this step's thread waited in acquires and for the optimizer.
  double wait_seconds() const { return wait_s_; }
  // ZeRO stage 3, recording: the units whose parameters the passes
  // acquired, in order, one entry per acquisition (ParamGather's order).
  const std::vector<size_t>& recorded_gathers() const { return recorded_gathers_; }
  // StepShape::reduce_beside: finishes the gradient whose sum is still in
  // flight (the backward's last unit's). RunStepPasses calls it after each
  // backward pass.
  Status FinishPendingGrad();

  bool computes() const override { return !access_->records(); }
  Result<void*> Acquire(const models::PassTensor& t, Access access) override;
  Status Release(const models::PassTensor& t, bool dirty) override;
  Result<models::GradTarget> BeginGrads(int unit, const models::MicroBatches& mb) override;
  Status EndGrads(int unit, const models::MicroBatches& mb, const models::GradTarget& g) override;
  Status GradsDone(int unit, const models::MicroBatches& mb) override;
  const int32_t* tokens(int64_t micro) override;
  const int32_t* targets(int64_t micro) override;
  float* losses(int64_t micro) override;
  void* residual_grad(int64_t micro) override;
  float dloss() const override { return dloss_; }
  models::ScratchSpace block_scratch() override;
  models::ScratchSpace head_scratch() override;
  bool keep_last_block() const override { return true; }

 private:
  TensorId IdOf(const models::PassTensor& t) const;
  // For the trace (base/trace.h): what `t` is, and the shortest wait it keeps.
  std::string NameOf(const models::PassTensor& t) const;
  static constexpr double kTracedWait = 50e-6;
  bool accumulates_across() const { return !shape_.layer_major && shape_.micro_batches > 1; }
  // The store's gradient is the accumulator (else the scratch or `gacc` is).
  bool f32() const { return state_->layout().grad_is_accumulator(); }
  // The fp32 scratch accumulator of unit u (f32() false).
  void* ScratchAccumulator(int unit) const;
  Status FinishGrad(int unit, void* acc, bool acquired);
  // FinishGrad's parts: the ranks' sum (beside: submitted), then, once it is
  // taken, the statistics, the rounding into the store, the release.
  Status SumGrad(size_t u, void* acc);
  Status CompleteGrad(size_t u, void* acc, bool acquired);

  // StepShape::reduce_beside: the unit whose sum is in flight, and whether
  // its GradsDone came (its grad_final then follows its completion).
  struct PendingGrad {
    size_t unit = 0;
    void* acc = nullptr;
    bool acquired = false;
    bool done = false;
  };
  std::optional<PendingGrad> pending_;

  ModelState* state_;
  StepBuffers* buffers_;
  kernels::Backend* backend_;
  StepAccess* access_;
  StepShape shape_;
  Hooks hooks_;
  Options options_;
  float dloss_ = 1;
  int64_t step_ = 0;
  double wait_s_ = 0;
  std::vector<char> params_used_;  // per unit: acquired in this step already
  std::vector<size_t> recorded_gathers_;
};

}  // namespace strata
