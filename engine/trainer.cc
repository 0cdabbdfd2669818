// The offload trainer, composed of pieces that each own their state:
//
//   budgets.h          the budgets, the plan and the update mode (decided
//                      before anything is allocated; --dry-run calls it too)
//   model_state.h      the model's tensors in the tier store, init, state I/O
//   step_buffers.h     the step's GPU scratch
//   step_env.h         the step's passes' environment (models/passes.h)
//   step_schedule.h    the access schedule recorded from those passes, and
//                      the prefetcher that runs it
//   optimizer_pool.h   the optimizer's workers, jobs, verdicts, sticky errors
//   shard_update.h     what a worker does with a shard (CPU Adam, GPU Adam,
//                      GPU-assisted streaming)
//   evaluation.h       the validation loss, by the same passes
//   run_log.h          the run's lines, JSON records and progress bar
//
// Read top to bottom this file is: Create (setup), the step (RunStep and
// the pieces of it), Save/Evaluate, Run.
#include "engine/trainer.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/device.h"
#include "engine/budgets.h"
#include "engine/checkpoint.h"
#include "engine/data.h"
#include "engine/evaluation.h"
#include "engine/gradient_counts.h"
#include "engine/link_bytes.h"
#include "engine/model_config.h"
#include "engine/model_state.h"
#include "engine/optimizer_pool.h"
#include "engine/run_log.h"
#include "engine/shard_update.h"
#include "engine/step_buffers.h"
#include "engine/step_env.h"
#include "engine/step_schedule.h"
#include "kernels/backend.h"
#include "kernels/gemm_peak.h"
#include "models/model_program.h"
#include "optim/cpu_adam.h"
#include "optim/grad_clip.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "tiers/tier_store.h"

