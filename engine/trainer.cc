// SPDX-License-Identifier: Apache-2.0
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
// trainer_impl.h holds them (Trainer::Impl). This file is the setup (Create)
// and the API; trainer_step.cc is the step, trainer_run.cc the whole run.
#include "engine/trainer.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "base/bytes.h"
#include "base/device.h"
#include "engine/checkpoint.h"
#include "engine/evaluation.h"
#include "engine/hf_export.h"
#include "engine/model_config.h"
#include "engine/preflight.h"
#include "engine/trainer_impl.h"

namespace strata {

namespace {

// The backend, on `device` when it is CUDA.
Result<std::unique_ptr<kernels::Backend>> MakeBackend(const TrainOptions& o, int device) {
  if (o.backend == "cpu") return kernels::MakeCpuBackend(o.cpu_threads);
  if (o.backend == "cuda") return kernels::MakeCudaBackend(device);
  if (o.backend != "auto")
    return InvalidArgument("backend \"" + o.backend + "\" is not allowed (allowed: auto, cpu, cuda)");
  auto cuda = kernels::MakeCudaBackend(device);
  if (cuda.ok()) return cuda;
  return kernels::MakeCpuBackend(o.cpu_threads);
}

// The rank's GPU (LOCAL_RANK's, engine/data_parallel.h RankDevice), 0 for
// one process of its own or without a GPU; and its share of the machine.
Result<int> RankShare(TrainOptions* o) {
  if (!TakesRanksPath(*o)) return 0;
  ASSIGN_OR_RETURN(const comm::RankEnv env, comm::RankEnvFromEnvironment());
  ShareTheMachine(env, o);
  if (o->backend == "cpu") return 0;
  const int visible = CudaDeviceCount();
  if (visible == 0) return 0;  // (auto: the CPU backend; cuda: MakeCudaBackend says why)
  return RankDevice(env, visible);
}

// The store the plan asks for: a GPU tier (the host stand-in without CUDA)
// and a host tier within the budgets, an NVMe tier when state lives there.
TierStoreOptions StoreOptions(const TrainOptions& o, const RunPlan& run, const TierSizes& tiers, bool cuda) {
  const Config& cfg = o.config;
  TierStoreOptions so;
  so.gpu = true;
  so.gpu_tier.budget_bytes = tiers.gpu;
  // One slab: streamed blocks of a few hundred MiB would otherwise leave
  // unusable ends in each 512 MiB slab.
  so.gpu_tier.slab_bytes = 0;
  so.gpu_tier.stand_in = !cuda;
  so.host_tier.budget_bytes = tiers.host;
  so.host_tier.slab_bytes = tiers.host_slab;
  so.host_tier.pin = tiers.host_pin;
  so.copy.stand_in = !cuda;
  // The prefetcher hints each copy's next use: should the store ever have to
  // make room itself, it drops the copy needed farthest ahead.
  so.eviction = EvictionPolicy::kNextUse;
  if (run.plan.optimizer == TierKind::kNvme || run.plan.params == TierKind::kNvme) {
    NvmeOptions no;
    no.dirs = {NvmeDirOf(cfg)};
    no.block_size = static_cast<uint32_t>(cfg.aio.block_size);
    no.queue_depth = static_cast<uint32_t>(cfg.aio.queue_depth);
    no.rings = cfg.aio.intra_op_parallelism;
    no.single_submit = cfg.aio.single_submit;
    no.overlap_events = cfg.aio.overlap_events;
    no.checksum = ParseChecksumKind(cfg.trainer.nvme_checksum).value_or(ChecksumKind::kCrc32c);  // the config checked it
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

}  // namespace

// ---- setup -------------------------------------------------------------------

Status Trainer::Impl::Setup() {
  const Config& c = cfg();
  ASSIGN_OR_RETURN(spec, ModelSpecFor(c));
  dtype = ComputeDType(c);
  shape = StepShape{c.grad_accum, c.trainer.schedule != "micro-batch-major", ReducesBesideBackward(opt)};
  ASSIGN_OR_RETURN(const int device, RankShare(&opt));  // several ranks: this one's share of the machine first
  ASSIGN_OR_RETURN(backend, MakeBackend(opt, device));
  if (TakesRanksPath(opt)) {
    ASSIGN_OR_RETURN(dp, DataParallel::Create(c, backend.get(), device, opt.comm_timeout_s, spec.largest_unit()));
    if (!dp->leads()) log = &quiet;  // (Run prints what the ranks do)
  }
  if (shape.reduce_beside) {
    // In place in the accumulator: partitioned, a reduce-scatter of its
    // padded flat partitions; else the all-reduce of the unit.
    auto sum = [this](size_t u, float* acc, int64_t numel, int64_t, void* s) -> Status {
      if (state->layout().partitioned()) return dp->ReduceScatterInPlace(acc, state->shard(u).slice_pad, s);
      return dp->ReduceGradient(acc, numel, s);
    };
    ASSIGN_OR_RETURN(grad_reduce, GradReduce::Create(backend.get(), device, std::move(sum)));
  }
  ASSIGN_OR_RETURN(models::ModelProgram p, models::ModelProgram::Make(backend.get(), spec, c.micro_batch,
                                                                       c.model.seq_len, dtype));
  program.emplace(std::move(p));
  // The GEMM baseline first: the budgets then see what the libraries hold.
  ASSIGN_OR_RETURN(peak, kernels::MeasureGemmPeak(*backend));
  ASSIGN_OR_RETURN(run, PlanRun(opt, *backend, spec));
  // What can be seen now is not left to fail after the run (engine/preflight.h).
  tiers = TierSizesFor(opt, run, spec, cuda());
  std::vector<std::string> warnings;
  RETURN_IF_ERROR(PreflightChecks(opt, run, tiers, spec, cuda(), &warnings));
  for (const std::string& w : warnings) *log << "warning: " << w << "\n";
  if (!opt.save_dir.empty() && leads()) {  // rank 0 alone writes checkpoints
    ASSIGN_OR_RETURN(SaveDirLock lock, SaveDirLock::Acquire(opt.save_dir, log));
    save_lock.emplace(std::move(lock));
  }
  ASSIGN_OR_RETURN(store, TierStore::Open(StoreOptions(opt, run, tiers, cuda())));
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
  if (dp) data->SetRanks(dp->rank(), dp->world());
  ModelState::Layout lay{dtype, GradDType(dtype), c.micro_batch, c.model.seq_len, c.grad_accum, shape.layer_major};
  lay.moment_dtype = MomentDType(c);
  if (dp) {
    lay.rank = dp->rank();
    lay.world = dp->world();
    lay.zero_stage = c.zero.stage;
    lay.partition_one = opt.partition_at_world_one;
  }
  // The step's scratch first: the working set must be there whatever the store caches.
  StepBuffers::Sizes z;
  z.block_scratch = program->block_scratch_bytes();
  z.head_scratch = program->head_scratch_bytes();
  z.batch = c.micro_batch, z.seq = c.model.seq_len, z.micro_batches = c.grad_accum;
  z.residual_sets = shape.layer_major ? c.grad_accum : 1;
  z.dtype = dtype;
  z.accumulators = !lay.grad_is_accumulator();
  z.world = lay.partitioned() ? lay.world : 1;
  z.second_block_accumulator = shape.reduce_beside;
  if (shape.reduce_beside && (!z.accumulators || (!shape.layer_major && shape.micro_batches > 1)))
    return Internal("the gradients' sums beside the backward need the step's fp32 scratch accumulators, each "
                    "final once per step");
  ASSIGN_OR_RETURN(StepBuffers b, StepBuffers::Allocate(store->gpu_tier(), spec, z));
  buffers.emplace(std::move(b));
  ASSIGN_OR_RETURN(state, ModelState::Create(store.get(), spec, run.plan, lay, run.mode.speculative));
  if (lay.partitioned()) {
    auto gather = [this](const void* send, size_t count, DType dt, void* recv, size_t recv_elems, bool on_backend) {
      return dp->AllGather(send, count, dt, recv, recv_elems, on_backend);
    };
    state->SetGather(gather);
    if (lay.gathers_params()) {
      ParamGather::Options go;
      go.gather = [this](void* buf, size_t count, DType dt, void* s) { return dp->AllGatherInPlace(buf, count, dt, s); };
      // Never a slice the optimizer has not written yet (the first use's wait, brought forward).
      go.before_gather = [this](size_t u) {
        double waited = 0;
        return WaitForUpdate(u, &waited);
      };
      go.prefetch_elems = c.zero.prefetch_bucket_size;
      go.own_stream = c.zero.overlap_comm;
      ASSIGN_OR_RETURN(param_gather, ParamGather::Create(state.get(), backend.get(), std::move(go)));
    }
  }
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
  ASSIGN_OR_RETURN(host_update, HostShardUpdate::Create(ctx, cfg().zero.offload_optimizer, opt.host_piece_params));
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
    RETURN_IF_ERROR(LoadCheckpoint(opt.resume_dir, spec, state->CheckpointShards(), &ts, &path, log));
    model_source = path;  // its config.json and tokenizer files go into the next checkpoints
    step = ts.step;
    data->set_position(ts.data_position);
    RETURN_IF_ERROR(scaler->Restore(ts.scaler));
    pool->SetAllUpdated(step);
    *log << "resumed from " << path << " at step " << step << "\n";
    return Status::OK();
  }
  if (!opt.init_from.empty()) {
    RETURN_IF_ERROR(state->InitFromHf(opt.init_from, opt.init_prefix));
    model_source = ModelSourceDir(opt.init_from);
    *log << "initialized from " << opt.init_from << "\n";
    return Status::OK();
  }
  return state->InitRandom(cfg().trainer.seed);
}

// The step's schedule, recorded from its passes, the prefetcher that runs
// it, the environment the passes run in; then the workers start.
Status Trainer::Impl::StartStep() {
  std::vector<size_t> gathers;
  ASSIGN_OR_RETURN(AccessSchedule s,
                   RecordStepSchedule(*program, state.get(), &*buffers, backend.get(), shape, *store, &gathers));
  if (param_gather) param_gather->SetStepOrder(std::move(gathers));
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
  if (dp && state->layout().partitioned()) {
    hooks.reduce_grad = [this](size_t u, void* g, int64_t n) {
      return dp->ReduceScatterGradient(static_cast<float*>(g), n, state->shard(u).slice_pad);
    };
  } else if (dp) {
    hooks.reduce_grad = [this](size_t, void* g, int64_t n) { return dp->ReduceGradient(g, n, stream()); };
  }
  hooks.grad_reduce = grad_reduce.get();
  if (param_gather) {
    hooks.acquire_params = [this](size_t u) { return param_gather->Acquire(u); };
    hooks.release_params = [this](size_t u) { return param_gather->Release(u); };
  }
  StepEnv::Options eo;
  eo.inject_nonfinite_shard = opt.inject_nonfinite_shard;
  eo.inject_nonfinite_step = opt.inject_nonfinite_step;
  env = std::make_unique<StepEnv>(state.get(), &*buffers, backend.get(), access.get(), shape, std::move(hooks), eo);
  last_bytes = StoreLinkBytes(*store);
  pool->Start();
  return Status::OK();
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

Status Trainer::FinishTrace() {
  // The last step's update may still run (it overlaps the next forward): in the file too.
  Status s = impl_->pool ? impl_->pool->WaitAll(impl_->step) : Status::OK();
  Status w = impl_->trace.Finish();
  return s.ok() ? w : s;
}

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainOptions& options, std::ostream& log) {
  std::unique_ptr<Trainer> t(new Trainer());
  t->impl_->owner = t.get();
  t->impl_->opt = options;
  t->impl_->log = &log;
  if (!options.trace_path.empty()) {
    // Before anything starts a thread, so that every thread's track is named.
    int rank = 0;
    if (TakesRanksPath(options)) {
      ASSIGN_OR_RETURN(const comm::RankEnv env, comm::RankEnvFromEnvironment());
      rank = env.rank;
    }
    const std::string path = TracePathOfRank(options.trace_path, rank, options.config.world_size);
    ASSIGN_OR_RETURN(t->impl_->trace, trace::Recording::Begin(path));
  }
  RETURN_IF_ERROR(t->impl_->Setup());
  return t;
}

Result<std::string> Trainer::DryRun(const TrainOptions& given) {
  TrainOptions options = given;
  const Config& cfg = options.config;
  ASSIGN_OR_RETURN(const int device, RankShare(&options));  // each rank's plan: its share of the machine
  ASSIGN_OR_RETURN(models::ModelSpec spec, ModelSpecFor(cfg));
  // The budgets as the run would see them: the backend it would use, after
  // the GEMM baseline it would measure (nothing else is allocated).
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> be, MakeBackend(options, device));
  RETURN_IF_ERROR(kernels::MeasureGemmPeak(*be).status());
  ASSIGN_OR_RETURN(RunPlan run, PlanRun(options, *be, spec));
  const bool cuda = be->kind() == kernels::BackendKind::kCuda;
  const TierSizes tiers = TierSizesFor(options, run, spec, cuda);
  std::vector<std::string> warnings;
  RETURN_IF_ERROR(PreflightChecks(options, run, tiers, spec, cuda, &warnings));
  std::ostringstream os;
  for (const std::string& w : warnings) os << "warning: " << w << "\n";
  os << ZeroStageNote(cfg) << "\n";
  if (cfg.world_size != 1) {
    RETURN_IF_ERROR(CheckBatchRule(cfg));
    os << DataParallelNote(options, spec.NumParameters()) << "\n";
  }
  os << "model: " << spec.n_layer << " layers, d " << spec.d_model << ", " << spec.n_head << " heads, vocab "
     << spec.vocab_size << " (padded " << spec.padded_vocab << "), seq " << cfg.model.seq_len << "; "
     << spec.NumParameters() << " parameters, " << cfg.precision() << "\n";
  os << "batch: micro " << cfg.micro_batch << " x accumulation " << cfg.grad_accum << " = " << cfg.train_batch_size
     << " sequences per step\n";
  os << run.plan.Table(run.budgets.gpu, run.budgets.host);
  os << tiers.what;
  if (run.budgets.ranks_device)
    os << "gpu: " << FormatBytes(run.budgets.ranks_device) << " beside the tiers for the ranks' collectives (staging"
       << (PartitionsRanksState(options) && cfg.zero.stage >= 3 ? " and the gathered parameters of ZeRO stage 3" : "")
       << ")\n";
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
  os << I.tiers.what;
  os << "swap window: " << FormatBytes(t.swap_window)
     << " of GPU memory for streamed tensors (prefetched by the step's schedule)\n";
  os << "per step (scheduled): H2D " << FormatBytes(t.h2d) << ", D2H " << FormatBytes(t.d2h) << ", NVMe read "
     << FormatBytes(p.nvme_read) << ", NVMe write " << FormatBytes(p.nvme_write) << "\n";
  os << "optimizer update: " << I.run.mode.why << "\n";
  if (I.state->layout().partitioned()) {
    uint64_t own = 0;
    for (const Shard& sh : I.state->shards()) own += static_cast<uint64_t>(sh.slice_len);
    os << "zero stage " << I.cfg().zero.stage << " across " << I.dp->world() << " ranks: the optimizer state of 1/"
       << I.dp->world() << " of every unit per rank (" << own << " of " << I.spec.NumParameters()
       << " parameters on rank " << I.dp->rank() << ")"
       << (I.param_gather ? "; its parameters too are gathered at each use (ZeRO stage 3)" : "") << "\n";
  }
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
                        I.run.plan.params_resident, I.param_gather.get()};
  double loss = 0;
  RETURN_IF_ERROR(I.Aside([&]() -> Status {
    ASSIGN_OR_RETURN(loss, EvaluateLoss(ctx, I.data.get(), batches));
    return Status::OK();
  }));
  return loss;
}

