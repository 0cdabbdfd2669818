// SPDX-License-Identifier: Apache-2.0
#include "engine/step_env.h"

#include "base/clock.h"
#include "base/trace.h"
#include "models/passes.h"

namespace strata {

using models::GradTarget;
using models::MicroBatches;
using models::PassTensor;
using models::UnitKind;

Result<void*> PrefetchedAccess::Acquire(TensorId id, Access access) {
  ASSIGN_OR_RETURN(TensorView v, pf_->Acquire(id, access));
  return v.data;
}

Status PrefetchedAccess::Release(TensorId id, bool dirty) { return pf_->Release(id, dirty, stream_); }

Status RunStepPasses(const models::ModelProgram& model, StepEnv& env, const StepShape& shape,
                     const StepHooks& hooks) {
  const int64_t A = shape.micro_batches, per = shape.layer_major ? A : 1;
  for (int64_t a0 = 0; a0 < A; a0 += per) {
    const MicroBatches mb{a0, a0 + per, a0 + per >= A};
    if (hooks.around_forward) RETURN_IF_ERROR(hooks.around_forward(false));
    RETURN_IF_ERROR(models::Forward(model, env, mb));
    if (hooks.around_forward) RETURN_IF_ERROR(hooks.around_forward(true));
    if (mb.last && hooks.before_last_backward) RETURN_IF_ERROR(hooks.before_last_backward());
    RETURN_IF_ERROR(models::Backward(model, env, mb));
    RETURN_IF_ERROR(env.FinishPendingGrad());
  }
  return Status::OK();
}

StepEnv::StepEnv(ModelState* state, StepBuffers* buffers, kernels::Backend* backend, StepAccess* access,
                 const StepShape& shape, Hooks hooks, Options options)
    : state_(state),
      buffers_(buffers),
      backend_(backend),
      access_(access),
      shape_(shape),
      hooks_(std::move(hooks)),
      options_(std::move(options)),
      params_used_(state->size(), 0) {}

void StepEnv::BeginStep(float dloss, int64_t step) {
  dloss_ = dloss;
  step_ = step;
  wait_s_ = 0;
  std::fill(params_used_.begin(), params_used_.end(), 0);
  pending_.reset();  // (a failed step's)
}

TensorId StepEnv::IdOf(const PassTensor& t) const {
  if (t.role == PassTensor::kParams) return state_->shard(static_cast<size_t>(t.unit)).p;
  return state_->checkpoint(t.layer, t.micro);
}

Result<void*> StepEnv::Acquire(const PassTensor& t, Access access) {
  if (t.role == PassTensor::kParams && !params_used_[static_cast<size_t>(t.unit)]) {
    params_used_[static_cast<size_t>(t.unit)] = 1;
    if (computes()) RETURN_IF_ERROR(hooks_.before_params(static_cast<size_t>(t.unit), &wait_s_));
  }
  if (t.role == PassTensor::kParams && state_->layout().gathers_params()) {
    if (!computes()) {  // (not the store's: nothing to schedule, but the gathers' order)
      recorded_gathers_.push_back(static_cast<size_t>(t.unit));
      return static_cast<void*>(nullptr);
    }
    const double t0 = NowSeconds();
    Result<void*> r = hooks_.acquire_params(static_cast<size_t>(t.unit));
    const double t1 = NowSeconds();
    wait_s_ += t1 - t0;
    if (trace::On() && t1 - t0 > kTracedWait) trace::Complete("wait", "gather of " + NameOf(t), t0, t1);
    return r;
  }
  const double t0 = NowSeconds();
  Result<void*> r = access_->Acquire(IdOf(t), access);
  const double t1 = NowSeconds();
  wait_s_ += t1 - t0;
  // The trace keeps the waits that held the step up (not every cached hit).
  if (trace::On() && t1 - t0 > kTracedWait) trace::Complete("wait", "wait for " + NameOf(t), t0, t1);
  return r;
}

std::string StepEnv::NameOf(const PassTensor& t) const {
  if (t.role == PassTensor::kParams) return state_->shard(static_cast<size_t>(t.unit)).name + "'s parameters";
  return "the checkpoint of layer " + std::to_string(t.layer) + ", micro-batch " + std::to_string(t.micro);
}

Status StepEnv::Release(const PassTensor& t, bool dirty) {
  if (t.role == PassTensor::kParams && state_->layout().gathers_params())
    return computes() ? hooks_.release_params(static_cast<size_t>(t.unit)) : Status::OK();
  return access_->Release(IdOf(t), dirty);
}

void* StepEnv::ScratchAccumulator(int unit) const {
  switch (state_->shard(static_cast<size_t>(unit)).kind) {
    case UnitKind::kEmbedding: return buffers_->embedding_acc.data();
    case UnitKind::kFinal: return buffers_->final_acc.data();
    case UnitKind::kBlock: break;
  }
  // Beside the backward, consecutive blocks alternate: one's sum reads its
  // accumulator while the next block's backward writes the other.
  if (shape_.reduce_beside && unit % 2 == 1) return buffers_->block_acc2.data();
  return buffers_->block_acc.data();
}

// The embedding's and the final unit's gradients collect over the whole
// step (the head's micro-batches, then the embedding's backward): zeroed by
// the first pass, always added to. A block's over the micro-batches of a
// pass, or, micro-batch-major, of every pass in its persistent accumulator.
Result<GradTarget> StepEnv::BeginGrads(int unit, const MicroBatches& mb) {
  const Shard& sh = state_->shard(static_cast<size_t>(unit));
  const Access mode = mb.first == 0 ? Access::kWriteDiscard : Access::kReadWrite;
  void* acc = nullptr;
  if (sh.kind != UnitKind::kBlock) {
    if (f32()) {
      ASSIGN_OR_RETURN(acc, access_->Acquire(sh.g, mode));
    } else {
      acc = ScratchAccumulator(unit);
    }
    // Written piecewise (wte by the head, wpe later, padding never): zeros first.
    if (mb.first == 0 && computes())
      RETURN_IF_ERROR(backend_->Memset(acc, 0, static_cast<size_t>(sh.numel) * 4));
    return GradTarget{acc, DType::kF32, true};
  }
  if (accumulates_across()) {
    ASSIGN_OR_RETURN(acc, access_->Acquire(f32() ? sh.g : sh.gacc, mode));
  } else if (f32()) {
    ASSIGN_OR_RETURN(acc, access_->Acquire(sh.g, Access::kWriteDiscard));
  } else {
    acc = ScratchAccumulator(unit);
  }
  return GradTarget{acc, DType::kF32, mb.first > 0};
}

Status StepEnv::EndGrads(int unit, const MicroBatches& mb, const GradTarget& g) {
  const Shard& sh = state_->shard(static_cast<size_t>(unit));
  if (sh.kind != UnitKind::kBlock || !accumulates_across()) {
    if (mb.last) return FinishGrad(unit, g.data, f32());
    if (f32()) return access_->Release(sh.g, true);
    return Status::OK();
  }
  if (!mb.last) return access_->Release(f32() ? sh.g : sh.gacc, true);
  RETURN_IF_ERROR(FinishGrad(unit, g.data, f32()));
  // The accumulator is rewritten from scratch by the next step's first
  // micro-batch: it need not go home.
  if (!f32()) return access_->Release(sh.gacc, false);
  return Status::OK();
}

Status StepEnv::GradsDone(int unit, const MicroBatches& mb) {
  if (!mb.last) return Status::OK();
  if (pending_ && pending_->unit == static_cast<size_t>(unit)) {
    pending_->done = true;  // (told once it is complete)
    return Status::OK();
  }
  return computes() ? hooks_.grad_final(static_cast<size_t>(unit)) : Status::OK();
}

// The gradient of unit u is complete in the fp32 accumulator `acc`: its
// sum over the ranks, its statistics, its rounding into the store's copy
// (`acquired`: acc is that copy, pinned on the GPU in fp32 mode), and its
// release: a gradient with a host home leaves for it at once (its next use
// overwrites the GPU copy). Beside the backward the sum is submitted here
// and the rest is the previous unit's, whose sum ran meanwhile.
Status StepEnv::FinishGrad(int unit, void* acc, bool acquired) {
  const size_t u = static_cast<size_t>(unit);
  RETURN_IF_ERROR(SumGrad(u, acc));
  if (!shape_.reduce_beside) return CompleteGrad(u, acc, acquired);
  RETURN_IF_ERROR(FinishPendingGrad());  // (the previous unit's: its sum ran under this unit's backward)
  pending_ = PendingGrad{u, acc, acquired, false};
  return Status::OK();
}

Status StepEnv::FinishPendingGrad() {
  if (!pending_) return Status::OK();
  const PendingGrad p = *pending_;
  pending_.reset();
  RETURN_IF_ERROR(CompleteGrad(p.unit, p.acc, p.acquired));
  return p.done && computes() ? hooks_.grad_final(p.unit) : Status::OK();
}

Status StepEnv::SumGrad(size_t u, void* acc) {
  if (!computes()) return Status::OK();
  const Shard& sh = state_->shard(u);
  if (!options_.inject_nonfinite_shard.empty() && sh.name == options_.inject_nonfinite_shard &&
      step_ == options_.inject_nonfinite_step)
    RETURN_IF_ERROR(backend_->Memset(acc, 0xff, 4));  // a NaN (tests)
  if (shape_.reduce_beside) {
    if (hooks_.grad_reduce == nullptr)
      return Internal("StepEnv: the gradients' sums run beside the backward, but no GradReduce was given");
    const int64_t padded = sh.partitioned ? sh.slice_pad * state_->layout().world : sh.numel;
    return hooks_.grad_reduce->Submit(u, static_cast<float*>(acc), sh.numel, padded);
  }
  return hooks_.reduce_grad ? hooks_.reduce_grad(u, acc, sh.numel) : Status::OK();
}

Status StepEnv::CompleteGrad(size_t u, void* acc, bool acquired) {
  const Shard& sh = state_->shard(u);
  if (computes()) {
    if (shape_.reduce_beside) RETURN_IF_ERROR(hooks_.grad_reduce->Await(u));
    // Partitioned, the rank's slice alone is reduced: its statistics are
    // this rank's part of the global ones (summed over the ranks later).
    void* mine = static_cast<char*>(acc) + sh.slice_off * 4;
    if (sh.slice_len > 0)
      RETURN_IF_ERROR(backend_->GradStats(mine, DType::kF32, sh.slice_len, buffers_->sumsq(), buffers_->nonfinite(u)));
  }
  if (!acquired) {
    // (A slice-only gradient takes the rank's slice; its padding is never read.)
    ASSIGN_OR_RETURN(void* g, access_->Acquire(sh.g, Access::kWriteDiscard));
    const float* from = static_cast<const float*>(acc) + (sh.grad_slice ? sh.slice_off : 0);
    const int64_t n = sh.grad_slice ? sh.slice_len : sh.numel;
    if (computes() && n > 0) RETURN_IF_ERROR(backend_->Cast(g, state_->layout().grad_dtype, from, DType::kF32, n));
  }
  return access_->Release(sh.g, true);
}

const int32_t* StepEnv::tokens(int64_t micro) {
  return buffers_->tokens.as<int32_t>() + micro * state_->layout().batch * state_->layout().seq;
}
const int32_t* StepEnv::targets(int64_t micro) {
  return buffers_->targets.as<int32_t>() + micro * state_->layout().batch * state_->layout().seq;
}
float* StepEnv::losses(int64_t micro) {
  return buffers_->losses.as<float>() + micro * state_->layout().batch * state_->layout().seq;
}
void* StepEnv::residual_grad(int64_t micro) {
  return buffers_->dx[shape_.layer_major ? static_cast<size_t>(micro) : 0].data();
}
models::ScratchSpace StepEnv::block_scratch() {
  return {buffers_->block_scratch.data(), static_cast<size_t>(buffers_->block_scratch.bytes())};
}
models::ScratchSpace StepEnv::head_scratch() {
  return {buffers_->head_scratch.data(), static_cast<size_t>(buffers_->head_scratch.bytes())};
}

}  // namespace strata