namespace strata {

namespace {

int64_t TotalSteps(const TrainOptions& o) { return o.steps >= 0 ? o.steps : o.config.trainer.steps; }

Result<std::unique_ptr<kernels::Backend>> MakeBackend(const TrainOptions& o) {
  if (o.backend == "cpu") return kernels::MakeCpuBackend(o.cpu_threads);
  if (o.backend == "cuda") return kernels::MakeCudaBackend(0);
  if (o.backend != "auto")
    return InvalidArgument("backend \"" + o.backend + "\" is not allowed (allowed: auto, cpu, cuda)");
  auto cuda = kernels::MakeCudaBackend(0);
  if (cuda.ok()) return cuda;
  return kernels::MakeCpuBackend(o.cpu_threads);
}

// The store the plan asks for: a GPU tier (the host stand-in without CUDA)
// and a host tier within the budgets, an NVMe tier when state lives there.
TierStoreOptions StoreOptions(const TrainOptions& o, const RunPlan& run, bool cuda) {
  const Config& cfg = o.config;
  TierStoreOptions so;
  so.gpu = true;
  so.gpu_tier.budget_bytes = run.budgets.gpu;
  // One slab: streamed blocks of a few hundred MiB would otherwise leave
  // unusable ends in each 512 MiB slab.
  so.gpu_tier.slab_bytes = 0;
  so.gpu_tier.stand_in = !cuda;
  so.host_tier.budget_bytes = run.budgets.host;
  so.host_tier.pin = cfg.zero.offload_optimizer.pin_memory && cfg.zero.offload_param.pin_memory;
  so.copy.stand_in = !cuda;
  // The prefetcher hints each copy's next use: should the store ever have to
  // make room itself, it drops the copy needed farthest ahead.
  so.eviction = EvictionPolicy::kNextUse;
  if (run.plan.optimizer == TierKind::kNvme || run.plan.params == TierKind::kNvme) {
    NvmeOptions no;
    no.dirs = {!cfg.zero.offload_optimizer.nvme_path.empty() ? cfg.zero.offload_optimizer.nvme_path
                                                             : cfg.zero.offload_param.nvme_path};
    no.block_size = static_cast<uint32_t>(cfg.aio.block_size);
    no.queue_depth = static_cast<uint32_t>(cfg.aio.queue_depth);
    no.rings = cfg.aio.intra_op_parallelism;
    no.single_submit = cfg.aio.single_submit;
    no.overlap_events = cfg.aio.overlap_events;
    no.env = o.nvme_env;
    so.nvme = no;
  }
  return so;
}

Result<optim::LossScaler> MakeLossScaler(const Config& cfg) {
  optim::LossScalerConfig lsc;
  if (cfg.fp16.enabled) {
    lsc.loss_scale = cfg.fp16.loss_scale;
    lsc.initial_scale_power = cfg.fp16.initial_scale_power;
    lsc.loss_scale_window = cfg.fp16.loss_scale_window;
    lsc.hysteresis = cfg.fp16.hysteresis;
    lsc.consecutive_hysteresis = cfg.fp16.consecutive_hysteresis;
    lsc.min_loss_scale = cfg.fp16.min_loss_scale;
  } else {
    lsc.loss_scale = 1.0;  // bf16/fp32: a static scale of 1
  }
  return optim::LossScaler::Create(lsc);
}

std::string NonFiniteText(int64_t step, double loss) {
  return "non-finite gradients at step " + std::to_string(step) + " (loss " + std::to_string(loss) + ")";
}

}  // namespace

struct Trainer::Impl {
  TrainOptions opt;
  std::ostream* log = &std::cerr;
  models::ModelSpec spec;
  DType dtype = DType::kF32;
  StepShape shape;
  std::unique_ptr<kernels::Backend> backend;
  std::optional<models::ModelProgram> program;
  kernels::GemmPeak peak;
  RunPlan run;  // a value: the trainer does not edit it
  std::unique_ptr<TierStore> store;
  // Declared after the store, destroyed before it. The pool (its threads)
  // goes first, then what its workers use.
  std::optional<StepBuffers> buffers;
  std::unique_ptr<ModelState> state;
  std::unique_ptr<optim::CpuAdam> adam;
  std::unique_ptr<OptimizerCopies> copies;
  std::unique_ptr<HostShardUpdate> host_update;
  std::unique_ptr<AssistShardUpdate> assist_update;
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

  // ---- setup ------------------------------------------------------------------
  Status Setup();
  Status SetUpOptimizer();
  Status InitState();
  Status StartStep();