namespace {

// Each rank's outcome of its part of a save, gathered by every rank: its
// state file's sum, or a failure (the rank's own error stays in its log).
struct RankFileRecord {
  int64_t ok = 0, crc32c = 0, bytes = 0;
};
static_assert(sizeof(RankFileRecord) == 3 * sizeof(int64_t), "gathered as three int64 values");

}  // namespace

Status Trainer::Save(const std::string& dir) {
  Impl& I = *impl_;
  TrainState ts;
  ts.step = I.step;
  ts.data_position = I.data->position();
  ts.scaler = I.scaler->state();
  ts.precision = I.cfg().precision();
  CheckpointExtras extras;
  extras.config = ConfigToJson(I.cfg());
  extras.model_source = I.model_source;
  extras.log = I.log;
  extras.hf_dtype = I.cfg().trainer.save_dtype == "fp32" ? DType::kF32 : DType::kBF16;
  ASSIGN_OR_RETURN(extras.hf_max_shard_bytes, ParseBytes(I.cfg().trainer.save_max_shard_size));
  const bool partitioned = I.dp && I.state->layout().partitioned() && I.dp->world() > 1;
  // Unpartitioned, the ranks' states are the same: rank 0 writes it
  // (engine/data_parallel.h); the others have nothing to do.
  if (!partitioned) {
    if (!I.leads()) return I.pool->WaitAll(I.step);
    return I.Aside([&] {
      ASSIGN_OR_RETURN(I.last_saved, SaveCheckpoint(dir, I.spec, I.state->CheckpointShards(), ts, extras));
      return Status::OK();
    });
  }
  // Partitioned: each rank writes its own slices into rank 0's temporary
  // directory; rank 0 then writes the Hugging Face weights (the others join
  // each unit's gather of the masters) and the manifest, and moves the step
  // into place (engine/checkpoint.h). Every rank takes part in every
  // collective below whatever failed before it, so that none waits for one.
  RETURN_IF_ERROR(I.pool->WaitAll(I.step));
  const int world = I.dp->world(), rank = I.dp->rank();
  return I.Aside([&]() -> Status {
    const std::string who = "checkpoint, rank " + std::to_string(rank);
    int64_t lead_pid = -1;
    Status prepared = I.leads() ? PrepareCheckpointTmpDir(dir, ts.step) : Status::OK();
    if (I.leads() && prepared.ok()) lead_pid = ::getpid();
    std::vector<int64_t> pids(static_cast<size_t>(world));
    RETURN_IF_ERROR(I.dp->AllGather(&lead_pid, 1, DType::kI64, pids.data(), pids.size(), false).WithContext(who));
    if (pids[0] < 0) return I.leads() ? prepared : Unavailable(who + ": rank 0 could not prepare the step directory");
    const std::string tmp_dir = CheckpointTmpDir(dir, ts.step, pids[0]);

    const std::vector<CheckpointShard> shards = I.state->CheckpointShards();
    Result<FileSum> own = WriteRankStateFile(tmp_dir, I.spec, shards, rank, world, ts.step);
    RankFileRecord mine;
    if (own.ok()) mine = {1, static_cast<int64_t>(own->crc32c), static_cast<int64_t>(own->bytes)};
    std::vector<RankFileRecord> all(static_cast<size_t>(world));
    RETURN_IF_ERROR(I.dp->AllGather(&mine, 3, DType::kI64, all.data(), all.size() * 3, false).WithContext(who));
    int failed = -1;  // the first rank whose file failed
    for (int r = world - 1; r >= 0; --r)
      if (!all[static_cast<size_t>(r)].ok) failed = r;
    if (failed >= 0) {
      if (I.leads()) {
        std::error_code ec;
        std::filesystem::remove_all(tmp_dir, ec);
      }
      if (!own.ok()) return own.status().WithContext(who);
      return Unavailable(who + ": rank " + std::to_string(failed) + " could not write its slices (its log says why)");
    }

    if (!I.leads()) {
      // Rank 0's reads of the masters, joined unit by unit.
      std::vector<float> w;
      for (size_t si : CheckpointUnitReads(I.spec)) {
        w.resize(static_cast<size_t>(shards[si].numel));
        RETURN_IF_ERROR(shards[si].read(w.data(), nullptr, nullptr).WithContext(who));
      }
      return Status::OK();
    }
    for (const RankFileRecord& r : all)
      extras.rank_files.push_back({static_cast<uint32_t>(r.crc32c), static_cast<uint64_t>(r.bytes)});
    ASSIGN_OR_RETURN(I.last_saved, SaveCheckpoint(dir, I.spec, shards, ts, extras));
    return Status::OK();
  });
}

Result<std::vector<float>> Trainer::Parameter(const std::string& hf_name) {
  Impl& I = *impl_;
  // Failed (sticky): the state as the workers leave it.
  if (!I.pool->WaitAll(I.step).ok()) I.pool->WaitIdle();
  return I.state->Parameter(hf_name);
}

}  // namespace strata
