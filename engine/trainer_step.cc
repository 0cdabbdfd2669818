// SPDX-License-Identifier: Apache-2.0
// One optimizer step of the offload trainer (engine/trainer.h): RunStep and
// the pieces it reads as — the inputs, the passes (engine/step_env.h), the
// backward's end, the loss and the norm, the update settled, the report.
#include <algorithm>
#include <cmath>

#include "base/clock.h"
#include "base/trace.h"
#include "engine/model_config.h"
#include "engine/trainer_impl.h"
#include "optim/grad_clip.h"

namespace strata {

namespace {

std::string NonFiniteText(int64_t step, double loss) {
  return "non-finite gradients at step " + std::to_string(step) + " (loss " + std::to_string(loss) + ")";
}

}  // namespace

// The optimizer's update of shard s (the last step's) is done, and the
// compute stream waits (on the GPU) for the upload of its new parameters.
Status Trainer::Impl::WaitForUpdate(size_t s, double* wait_s) {
  CopyTicket up;
  RETURN_IF_ERROR(pool->WaitForShard(s, step, wait_s, &up));
  return cuda() ? up.StreamWait(stream()) : up.Wait();
}

// During a job posted in the backward: shard s's gradient is final. Its
// non-finite count is copied down after everything queued on the compute
// stream so far — the shard's backward, its statistics, its rounding — so
// that copy's ticket tells the worker both the count and that the GPU is
// done with the shard's gradient and parameters. The write-back itself is
// ordered by the store (a worker's Acquire of the gradient on the host
// first finishes the moves queued on it).
Status Trainer::Impl::GradFinal(size_t s) {
  if (!job_in_backward || s < state->gpu_prefix()) return Status::OK();
  ASSIGN_OR_RETURN(CopyTicket t, counts->CopyDown(s, buffers->nonfinite(s), cuda() ? stream() : nullptr));
  counted[s] = t;
  pool->MarkGradFinal(s, t);
  return Status::OK();
}

// Partitioned (ZeRO stages >= 1 across ranks): once every slice has this
// step's update, each unit's new parameters are all-gathered from the ranks'
// slices, unit by unit in forward order on this thread (the collectives'
// one order), so every rank has the whole parameters for the next step, an
// evaluation or a save. The update itself still overlaps the backward when
// it runs during it; the post-backward update is waited for here.
// Stage 3 keeps no whole parameters: the gathered buffers are out of date.
Status Trainer::Impl::GatherParams() {
  if (param_gather) RETURN_IF_ERROR(param_gather->Invalidate());
  if (!state->layout().partitioned() || param_gather) return Status::OK();
  RETURN_IF_ERROR(pool->WaitAll(step));
  for (size_t s = 0; s < state->size(); ++s) RETURN_IF_ERROR(state->GatherParams(s));
  return Status::OK();
}

Status Trainer::Impl::ReadyForStep() const {
  RETURN_IF_ERROR(pool->error());
  RETURN_IF_ERROR(CheckSwapFiles());
  const Prefetcher& pf = *prefetch.prefetcher;
  if (!pf.at_cycle_start())
    return FailedPrecondition("a previous step of this trainer failed midway (at " +
                              pf.schedule().EventString(pf.tick()) +
                              "); create the trainer again (from the last checkpoint)");
  return Status::OK();
}

// Inputs for all micro-batches, checked (a token outside the vocabulary
// would index past the embedding) and uploaded; the gradient statistics
// zeroed. Returns the number of counted targets.
Result<int64_t> Trainer::Impl::UploadInputs(const int32_t* tokens, const int32_t* targets) {
  const size_t n = tok_host.size();
  const int32_t V = static_cast<int32_t>(spec.vocab_size);
  int64_t valid = 0;
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      return InvalidArgument("token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                             " is outside the vocabulary [0, " + std::to_string(V) + ")");
    if (targets[i] >= V)
      return InvalidArgument("target " + std::to_string(targets[i]) + " at position " + std::to_string(i) +
                             " is outside the vocabulary [0, " + std::to_string(V) + ") (negative targets are ignored)");
    valid += targets[i] >= 0;
  }
  if (tokens != tok_host.data()) std::copy(tokens, tokens + n, tok_host.begin());
  if (targets != tgt_host.data()) std::copy(targets, targets + n, tgt_host.begin());
  RETURN_IF_ERROR(backend->CopyToDevice(buffers->tokens.data(), tok_host.data(), n * 4));
  RETURN_IF_ERROR(backend->CopyToDevice(buffers->targets.data(), tgt_host.data(), n * 4));
  RETURN_IF_ERROR(backend->Memset(buffers->stats.data(), 0, buffers->stats_bytes));
  RETURN_IF_ERROR(prefetch.prefetcher->Poll());  // parameters updated meanwhile start up
  return valid;
}

// The backward's GPU work and the gradients' write-backs are done (the
// optimizer needs them first thing, and the step's bytes are all counted
// before it starts); with a job in the backward, every shard's non-finite
// count has come down before the next step's statistics overwrite them.
Status Trainer::Impl::FinishBackward() {
  RETURN_IF_ERROR(backend->Synchronize());
  RETURN_IF_ERROR(prefetch.prefetcher->WaitEvictions());
  if (!job_in_backward) return Status::OK();
  // (A worker may not have asked for the last ones yet.)
  for (const CopyTicket& c : counted) RETURN_IF_ERROR(c.Wait());
  return Status::OK();
}

Result<Trainer::Impl::Gradients> Trainer::Impl::ReadLossAndNorm(int64_t valid, double scale) {
  RETURN_IF_ERROR(backend->CopyToHost(loss_host.data(), buffers->losses.data(), loss_host.size() * 4));
  double total = 0;
  for (size_t i = 0; i < loss_host.size(); ++i)
    if (tgt_host[i] >= 0) total += loss_host[i];
  if (dp) {
    ASSIGN_OR_RETURN(total, dp->SumLoss(total));
  }
  Gradients g;
  g.loss = total / static_cast<double>(std::max<int64_t>(valid, 1));
  float sumsq = 0;
  std::vector<int32_t> nonfinite(state->size(), 0);
  RETURN_IF_ERROR(backend->CopyToHost(&sumsq, buffers->stats.data(), 4));
  RETURN_IF_ERROR(backend->CopyToHost(nonfinite.data(), buffers->nonfinite(0), nonfinite.size() * 4));
  optim::GradStats gs;
  gs.sum_sq = sumsq;
  if (state->layout().partitioned()) {
    // Each rank has its slices' statistics: the global ones are their sum,
    // in one all-reduce each (engine/data_parallel.h).
    RETURN_IF_ERROR(dp->SumGradStats(&gs.sum_sq, &nonfinite));
  }
  for (int32_t c : nonfinite) gs.nonfinite += static_cast<uint64_t>(c);
  g.overflow = gs.overflow() || !std::isfinite(gs.sum_sq);
  g.norm = optim::GlobalGradNorm(gs, scale);
  return g;
}

OptJob Trainer::Impl::MakeJob(int64_t job_step, const optim::LrValue& lr, double grad_multiplier,
                              bool streaming) const {
  const OptimizerConfig& o = cfg().optimizer;
  OptJob j;
  j.step = job_step;
  j.streaming = streaming;
  j.grad_multiplier = grad_multiplier;
  j.hyper.lr = lr.lr;
  j.hyper.beta1 = lr.beta1.value_or(o.beta1);
  j.hyper.beta2 = lr.beta2.value_or(o.beta2);
  j.hyper.eps = o.eps;
  j.hyper.weight_decay = o.weight_decay;
  j.hyper.decay_mode = o.adam_w_mode ? optim::WeightDecayMode::kDecoupled : optim::WeightDecayMode::kL2;
  j.hyper.bias_correction = o.bias_correction;
  j.hyper.step = job_step;
  return j;
}

// The update once the step's norm and overflow are known: a speculative
// job's verdict, a streaming job's end, or the job posted now (after the
// backward, overlapping the next forward). `job` is this step's (for the
// GPU-state prefix).
Status Trainer::Impl::SettleUpdate(int64_t next, const optim::LrValue& lr, double scale, const Gradients& g,
                                   OptJob* job, StepReport* r) {
  const double clip = optim::ClipCoefficient(g.norm, cfg().gradient_clipping);
  if (job_in_backward && job->speculative) {
    if (g.overflow) {
      // Nothing is committed: the speculated shards wrote only their other
      // sets, and StepWith's Abort restores the parameters they wrote. The
      // state stays the last step's, so the error does not stick.
      return FailedPrecondition(NonFiniteText(next, g.loss) +
                                "; with bf16/fp32 (or a static fp16 loss scale) there is no loss scale to lower: lower "
                                "the learning rate or check the data. The update was speculative and nothing of it "
                                "was committed: the state is step " + std::to_string(step) + "'s");
    }
    // A hit needs the very multiplier the updates assumed: a clip
    // coefficient of exactly 1, the norm within gradient_clipping.
    const double multiplier = optim::GradMultiplier(scale, clip);
    const bool hit = clip == 1.0 && multiplier == job->grad_multiplier;
    RETURN_IF_ERROR(scaler->Update(false));
    pool->Verdict(next, hit, multiplier);
    job->grad_multiplier = multiplier;
    r->speculation = hit ? Speculation::kCommitted : Speculation::kMissed;
    job_in_backward = false;
    return Status::OK();
  }
  if (job_in_backward) {
    if (g.overflow) {
      // Some shards may hold this step's update already (never one whose
      // own gradient is non-finite). Which ones is settled once the workers
      // have left the job; the error then sticks.
      Status e = FailedPrecondition(
          NonFiniteText(next, g.loss) +
          "; with bf16/fp32 (or a static fp16 loss scale) there is no loss scale to lower: lower the learning rate "
          "or check the data. The optimizer was updating during the backward (" + run.mode.why +
          "): shards taken before this was known may hold step " + std::to_string(next) +
          "'s update, so the in-memory state may be partly updated and cannot be saved; resume from the last "
          "checkpoint");
      pool->WaitIdle();
      pool->SetError(e);
      job_in_backward = false;
      return e;
    }
    RETURN_IF_ERROR(scaler->Update(false));
    job_in_backward = false;
    return Status::OK();
  }
  if (g.overflow && scaler->dynamic()) {
    job->step = next;
    job->skip = true;
    r->skipped = true;
  } else if (g.overflow) {
    return FailedPrecondition(NonFiniteText(next, g.loss) +
                              "; with bf16/fp32 there is no loss scale to lower: lower the learning rate or "
                              "check the data");
  } else {
    *job = MakeJob(next, lr, optim::GradMultiplier(scale, clip), false);
  }
  RETURN_IF_ERROR(scaler->Update(g.overflow));
  return pool->Post(*job);
}

// What moved since the last step, less what Evaluate/Save moved: this
// step's own transfers, and the previous step's update (whose copies may
// fall before, in or after this step: counted apart). NVMe traffic still
// running now counts in the next step.
void Trainer::Impl::ReportBytes(const OptimizerCopies::Snapshot& now, StepReport* r) {
  const LinkBytes& m = now.links;
  LinkBytes& last = last_bytes;
  LinkBytes& ex = excluded_bytes;
  r->h2d = m.h2d - last.h2d - ex.h2d - (now.all.h2d - last_opt_copied.h2d) + now.job.h2d;
  r->d2h = m.d2h - last.d2h - ex.d2h - (now.all.d2h - last_opt_copied.d2h) + now.job.d2h;
  r->nvme_read = m.nvme_read - last.nvme_read - ex.nvme_read;
  r->nvme_write = m.nvme_write - last.nvme_write - ex.nvme_write;
  last = m;
  last_opt_copied = now.all;
  ex = LinkBytes{};
}

Result<StepReport> Trainer::Impl::RunStep(const int32_t* tokens, const int32_t* targets) {
  RETURN_IF_ERROR(ReadyForStep());
  StepReport r;
  trace::NameThread("step");
  trace::Span whole("step", [&] { return "step " + std::to_string(step + 1); });
  const double t0 = NowSeconds();
  ASSIGN_OR_RETURN(int64_t valid, UploadInputs(tokens, targets));
  if (dp) {
    ASSIGN_OR_RETURN(valid, dp->SumCount(valid));  // the global batch's mean: every rank's targets
  }
  const double scale = scaler->scale();
  const int64_t next = step + 1;  // the optimizer step this one takes
  const optim::LrValue lr = schedule->ForStep(next);
  r.lr = lr.lr;
  env->BeginStep(static_cast<float>(scale / static_cast<double>(std::max<int64_t>(valid, 1))), next);
  OptJob job;  // the job this step posts
  const bool speculate = SpeculateNow();
  last_clip_one = false;  // until this step succeeds with a clip coefficient of 1

  // Forward, head and backward: one pass over the layers with every
  // micro-batch (layer-major), or one pass per micro-batch.
  double fwd_s = 0, f0 = t0;  // the first forward counts the step's input checks and copies
  StepHooks hooks;
  double pass0 = t0;  // (the trace's: where the pass now running began)
  hooks.around_forward = [&](bool done) -> Status {
    if (!done) {
      // A backward pass ended here (micro-batch-major), unless this is the first forward.
      if (trace::On()) {
        const double t = NowSeconds();
        if (pass0 > t0) trace::Complete("step", "head and backward", pass0, t);
        pass0 = t;
      }
      return Status::OK();
    }
    if (cfg().wall_clock_breakdown) RETURN_IF_ERROR(backend->Synchronize());
    const double t = NowSeconds();
    fwd_s += t - f0;
    f0 = t;
    trace::Complete("step", "forward", pass0, t);
    pass0 = t;
    return Status::OK();
  };
  hooks.before_last_backward = [&]() -> Status {
    // The update runs during the backward's last pass, each shard as its
    // gradient is final, with the multiplier it would have after it: no
    // clipping and a static scale (UpdateModeFor), or, speculating, a clip
    // coefficient of 1, which the verdict checks.
    if (!run.mode.during_backward && !speculate) return Status::OK();
    job = MakeJob(next, lr, optim::GradMultiplier(scale, 1.0), true);
    job.speculative = speculate;
    RETURN_IF_ERROR(pool->Post(job));
    counted.assign(state->size(), CopyTicket{});
    job_in_backward = true;
    return Status::OK();
  };
  if (param_gather) param_gather->BeginStep();  // (stage 3: the gathers fetched ahead of use)
  if (grad_reduce) RETURN_IF_ERROR(grad_reduce->Drain());  // (none, unless the last step failed mid-backward)
  RETURN_IF_ERROR(RunStepPasses(*program, *env, shape, hooks));
  if (param_gather) RETURN_IF_ERROR(param_gather->EndStep());
  RETURN_IF_ERROR(FinishBackward());
  const double t2 = NowSeconds();
  trace::Complete("step", "head and backward", pass0, t2);
  trace::Span after("step", "after the backward (loss, norm, the update's verdict, gathers)");
  // The links' counters and the optimizer's own copies, read together; the
  // previous step's job is complete (the forward waited for all its shards).
  const OptimizerCopies::Snapshot moved = copies->Take(next - 1);

  ASSIGN_OR_RETURN(const Gradients g, ReadLossAndNorm(valid, scale));
  r.loss = g.loss;
  r.grad_norm = g.norm;
  r.loss_scale = scale;
  RETURN_IF_ERROR(SettleUpdate(next, lr, scale, g, &job, &r));
  step = next;
  last_clip_one = !g.overflow && optim::ClipCoefficient(g.norm, cfg().gradient_clipping) == 1.0;
  RETURN_IF_ERROR(pool->UpdateGpuPrefix(job, host_update.get()));
  RETURN_IF_ERROR(GatherParams());
  // Parameters the update has written already start up now (counted in the
  // next step, as they are used there).
  if (job.streaming) RETURN_IF_ERROR(prefetch.prefetcher->Poll());

  r.step = step;
  r.tokens = shape.micro_batches * cfg().micro_batch * cfg().model.seq_len;
  // The whole step: what follows the backward (the loss and norm, the
  // update of the GPU-state prefix, which is every shard all-resident, the
  // gathers) holds the next step back as much as the passes do.
  r.seconds = NowSeconds() - t0;
  r.forward_s = fwd_s;
  r.backward_s = t2 - t0 - fwd_s;  // head and backward (and, micro-batch-major, everything but the forwards)
  r.wait_s = env->wait_seconds();
  const OptimizerPool::JobStats prev = pool->Stats(next - 1);  // the previous step's update (it overlaps this forward)
  r.optimizer_s = prev.seconds;
  r.optimizer_gpu_share = assist_update ? prev.assist_share : 0;
  ReportBytes(moved, &r);
  const double flops = ModelFlopsPerToken(spec, cfg().model.seq_len) * static_cast<double>(r.tokens);
  r.tflops = flops / std::max(r.seconds, 1e-9) / 1e12;
  r.mfu = peak.flops > 0 ? flops / std::max(r.seconds, 1e-9) / peak.flops : 0;
  return r;
}

}  // namespace strata