  // ---- the step -------------------------------------------------------------------
  Result<StepReport> RunStep(const int32_t* tokens, const int32_t* targets);
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

// ---- setup -------------------------------------------------------------------

Status Trainer::Impl::Setup() {
  const Config& c = cfg();
  ASSIGN_OR_RETURN(spec, ModelSpecFor(c));
  dtype = ComputeDType(c);
  shape = StepShape{c.grad_accum, c.trainer.schedule != "micro-batch-major"};
  if (c.world_size != 1)
    return Unavailable("strata train runs one process on one GPU so far; world size is " +
                       std::to_string(c.world_size));
  ASSIGN_OR_RETURN(backend, MakeBackend(opt));
  ASSIGN_OR_RETURN(models::ModelProgram p, models::ModelProgram::Make(backend.get(), spec, c.micro_batch,
                                                                       c.model.seq_len, dtype));
  program.emplace(std::move(p));
  // The GEMM baseline first: the budgets then see what the libraries hold.
  ASSIGN_OR_RETURN(peak, kernels::MeasureGemmPeak(*backend));
  ASSIGN_OR_RETURN(run, PlanRun(opt, *backend, spec));
  ASSIGN_OR_RETURN(store, TierStore::Open(StoreOptions(opt, run, cuda())));
  optim::CpuAdam::Options ao;
  ao.threads = opt.cpu_threads;
  ASSIGN_OR_RETURN(adam, optim::CpuAdam::Create(ao));
  ASSIGN_OR_RETURN(optim::LossScaler ls, MakeLossScaler(c));
  scaler.emplace(ls);
  ASSIGN_OR_RETURN(optim::LrSchedule sched, optim::MakeLrSchedule(c.scheduler.type, c.scheduler.params,
                                                                  c.optimizer.lr, TotalSteps(opt), c.source));
  schedule.emplace(sched);
  ASSIGN_OR_RETURN(data, DataLoader::Open(c.data, opt.default_data, static_cast<int>(spec.vocab_size),
                                          static_cast<int>(c.micro_batch), static_cast<int>(c.model.seq_len)));
  // The step's scratch first: the working set must be there whatever the store caches.
  StepBuffers::Sizes z;
  z.block_scratch = program->block_scratch_bytes();
  z.head_scratch = program->head_scratch_bytes();
  z.batch = c.micro_batch, z.seq = c.model.seq_len, z.micro_batches = c.grad_accum;
  z.residual_sets = shape.layer_major ? c.grad_accum : 1;
  z.dtype = dtype, z.grad_dtype = GradDType(dtype);
  ASSIGN_OR_RETURN(StepBuffers b, StepBuffers::Allocate(store->gpu_tier(), spec, z));
  buffers.emplace(std::move(b));
  ModelState::Layout lay{dtype, GradDType(dtype), c.micro_batch, c.model.seq_len, c.grad_accum, shape.layer_major};
  ASSIGN_OR_RETURN(state, ModelState::Create(store.get(), spec, run.plan, lay, run.mode.speculative));
  const size_t n = static_cast<size_t>(c.grad_accum * c.micro_batch * c.model.seq_len);
  tok_host.resize(n);
  tgt_host.resize(n);
  loss_host.resize(n);
  RETURN_IF_ERROR(SetUpOptimizer());
  RETURN_IF_ERROR(InitState());
  return StartStep();
}

// The shard updates, the GPU-assisted worker when it runs, the counts of the
// update during the backward, the pool.
Status Trainer::Impl::SetUpOptimizer() {
  copies = std::make_unique<OptimizerCopies>(store.get());
  const ShardUpdateContext ctx{store.get(), state.get(), backend.get(), adam.get(), copies.get()};
  ASSIGN_OR_RETURN(host_update, HostShardUpdate::Create(ctx, cfg().zero.offload_optimizer));
  const std::string& mode = cfg().trainer.gpu_assisted_optimizer;
  if (mode == "on" || (mode == "auto" && cuda())) {
    const std::string no = AssistShardUpdate::Ineligible(*state);
    if (!no.empty()) {
      if (mode == "on") *log << "gpu-assisted optimizer: off (" << no << ")\n";
    } else {
      // Keep the swap window at least one streamed tensor wide (step_schedule.h).
      GpuTier* gt = store->gpu_tier();
      const uint64_t act = static_cast<uint64_t>(cfg().micro_batch * cfg().model.seq_len * spec.d_model);
      const uint64_t largest = AlignUp(act * DTypeSize(dtype), gt->alignment());
      std::string why;
      ASSIGN_OR_RETURN(assist_update, AssistShardUpdate::Create(ctx, opt.assist_chunk_params, largest, &why));
      if (!assist_update) {
        *log << "gpu-assisted optimizer: off (" << why << ")\n";
      } else {
        *log << "optimizer: CPU Adam and GPU-assisted streaming (master/m/v through 3 chunks of "
             << assist_update->chunk() << " parameters, " << FormatBytes(assist_update->buffer_bytes())
             << " of GPU memory), shards claimed in forward order\n";
      }
    }
  }
  if (run.mode.during_backward || run.mode.speculative) {
    ASSIGN_OR_RETURN(counts, GradientCounts::Create(store->host_tier(), state->size(), !cuda()));
  }
  *log << "optimizer update: " << run.mode.why << "\n";
  OptimizerPool::Options po;
  po.update_mode = run.mode.why;
  po.assist_takes_all = opt.assist_takes_all;
  pool = std::make_unique<OptimizerPool>(state.get(), counts.get(), copies.get(), host_update.get(),
                                         assist_update.get(), po);
  return Status::OK();
}

Status Trainer::Impl::InitState() {
  if (!opt.resume_dir.empty()) {
    TrainState ts;
    std::string path;
    RETURN_IF_ERROR(LoadCheckpoint(opt.resume_dir, spec, state->CheckpointShards(), &ts, &path));
    step = ts.step;
    data->set_position(ts.data_position);
    RETURN_IF_ERROR(scaler->Restore(ts.scaler));
    pool->SetAllUpdated(step);
    *log << "resumed from " << path << " at step " << step << "\n";
    return Status::OK();
  }
  if (!opt.init_from.empty()) {
    RETURN_IF_ERROR(state->InitFromHf(opt.init_from, opt.init_prefix));
    *log << "initialized from " << opt.init_from << "\n";
    return Status::OK();
  }
  return state->InitRandom(cfg().trainer.seed);
}

// The step's schedule, recorded from its passes, the prefetcher that runs
// it, the environment the passes run in; then the workers start.
Status Trainer::Impl::StartStep() {
  ASSIGN_OR_RETURN(AccessSchedule s,
                   RecordStepSchedule(*program, state.get(), &*buffers, backend.get(), shape, *store));
  // A shard's parameters are loaded for step `cycle` only once the optimizer
  // has written them (exactness: never a stale weight, never a wasted load),
  // and not before the step that made them has ended (`step`, the step
  // thread's, as this is called on it): an update that runs during the
  // backward does not pull the next step's loads into this one, so each
  // step moves what its schedule says.
  auto ready = [this](TensorId id, uint64_t cycle) {
    const std::optional<size_t> s = state->ShardOfParams(id);
    if (!s) return true;
    const int64_t want = prefetch_step0 + static_cast<int64_t>(cycle);
    return step >= want && pool->Updated(*s, want);
  };
  prefetch_step0 = step;
  ASSIGN_OR_RETURN(prefetch, StartStepPrefetcher(store.get(), std::move(s), *state, ready));
  access = std::make_unique<PrefetchedAccess>(prefetch.prefetcher.get(), stream());
  StepEnv::Hooks hooks;
  hooks.before_params = [this](size_t s, double* wait_s) { return WaitForUpdate(s, wait_s); };
  hooks.grad_final = [this](size_t s) { return GradFinal(s); };
  StepEnv::Options eo;
  eo.inject_nonfinite_shard = opt.inject_nonfinite_shard;
  eo.inject_nonfinite_step = opt.inject_nonfinite_step;
  env = std::make_unique<StepEnv>(state.get(), &*buffers, backend.get(), access.get(), shape, std::move(hooks), eo);
  last_bytes = StoreLinkBytes(*store);
  pool->Start();
  return Status::OK();
}

// ---- the step ---------------------------------------------------------------------

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
  Gradients g;
  g.loss = total / static_cast<double>(std::max<int64_t>(valid, 1));
  float sumsq = 0;
  std::vector<int32_t> nonfinite(state->size(), 0);
  RETURN_IF_ERROR(backend->CopyToHost(&sumsq, buffers->stats.data(), 4));
  RETURN_IF_ERROR(backend->CopyToHost(nonfinite.data(), buffers->nonfinite(0), nonfinite.size() * 4));
  optim::GradStats gs;
  gs.sum_sq = sumsq;
  for (int32_t c : nonfinite) gs.nonfinite += static_cast<uint64_t>(c);
  g.overflow = gs.overflow() || !std::isfinite(sumsq);
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
  const double t0 = NowSeconds();
  ASSIGN_OR_RETURN(const int64_t valid, UploadInputs(tokens, targets));
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
  hooks.around_forward = [&](bool done) -> Status {
    if (!done) return Status::OK();
    if (cfg().wall_clock_breakdown) RETURN_IF_ERROR(backend->Synchronize());
    const double t = NowSeconds();
    fwd_s += t - f0;
    f0 = t;
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
  RETURN_IF_ERROR(RunStepPasses(*program, *env, shape, hooks));
  RETURN_IF_ERROR(FinishBackward());
  const double t2 = NowSeconds();
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
  // Parameters the update has written already start up now (counted in the
  // next step, as they are used there).
  if (job.streaming) RETURN_IF_ERROR(prefetch.prefetcher->Poll());

  r.step = step;
  r.tokens = shape.micro_batches * cfg().micro_batch * cfg().model.seq_len;
  r.seconds = t2 - t0;
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

// ---- Trainer -----------------------------------------------------------------------

const char* SpeculationName(Speculation s) {
  switch (s) {
    case Speculation::kNone: return "none";
    case Speculation::kCommitted: return "committed";
    case Speculation::kMissed: return "missed";
  }
  return "?";
}

Trainer::Trainer() : impl_(std::make_unique<Impl>()) {}
Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainOptions& options, std::ostream& log) {
  std::unique_ptr<Trainer> t(new Trainer());
  t->impl_->opt = options;
  t->impl_->log = &log;
  RETURN_IF_ERROR(t->impl_->Setup());
  return t;
}

Result<std::string> Trainer::DryRun(const TrainOptions& options) {
  const Config& cfg = options.config;
  ASSIGN_OR_RETURN(models::ModelSpec spec, ModelSpecFor(cfg));
  // The budgets as the run would see them: the backend it would use, after
  // the GEMM baseline it would measure (nothing else is allocated).
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> be, MakeBackend(options));
  RETURN_IF_ERROR(kernels::MeasureGemmPeak(*be).status());
  ASSIGN_OR_RETURN(RunPlan run, PlanRun(options, *be, spec));
  std::ostringstream os;
  os << "model: " << spec.n_layer << " layers, d " << spec.d_model << ", " << spec.n_head << " heads, vocab "
     << spec.vocab_size << " (padded " << spec.padded_vocab << "), seq " << cfg.model.seq_len << "; "
     << spec.NumParameters() << " parameters, " << cfg.precision() << "\n";
  os << "batch: micro " << cfg.micro_batch << " x accumulation " << cfg.grad_accum << " = " << cfg.train_batch_size
     << " sequences per step\n";
  os << run.plan.Table(run.budgets.gpu, run.budgets.host);
  os << "optimizer update: " << run.mode.why << "\n";
  return os.str();
}

const Plan& Trainer::plan() const { return impl_->run.plan; }
const ScheduledTraffic& Trainer::traffic() const { return impl_->prefetch.traffic; }

std::string Trainer::PlanTable() const {
  const Impl& I = *impl_;
  const Plan& p = I.run.plan;
  const ScheduledTraffic& t = I.prefetch.traffic;
  std::ostringstream os;
  os << p.Table(I.run.budgets.gpu, I.run.budgets.host);
  os << "swap window: " << FormatBytes(t.swap_window)
     << " of GPU memory for streamed tensors (prefetched by the step's schedule)\n";
  os << "per step (scheduled): H2D " << FormatBytes(t.h2d) << ", D2H " << FormatBytes(t.d2h) << ", NVMe read "
     << FormatBytes(p.nvme_read) << ", NVMe write " << FormatBytes(p.nvme_write) << "\n";
  os << "optimizer update: " << I.run.mode.why << "\n";
  return os.str();
}

int64_t Trainer::step() const { return impl_->step; }

TrainerInfo Trainer::Info() const {
  const Impl& I = *impl_;
  TrainerInfo t;
  t.backend = I.backend->name();
  t.peak_flops = I.peak.flops;
  t.peak_what = I.peak.what;
  t.flops_per_token = ModelFlopsPerToken(I.spec, I.cfg().model.seq_len);
  t.tokens_per_step = I.shape.micro_batches * I.cfg().micro_batch * I.cfg().model.seq_len;
  t.gpu_budget = I.run.budgets.gpu;
  t.host_budget = I.run.budgets.host;
  t.gpu_overhead = I.run.budgets.gpu_overhead;
  TierStoreStats st = I.store->stats();
  t.gpu_tier_peak = st.tiers[0].usage.peak_used;
  t.host_tier_peak = st.tiers[1].usage.peak_used;
  PrefetcherStats ps = I.prefetch.prefetcher->stats();
  t.swap_window = I.prefetch.prefetcher->budget();
  t.swap_prefetches = ps.prefetches;
  t.swap_evictions = ps.evictions;
  t.swap_forced = ps.forced;
  t.swap_fragmented = ps.fragmented;
  t.gpu_evictions = st.tiers[0].evictions;
  for (const Shard& sh : I.state->shards())
    if (sh.opt_home == TierKind::kGpu) {
      ++t.optimizer_gpu_shards;
      t.optimizer_gpu_params += static_cast<uint64_t>(sh.numel);
    }
  t.optimizer_during_backward = I.run.mode.during_backward;
  t.optimizer_speculative = I.run.mode.speculative;
  t.speculative_bytes = I.run.mode.speculative ? I.run.plan.speculative_bytes : 0;
  t.optimizer_update = I.run.mode.why;
  if (I.cuda()) {
    auto info = QueryGpu(0);
    if (info.ok()) t.device_in_use = info->total_bytes - info->free_bytes;
  }
  return t;
}

Result<StepReport> Trainer::Step() {
  Impl& I = *impl_;
  const int64_t BT = I.cfg().micro_batch * I.cfg().model.seq_len;
  // Straight into the step's host buffers (StepWith does not copy them onto themselves).
  for (int64_t a = 0; a < I.shape.micro_batches; ++a)
    RETURN_IF_ERROR(I.data->NextTrain(I.tok_host.data() + a * BT, I.tgt_host.data() + a * BT));
  return StepWith(I.tok_host.data(), I.tgt_host.data());
}

Result<StepReport> Trainer::StepWith(const int32_t* tokens, const int32_t* targets) {
  Impl& I = *impl_;
  Result<StepReport> r = I.RunStep(tokens, targets);
  if (I.job_in_backward) {  // failed with its job posted during the backward
    I.job_in_backward = false;
    I.pool->Abort(r.status(), I.step);
  }
  return r;
}

Result<double> Trainer::Evaluate(int batches) {
  Impl& I = *impl_;
  const EvalContext ctx{&*I.program, I.state.get(), &*I.buffers, I.store.get(), I.backend.get(),
                        I.run.plan.params_resident};
  double loss = 0;
  RETURN_IF_ERROR(I.Aside([&]() -> Status {
    ASSIGN_OR_RETURN(loss, EvaluateLoss(ctx, I.data.get(), batches));
    return Status::OK();
  }));
  return loss;
}

Status Trainer::Save(const std::string& dir) {
  Impl& I = *impl_;
  return I.Aside([&] {
    TrainState ts;
    ts.step = I.step;
    ts.data_position = I.data->position();
    ts.scaler = I.scaler->state();
    ts.precision = I.cfg().precision();
    return SaveCheckpoint(dir, I.spec, I.state->CheckpointShards(), ts, ConfigToJson(I.cfg()), &std::cerr);
  });
}

Result<std::vector<float>> Trainer::Parameter(const std::string& hf_name) {
  Impl& I = *impl_;
  // Failed (sticky): the state as the workers leave it.
  if (!I.pool->WaitAll(I.step).ok()) I.pool->WaitIdle();
  return I.state->Parameter(hf_name);
}

// ---- the run: steps, logs, evaluation, checkpoints -----------------------------------------

Status Trainer::Run(std::ostream& out) {
  Impl& I = *impl_;
  const Config& c = I.cfg();
  const int64_t total = TotalSteps(I.opt);
  out << "strata: " << I.backend->name() << "; GEMM baseline " << I.peak.what << "\n";
  out << "model: " << I.spec.n_layer << " layers, d " << I.spec.d_model << ", " << I.spec.n_head << " heads, vocab "
      << I.spec.vocab_size << ", seq " << c.model.seq_len << ": " << I.spec.NumParameters() << " parameters, "
      << c.precision() << "; batch " << c.micro_batch << " x " << c.grad_accum << " micro-batches\n";
  out << "data: " << I.data->Describe() << "\n";
  out << "plan:\n" << PlanTable();
  if (I.run.budgets.gpu_overhead)
    out << "gpu: the tier's budget is the limit less " << FormatBytes(I.run.budgets.gpu_overhead)
        << " held outside it (CUDA context, cuBLASLt, a margin)\n";
  out.flush();
  RunLog::Options lo;
  lo.total_steps = total;
  lo.every = c.steps_per_print;
  lo.peak_flops = I.peak.flops;
  lo.flops_per_token = ModelFlopsPerToken(I.spec, c.model.seq_len);
  lo.wall_clock_breakdown = c.wall_clock_breakdown;
  lo.assist = I.assist_update != nullptr;
  lo.speculative = I.run.mode.speculative;
  lo.progress = I.opt.progress;
  lo.json_path = I.opt.log_json;
  ASSIGN_OR_RETURN(RunLog log, RunLog::Open(&out, lo));
  auto validate = [&]() -> Status {
    ASSIGN_OR_RETURN(double vl, Evaluate(c.trainer.eval_batches));
    out << "step " << I.step << " | val loss " << Fixed(vl, 4) << "\n";
    return Status::OK();
  };
  while (I.step < total) {
    if (Status files = I.CheckSwapFiles(); !files.ok()) {
      // Nothing of the step has run and the deleted file's data is still
      // readable through the tier's descriptor: save it while we can.
      if (I.opt.save_dir.empty())
        return files.WithContext("stopping before step " + std::to_string(I.step + 1) +
                                 " (no --save DIR to keep the state in); resume from the last checkpoint");
      RETURN_IF_ERROR(Save(I.opt.save_dir).WithContext("saving the state after " + files.ToString()));
      return files.WithContext("stopping before step " + std::to_string(I.step + 1) + "; the state after step " +
                               std::to_string(I.step) + " was saved to " + I.opt.save_dir + " (resume from it)");
    }
    ASSIGN_OR_RETURN(StepReport r, Step());
    log.Add(r, I.store->stats());
    if (c.trainer.eval_interval > 0 && r.step % c.trainer.eval_interval == 0 && I.data->val_tokens())
      RETURN_IF_ERROR(validate());
    if (!I.opt.save_dir.empty() && I.opt.save_every > 0 && r.step % I.opt.save_every == 0 && r.step != total)
      RETURN_IF_ERROR(Save(I.opt.save_dir));
  }
  if (I.data->val_tokens()) RETURN_IF_ERROR(validate());
  if (!I.opt.save_dir.empty()) RETURN_IF_ERROR(Save(I.opt.save_dir));
  RETURN_IF_ERROR(I.pool->WaitAll(I.step));
  TierStoreStats st = I.store->stats();
  out << "memory: gpu tier peak " << FormatBytes(st.tiers[0].usage.peak_used) << " of its budget "
      << FormatBytes(st.tiers[0].usage.budget) << "; host tier peak " << FormatBytes(st.tiers[1].usage.peak_used);
  if (I.cuda()) {
    auto info = QueryGpu(0);
    if (info.ok())
      out << "; device in use now (cudaMemGetInfo, all of this process) "
          << FormatBytes(info->total_bytes - info->free_bytes);
  }
  out << "\n";
  return Status::OK();
}

}  // namespace strata
