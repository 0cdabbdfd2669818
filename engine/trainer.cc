// The offload trainer. Read top to bottom it is the step:
//   Create      backend, plan, store, tensors, init/resume          (setup)
//   Step        Forward -> Head -> Backward -> post the optimizer's job (one step;
//               before the last pass's Head when the update runs during the backward,
//               and then, speculating, the verdict at its end: GiveVerdict)
//   Schedule    the step's GPU accesses, in order: the prefetcher (swap/) runs
//               them, keeping what comes next resident within the GPU room
//   Optimizer   OptimizerLoop / UpdateShard on the optimizer thread (overlaps the next forward,
//               and the backward too when nothing waits on the global norm, or on
//               speculation that the clip coefficient is 1: UpdateModeFor, SpeculateNow);
//               UpdateGpuPrefix: the GPU-state shards of offload_optimizer.ratio < 1
//   Evaluate, Save/Resume (engine/checkpoint.cc), Run (logging)
#include "engine/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/device.h"
#include "base/half.h"
#include "base/host_memory.h"
#include "engine/checkpoint.h"
#include "engine/data.h"
#include "engine/gpt_init.h"
#include "engine/safetensors.h"
#include "kernels/backend.h"
#include "kernels/gpt.h"
#include "optim/cpu_adam.h"
#include "optim/gpu_adam.h"
#include "optim/grad_clip.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "swap/prefetcher.h"
#include "tiers/copy_engine.h"
#include "tiers/tier_store.h"

namespace strata {

using kernels::GptBuffer;
using kernels::GptConfig;
using kernels::GptLayers;

namespace {

// The host tier's default budget: 80% of the host's available memory.
Result<uint64_t> DefaultHostBudget() {
  ASSIGN_OR_RETURN(HostMemoryInfo m, QueryHostMemory());
  return m.available_bytes / 10 * 8;
}

Result<DType> PrecisionDType(const Config& c) {
  if (c.bf16) return DType::kBF16;
  if (c.fp16.enabled) return DType::kF16;
  return DType::kF32;
}


int64_t TotalSteps(const TrainOptions& o) { return o.steps >= 0 ? o.steps : o.config.trainer.steps; }

// FLOPs per trained token as the MFU convention counts them (DESIGN.md):
// 6 N for the parameter GEMMs forward and backward, plus 12 L d T for attention.
double ModelFlopsPerToken(const GptConfig& g, int64_t seq) {
  return 6.0 * static_cast<double>(g.NumParameters()) +
         12.0 * static_cast<double>(g.n_layer) * static_cast<double>(g.n_embd) * static_cast<double>(seq);
}

// When the offloaded optimizer state is updated. The exact update of a shard
// needs its final gradient and the step's gradient multiplier; that
// multiplier is GradMultiplier(scale, 1) before the backward ends unless
// gradient clipping needs the global norm or a dynamic loss scale may skip
// the step on overflow (which must leave every shard untouched). Then the
// shards are updated during the backward, each as its gradient is final;
// else after it. With gradient clipping alone the update may still run
// during the backward on speculation that the clip coefficient will be 1
// (trainer.h), into a second master/m/v on the host, if the plan has room
// for it (PlanInputs::speculative_state). With every shard's state on the
// GPU (the GPU Adam, at device speed) there is nothing worth moving into the
// backward.
struct UpdateMode {
  bool during_backward = false;
  bool speculative = false;
  std::string why;
};

bool DynamicLossScale(const Config& c) { return c.fp16.enabled && c.fp16.loss_scale == 0; }

// Whether the plan should count the speculative update's second set: the
// update would run after the backward only because of gradient clipping.
bool WantsSpeculativeState(const Config& c, const TrainOptions& o) {
  return o.speculative_update && !o.optimizer_after_backward && c.gradient_clipping > 0 && !DynamicLossScale(c);
}

// A config value as the mode's reason quotes it: 1.0, 0.5, 128.0.
std::string ConfigNumber(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  std::string t = b;
  if (t.find_first_of(".e") == std::string::npos) t += ".0";
  return t;
}

UpdateMode UpdateModeFor(const Config& c, const Plan& p, int64_t n_shards, const TrainOptions& o,
                         uint64_t host_budget) {
  const auto num = ConfigNumber;
  if (p.optimizer == TierKind::kGpu || p.optimizer_gpu_shards >= n_shards)
    return {false, false, "after backward (the optimizer state is on the GPU)"};
  if (o.optimizer_after_backward) return {false, false, "after backward (asked for: --optimizer-after-backward)"};
  if (c.gradient_clipping > 0) {
    const std::string clip = "gradient_clipping " + num(c.gradient_clipping);
    if (DynamicLossScale(c))
      return {false, false,
              "after backward (" + clip + " needs the global norm, and fp16's dynamic loss scale skips the step on "
              "overflow)"};
    if (p.speculative_fits)
      return {false, true,
              "during backward, speculative (" + clip +
                  ": updates assume the norm is within it and are redone when it is not)"};
    std::string why = "after backward (" + clip + " needs the global norm; ";
    if (!o.speculative_update) {
      why += "speculation is off";
    } else if (p.optimizer != TierKind::kHost) {
      why += "no speculation with the optimizer state on NVMe: its second copy would be written there too";
    } else {
      const uint64_t left = host_budget > p.host_total ? host_budget - p.host_total : 0;
      why += "speculating would need " + FormatBytes(p.speculative_bytes) +
             " more host memory for a second fp32 master/m/v, and the plan leaves " + FormatBytes(left) + " of the " +
             FormatBytes(host_budget) + " host budget";
    }
    return {false, false, why + ")"};
  }
  if (DynamicLossScale(c))
    return {false, false, "after backward (fp16's dynamic loss scale skips the step on overflow)"};
  const std::string what = c.fp16.enabled ? "fp16, static loss scale " + num(c.fp16.loss_scale) : c.precision();
  return {true, false, "during backward (no clipping, " + what + ")"};
}

}  // namespace

// One optimizer shard: a buffer of the model (embedding, a block, ln_f) with
// all its tensors in the store.
struct Shard {
  std::string name;       // "emb", "blk3", "lnf"
  GptBuffer kind = GptBuffer::kBlock;
  int layer = -1;
  int64_t numel = 0;
  TensorId p, g, w, m, v;  // params (dtype), grads (grad dtype), master, exp_avg, exp_avg_sq (f32)
  // The speculative update's other set of master/m/v (host, f32; invalid
  // when the run does not speculate). A speculative update reads w/m/v and
  // writes these; a commit swaps the two sets' ids. Who may touch the ids:
  // the worker holding the shard (claimed, not yet done), or, when none
  // does, the step thread under Impl::mu (the verdict) or with no job
  // running (checkpoints, Parameter).
  TensorId w2, m2, v2;
  TensorId gacc;           // micro-batch-major, bf16/fp16 blocks: the fp32 gradient accumulator
  TierKind p_home = TierKind::kGpu, g_home = TierKind::kGpu, opt_home = TierKind::kGpu;
};

struct Trainer::Impl {
  TrainOptions opt;
  Config cfg;
  GptConfig gcfg;
  DType dtype = DType::kF32;
  // The gradients the optimizer reads: bf16 in bf16 training (as DeepSpeed's
  // bf16 ZeRO-3), fp32 otherwise. Whatever this is, every gradient is
  // accumulated over the micro-batches in fp32 on the GPU and rounded once,
  // so all placements compute the same update.
  DType grad_dtype = DType::kF32;
  int64_t B = 0, T = 0, A = 1, L = 0, C = 0;
  // Schedule (TrainerConfig::schedule). Layer-major keeps the checkpoints
  // and residual gradients of all A micro-batches; micro-batch-major those of
  // one (slot 0), and with A > 1 accumulates each block's gradient across the
  // micro-batches in a store tensor (the fp32 gradient itself, or gacc).
  bool layer_major = true;
  bool accum_across = false;  // micro-batch-major with A > 1
  size_t Slot(int64_t a) const { return layer_major ? static_cast<size_t>(a) : 0; }
  int64_t Sets() const { return layer_major ? A : 1; }
  std::unique_ptr<kernels::Backend> backend;
  std::optional<GptLayers> layers;
  PlanInputs plan_in;
  Plan plan;
  uint64_t gpu_budget = 0, host_budget = 0;  // of the tiers
  uint64_t gpu_overhead = 0;  // device memory outside the GPU tier (context, libraries), counted in the limit
  std::unique_ptr<TierStore> store;
  // Every GPU Acquire/Release of Forward, Head and Backward goes through the
  // prefetcher, in the order of the step's schedule (BuildSchedule). Declared
  // after the store: destroyed before it.
  std::unique_ptr<Prefetcher> prefetcher;
  std::unordered_map<uint64_t, size_t> param_shard;  // params TensorId -> shard index
  int64_t prefetch_step0 = 0;                        // optimizer steps taken when its cycle 0 began
  // Link counters at the end of the last step, and bytes moved since by
  // Evaluate/Save (not the step's): each step reports what moved since the
  // last, the optimizer's update (which overlaps the next forward) included.
  struct LinkBytes {
    uint64_t h2d = 0, d2h = 0, nvme_read = 0, nvme_write = 0;
  };
  LinkBytes last_bytes, excluded_bytes;
  std::unique_ptr<optim::CpuAdam> adam;
  std::optional<optim::LossScaler> scaler;
  std::optional<optim::LrSchedule> schedule;
  std::unique_ptr<DataLoader> data;
  double peak_flops = 0;  // measured GEMM rate of the backend (FLOP/s)
  std::string peak_what;
  std::ostream* log = &std::cerr;

  std::vector<Shard> shards;                // 0: embedding, 1..L: blocks, L+1: ln_f
  // offload_optimizer.ratio < 1 with the rest offloaded: shards [0, gpu_prefix)
  // keep their optimizer state on the GPU and are updated by the step's own
  // thread (UpdateGpuPrefix); the optimizer workers take the rest. 0 when
  // every shard's state is on the GPU (the workers update them all) or none.
  size_t gpu_prefix = 0;
  std::vector<std::vector<TensorId>> ck;    // [L+1][Sets()]: layer inputs (ck[L]: head input)
  std::vector<TierKind> ck_home;            // [L+1]: the plan's split of the checkpoints

  // GPU scratch, carved from the store's GPU tier.
  TierBlock block_scratch, head_scratch, tokens_dev, targets_dev, losses_dev, stats_dev, xbuf;
  // fp32 gradient accumulators, when grad_dtype is not fp32: one block's, the
  // embedding's (it collects from the head and the embedding backward), ln_f's.
  TierBlock block_acc, emb_acc, lnf_acc;
  TensorView emb_grad_view;  // f32 mode: emb.g pinned on the GPU from Head to the end of Backward
  std::vector<TierBlock> dx;                // [Sets()] residual-stream gradients [B,T,C]
  size_t block_scratch_bytes = 0, head_scratch_bytes = 0;
  // Host staging (pinned, from the host tier) for GPU-home grads/params with
  // a host optimizer. Parameters have two slots: the CPU Adam writes the next
  // shard's into one while the other uploads. The CPU worker's alone.
  TierBlock grad_staging, param_staging[2];
  CopyTicket param_upload[2];
  int param_slot = 0;

  // GPU-assisted optimizer (TrainerConfig::gpu_assisted_optimizer): a second
  // worker updates host-state shards on the GPU, streaming master/m/v (and a
  // host gradient) through three chunk buffers: up on the H2D copy stream,
  // the fused Adam and the way down on the D2H stream. The assist worker's alone.
  bool assist = false;
  uint64_t assist_chunk = 0;  // parameters per chunk
  struct AssistSlot {
    TierBlock buf;                  // master, m, v (f32) and the gradient, assist_chunk each
    std::vector<CopyTicket> down;   // the copies back of the chunk in it
  };
  AssistSlot assist_slots[3];
  int assist_next = 0;

  std::vector<int32_t> tok_host, tgt_host;  // [A][B*T]
  std::vector<float> loss_host;

  int64_t step = 0;  // optimizer steps taken

  // ---- optimizer thread ------------------------------------------------------
  struct OptJob {
    int64_t step = 0;        // the step number this update produces (1-based)
    bool skip = false;       // fp16 overflow: nothing to update
    // Posted before the backward's last pass: a shard is claimed once its
    // gradient is final (grad_final), and checked finite first (NonFiniteCount).
    bool streaming = false;
    // Streaming on speculation (gradient clipping): grad_multiplier assumes
    // a clip coefficient of 1; until the verdict (GiveVerdict) shards are
    // updated into their other set.
    bool speculative = false;
    double grad_multiplier = 1;
    optim::AdamHyper hyper;
  };
  // The update mode (UpdateModeFor), fixed for the run: during the backward
  // (`streaming`), speculative (during the backward at the steps
  // SpeculateNow picks, after it at the others) or after it, and the reason,
  // for the plan and the log.
  bool streaming = false;
  bool speculative = false;
  std::string update_mode;
  // The step thread's: the last step's clip coefficient was exactly 1 (its
  // norm within gradient_clipping). False after Create, a resume or a failed
  // step (SpeculateNow).
  bool last_clip_one = false;
  // The shards the workers update (every shard from gpu_prefix on) in
  // forward order, and reversed: the backward's order (ln_f, the last block
  // ... the embedding). A job posted after the backward claims them in the
  // first, one posted during it in the second (each as its gradient is
  // final); after a speculative job's verdict the rest go in forward order.
  std::vector<size_t> forward_order, backward_order;
  // A shard's part in the current job.
  enum class ShardState : uint8_t {
    kWaiting,     // not claimed (or handed back: its speculative claim met a non-finite gradient)
    kRunning,     // a worker holds it
    kSpeculated,  // its other set holds its speculative update, and its parameters are written; awaits the verdict
    kFinal,       // done for this job (updated[s] says so)
  };
  enum class Verdict : uint8_t { kPending, kCommit, kMiss };
  // The step thread's: this step's job is posted during the backward
  // (streaming or speculative) and not settled (a failure before the step's
  // end, or before its verdict, aborts it: AbortJob).
  bool job_in_backward = false;
  // Streaming: each shard's non-finite gradient count ([shards] int32,
  // pinned), copied down from stats_dev after the shard's gradient work, by
  // a copy engine of their own: each copy waits on the GPU for the compute
  // stream to reach its shard's end, and on the store's shared D2H stream
  // that wait would hold up every copy queued after it (the step thread
  // queues the backward far ahead of the GPU) — the workers' own gradient
  // downloads included. Declared after nonfinite_host: its destructor waits
  // for the copies into it.
  TierBlock nonfinite_host;
  std::unique_ptr<CopyEngine> count_copies;
  // The optimizer's workers (the CPU Adam, and the GPU-assisted one when on)
  // claim the job's shards in its queue, one at a time.
  std::thread opt_thread, assist_thread;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<OptJob> job;          // GUARDED_BY(mu): reset when every worker is done with it
  int64_t job_seq = 0;                // GUARDED_BY(mu): jobs posted
  std::vector<size_t> queue;          // GUARDED_BY(mu): the job's shards in claim order (rebuilt by a verdict)
  size_t next_claim = 0;              // GUARDED_BY(mu): the next index of queue to claim
  std::vector<ShardState> job_state;  // GUARDED_BY(mu): per shard
  Verdict verdict = Verdict::kPending;  // GUARDED_BY(mu): a speculative job's, once the backward is over
  double job_multiplier = 1;          // GUARDED_BY(mu): what claims use: the job's, after a verdict the true one
  uint64_t job_params = 0;            // GUARDED_BY(mu): parameters updated this job (redone ones twice)
  int job_workers = 0;                // GUARDED_BY(mu): workers still on the job
  double job_t0 = 0;                  // GUARDED_BY(mu)
  uint64_t assist_params = 0;         // GUARDED_BY(mu): parameters the GPU-assisted worker updated, this job
  int64_t job_writes = 0;             // GUARDED_BY(mu): shards this job has updated in place (not speculatively)
  std::vector<char> grad_final;       // GUARDED_BY(mu): streaming job: per shard, its gradient is final and home-bound
  std::vector<CopyTicket> grad_counted;  // GUARDED_BY(mu): ... and the copy of its non-finite count (after its GPU work)
  bool job_abort = false;             // GUARDED_BY(mu): the step failed with its job in the backward: claim no more
  std::vector<CopyTicket> uploads;    // GUARDED_BY(mu): per shard, the upload of its new parameters
  bool stop = false;                  // GUARDED_BY(mu)
  std::vector<int64_t> updated;       // GUARDED_BY(mu): optimizer steps applied per shard
  Status opt_error;                   // GUARDED_BY(mu): sticky
  // Of each job, by its step's parity (the previous job's is read while the
  // next may be running): its time and the GPU-assisted worker's share.
  double job_seconds[2] = {0, 0};     // GUARDED_BY(mu)
  double job_assist_share[2] = {0, 0};  // GUARDED_BY(mu)
  // The workers' own PCIe copies (staged gradients, parameter uploads, the
  // GPU-assisted chunks), counted apart so that each step reports its own
  // transfers plus exactly the previous update's whatever their timing: a
  // worker counts a copy and submits it under bytes_mu, and the step thread
  // reads the links' counters and these under it (OptCopy, RunStep).
  // Lock order: mu before bytes_mu.
  std::mutex bytes_mu;
  LinkBytes opt_copied;               // GUARDED_BY(bytes_mu): all the workers' copies so far
  LinkBytes job_copied[2];            // GUARDED_BY(bytes_mu): per job, by its step's parity
  LinkBytes last_opt_copied;          // the step thread's: opt_copied at the last step's end

  // ---- setup -------------------------------------------------------------------
  Status Setup();
  Status CreateTensors();
  Status InitModel();
  Status InitFromHf();
  Status MeasurePeak();

  // ---- the step ----------------------------------------------------------------
  // The NVMe swap files are still ours (NvmeTier::CheckFiles): checked
  // before each step, which then changes nothing when one was deleted.
  Status CheckSwapFiles() const {
    NvmeTier* nv = store->nvme_tier();
    return nv ? nv->CheckFiles() : Status::OK();
  }
  Status WaitShard(size_t s, double* wait_s);
  Status WaitAllUpdated();
  Status BuildSchedule(AccessSchedule* s) const;
  Status StartPrefetcher();
  LinkBytes Bytes() const;
  template <class F>
  Status Aside(F&& f);
  // Each runs the micro-batches [a0, a1): all of them (layer-major) or one.
  Status Forward(int64_t a0, int64_t a1, double* wait_s);
  Status Head(int64_t a0, int64_t a1, double dloss);
  Status Backward(int64_t a0, int64_t a1, double* wait_s);
  // One micro-batch per pass: the last block's forward leaves its internals
  // in the block scratch (the head has its own) and its backward, which
  // follows the head, skips their recompute (same bits).
  kernels::GptLayers::Internals KeptInternals(int64_t l, int64_t a0, int64_t a1) const {
    return l == L - 1 && a1 - a0 == 1 ? kernels::GptLayers::Internals::kKept
                                      : kernels::GptLayers::Internals::kNotKept;
  }
  void ScheduleForward(AccessSchedule* s, int64_t a0, int64_t a1) const;
  void ScheduleHead(AccessSchedule* s, int64_t a0, int64_t a1) const;
  void ScheduleBackward(AccessSchedule* s, int64_t a0, int64_t a1) const;
  Status FinishGrad(Shard& sh, void* acc, void* acquired);
  Result<StepReport> RunStep(const int32_t* tokens, const int32_t* targets);
  OptJob MakeJob(int64_t job_step, const optim::LrValue& lr, double grad_multiplier, bool streaming) const;
  Status PostJob(const OptJob& j);
  Status GradFinal(size_t s);
  bool SpeculateNow() const;
  void GiveVerdict(int64_t job_step, bool hit, double multiplier);
  void Commit(size_t s, int64_t job_step);
  void AbortJob(const Status& why);
  Status RestoreParams(Shard& sh);
  Status NonFiniteError(int64_t job_step, const std::string& what) const;
  Result<int32_t> NonFiniteCount(const Shard& sh, const CopyTicket& counted);
  Result<CopyTicket> OptCopy(int64_t job_step, CopyDirection dir, void* dst, const void* src, uint64_t bytes,
                             const CopyAfter& after = {});
  void OptimizerLoop(bool gpu_worker);
  Status UpdateGpuPrefix(const OptJob& j);
  // How a shard is updated: with which gradient multiplier, and whether
  // into its other set (a speculative update) or in place.
  struct How {
    double multiplier = 1;
    bool speculative = false;
  };
  Status UpdateShard(Shard& sh, const OptJob& j, const How& how);
  Status AssistShard(Shard& sh, const OptJob& j, const How& how);
  Status SetUpAssist();
  Status SetUpSpeculation();
  Status ForwardEval(int64_t batches, double* loss);

  // ---- state I/O (init, checkpoints, tests) -------------------------------------
  // master/m/v as host fp32 arrays of shard.numel (m/v null: zeros); the
  // parameters become the master rounded to the compute dtype.
  Status WriteShardState(Shard& s, const float* master, const float* m, const float* v);
  // The master rounded to the compute dtype: the parameters (what the CPU
  // and GPU Adam write beside it, bit for bit), written into s.p.
  Status WriteParamsFromMaster(Shard& s, const float* master);
  Status ReadShardState(Shard& s, float* master, float* m, float* v);
  std::vector<CheckpointShard> CheckpointShards();
  TrainState CurrentState() const;

  void* stream() const { return backend->native_stream(); }
  // stats_dev: the squared norm (float, at 0) and each shard's non-finite
  // count (int32 per shard, from 64).
  size_t StatsBytes() const { return 64 + 4 * static_cast<size_t>(L + 2); }
  int32_t* NonfiniteDev(size_t s) const {
    return reinterpret_cast<int32_t*>(stats_dev.as<char>() + 64) + s;
  }
  // The largest shard the host optimizer updates (0: every shard's state is
  // on the GPU): what the staging and the assist buffers are sized for.
  uint64_t MaxOffloadedNumel() const {
    int64_t n = 0;
    for (const Shard& sh : shards)
      if (sh.opt_home != TierKind::kGpu) n = std::max(n, sh.numel);
    return static_cast<uint64_t>(n);
  }
  bool cuda() const { return backend->kind() == kernels::BackendKind::kCuda; }
};

// ---- setup ---------------------------------------------------------------------

namespace {

Result<GptConfig> MakeGptConfig(const Config& c) {
  GptConfig g;
  g.n_layer = c.model.n_layer;
  g.n_embd = c.model.n_embd;
  g.n_head = c.model.n_head;
  g.vocab_size = c.model.vocab_size;
  g.padded_vocab_size = 0;
  g.seq_len = c.model.seq_len;
  RETURN_IF_ERROR(g.Validate().WithContext(c.source + ": model"));
  return g;
}

Result<std::unique_ptr<kernels::Backend>> MakeBackend(const TrainOptions& o) {
  if (o.backend == "cpu") return kernels::MakeCpuBackend(o.cpu_threads);
  if (o.backend == "cuda") return kernels::MakeCudaBackend(0);
  if (o.backend != "auto")
    return InvalidArgument("backend \"" + o.backend + "\" is not allowed (allowed: auto, cpu, cuda)");
  auto cuda = kernels::MakeCudaBackend(0);
  if (cuda.ok()) return cuda;
  return kernels::MakeCpuBackend(o.cpu_threads);
}

}  // namespace

static Status MakePlanInputs(const Config& cfg, const GptConfig& g, DType dtype,
                      size_t block_scratch, size_t head_scratch, uint64_t gpu_budget, uint64_t host_budget,
                      bool speculative_state, PlanInputs* in) {
  const int64_t B = cfg.micro_batch, T = cfg.model.seq_len, C = g.n_embd;
  in->n_layer = g.n_layer;
  in->layer_params = static_cast<uint64_t>(kernels::BlockLayout::For(C).numel);
  in->embedding_params = static_cast<uint64_t>(kernels::EmbeddingLayout::For(g.Vp(), g.seq_len, C).numel);
  in->final_params = static_cast<uint64_t>(kernels::LnFLayout::For(C).numel);
  in->param_bytes = DTypeSize(dtype);
  in->checkpoint_bytes = static_cast<uint64_t>(B * T * C) * DTypeSize(dtype);
  in->grad_host_bytes = dtype == DType::kBF16 ? 2 : 4;
  in->grad_accum = cfg.grad_accum;
  in->layer_major = cfg.trainer.schedule != "micro-batch-major";
  in->layer_workspace = block_scratch;
  // The head's scratch, the embedding/ln_f gradients held through backward,
  // one spare activation (evaluation), tokens/targets/losses.
  in->head_workspace = head_scratch + (in->embedding_params + in->final_params) * 4 + in->checkpoint_bytes;
  in->fixed_gpu = static_cast<uint64_t>(cfg.grad_accum * B * T) * 12 + (1 << 20);
  in->gpu_budget = gpu_budget;
  in->host_budget = host_budget;
  const auto& zo = cfg.zero;
  in->have_nvme = !zo.offload_optimizer.nvme_path.empty() || !zo.offload_param.nvme_path.empty();
  in->offload_param = zo.offload_param.device;
  in->offload_optimizer = zo.offload_optimizer.device;
  in->cpu_checkpointing = cfg.activation_checkpointing.cpu_checkpointing;
  in->optimizer_chunk_params = std::max<uint64_t>(in->layer_params, 1);
  in->optimizer_offload_ratio = zo.offload_optimizer.ratio;
  in->speculative_state = speculative_state;
  return Status::OK();
}

Status Trainer::Impl::Setup() {
  cfg = opt.config;
  ASSIGN_OR_RETURN(gcfg, MakeGptConfig(cfg));
  ASSIGN_OR_RETURN(dtype, PrecisionDType(cfg));
  grad_dtype = dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  B = cfg.micro_batch;
  T = cfg.model.seq_len;
  A = cfg.grad_accum;
  L = gcfg.n_layer;
  layer_major = cfg.trainer.schedule != "micro-batch-major";
  accum_across = !layer_major && A > 1;
  C = gcfg.n_embd;
  if (cfg.world_size != 1)
    return Unavailable("strata train runs one process on one GPU so far; world size is " +
                       std::to_string(cfg.world_size));

  ASSIGN_OR_RETURN(backend, MakeBackend(opt));
  ASSIGN_OR_RETURN(GptLayers gl, GptLayers::Make(backend.get(), gcfg, B, T, dtype));
  layers.emplace(std::move(gl));
  block_scratch_bytes = layers->block_scratch_bytes();
  head_scratch_bytes = layers->head_scratch_bytes();

  // Budgets. The GPU limit covers the whole process: what the CUDA context,
  // cuBLASLt and the backend already hold (measured now, after the GEMM
  // baseline freed its buffers) comes off the tier's budget, so the device
  // never holds more than the limit.
  const bool cuda = backend->kind() == kernels::BackendKind::kCuda;
  RETURN_IF_ERROR(MeasurePeak());
  if (opt.host_memory_limit) {
    host_budget = opt.host_memory_limit;
  } else {
    ASSIGN_OR_RETURN(host_budget, DefaultHostBudget());
  }
  if (cuda) {
    ASSIGN_OR_RETURN(GpuInfo info, QueryGpu(0));
    const uint64_t in_use = info.total_bytes - info.free_bytes;
    // cuBLASLt heuristics and lazily made library state, plus what the driver
    // takes on the device for mapping pinned host memory, which grows with
    // the host tier: the 6.7B run (99.6 GiB pinned) ended 0.1 GiB over its
    // 24 GiB limit with a flat 128 MiB margin. 4 MiB per GiB of host budget.
    const uint64_t margin = 128 * kMiB + host_budget / 256;
    gpu_overhead = in_use + margin;
    if (opt.gpu_memory_limit) {
      if (opt.gpu_memory_limit <= gpu_overhead)
        return OutOfMemory(TierKind::kGpu, gpu_overhead, opt.gpu_memory_limit,
                           "--gpu-memory-limit is smaller than what the CUDA context and libraries already use (" +
                               FormatBytes(in_use) + " in use on the device, plus a " + FormatBytes(margin) +
                               " margin)");
      gpu_budget = opt.gpu_memory_limit - gpu_overhead;
    } else {
      gpu_budget = info.free_bytes > 512 * kMiB ? info.free_bytes - 512 * kMiB : info.free_bytes / 2;
    }
  } else {
    gpu_budget = opt.gpu_memory_limit ? opt.gpu_memory_limit : 4 * kGiB;  // the stand-in: host memory
  }

  RETURN_IF_ERROR(MakePlanInputs(cfg, gcfg, dtype, block_scratch_bytes, head_scratch_bytes, gpu_budget,
                                 host_budget, WantsSpeculativeState(cfg, opt), &plan_in));
  ASSIGN_OR_RETURN(plan, MakePlan(plan_in));

  // The store.
  TierStoreOptions so;
  so.gpu = true;
  so.gpu_tier.budget_bytes = gpu_budget;
  // One slab: streamed blocks of a few hundred MiB would otherwise leave
  // unusable ends in each 512 MiB slab.
  so.gpu_tier.slab_bytes = 0;
  so.gpu_tier.stand_in = !cuda;
  so.host_tier.budget_bytes = host_budget;
  so.host_tier.pin = cfg.zero.offload_optimizer.pin_memory && cfg.zero.offload_param.pin_memory;
  so.copy.stand_in = !cuda;
  // The prefetcher hints each copy's next use: should the store ever have to
  // make room itself, it drops the copy needed farthest ahead.
  so.eviction = EvictionPolicy::kNextUse;
  if (plan.optimizer == TierKind::kNvme || plan.params == TierKind::kNvme) {
    NvmeOptions no;
    std::string dir = !cfg.zero.offload_optimizer.nvme_path.empty() ? cfg.zero.offload_optimizer.nvme_path
                                                                    : cfg.zero.offload_param.nvme_path;
    no.dirs = {dir};
    no.block_size = static_cast<uint32_t>(cfg.aio.block_size);
    no.queue_depth = static_cast<uint32_t>(cfg.aio.queue_depth);
    no.rings = cfg.aio.intra_op_parallelism;
    no.single_submit = cfg.aio.single_submit;
    no.overlap_events = cfg.aio.overlap_events;
    no.env = opt.nvme_env;
    so.nvme = no;
  }
  ASSIGN_OR_RETURN(store, TierStore::Open(so));

  optim::CpuAdam::Options ao;
  ao.threads = opt.cpu_threads;
  ASSIGN_OR_RETURN(adam, optim::CpuAdam::Create(ao));

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
  ASSIGN_OR_RETURN(optim::LossScaler ls, optim::LossScaler::Create(lsc));
  scaler.emplace(ls);
  ASSIGN_OR_RETURN(optim::LrSchedule sched, optim::MakeLrSchedule(cfg.scheduler.type, cfg.scheduler.params,
                                                                  cfg.optimizer.lr, TotalSteps(opt), cfg.source));
  schedule.emplace(sched);

  ASSIGN_OR_RETURN(data, DataLoader::Open(cfg.data, opt.default_data, static_cast<int>(gcfg.vocab_size),
                                          static_cast<int>(B), static_cast<int>(T)));
  RETURN_IF_ERROR(CreateTensors());
  RETURN_IF_ERROR(SetUpAssist());
  updated.assign(shards.size(), 0);  // re-set after a resume
  uploads.assign(shards.size(), CopyTicket{});
  const UpdateMode mode = UpdateModeFor(cfg, plan, static_cast<int64_t>(shards.size()), opt, host_budget);
  streaming = mode.during_backward;
  speculative = mode.speculative;
  update_mode = mode.why;
  for (size_t i = gpu_prefix; i < shards.size(); ++i) forward_order.push_back(i);
  backward_order.assign(forward_order.rbegin(), forward_order.rend());
  if (streaming || speculative) {
    ASSIGN_OR_RETURN(nonfinite_host, store->host_tier()->Allocate(4 * shards.size(), "non-finite gradient counts"));
    CopyEngineOptions co;
    co.stand_in = !cuda;
    co.staging_bytes = 4096;  // (only pinned memory is copied)
    ASSIGN_OR_RETURN(count_copies, CopyEngine::Create(co));
  }
  if (speculative) RETURN_IF_ERROR(SetUpSpeculation());
  grad_final.assign(shards.size(), 0);
  grad_counted.assign(shards.size(), CopyTicket{});
  job_state.assign(shards.size(), ShardState::kWaiting);
  *log << "optimizer update: " << update_mode << "\n";
  if (!opt.resume_dir.empty()) {
    TrainState ts;
    std::string path;
    RETURN_IF_ERROR(LoadCheckpoint(opt.resume_dir, gcfg, CheckpointShards(), &ts, &path));
    step = ts.step;
    data->set_position(ts.data_position);
    RETURN_IF_ERROR(scaler->Restore(ts.scaler));
    std::fill(updated.begin(), updated.end(), step);
    *log << "resumed from " << path << " at step " << step << "\n";
  } else if (!opt.init_from.empty()) {
    RETURN_IF_ERROR(InitFromHf());
    *log << "initialized from " << opt.init_from << "\n";
  } else {
    RETURN_IF_ERROR(InitModel());
  }
  RETURN_IF_ERROR(StartPrefetcher());
  last_bytes = Bytes();
  opt_thread = std::thread([this] { OptimizerLoop(false); });
  if (assist) assist_thread = std::thread([this] { OptimizerLoop(true); });
  return Status::OK();
}

// Decides whether the GPU-assisted optimizer runs and allocates its chunk
// buffers. It needs every offloaded shard's state on the host (not NVMe) and
// its parameters in GPU memory (so one kind of worker never touches the
// other's staging), at least one such shard, and room in the GPU tier beyond
// what the step's swap window needs. The GPU-state prefix of
// offload_optimizer.ratio < 1 is no obstacle: the workers never see it
// (UpdateGpuPrefix).
Status Trainer::Impl::SetUpAssist() {
  const std::string& mode = cfg.trainer.gpu_assisted_optimizer;
  if (mode == "off" || (mode == "auto" && !cuda())) return Status::OK();
  for (const Shard& sh : shards)
    if (sh.opt_home != TierKind::kGpu && (sh.opt_home != TierKind::kHost || sh.p_home != TierKind::kGpu)) {
      if (mode == "on")
        *log << "gpu-assisted optimizer: off (it needs the optimizer state on the host and the parameters "
                "resident on the GPU)\n";
      return Status::OK();
    }
  const uint64_t max_numel = MaxOffloadedNumel();
  if (max_numel == 0) {
    if (mode == "on") *log << "gpu-assisted optimizer: off (every shard's optimizer state is on the GPU)\n";
    return Status::OK();
  }
  GpuTier* gt = store->gpu_tier();
  // 4 Mi parameters a chunk: about a millisecond of PCIe each way, small
  // next to a shard (tens of chunks), large next to a copy's fixed cost.
  assist_chunk = std::min<uint64_t>(4ull << 20, max_numel);
  if (opt.assist_chunk_params) assist_chunk = std::min<uint64_t>(opt.assist_chunk_params, assist_chunk);
  const uint64_t per = assist_chunk * (12 + DTypeSize(grad_dtype));
  const TierUsage u = gt->usage();
  // Keep the swap window at least one streamed tensor wide (StartPrefetcher).
  const uint64_t largest = AlignUp(static_cast<uint64_t>(B * T * C) * DTypeSize(dtype), gt->alignment());
  const uint64_t need = 3 * AlignUp(per, gt->alignment()) + largest;
  if (u.budget < u.used + need) {
    *log << "gpu-assisted optimizer: off (" << FormatBytes(3 * per) << " of chunk buffers do not fit in the GPU budget)\n";
    return Status::OK();
  }
  for (AssistSlot& sl : assist_slots) {
    ASSIGN_OR_RETURN(sl.buf, gt->Allocate(per, "gpu-assisted optimizer chunk"));
  }
  assist = true;
  *log << "optimizer: CPU Adam and GPU-assisted streaming (master/m/v through 3 chunks of "
       << assist_chunk << " parameters, " << FormatBytes(3 * per) << " of GPU memory), shards claimed in forward order\n";
  return Status::OK();
}

// The speculative update's second master/m/v of every shard whose state is
// on the host, allocated last. The plan counted them; should the host tier
// still not hold them (its own staging is not in the plan), the update runs
// after the backward, and the reason says why.
Status Trainer::Impl::SetUpSpeculation() {
  Status st;
  for (Shard& sh : shards) {
    if (sh.opt_home != TierKind::kHost) continue;
    for (auto [suffix, id] : {std::pair{".w2", &sh.w2}, {".m2", &sh.m2}, {".v2", &sh.v2}}) {
      if (!st.ok()) break;
      Result<TensorId> r = store->Create(sh.name + suffix, DType::kF32, Shape{sh.numel}, TierKind::kHost);
      if (r.ok()) *id = *r;
      else st = r.status();
    }
  }
  if (st.ok()) return Status::OK();
  if (st.code() != StatusCode::kOutOfMemory) return st;
  for (Shard& sh : shards)
    for (TensorId* id : {&sh.w2, &sh.m2, &sh.v2})
      if (id->valid()) {
        RETURN_IF_ERROR(store->Remove(*id));
        *id = TensorId{};
      }
  speculative = false;
  plan.DropSpeculativeState();
  update_mode = "after backward (gradient_clipping " + ConfigNumber(cfg.gradient_clipping) +
                " needs the global norm; the host tier could not hold the speculative update's second fp32 "
                "master/m/v: " + std::string(st.message()) + ")";
  return Status::OK();
}

Status Trainer::Impl::MeasurePeak() {
  // The backend's GEMM rate, the physical baseline of MFU, measured now.
  const bool cuda = backend->kind() == kernels::BackendKind::kCuda;
  const int64_t n = cuda ? 8192 : 512;
  const DType t = cuda ? DType::kBF16 : DType::kF32;
  const size_t bytes = static_cast<size_t>(n * n) * DTypeSize(t);
  ASSIGN_OR_RETURN(auto a, backend->Allocate(bytes));
  ASSIGN_OR_RETURN(auto b, backend->Allocate(bytes));
  ASSIGN_OR_RETURN(auto c, backend->Allocate(bytes));
  {
    std::vector<uint16_t> h(static_cast<size_t>(n * n));
    std::vector<float> f(static_cast<size_t>(n * n));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-1, 1);
    for (size_t i = 0; i < h.size(); ++i) f[i] = d(rng), h[i] = FloatToBF16(f[i]);
    const void* src = cuda ? static_cast<const void*>(h.data()) : static_cast<const void*>(f.data());
    RETURN_IF_ERROR(backend->CopyToDevice(a.data(), src, bytes));
    RETURN_IF_ERROR(backend->CopyToDevice(b.data(), src, bytes));
  }
  kernels::GemmArgs g;
  g.m = g.n = g.k = n;
  g.a = a.data();
  g.b = b.data();
  g.c = c.data();
  g.lda = g.ldb = g.ldc = n;
  g.ab_dtype = g.c_dtype = t;
  RETURN_IF_ERROR(backend->Gemm(g));  // warm-up
  RETURN_IF_ERROR(backend->Synchronize());
  const double flops = 2.0 * static_cast<double>(n) * n * n;
  if (cuda) {
    // Back to back on the stream: the mean of 10 (each ~1.4 ms).
    const int reps = 10;
    double t0 = NowSeconds();
    for (int i = 0; i < reps; ++i) RETURN_IF_ERROR(backend->Gemm(g));
    RETURN_IF_ERROR(backend->Synchronize());
    peak_flops = flops * reps / (NowSeconds() - t0);
  } else {
    // The CPU's GEMMs are a few ms each, and a busy machine (a build, a
    // neighbour) slows one now and then: the best of 7 is the rate the
    // cores can give, so MFU never reads above 100% because the baseline
    // was measured during a hiccup.
    double best = 1e30;
    for (int i = 0; i < 7; ++i) {
      double t0 = NowSeconds();
      RETURN_IF_ERROR(backend->Gemm(g));
      RETURN_IF_ERROR(backend->Synchronize());
      best = std::min(best, NowSeconds() - t0);
    }
    peak_flops = flops / best;
  }
  std::ostringstream os;
  os << n << "^3 " << DTypeName(t) << " GEMM " << std::fixed << std::setprecision(1);
  if (peak_flops >= 1e12) os << peak_flops / 1e12 << " TFLOP/s";
  else os << peak_flops / 1e9 << " GFLOP/s";
  peak_what = os.str();
  return Status::OK();
}

Status Trainer::Impl::CreateTensors() {
  const int64_t Vp = gcfg.Vp();
  auto add_shard = [&](std::string name, GptBuffer kind, int layer, int64_t numel) -> Status {
    Shard s;
    s.name = std::move(name);
    s.kind = kind;
    s.layer = layer;
    s.numel = numel;
    // offload_optimizer.ratio < 1: the first plan.optimizer_gpu_shards shards
    // (forward order) keep optimizer state, gradients and parameters on the
    // GPU; the GPU Adam updates them (UpdateGpuPrefix).
    const bool gpu_state = static_cast<int64_t>(shards.size()) < plan.optimizer_gpu_shards;
    const bool host_opt = !gpu_state && plan.optimizer != TierKind::kGpu;
    s.opt_home = host_opt ? plan.optimizer : TierKind::kGpu;
    s.g_home = gpu_state ? TierKind::kGpu : plan.grads;
    if (!host_opt) s.p_home = TierKind::kGpu;
    else if (kind == GptBuffer::kBlock && !plan.params_resident) s.p_home = plan.params;
    else s.p_home = TierKind::kGpu;
    const Shape shape{numel};
    ASSIGN_OR_RETURN(s.p, store->Create(s.name + ".p", dtype, shape, s.p_home));
    ASSIGN_OR_RETURN(s.g, store->Create(s.name + ".g", grad_dtype, shape, s.g_home));
    ASSIGN_OR_RETURN(s.w, store->Create(s.name + ".w", DType::kF32, shape, s.opt_home));
    ASSIGN_OR_RETURN(s.m, store->Create(s.name + ".m", DType::kF32, shape, s.opt_home));
    ASSIGN_OR_RETURN(s.v, store->Create(s.name + ".v", DType::kF32, shape, s.opt_home));
    if (accum_across && kind == GptBuffer::kBlock && grad_dtype != DType::kF32) {
      ASSIGN_OR_RETURN(s.gacc, store->Create(s.name + ".gacc", DType::kF32, shape, s.g_home));
    }
    shards.push_back(std::move(s));
    return Status::OK();
  };
  // Scratch first: the working set must be there whatever the store caches.
  GpuTier* gt = store->gpu_tier();
  ASSIGN_OR_RETURN(block_scratch, gt->Allocate(std::max<size_t>(block_scratch_bytes, 256), "block scratch"));
  ASSIGN_OR_RETURN(head_scratch, gt->Allocate(std::max<size_t>(head_scratch_bytes, 256), "head scratch"));
  const uint64_t act = static_cast<uint64_t>(B * T * C) * DTypeSize(dtype);
  for (int64_t a = 0; a < Sets(); ++a) {
    ASSIGN_OR_RETURN(TierBlock d, gt->Allocate(act, "residual gradient"));
    dx.push_back(std::move(d));
  }
  ASSIGN_OR_RETURN(xbuf, gt->Allocate(act, "evaluation activations"));
  ASSIGN_OR_RETURN(tokens_dev, gt->Allocate(static_cast<uint64_t>(A * B * T) * 4, "tokens"));
  ASSIGN_OR_RETURN(targets_dev, gt->Allocate(static_cast<uint64_t>(A * B * T) * 4, "targets"));
  ASSIGN_OR_RETURN(losses_dev, gt->Allocate(static_cast<uint64_t>(A * B * T) * 4, "losses"));
  ASSIGN_OR_RETURN(stats_dev, gt->Allocate(std::max<size_t>(256, StatsBytes()), "gradient statistics"));
  if (grad_dtype != DType::kF32) {
    const int64_t Cb = kernels::BlockLayout::For(C).numel;
    ASSIGN_OR_RETURN(block_acc, gt->Allocate(static_cast<uint64_t>(Cb) * 4, "block gradient accumulator"));
    ASSIGN_OR_RETURN(emb_acc, gt->Allocate(static_cast<uint64_t>(kernels::EmbeddingLayout::For(Vp, gcfg.seq_len, C).numel) * 4,
                                          "embedding gradient accumulator"));
    ASSIGN_OR_RETURN(lnf_acc, gt->Allocate(static_cast<uint64_t>(kernels::LnFLayout::For(C).numel) * 4,
                                          "ln_f gradient accumulator"));
  }

  RETURN_IF_ERROR(add_shard("emb", GptBuffer::kEmbedding, -1,
                            kernels::EmbeddingLayout::For(Vp, gcfg.seq_len, C).numel));
  for (int l = 0; l < L; ++l)
    RETURN_IF_ERROR(add_shard("blk" + std::to_string(l), GptBuffer::kBlock, l, kernels::BlockLayout::For(C).numel));
  RETURN_IF_ERROR(add_shard("lnf", GptBuffer::kLnF, -1, kernels::LnFLayout::For(C).numel));
  if (plan.optimizer != TierKind::kGpu)
    gpu_prefix = static_cast<size_t>(std::clamp<int64_t>(plan.optimizer_gpu_shards, 0, static_cast<int64_t>(shards.size())));

  ck.assign(static_cast<size_t>(L + 1), {});
  ck_home.assign(static_cast<size_t>(L + 1), plan.checkpoints);
  if (plan.checkpoints != TierKind::kGpu)
    for (int64_t l = L + 1 - plan.checkpoint_gpu_layers; l <= L; ++l) ck_home[static_cast<size_t>(l)] = TierKind::kGpu;
  for (int64_t l = 0; l <= L; ++l)
    for (int64_t a = 0; a < Sets(); ++a) {
      ASSIGN_OR_RETURN(TensorId id, store->Create("x" + std::to_string(l) + "." + std::to_string(a), dtype,
                                                  Shape{B, T, C}, ck_home[static_cast<size_t>(l)]));
      ck[static_cast<size_t>(l)].push_back(id);
    }

  // Staging for the shards with a host optimizer (all, or those after the
  // GPU-state prefix): their GPU gradients come down through one buffer,
  // their GPU parameters go up through two.
  const uint64_t host_opt_numel = MaxOffloadedNumel();
  bool grads_staged = false, params_staged = false;
  for (const Shard& sh : shards)
    if (sh.opt_home != TierKind::kGpu) {
      grads_staged |= sh.g_home == TierKind::kGpu;
      params_staged |= sh.p_home == TierKind::kGpu;
    }
  if (host_opt_numel > 0) {
    HostTier* ht = store->host_tier();
    if (grads_staged) {
      ASSIGN_OR_RETURN(grad_staging, ht->Allocate(host_opt_numel * DTypeSize(grad_dtype), "gradient staging"));
    }
    if (params_staged)
      for (TierBlock& b : param_staging) {
        ASSIGN_OR_RETURN(b, ht->Allocate(host_opt_numel * DTypeSize(dtype), "parameter staging"));
      }
  }
  tok_host.resize(static_cast<size_t>(A * B * T));
  tgt_host.resize(static_cast<size_t>(A * B * T));
  loss_host.resize(static_cast<size_t>(A * B * T));
  return Status::OK();
}

// Writes master = init, m = v = 0, params = master rounded to the compute dtype.
// Shards are initialized in parallel (a few at a time: each holds a few
// copies of its size in host memory); the values do not depend on the order.
Status Trainer::Impl::InitModel() {
  std::mutex err_mu;
  Status first;
  tbb::task_arena arena(std::max(1, std::min<int>(6, static_cast<int>(std::thread::hardware_concurrency()))));
  arena.execute([&] {
    tbb::parallel_for(size_t{0}, shards.size(), [&](size_t i) {
      Shard& s = shards[i];
      Status st;
      auto master = InitShard(gcfg, s.kind, s.layer, s.numel, cfg.trainer.seed);
      st = master.ok() ? WriteShardState(s, master->data(), nullptr, nullptr) : master.status();
      if (!st.ok()) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (first.ok()) first = st.WithContext("initializing " + s.name);
      }
    });
  });
  return first;
}


// Parameters from a safetensors file with Hugging Face GPT-2 names (with or
// without the "transformer." prefix, after opt.init_prefix), any float dtype;
// m = v = 0. wpe may have more rows than seq_len (the first are taken).
Status Trainer::Impl::InitFromHf() {
  ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(opt.init_from));
  const auto tensors = kernels::HfTensors(gcfg);
  for (size_t si = 0; si < shards.size(); ++si) {
    Shard& sh = shards[si];
    std::vector<float> master(static_cast<size_t>(sh.numel), 0.f);
    for (const auto& t : tensors) {
      size_t ts = t.buffer == GptBuffer::kEmbedding ? 0
                  : t.buffer == GptBuffer::kLnF    ? shards.size() - 1
                                                   : static_cast<size_t>(t.layer) + 1;
      if (ts != si) continue;
      std::string name = opt.init_prefix + t.name;
      const SafetensorsEntry* e = f.Find(name);
      if (!e && t.name.rfind("transformer.", 0) == 0) {
        name = opt.init_prefix + t.name.substr(12);
        e = f.Find(name);
      }
      if (!e) return NotFound("tensor '" + opt.init_prefix + t.name + "' is not in " + opt.init_from);
      const bool is_wpe = t.name == "transformer.wpe.weight";
      bool shape_ok = e->shape.rank() == static_cast<int>(t.shape.size());
      for (size_t d = 0; shape_ok && d < t.shape.size(); ++d)
        shape_ok = is_wpe && d == 0 ? e->shape[0] >= t.shape[0] : e->shape[static_cast<int>(d)] == t.shape[d];
      if (!shape_ok) {
        std::string want = "[";
        for (size_t d = 0; d < t.shape.size(); ++d) want += (d ? ", " : "") + std::to_string(t.shape[d]);
        return InvalidArgument("tensor '" + name + "' in " + opt.init_from + " has shape " + e->shape.ToString() +
                               ", the configured model needs " + want + "]" +
                               (is_wpe ? " (at least seq_len rows)" : ""));
      }
      ASSIGN_OR_RETURN(std::vector<float> v, f.ReadF32(name));
      std::copy(v.begin(), v.begin() + t.numel, master.begin() + t.offset);
    }
    RETURN_IF_ERROR(WriteShardState(sh, master.data(), nullptr, nullptr));
  }
  return Status::OK();
}

// ---- state I/O -------------------------------------------------------------------

Status Trainer::Impl::WriteShardState(Shard& s, const float* master, const float* m, const float* v) {
  const size_t n = static_cast<size_t>(s.numel);
  const uint64_t fbytes = n * 4;
  RETURN_IF_ERROR(store->Write(s.w, master, fbytes));
  std::vector<float> zeros;
  if (!m || !v) zeros.assign(n, 0.f);
  RETURN_IF_ERROR(store->Write(s.m, m ? m : zeros.data(), fbytes));
  RETURN_IF_ERROR(store->Write(s.v, v ? v : zeros.data(), fbytes));
  RETURN_IF_ERROR(WriteParamsFromMaster(s, master));
  // Gradients start as zeros so that padding never holds garbage.
  if (zeros.empty()) zeros.assign(n, 0.f);
  RETURN_IF_ERROR(store->Write(s.g, zeros.data(), n * DTypeSize(grad_dtype)));
  // Write-through to the homes that are not the copy written (NVMe state).
  for (TensorId id : {s.g, s.w, s.m, s.v}) {
    ASSIGN_OR_RETURN(TensorInfo info, store->Info(id));
    if (info.home == TierKind::kNvme) {
      ASSIGN_OR_RETURN(Ticket t, store->Evict(id, TierKind::kHost));
      RETURN_IF_ERROR(t.Wait());
    }
  }
  return Status::OK();
}

Status Trainer::Impl::WriteParamsFromMaster(Shard& s, const float* master) {
  const size_t n = static_cast<size_t>(s.numel);
  std::vector<uint8_t> p(n * DTypeSize(dtype));
  if (dtype == DType::kF32) {
    std::memcpy(p.data(), master, n * 4);
  } else {
    uint16_t* h = reinterpret_cast<uint16_t*>(p.data());
    for (size_t i = 0; i < n; ++i) h[i] = dtype == DType::kBF16 ? FloatToBF16(master[i]) : FloatToHalf(master[i]);
  }
  RETURN_IF_ERROR(store->Write(s.p, p.data(), p.size()));
  if (s.p_home == TierKind::kNvme) {  // write-through
    ASSIGN_OR_RETURN(Ticket t, store->Evict(s.p, TierKind::kHost));
    RETURN_IF_ERROR(t.Wait());
  }
  return Status::OK();
}

Status Trainer::Impl::ReadShardState(Shard& s, float* master, float* m, float* v) {
  const uint64_t fbytes = static_cast<uint64_t>(s.numel) * 4;
  if (master) RETURN_IF_ERROR(store->Read(s.w, master, fbytes));
  if (m) RETURN_IF_ERROR(store->Read(s.m, m, fbytes));
  if (v) RETURN_IF_ERROR(store->Read(s.v, v, fbytes));
  return Status::OK();
}

std::vector<CheckpointShard> Trainer::Impl::CheckpointShards() {
  std::vector<CheckpointShard> out;
  for (auto& s : shards) {
    CheckpointShard c;
    c.kind = s.kind;
    c.layer = s.layer;
    c.numel = s.numel;
    Shard* sp = &s;
    c.read = [this, sp](float* w, float* m, float* v) { return ReadShardState(*sp, w, m, v); };
    c.write = [this, sp](const float* w, const float* m, const float* v) { return WriteShardState(*sp, w, m, v); };
    out.push_back(std::move(c));
  }
  return out;
}

TrainState Trainer::Impl::CurrentState() const {
  TrainState t;
  t.step = step;
  t.data_position = data->position();
  t.scaler = scaler->state();
  t.precision = cfg.precision();
  return t;
}

// ---- the step --------------------------------------------------------------------

Status Trainer::Impl::WaitShard(size_t s, double* wait_s) {
  CopyTicket up;
  {
    std::unique_lock<std::mutex> lk(mu);
    if (updated[s] < step || !opt_error.ok()) {
      double t0 = NowSeconds();
      cv.wait(lk, [&] { return updated[s] >= step || !opt_error.ok(); });
      if (wait_s) *wait_s += NowSeconds() - t0;
    }
    RETURN_IF_ERROR(opt_error);
    up = uploads[s];
  }
  // The compute stream waits (on the GPU) for the new parameters' upload.
  return cuda() ? up.StreamWait(stream()) : up.Wait();
}

Status Trainer::Impl::WaitAllUpdated() {
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] {
    if (!opt_error.ok()) return true;
    if (job) return false;
    for (int64_t u : updated)
      if (u < step) return false;
    return true;
  });
  RETURN_IF_ERROR(opt_error);
  std::vector<CopyTicket> ups = uploads;
  lk.unlock();
  for (const CopyTicket& t : ups) RETURN_IF_ERROR(t.Wait());
  return Status::OK();
}

// ---- the schedule: the step's GPU accesses, run by the prefetcher ------------------------

// The GPU Acquire/Release calls of Forward, Head and Backward, in the order
// they make them (keep them in step: the prefetcher refuses a call that does
// not follow this). The first use of each shard's parameters in a step is a
// refresh: the optimizer has written new ones since the last step.
Status Trainer::Impl::BuildSchedule(AccessSchedule* s) const {
  if (layer_major) {
    ScheduleForward(s, 0, A);
    ScheduleHead(s, 0, A);
    ScheduleBackward(s, 0, A);
  } else {
    for (int64_t a = 0; a < A; ++a) {
      ScheduleForward(s, a, a + 1);
      ScheduleHead(s, a, a + 1);
      ScheduleBackward(s, a, a + 1);
    }
  }
  RETURN_IF_ERROR(s->DescribeFrom(*store));
  return s->Finish();
}

void Trainer::Impl::ScheduleForward(AccessSchedule* s, int64_t a0, int64_t a1) const {
  const Shard& emb = shards.front();
  const bool first = a0 == 0;  // the step's first use of each shard's parameters
  auto x = [&](int64_t l, int64_t a) { return ck[static_cast<size_t>(l)][Slot(a)]; };
  s->Acquire(emb.p, Access::kRead, /*refresh=*/first);
  for (int64_t a = a0; a < a1; ++a) {
    s->Acquire(x(0, a), Access::kWriteDiscard);
    s->Release(x(0, a));
  }
  s->Release(emb.p);
  for (int64_t l = 0; l < L; ++l) {
    const Shard& sh = shards[static_cast<size_t>(l) + 1];
    s->Acquire(sh.p, Access::kRead, /*refresh=*/first);
    for (int64_t a = a0; a < a1; ++a) {
      s->Acquire(x(l, a), Access::kRead);
      s->Acquire(x(l + 1, a), Access::kWriteDiscard);
      s->Release(x(l, a));
      s->Release(x(l + 1, a));
    }
    s->Release(sh.p);
  }
}

void Trainer::Impl::ScheduleHead(AccessSchedule* s, int64_t a0, int64_t a1) const {
  const Shard& emb = shards.front();
  const Shard& lnf = shards.back();
  const bool f32 = grad_dtype == DType::kF32, last = a1 == A;
  const Access acc_mode = a0 == 0 ? Access::kWriteDiscard : Access::kReadWrite;
  s->Acquire(emb.p, Access::kRead);
  s->Acquire(lnf.p, Access::kRead, /*refresh=*/a0 == 0);
  if (f32) {
    s->Acquire(emb.g, acc_mode);
    s->Acquire(lnf.g, acc_mode);
  }
  for (int64_t a = a0; a < a1; ++a) {
    const TensorId xl = ck[static_cast<size_t>(L)][Slot(a)];
    s->Acquire(xl, Access::kRead);
    s->Release(xl);
  }
  s->Release(lnf.p);
  s->Release(emb.p);
  if (last) {
    if (!f32) s->Acquire(lnf.g, Access::kWriteDiscard);
    s->Release(lnf.g);
  } else if (f32) {
    s->Release(lnf.g);
  }
}

void Trainer::Impl::ScheduleBackward(AccessSchedule* s, int64_t a0, int64_t a1) const {
  const Shard& emb = shards.front();
  const bool f32 = grad_dtype == DType::kF32, last = a1 == A;
  const Access acc_mode = a0 == 0 ? Access::kWriteDiscard : Access::kReadWrite;
  for (int64_t l = L - 1; l >= 0; --l) {
    const Shard& sh = shards[static_cast<size_t>(l) + 1];
    const TensorId acc = f32 ? sh.g : sh.gacc;
    s->Acquire(sh.p, Access::kRead);
    if (accum_across) s->Acquire(acc, acc_mode);
    else if (f32) s->Acquire(sh.g, Access::kWriteDiscard);
    for (int64_t a = a0; a < a1; ++a) {
      const TensorId xi = ck[static_cast<size_t>(l)][Slot(a)];
      s->Acquire(xi, Access::kRead);
      s->Release(xi);
    }
    if (!accum_across || last) {
      if (!f32) s->Acquire(sh.g, Access::kWriteDiscard);
      s->Release(sh.g);
      if (accum_across && !f32) s->Release(sh.gacc, /*discard=*/true);
    } else {
      s->Release(acc);
    }
    s->Release(sh.p);
  }
  // The embedding's gradient.
  if (last) {
    if (!f32) s->Acquire(emb.g, Access::kWriteDiscard);
    s->Release(emb.g);
  } else if (f32) {
    s->Release(emb.g);
  }
}

// The prefetcher gets the GPU tier's free room once homes and scratch are
// in, less one copy of the largest streamed tensor: the tier's allocator does
// not compact, and that slack keeps its free room from coming in pieces too
// small for the next copy. The plan's per-step traffic becomes what the
// schedule moves in that room.
Status Trainer::Impl::StartPrefetcher() {
  AccessSchedule s(TierKind::kGpu);
  RETURN_IF_ERROR(BuildSchedule(&s));
  for (size_t i = 0; i < shards.size(); ++i) param_shard[shards[i].p.value] = i;
  GpuTier* gt = store->gpu_tier();
  const TierUsage u = gt->usage();
  const uint64_t align = gt->alignment();
  const uint64_t cap = u.budget / align * align;
  uint64_t largest = 0;
  for (uint32_t t = 0; t < s.tensors().size(); ++t)
    if (s.managed(t)) largest = std::max(largest, AlignUp(std::max<uint64_t>(s.tensors()[t].bytes, 1), align));
  const uint64_t free = cap > u.used ? cap - u.used : 0;
  const uint64_t budget = free > largest ? free - largest : 0;
  ASSIGN_OR_RETURN(std::vector<ScheduleTraffic> traffic, SimulateTraffic(s, budget, align, 3));
  // The optimizer's own PCIe traffic: gradients with a GPU home come down to
  // a host optimizer, and parameters with a GPU home go back up.
  uint64_t opt_h2d = 0, opt_d2h = 0;
  for (const Shard& sh : shards) {
    if (sh.opt_home == TierKind::kGpu) continue;
    if (sh.p_home == TierKind::kGpu) opt_h2d += static_cast<uint64_t>(sh.numel) * DTypeSize(dtype);
    if (sh.g_home == TierKind::kGpu) opt_d2h += static_cast<uint64_t>(sh.numel) * DTypeSize(grad_dtype);
  }
  plan.h2d = traffic.back().load_bytes + opt_h2d;
  plan.d2h = traffic.back().writeback_bytes + opt_d2h;
  plan.traffic_scheduled = true;
  plan.swap_window = budget;

  PrefetcherOptions po;
  po.budget_bytes = budget;
  // A shard's parameters are loaded for step `cycle` only once the optimizer
  // has written them (exactness: never a stale weight, never a wasted load),
  // and not before the step that made them has ended (`step`, the step
  // thread's, as this is called on it): an update that runs during the
  // backward does not pull the next step's loads into this one, so each
  // step moves what its schedule says.
  po.ready = [this](TensorId id, uint64_t cycle) {
    auto it = param_shard.find(id.value);
    if (it == param_shard.end()) return true;
    const int64_t want = prefetch_step0 + static_cast<int64_t>(cycle);
    if (step < want) return false;
    std::lock_guard<std::mutex> lk(mu);
    return updated[it->second] >= want;
  };
  prefetch_step0 = step;
  ASSIGN_OR_RETURN(prefetcher, Prefetcher::Create(store.get(), std::move(s), std::move(po)));
  return Status::OK();
}

Trainer::Impl::LinkBytes Trainer::Impl::Bytes() const {
  // Every host<->GPU byte goes through the copy engine (the store's moves and
  // the optimizer's staging copies alike).
  TierStoreStats st = store->stats();
  return LinkBytes{st.copy.h2d.bytes, st.copy.d2h.bytes, st.nvme_to_host.bytes, st.host_to_nvme.bytes};
}

Status Trainer::Impl::Forward(int64_t a0, int64_t a1, double* wait_s) {
  const int64_t BT = B * T;
  Shard& emb = shards.front();
  Prefetcher& pf = *prefetcher;
  // The optimizer's updates are waited for (and their uploads ordered) once,
  // by the step's first pass; later micro-batches find them done.
  const bool first = a0 == 0;
  if (first) RETURN_IF_ERROR(WaitShard(0, wait_s));
  ASSIGN_OR_RETURN(TensorView e, pf.Acquire(emb.p, Access::kRead));
  for (int64_t a = a0; a < a1; ++a) {
    TensorId x0 = ck[0][Slot(a)];
    ASSIGN_OR_RETURN(TensorView x, pf.Acquire(x0, Access::kWriteDiscard));
    RETURN_IF_ERROR(layers->EmbeddingForward(e.data, tokens_dev.as<int32_t>() + a * BT, x.data));
    RETURN_IF_ERROR(pf.Release(x0, true, stream()));
  }
  RETURN_IF_ERROR(pf.Release(emb.p, false, stream()));
  for (int64_t l = 0; l < L; ++l) {
    size_t si = static_cast<size_t>(l) + 1;
    if (first) RETURN_IF_ERROR(WaitShard(si, wait_s));
    Shard& sh = shards[si];
    double t0 = NowSeconds();
    ASSIGN_OR_RETURN(TensorView p, pf.Acquire(sh.p, Access::kRead));
    if (wait_s) *wait_s += NowSeconds() - t0;
    for (int64_t a = a0; a < a1; ++a) {
      TensorId in = ck[static_cast<size_t>(l)][Slot(a)];
      TensorId out = ck[static_cast<size_t>(l + 1)][Slot(a)];
      ASSIGN_OR_RETURN(TensorView xi, pf.Acquire(in, Access::kRead));
      ASSIGN_OR_RETURN(TensorView xo, pf.Acquire(out, Access::kWriteDiscard));
      RETURN_IF_ERROR(layers->BlockForward(p.data, xi.data, xo.data, block_scratch.data(), block_scratch.bytes(),
                                           KeptInternals(l, a0, a1)));
      // A host checkpoint leaves for the host once the window has no room
      // for it until the backward (the prefetcher decides).
      RETURN_IF_ERROR(pf.Release(in, false, stream()));
      RETURN_IF_ERROR(pf.Release(out, true, stream()));
    }
    RETURN_IF_ERROR(pf.Release(sh.p, false, stream()));
  }
  return Status::OK();
}

Status Trainer::Impl::Head(int64_t a0, int64_t a1, double dloss) {
  const int64_t BT = B * T;
  const bool last = a1 == A;
  Shard& emb = shards.front();
  Shard& lnf = shards.back();
  Prefetcher& pf = *prefetcher;
  if (a0 == 0) RETURN_IF_ERROR(WaitShard(shards.size() - 1, nullptr));
  ASSIGN_OR_RETURN(TensorView e, pf.Acquire(emb.p, Access::kRead));
  ASSIGN_OR_RETURN(TensorView f, pf.Acquire(lnf.p, Access::kRead));
  // Gradient accumulators: the store's GPU copies themselves in fp32 mode,
  // else fp32 scratch rounded into them at the end. They collect over all
  // micro-batches: zeroed by the first, rounded by the last.
  void* eacc = emb_acc.data();
  void* facc = lnf_acc.data();
  TensorView fg;
  if (grad_dtype == DType::kF32) {
    const Access mode = a0 == 0 ? Access::kWriteDiscard : Access::kReadWrite;
    ASSIGN_OR_RETURN(emb_grad_view, pf.Acquire(emb.g, mode));
    ASSIGN_OR_RETURN(fg, pf.Acquire(lnf.g, mode));
    eacc = emb_grad_view.data;
    facc = fg.data;
  }
  if (a0 == 0) {
    // Written piecewise (wte by the head, wpe later, padding never): zeros first.
    RETURN_IF_ERROR(backend->Memset(eacc, 0, static_cast<size_t>(emb.numel) * 4));
    RETURN_IF_ERROR(backend->Memset(facc, 0, static_cast<size_t>(lnf.numel) * 4));
  }
  for (int64_t a = a0; a < a1; ++a) {
    TensorId xl = ck[static_cast<size_t>(L)][Slot(a)];
    ASSIGN_OR_RETURN(TensorView x, pf.Acquire(xl, Access::kRead));
    GptLayers::HeadArgs h;
    h.lnf_params = f.data;
    h.emb_params = e.data;
    h.x = x.data;
    h.targets = targets_dev.as<int32_t>() + a * BT;
    h.losses = losses_dev.as<float>() + a * BT;
    h.dloss = static_cast<float>(dloss);
    h.dx = dx[Slot(a)].data();
    h.lnf_grads = facc;
    h.emb_grads = eacc;
    h.grad_dtype = DType::kF32;
    h.accumulate = true;
    h.scratch = head_scratch.data();
    h.scratch_bytes = head_scratch.bytes();
    RETURN_IF_ERROR(layers->HeadForwardBackward(h));
    RETURN_IF_ERROR(pf.Release(xl, false, stream()));
  }
  RETURN_IF_ERROR(pf.Release(lnf.p, false, stream()));
  RETURN_IF_ERROR(pf.Release(emb.p, false, stream()));
  // After the last micro-batch ln_f's gradients are complete (its
  // parameters are released: it may be updated now); the embedding's get the
  // token scatter at the end of Backward().
  if (last) {
    RETURN_IF_ERROR(FinishGrad(lnf, facc, fg.data));
    return GradFinal(shards.size() - 1);
  }
  if (grad_dtype == DType::kF32) return pf.Release(lnf.g, true, stream());
  return Status::OK();
}

// The gradient of shard `sh` is complete in the fp32 accumulator `acc`: take
// its statistics (the squared norm summed over all shards in the backward's
// order, the non-finite count per shard), round it into the store's copy
// (`acquired`: the GPU view already pinned in fp32 mode, else null) and
// release it: a gradient with a host home leaves for it at once (its next use
// overwrites the GPU copy; the prefetcher queues that write-back now).
Status Trainer::Impl::FinishGrad(Shard& sh, void* acc, void* acquired) {
  const size_t si = static_cast<size_t>(&sh - shards.data());
  if (!opt.inject_nonfinite_shard.empty() && sh.name == opt.inject_nonfinite_shard &&
      step + 1 == opt.inject_nonfinite_step)
    RETURN_IF_ERROR(backend->Memset(acc, 0xff, 4));  // a NaN (TrainOptions, tests)
  float* sumsq = stats_dev.as<float>();
  RETURN_IF_ERROR(backend->GradStats(acc, DType::kF32, sh.numel, sumsq, NonfiniteDev(si)));
  if (!acquired) {
    ASSIGN_OR_RETURN(TensorView g, prefetcher->Acquire(sh.g, Access::kWriteDiscard));
    RETURN_IF_ERROR(backend->Cast(g.data, grad_dtype, acc, DType::kF32, sh.numel));
  }
  return prefetcher->Release(sh.g, true, stream());
}

Status Trainer::Impl::Backward(int64_t a0, int64_t a1, double* wait_s) {
  const int64_t BT = B * T;
  const bool f32 = grad_dtype == DType::kF32, last = a1 == A;
  Prefetcher& pf = *prefetcher;
  for (int64_t l = L - 1; l >= 0; --l) {
    size_t si = static_cast<size_t>(l) + 1;
    Shard& sh = shards[si];
    double t0 = NowSeconds();
    ASSIGN_OR_RETURN(TensorView p, pf.Acquire(sh.p, Access::kRead));
    // The fp32 accumulator: one block's scratch (layer-major: every
    // micro-batch of this block runs now), the fp32 gradient itself, or the
    // block's own accumulator that persists across micro-batches.
    void* acc = block_acc.data();
    void* acquired = nullptr;
    const TensorId acc_id = f32 ? sh.g : sh.gacc;
    if (accum_across) {
      ASSIGN_OR_RETURN(TensorView g, pf.Acquire(acc_id, a0 == 0 ? Access::kWriteDiscard : Access::kReadWrite));
      acc = g.data;
      if (f32) acquired = g.data;
    } else if (f32) {
      ASSIGN_OR_RETURN(TensorView g, pf.Acquire(sh.g, Access::kWriteDiscard));
      acc = acquired = g.data;
    }
    if (wait_s) *wait_s += NowSeconds() - t0;
    for (int64_t a = a0; a < a1; ++a) {
      TensorId in = ck[static_cast<size_t>(l)][Slot(a)];
      t0 = NowSeconds();
      ASSIGN_OR_RETURN(TensorView xi, pf.Acquire(in, Access::kRead));
      if (wait_s) *wait_s += NowSeconds() - t0;
      void* d = dx[Slot(a)].data();
      RETURN_IF_ERROR(layers->BlockBackward(p.data, xi.data, d, d, acc, DType::kF32, a > 0, block_scratch.data(),
                                            block_scratch.bytes(), KeptInternals(l, a0, a1)));
      RETURN_IF_ERROR(pf.Release(in, false, stream()));
    }
    if (!accum_across || last) {
      RETURN_IF_ERROR(FinishGrad(sh, acc, acquired));
      // The accumulator is rewritten from scratch by the next step's first
      // micro-batch: it need not go home.
      if (accum_across && !f32) RETURN_IF_ERROR(pf.Release(sh.gacc, false, stream()));
      RETURN_IF_ERROR(pf.Release(sh.p, false, stream()));
      // The block is done with in this step: it may be updated now.
      RETURN_IF_ERROR(GradFinal(si));
    } else {
      RETURN_IF_ERROR(pf.Release(acc_id, true, stream()));
      RETURN_IF_ERROR(pf.Release(sh.p, false, stream()));
    }
  }
  // Embedding backward: d wte += by token (the head wrote its part), d wpe.
  Shard& emb = shards.front();
  void* eacc = f32 ? emb_grad_view.data : emb_acc.data();
  for (int64_t a = a0; a < a1; ++a)
    RETURN_IF_ERROR(layers->EmbeddingBackward(eacc, DType::kF32, true, tokens_dev.as<int32_t>() + a * BT,
                                              dx[Slot(a)].data()));
  Status st;
  if (last) st = FinishGrad(emb, eacc, f32 ? eacc : nullptr);
  else if (f32) st = pf.Release(emb.g, true, stream());
  if (f32) emb_grad_view = TensorView{};
  if (st.ok() && last) st = GradFinal(0);
  return st;
}

// ---- the optimizer (its own thread) ---------------------------------------------------

Trainer::Impl::OptJob Trainer::Impl::MakeJob(int64_t job_step, const optim::LrValue& lr, double grad_multiplier,
                                             bool streaming_job) const {
  OptJob j;
  j.step = job_step;
  j.streaming = streaming_job;
  j.grad_multiplier = grad_multiplier;
  j.hyper.lr = lr.lr;
  j.hyper.beta1 = lr.beta1.value_or(cfg.optimizer.beta1);
  j.hyper.beta2 = lr.beta2.value_or(cfg.optimizer.beta2);
  j.hyper.eps = cfg.optimizer.eps;
  j.hyper.weight_decay = cfg.optimizer.weight_decay;
  j.hyper.decay_mode = cfg.optimizer.adam_w_mode ? optim::WeightDecayMode::kDecoupled : optim::WeightDecayMode::kL2;
  j.hyper.bias_correction = cfg.optimizer.bias_correction;
  j.hyper.step = job_step;
  return j;
}

// Hands a job to the workers. The previous job is over for every worker (its
// shards are all updated — the forward waited for them — but a worker may
// still be on its way out): a job is never replaced under a worker that has
// not finished it.
Status Trainer::Impl::PostJob(const OptJob& j) {
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return !job.has_value(); });
  job = j;
  ++job_seq;
  queue = j.streaming ? backward_order : forward_order;
  next_claim = 0;
  std::fill(job_state.begin(), job_state.end(), ShardState::kWaiting);
  verdict = Verdict::kPending;
  job_multiplier = j.grad_multiplier;
  job_params = 0;
  job_workers = assist ? 2 : 1;
  job_t0 = NowSeconds();
  assist_params = 0;
  job_writes = 0;
  job_abort = false;
  std::fill(grad_final.begin(), grad_final.end(), 0);
  std::fill(grad_counted.begin(), grad_counted.end(), CopyTicket{});
  {
    // No worker copies now (none is on a job); this slot last held the job
    // two steps back, reported already.
    std::lock_guard<std::mutex> bl(bytes_mu);
    job_copied[j.step % 2] = LinkBytes{};
  }
  cv.notify_all();
  return Status::OK();
}

// During a streaming job: shard `s`'s gradient is final (its write-back to a
// host home queued by the prefetcher at its release) and the step is done
// with its parameters, so a worker may take it. Its non-finite count is
// copied down after everything queued on the compute stream so far — the
// shard's backward, its statistics, its rounding — so that copy's ticket
// tells the worker both the count and that the GPU is done with the shard's
// gradient and parameters (CheckFinite). The write-back itself is ordered by
// the store: the worker's Acquire of the gradient on the host first finishes
// the moves queued on it (tiers/tier_store.h, "operations on one tensor run
// in call order"), so no one polls for it.
Status Trainer::Impl::GradFinal(size_t s) {
  if (!job_in_backward || s < gpu_prefix) return Status::OK();
  CopyAfter after;
  if (cuda()) after.stream = stream();
  // (Unpinned, the copy goes through the engine's staging on its own thread:
  // the step thread never waits for the compute stream here.)
  const HostMemory hm = store->host_tier()->pinned() ? HostMemory::kPinned : HostMemory::kPageable;
  ASSIGN_OR_RETURN(CopyTicket t,
                   count_copies->DeviceToHost(nonfinite_host.as<int32_t>() + s, NonfiniteDev(s), 4, after, hm));
  std::lock_guard<std::mutex> lk(mu);
  grad_counted[s] = t;
  grad_final[s] = 1;
  cv.notify_all();
  return Status::OK();
}

// Whether this step's update speculates (in a speculative run). A miss
// costs a redo of what was speculated, more than not speculating at all, so
// a step speculates only where a hit is likely: after a step whose norm was
// within gradient_clipping (its clip coefficient exactly 1; the norm moves
// little from one step to the next). The first step after Create or a
// resume has no such history and does not; nor does the step after a failed
// one.
bool Trainer::Impl::SpeculateNow() const {
  if (!speculative) return false;
  return last_clip_one || opt.speculate_every_step;
}

// The verdict on a speculative job, given by the step thread once the
// backward is over and the true multiplier is known. A hit (the multiplier
// assumed) commits every speculated shard (Commit: its sets swap, nothing is
// copied); a miss queues each to be redone in place from its current set,
// which the speculation never wrote (the redo rewrites its parameters too).
// The shards not claimed yet are updated in place with `multiplier`; these
// and the redone ones in forward order, the next forward's. A shard a worker
// holds now is settled by that worker when it is done (OptimizerLoop). Every
// change of a shard's job state is made under mu, so each speculated shard
// is settled exactly once, by whichever of the verdict and its worker comes
// second.
void Trainer::Impl::GiveVerdict(int64_t job_step, bool hit, double multiplier) {
  std::lock_guard<std::mutex> lk(mu);
  verdict = hit ? Verdict::kCommit : Verdict::kMiss;
  job_multiplier = multiplier;
  std::vector<size_t> rest;
  for (size_t s : forward_order) {
    if (job_state[s] == ShardState::kSpeculated) {
      if (hit) {
        Commit(s, job_step);
        continue;
      }
      job_state[s] = ShardState::kWaiting;
    }
    if (job_state[s] == ShardState::kWaiting) rest.push_back(s);
  }
  queue = std::move(rest);
  next_claim = 0;
  cv.notify_all();
}

// Shard `s`'s speculative update becomes its state: the two sets swap (ids
// only). Called under mu, with no worker on the shard but the caller.
void Trainer::Impl::Commit(size_t s, int64_t job_step) {
  Shard& sh = shards[s];
  std::swap(sh.w, sh.w2);
  std::swap(sh.m, sh.m2);
  std::swap(sh.v, sh.v2);
  job_state[s] = ShardState::kFinal;
  updated[s] = job_step;
}

// The step failed with its job posted during the backward: the workers take
// no more shards and the step waits for them to leave the job. Then:
//  - if a shard was updated in place (streaming), or the job had its
//    verdict (speculative), the in-memory state is part this step's, part
//    the last: the error sticks (every later call, Save included, returns it);
//  - else the state is the last step's, untouched: a speculative update
//    writes only its shard's other set (garbage now) and its parameters,
//    which are rewritten here from the untouched master. The trainer stays
//    as usable as after a failure with the update after the backward (Save
//    writes the last step's state), unless that rewrite fails (sticky).
void Trainer::Impl::AbortJob(const Status& why) {
  std::vector<size_t> restore;
  {
    std::unique_lock<std::mutex> lk(mu);
    job_abort = true;
    cv.notify_all();
    cv.wait(lk, [&] { return !job.has_value(); });
    job_abort = false;
    if (job_writes > 0 || verdict != Verdict::kPending) {
      if (opt_error.ok())
        opt_error = FailedPrecondition(
            "step " + std::to_string(step + 1) + " failed after the optimizer had begun updating during the " +
            "backward (" + std::to_string(job_writes) + " shards hold its update, the others the last step's): " +
            "the in-memory state is partly updated and cannot be saved; resume from the last checkpoint. The " +
            "failure: " + why.ToString());
      return;
    }
    for (size_t s : forward_order)
      if (job_state[s] == ShardState::kSpeculated) restore.push_back(s);
  }
  for (size_t s : restore) {
    Status st = RestoreParams(shards[s]);
    if (st.ok()) continue;
    std::lock_guard<std::mutex> lk(mu);
    if (opt_error.ok())
      opt_error = FailedPrecondition(
          "step " + std::to_string(step + 1) + " failed during its speculative update, and the parameters of " +
          shards[s].name + " that it had written could not be restored from the untouched master weights (" +
          st.ToString() + "): resume from the last checkpoint. The failure: " + why.ToString());
    return;
  }
}

// The parameters of a shard whose speculative update was never committed,
// back to the last step's: its master weights (untouched) rounded, which is
// what the update that made them wrote beside them, bit for bit. The
// speculative upload into their GPU home has landed first.
Status Trainer::Impl::RestoreParams(Shard& sh) {
  CopyTicket up;
  {
    std::lock_guard<std::mutex> lk(mu);
    up = uploads[static_cast<size_t>(&sh - shards.data())];
  }
  RETURN_IF_ERROR(up.Wait());
  std::vector<float> master(static_cast<size_t>(sh.numel));
  RETURN_IF_ERROR(store->Read(sh.w, master.data(), master.size() * 4));
  return WriteParamsFromMaster(sh, master.data());
}

Status Trainer::Impl::NonFiniteError(int64_t job_step, const std::string& what) const {
  return FailedPrecondition(
      "non-finite gradients at step " + std::to_string(job_step) + " (" + what +
      "); with bf16/fp32 (or a static fp16 loss scale) there is no loss scale to lower: lower the learning rate or "
      "check the data. The optimizer was updating during the backward (" + update_mode +
      "): shards taken before this was known may hold step " + std::to_string(job_step) +
      "'s update, so the in-memory state may be partly updated and cannot be saved; resume from the last "
      "checkpoint");
}

// Streaming: a shard's non-finite gradient count, once its copy has come
// down (the step's overflow flag comes only at the backward's end). Waiting
// for it also means the GPU is done with the shard's gradient and
// parameters, so no copy or kernel of the update needs ordering on the GPU.
Result<int32_t> Trainer::Impl::NonFiniteCount(const Shard& sh, const CopyTicket& counted) {
  RETURN_IF_ERROR(counted.Wait());
  return nonfinite_host.as<int32_t>()[&sh - shards.data()];
}

// A PCIe copy of the optimizer's workers, counted as the update's (bytes_mu).
Result<CopyTicket> Trainer::Impl::OptCopy(int64_t job_step, CopyDirection dir, void* dst, const void* src,
                                          uint64_t bytes, const CopyAfter& after) {
  std::lock_guard<std::mutex> bl(bytes_mu);
  Result<CopyTicket> t = store->copy_engine()->Copy(dir, dst, src, bytes, after, HostMemory::kPinned);
  if (t.ok()) {
    uint64_t& all = dir == CopyDirection::kHostToDevice ? opt_copied.h2d : opt_copied.d2h;
    uint64_t& mine = dir == CopyDirection::kHostToDevice ? job_copied[job_step % 2].h2d : job_copied[job_step % 2].d2h;
    all += bytes;
    mine += bytes;
  }
  return t;
}

void Trainer::Impl::OptimizerLoop(bool gpu_worker) {
  int64_t seen = 0;
  const auto& oo = cfg.zero.offload_optimizer;
  for (;;) {
    OptJob j;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return stop || (job.has_value() && job_seq > seen); });
      if (!(job.has_value() && job_seq > seen)) return;  // stopping, nothing posted
      j = *job;
      seen = job_seq;
    }
    // NVMe state is pipelined (DeepSpeed pipeline_read / pipeline_write):
    // the next shard in claim order is read while one updates, and the one
    // before is written back meanwhile (UpdateShard's evictions return at
    // once; without pipeline_write they are waited for before the next
    // shard). NVMe state has no GPU-assisted worker, so the CPU worker claims
    // every shard, and is never speculated on, so the claim order is the
    // job's first. The first shard's read starts with the job (during the
    // backward, the wait for its gradient hides it).
    const std::vector<size_t>& order = j.streaming ? backward_order : forward_order;
    auto read_ahead = [&](size_t k) {
      if (gpu_worker || !oo.pipeline_read || j.skip || j.speculative || k >= order.size()) return;
      const Shard& sh = shards[order[k]];
      if (sh.opt_home != TierKind::kNvme) return;
      for (TensorId id : {sh.w, sh.m, sh.v}) (void)store->Prefetch(id, TierKind::kHost);
    };
    read_ahead(0);
    for (;;) {
      size_t k, s;
      bool ok;
      CopyTicket counted;
      How how;
      if (!gpu_worker && assist && opt.assist_takes_all) break;
      {
        std::unique_lock<std::mutex> lk(mu);
        // A streaming job's shards are claimed once final, in claim order; a
        // speculative job is left only after its verdict (a miss queues more).
        cv.wait(lk, [&] {
          if (stop || job_abort) return true;
          if (next_claim < queue.size()) return !j.streaming || grad_final[queue[next_claim]] != 0;
          return !j.speculative || verdict != Verdict::kPending;
        });
        if (stop || job_abort || next_claim >= queue.size()) break;
        k = next_claim++;
        s = queue[k];
        ok = opt_error.ok();
        counted = grad_counted[s];
        how.multiplier = job_multiplier;
        how.speculative = j.speculative && verdict == Verdict::kPending;
        job_state[s] = ShardState::kRunning;
      }
      read_ahead(k + 1);
      Shard& sh = shards[s];
      const std::string what = std::string("optimizer step of ") + sh.name + (gpu_worker ? " (gpu-assisted)" : "");
      auto update = [&] {
        Status u = gpu_worker ? AssistShard(sh, j, how) : UpdateShard(sh, j, how);
        return u.WithContext(what);
      };
      Status st;
      bool wrote = false, handed_back = false;
      if (!j.skip && ok) {
        if (j.streaming) {
          // Never update a shard whose own gradient holds a non-finite value
          // (NonFiniteError says what other shards may hold). Speculating,
          // such a shard is just handed back: nothing is committed before the
          // backward's end, which finds the overflow and fails the step.
          Result<int32_t> bad = NonFiniteCount(sh, counted);
          if (!bad.ok()) st = bad.status().WithContext(what);
          else if (*bad != 0 && how.speculative) handed_back = true;
          else if (*bad != 0)
            st = NonFiniteError(j.step, std::to_string(*bad) + " in " + sh.name + ", which was not updated");
        }
        if (st.ok() && !handed_back) {
          st = update();
          wrote = st.ok();
        }
      }
      // Settle the shard. A speculative update whose verdict came meanwhile
      // is committed, or, missed, redone here in place.
      std::unique_lock<std::mutex> lk(mu);
      auto count = [&] {
        job_params += static_cast<uint64_t>(sh.numel);
        if (gpu_worker) assist_params += static_cast<uint64_t>(sh.numel);
      };
      if (wrote) count();
      while (wrote && how.speculative && verdict == Verdict::kMiss) {
        how = How{job_multiplier, false};
        lk.unlock();
        st = update();
        wrote = st.ok();
        lk.lock();
        if (wrote) count();
      }
      if (!st.ok() && opt_error.ok()) opt_error = st;  // sticky: the next call reports it
      if (handed_back) {
        job_state[s] = ShardState::kWaiting;
      } else if (wrote && how.speculative && verdict == Verdict::kPending) {
        job_state[s] = ShardState::kSpeculated;
      } else if (wrote && how.speculative) {
        Commit(s, j.step);
      } else {
        job_state[s] = ShardState::kFinal;
        updated[s] = j.step;
        if (wrote) ++job_writes;
      }
      cv.notify_all();
    }
    std::lock_guard<std::mutex> lk(mu);
    if (--job_workers == 0) {
      const size_t slot = static_cast<size_t>(j.step % 2);
      job_seconds[slot] = NowSeconds() - job_t0;
      job_assist_share[slot] = job_params ? static_cast<double>(assist_params) / static_cast<double>(job_params) : 0;
      job.reset();
    }
    cv.notify_all();
  }
}

// The GPU-state prefix of offload_optimizer.ratio < 1 ("Twin-Flow"): updated
// by the step's thread as soon as the job is posted, with the fused GPU Adam
// on the compute stream (idle then: the backward has been synchronized),
// while the workers start on the offloaded shards at once. The workers are
// not given these shards: the GPU path of UpdateShard synchronizes the
// compute stream, and from a worker that would wait behind the next step's
// forward kernels, holding the CPU Adam back by about the prefix's forward
// time. Here it costs the GPU Adam's time over the prefix (bandwidth-bound,
// ~28 B/param at device speed), before the next forward is queued; the first
// shard the forward needs is the prefix's anyway. An error is sticky like a
// worker's.
Status Trainer::Impl::UpdateGpuPrefix(const OptJob& j) {
  for (size_t s = 0; s < gpu_prefix; ++s) {
    Status st;
    if (!j.skip) {
      {
        std::lock_guard<std::mutex> lk(mu);
        st = opt_error;
      }
      if (st.ok())
        st = UpdateShard(shards[s], j, How{j.grad_multiplier, false})
                 .WithContext("optimizer step of " + shards[s].name + " (gpu state)");
    }
    std::lock_guard<std::mutex> lk(mu);
    if (!st.ok() && opt_error.ok()) opt_error = st;
    updated[s] = j.step;
    cv.notify_all();
    if (!st.ok()) return st;
  }
  // The job's optimizer time spans the prefix too (the workers, when still
  // on the job, set it when they finish, later than now).
  std::lock_guard<std::mutex> lk(mu);
  double& secs = job_seconds[j.step % 2];
  if (gpu_prefix > 0 && !job) secs = std::max(secs, NowSeconds() - job_t0);
  return Status::OK();
}

// One shard's update by a worker (or, GPU state, the step thread), with the
// CPU Adam or the fused GPU Adam: in place, or (how.speculative, host state
// only) from the current master/m/v into the other set, which a commit then
// makes current. The new parameters are written either way.
Status Trainer::Impl::UpdateShard(Shard& sh, const OptJob& j, const How& how) {
  const uint64_t n = static_cast<uint64_t>(sh.numel);
  if (how.speculative && sh.opt_home != TierKind::kHost)
    return Internal("a speculative update of " + sh.name + ", whose optimizer state is not on the host");
  if (sh.opt_home == TierKind::kGpu) {
    // Everything of this shard is on the GPU (or its stand-in).
    ASSIGN_OR_RETURN(TensorView w, store->Acquire(sh.w, TierKind::kGpu, Access::kReadWrite));
    ASSIGN_OR_RETURN(TensorView m, store->Acquire(sh.m, TierKind::kGpu, Access::kReadWrite));
    ASSIGN_OR_RETURN(TensorView v, store->Acquire(sh.v, TierKind::kGpu, Access::kReadWrite));
    ASSIGN_OR_RETURN(TensorView g, store->Acquire(sh.g, TierKind::kGpu, Access::kRead));
    ASSIGN_OR_RETURN(TensorView p, store->Acquire(sh.p, TierKind::kGpu, Access::kWriteDiscard));
    optim::AdamShard a;
    a.n = n;
    a.master = static_cast<float*>(w.data);
    a.exp_avg = m.data;
    a.exp_avg_sq = v.data;
    a.grad = g.data;
    a.grad_dtype = grad_dtype;
    a.param_out = p.data;
    a.param_out_dtype = dtype;
    void* s = nullptr;
    if (cuda()) {
      s = stream();
      RETURN_IF_ERROR(optim::GpuAdamStep(a, j.hyper, how.multiplier, s));
      RETURN_IF_ERROR(backend->Synchronize());
    } else {
      ASSIGN_OR_RETURN(optim::AdamStepResult r, adam->Step(a, j.hyper, {how.multiplier, false}));
      (void)r;
    }
    RETURN_IF_ERROR(store->Release(sh.g, TierKind::kGpu, false, s));
    RETURN_IF_ERROR(store->Release(sh.w, TierKind::kGpu, true, s));
    RETURN_IF_ERROR(store->Release(sh.m, TierKind::kGpu, true, s));
    RETURN_IF_ERROR(store->Release(sh.v, TierKind::kGpu, true, s));
    return store->Release(sh.p, TierKind::kGpu, true, s);
  }

  // Host optimizer (state on the host or streamed from NVMe through it).
  const void* grad = nullptr;
  bool grad_acquired = false;
  if (sh.g_home == TierKind::kGpu) {
    // Gradients accumulated on the GPU come down through the staging buffer.
    ASSIGN_OR_RETURN(TensorView g, store->Acquire(sh.g, TierKind::kGpu, Access::kRead));
    auto t = OptCopy(j.step, CopyDirection::kDeviceToHost, grad_staging.data(), g.data, n * DTypeSize(grad_dtype));
    Status cs = t.ok() ? t->Wait() : t.status();
    RETURN_IF_ERROR(store->Release(sh.g, TierKind::kGpu, false, nullptr));
    RETURN_IF_ERROR(cs);
    grad = grad_staging.data();
  } else {
    ASSIGN_OR_RETURN(TensorView g, store->Acquire(sh.g, TierKind::kHost, Access::kRead));
    grad = g.data;
    grad_acquired = true;
  }
  const bool spec = how.speculative;
  const Access state_access = spec ? Access::kRead : Access::kReadWrite;
  ASSIGN_OR_RETURN(TensorView w, store->Acquire(sh.w, TierKind::kHost, state_access));
  ASSIGN_OR_RETURN(TensorView m, store->Acquire(sh.m, TierKind::kHost, state_access));
  ASSIGN_OR_RETURN(TensorView v, store->Acquire(sh.v, TierKind::kHost, state_access));
  TensorView w2, m2, v2;  // speculative: where the new state goes
  if (spec) {
    ASSIGN_OR_RETURN(w2, store->Acquire(sh.w2, TierKind::kHost, Access::kWriteDiscard));
    ASSIGN_OR_RETURN(m2, store->Acquire(sh.m2, TierKind::kHost, Access::kWriteDiscard));
    ASSIGN_OR_RETURN(v2, store->Acquire(sh.v2, TierKind::kHost, Access::kWriteDiscard));
  }
  void* pout = nullptr;
  const bool p_on_host = sh.p_home != TierKind::kGpu;
  if (p_on_host) {
    ASSIGN_OR_RETURN(TensorView p, store->Acquire(sh.p, TierKind::kHost, Access::kWriteDiscard));
    pout = p.data;
  } else {
    // The slot's previous upload (two shards ago) has landed.
    RETURN_IF_ERROR(param_upload[param_slot].Wait());
    pout = param_staging[param_slot].data();
  }
  optim::AdamShard a;
  a.n = n;
  a.master = static_cast<float*>(w.data);
  a.exp_avg = m.data;
  a.exp_avg_sq = v.data;
  a.grad = grad;
  a.grad_dtype = grad_dtype;
  a.param_out = pout;
  a.param_out_dtype = dtype;
  if (spec) {
    a.master_out = static_cast<float*>(w2.data);
    a.exp_avg_out = m2.data;
    a.exp_avg_sq_out = v2.data;
  }
  auto r = adam->Step(a, j.hyper, {how.multiplier, false});
  if (grad_acquired) RETURN_IF_ERROR(store->Release(sh.g, TierKind::kHost, false));
  RETURN_IF_ERROR(store->Release(sh.w, TierKind::kHost, !spec && r.ok()));
  RETURN_IF_ERROR(store->Release(sh.m, TierKind::kHost, !spec && r.ok()));
  RETURN_IF_ERROR(store->Release(sh.v, TierKind::kHost, !spec && r.ok()));
  if (spec) {
    RETURN_IF_ERROR(store->Release(sh.w2, TierKind::kHost, r.ok()));
    RETURN_IF_ERROR(store->Release(sh.m2, TierKind::kHost, r.ok()));
    RETURN_IF_ERROR(store->Release(sh.v2, TierKind::kHost, r.ok()));
  }
  if (p_on_host) RETURN_IF_ERROR(store->Release(sh.p, TierKind::kHost, r.ok()));
  RETURN_IF_ERROR(r.status());
  if (sh.opt_home == TierKind::kNvme) {
    // Write-behind: the state goes home while the next shard updates (or
    // before it, without pipeline_write). A failed write keeps the data in
    // host memory and surfaces at the next call on the tensor.
    for (TensorId id : {sh.w, sh.m, sh.v}) {
      ASSIGN_OR_RETURN(Ticket t, store->Evict(id, TierKind::kHost));
      if (!cfg.zero.offload_optimizer.pipeline_write) RETURN_IF_ERROR(t.Wait());
    }
  }
  if (!p_on_host) {
    // Upload the new parameters into their GPU home, without waiting: the
    // next shard's update runs meanwhile, the forward's stream waits for the
    // upload on the GPU (WaitShard), and the store orders any later use of
    // the memory after it (Release on the copy stream).
    CopyEngine* ce = store->copy_engine();
    ASSIGN_OR_RETURN(TensorView p, store->Acquire(sh.p, TierKind::kGpu, Access::kWriteDiscard));
    auto t = OptCopy(j.step, CopyDirection::kHostToDevice, p.data, pout, n * DTypeSize(dtype));
    Status cs = t.status();
    void* cstream = cuda() ? ce->stream(CopyDirection::kHostToDevice) : nullptr;
    if (cs.ok() && !cuda()) cs = t->Wait();  // the stand-in has no stream to order on
    RETURN_IF_ERROR(store->Release(sh.p, TierKind::kGpu, cs.ok(), cs.ok() ? cstream : nullptr));
    RETURN_IF_ERROR(cs);
    param_upload[param_slot] = *t;
    param_slot ^= 1;
    std::lock_guard<std::mutex> lk(mu);
    uploads[static_cast<size_t>(&sh - shards.data())] = *t;
  } else if (sh.p_home == TierKind::kNvme) {
    RETURN_IF_ERROR(store->Evict(sh.p, TierKind::kHost).status());
  }
  return Status::OK();
}

// The GPU-assisted update of a shard whose optimizer state lives on the host
// and whose parameters live on the GPU: chunk by chunk, master/m/v (and a
// host-resident gradient) go up on the H2D copy stream, the fused Adam runs on
// the D2H copy stream once they have landed and writes the new parameters in
// place, and master/m/v come back on the same stream after it (into the
// other set when speculative: the chunk buffers are scratch, so the GPU Adam
// itself stays in place). Three chunk buffers rotate (one going up, one
// updating, one coming down). The result is the CPU Adam's, bit for bit
// (optim/gpu_adam.h), so which worker takes a shard changes nothing but the
// time. In the stand-in the same pipeline runs with the CPU Adam on the
// stand-in's memory.
Status Trainer::Impl::AssistShard(Shard& sh, const OptJob& j, const How& how) {
  const uint64_t n = static_cast<uint64_t>(sh.numel);
  CopyEngine* ce = store->copy_engine();
  void* s = cuda() ? ce->stream(CopyDirection::kDeviceToHost) : nullptr;
  const uint64_t gs = DTypeSize(grad_dtype), ps = DTypeSize(dtype);
  const bool host_grad = sh.g_home != TierKind::kGpu;
  const TierKind gtier = host_grad ? TierKind::kHost : TierKind::kGpu;
  const bool spec = how.speculative;
  // The pins taken, each released at the end whatever failed (`out`: written
  // by the update, dirty if it succeeded).
  struct Pin {
    TensorId id;
    TierKind tier;
    bool out;
  };
  std::vector<Pin> pins;
  Status st;
  auto pin = [&](TensorId id, TierKind tier, Access access, bool out) -> char* {
    if (!st.ok()) return nullptr;
    Result<TensorView> r = store->Acquire(id, tier, access);
    if (!r.ok()) {
      st = r.status();
      return nullptr;
    }
    pins.push_back({id, tier, out});
    return static_cast<char*>(r->data);
  };
  // A miss has this worker redo a shard the CPU worker may have speculated
  // on: the new parameters are written on this stream only after that
  // upload of the speculated ones (almost always landed long ago).
  CopyTicket uploaded;
  {
    std::lock_guard<std::mutex> lk(mu);
    uploaded = uploads[static_cast<size_t>(&sh - shards.data())];
  }
  st = uploaded.StreamWait(s);  // (the stand-in: waits)
  const Access state_access = spec ? Access::kRead : Access::kReadWrite;
  const char* g = pin(sh.g, gtier, Access::kRead, false);
  char* hw = pin(sh.w, TierKind::kHost, state_access, !spec);
  char* hm = pin(sh.m, TierKind::kHost, state_access, !spec);
  char* hv = pin(sh.v, TierKind::kHost, state_access, !spec);
  char* ow = spec ? pin(sh.w2, TierKind::kHost, Access::kWriteDiscard, true) : hw;
  char* om = spec ? pin(sh.m2, TierKind::kHost, Access::kWriteDiscard, true) : hm;
  char* ov = spec ? pin(sh.v2, TierKind::kHost, Access::kWriteDiscard, true) : hv;
  char* p = pin(sh.p, TierKind::kGpu, Access::kWriteDiscard, true);
  for (uint64_t off = 0; off < n && st.ok(); off += assist_chunk) {
    const uint64_t c = std::min(assist_chunk, n - off);
    AssistSlot& sl = assist_slots[assist_next];
    assist_next = (assist_next + 1) % 3;
    for (const CopyTicket& t : sl.down)
      if (st.ok()) st = t.Wait();  // the buffer's last chunk is home
    sl.down.clear();
    if (!st.ok()) break;
    float* dw = static_cast<float*>(sl.buf.data());
    float* dm = dw + assist_chunk;
    float* dv = dm + assist_chunk;
    char* dg = reinterpret_cast<char*>(dv + assist_chunk);
    std::vector<CopyTicket> up;
    auto h2d = [&](void* dst, const void* src, uint64_t bytes) {
      if (!st.ok()) return;
      auto t = OptCopy(j.step, CopyDirection::kHostToDevice, dst, src, bytes);
      if (t.ok()) up.push_back(*t);
      else st = t.status();
    };
    h2d(dw, hw + off * 4, c * 4);
    h2d(dm, hm + off * 4, c * 4);
    h2d(dv, hv + off * 4, c * 4);
    if (host_grad) h2d(dg, g + off * gs, c * gs);
    optim::AdamShard a;
    a.n = c;
    a.master = dw;
    a.exp_avg = dm;
    a.exp_avg_sq = dv;
    a.grad = host_grad ? static_cast<const void*>(dg) : g + off * gs;
    a.grad_dtype = grad_dtype;
    a.param_out = p + off * ps;
    a.param_out_dtype = dtype;
    if (cuda()) {
      for (const CopyTicket& t : up)
        if (st.ok()) st = t.StreamWait(s);
      if (st.ok()) st = optim::GpuAdamStep(a, j.hyper, how.multiplier, s);
    } else {
      for (const CopyTicket& t : up)
        if (st.ok()) st = t.Wait();
      if (st.ok()) st = adam->Step(a, j.hyper, {how.multiplier, false}).status();
    }
    CopyAfter after;
    after.stream = s;
    auto d2h = [&](void* dst, const void* src, uint64_t bytes) {
      if (!st.ok()) return;
      auto t = OptCopy(j.step, CopyDirection::kDeviceToHost, dst, src, bytes, after);
      if (t.ok()) sl.down.push_back(*t);
      else st = t.status();
    };
    d2h(ow + off * 4, dw, c * 4);
    d2h(om + off * 4, dm, c * 4);
    d2h(ov + off * 4, dv, c * 4);
  }
  // The shard's state is home (each download follows its chunk's update,
  // so the parameters are written too) before anyone else may touch it.
  for (AssistSlot& sl : assist_slots) {
    for (const CopyTicket& t : sl.down) {
      Status ws = t.Wait();
      if (st.ok()) st = ws;
    }
    sl.down.clear();
  }
  // Every pin is released whatever failed; the first error is reported.
  const bool written = st.ok();
  for (const Pin& pn : pins) {
    Status r = store->Release(pn.id, pn.tier, pn.out && written, nullptr);
    if (st.ok()) st = r;
  }
  return st;
}

// ---- evaluation ----------------------------------------------------------------------

Status Trainer::Impl::ForwardEval(int64_t batches, double* mean) {
  RETURN_IF_ERROR(WaitAllUpdated());
  const int64_t BT = B * T;
  double total = 0;
  int64_t count = 0;
  Shard& emb = shards.front();
  Shard& lnf = shards.back();
  for (int64_t bi = 0; bi < batches; ++bi) {
    RETURN_IF_ERROR(data->Val(static_cast<uint64_t>(bi), tok_host.data(), tgt_host.data()));
    RETURN_IF_ERROR(backend->CopyToDevice(tokens_dev.data(), tok_host.data(), static_cast<size_t>(BT) * 4));
    RETURN_IF_ERROR(backend->CopyToDevice(targets_dev.data(), tgt_host.data(), static_cast<size_t>(BT) * 4));
    void* x = xbuf.data();
    void* y = dx[0].data();
    {
      ASSIGN_OR_RETURN(TensorView e, store->Acquire(emb.p, TierKind::kGpu, Access::kRead));
      RETURN_IF_ERROR(layers->EmbeddingForward(e.data, tokens_dev.as<int32_t>(), x));
      RETURN_IF_ERROR(store->Release(emb.p, TierKind::kGpu, false, stream()));
    }
    for (int64_t l = 0; l < L; ++l) {
      Shard& sh = shards[static_cast<size_t>(l) + 1];
      if (l + 1 < L) (void)store->Prefetch(shards[static_cast<size_t>(l) + 2].p, TierKind::kGpu);
      ASSIGN_OR_RETURN(TensorView p, store->Acquire(sh.p, TierKind::kGpu, Access::kRead));
      RETURN_IF_ERROR(layers->BlockForward(p.data, x, y, block_scratch.data(), block_scratch.bytes()));
      RETURN_IF_ERROR(store->Release(sh.p, TierKind::kGpu, false, stream()));
      if (sh.p_home != TierKind::kGpu && !plan.params_resident)
        RETURN_IF_ERROR(store->Evict(sh.p, TierKind::kGpu).status());
      std::swap(x, y);
    }
    ASSIGN_OR_RETURN(TensorView e, store->Acquire(emb.p, TierKind::kGpu, Access::kRead));
    ASSIGN_OR_RETURN(TensorView f, store->Acquire(lnf.p, TierKind::kGpu, Access::kRead));
    GptLayers::HeadArgs h;
    h.lnf_params = f.data;
    h.emb_params = e.data;
    h.x = x;
    h.targets = targets_dev.as<int32_t>();
    h.losses = losses_dev.as<float>();
    h.scratch = head_scratch.data();
    h.scratch_bytes = head_scratch.bytes();
    RETURN_IF_ERROR(layers->HeadForward(h));
    RETURN_IF_ERROR(store->Release(lnf.p, TierKind::kGpu, false, stream()));
    RETURN_IF_ERROR(store->Release(emb.p, TierKind::kGpu, false, stream()));
    RETURN_IF_ERROR(backend->Synchronize());
    RETURN_IF_ERROR(backend->CopyToHost(loss_host.data(), losses_dev.data(), static_cast<size_t>(BT) * 4));
    for (int64_t i = 0; i < BT; ++i)
      if (tgt_host[static_cast<size_t>(i)] >= 0) total += loss_host[static_cast<size_t>(i)], ++count;
  }
  *mean = count ? total / static_cast<double>(count) : 0.0;
  return Status::OK();
}

// ---- Trainer --------------------------------------------------------------------------

const char* SpeculationName(Speculation s) {
  switch (s) {
    case Speculation::kNone: return "none";
    case Speculation::kCommitted: return "committed";
    case Speculation::kMissed: return "missed";
  }
  return "?";
}

Trainer::Trainer() : impl_(std::make_unique<Impl>()) {}

Trainer::~Trainer() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
    impl_->cv.notify_all();
  }
  if (impl_->opt_thread.joinable()) impl_->opt_thread.join();
  if (impl_->assist_thread.joinable()) impl_->assist_thread.join();
}

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainOptions& options, std::ostream& log) {
  std::unique_ptr<Trainer> t(new Trainer());
  t->impl_->opt = options;
  t->impl_->log = &log;
  RETURN_IF_ERROR(t->impl_->Setup());
  return t;
}

Result<std::string> Trainer::DryRun(const TrainOptions& options) {
  Config cfg = options.config;
  ASSIGN_OR_RETURN(GptConfig g, MakeGptConfig(cfg));
  ASSIGN_OR_RETURN(DType dtype, PrecisionDType(cfg));
  // Scratch sizes from the backend the run would use (its attention's
  // workspace depends on the kernel chosen); nothing is allocated on it.
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> be, MakeBackend(options));
  size_t block = GptLayers::BlockScratchBytes(*be, g, cfg.micro_batch, cfg.model.seq_len, dtype);
  size_t head = GptLayers::HeadScratchBytes(g, cfg.micro_batch, cfg.model.seq_len, dtype);
  uint64_t gpu = options.gpu_memory_limit;
  if (!gpu) {
    auto info = QueryGpu(0);
    gpu = info.ok() ? info->free_bytes : 4 * kGiB;
  }
  uint64_t host = options.host_memory_limit;
  if (!host) {
    ASSIGN_OR_RETURN(host, DefaultHostBudget());
  }
  PlanInputs in;
  RETURN_IF_ERROR(MakePlanInputs(cfg, g, dtype, block, head, gpu, host, WantsSpeculativeState(cfg, options), &in));
  ASSIGN_OR_RETURN(Plan p, MakePlan(in));
  std::ostringstream os;
  os << "model: " << g.n_layer << " layers, d " << g.n_embd << ", " << g.n_head << " heads, vocab " << g.vocab_size
     << " (padded " << g.Vp() << "), seq " << cfg.model.seq_len << "; " << g.NumParameters() << " parameters, "
     << cfg.precision() << "\n";
  os << "batch: micro " << cfg.micro_batch << " x accumulation " << cfg.grad_accum << " = " << cfg.train_batch_size
     << " sequences per step\n";
  os << p.Table(gpu, host);
  os << "optimizer update: " << UpdateModeFor(cfg, p, g.n_layer + 2, options, host).why << "\n";
  return os.str();
}

const Plan& Trainer::plan() const { return impl_->plan; }
std::string Trainer::PlanTable() const {
  return impl_->plan.Table(impl_->gpu_budget, impl_->host_budget) + "optimizer update: " + impl_->update_mode + "\n";
}
int64_t Trainer::step() const { return impl_->step; }

TrainerInfo Trainer::Info() const {
  const Impl& I = *impl_;
  TrainerInfo t;
  t.backend = I.backend->name();
  t.peak_flops = I.peak_flops;
  t.peak_what = I.peak_what;
  t.flops_per_token = ModelFlopsPerToken(I.gcfg, I.T);
  t.tokens_per_step = I.A * I.B * I.T;
  t.gpu_budget = I.gpu_budget;
  t.host_budget = I.host_budget;
  t.gpu_overhead = I.gpu_overhead;
  TierStoreStats st = I.store->stats();
  t.gpu_tier_peak = st.tiers[0].usage.peak_used;
  t.host_tier_peak = st.tiers[1].usage.peak_used;
  PrefetcherStats ps = I.prefetcher->stats();
  t.swap_window = I.prefetcher->budget();
  t.swap_prefetches = ps.prefetches;
  t.swap_evictions = ps.evictions;
  t.swap_forced = ps.forced;
  t.swap_fragmented = ps.fragmented;
  t.gpu_evictions = st.tiers[0].evictions;
  for (const Shard& sh : I.shards)
    if (sh.opt_home == TierKind::kGpu) {
      ++t.optimizer_gpu_shards;
      t.optimizer_gpu_params += static_cast<uint64_t>(sh.numel);
    }
  t.optimizer_during_backward = I.streaming;
  t.optimizer_speculative = I.speculative;
  t.speculative_bytes = I.speculative ? I.plan.speculative_bytes : 0;
  t.optimizer_update = I.update_mode;
  if (I.cuda()) {
    auto info = QueryGpu(0);
    if (info.ok()) t.device_in_use = info->total_bytes - info->free_bytes;
  }
  return t;
}

Result<StepReport> Trainer::Step() {
  Impl& I = *impl_;
  const int64_t BT = I.B * I.T;
  // Straight into the step's host buffers (StepWith does not copy them onto themselves).
  for (int64_t a = 0; a < I.A; ++a)
    RETURN_IF_ERROR(I.data->NextTrain(I.tok_host.data() + a * BT, I.tgt_host.data() + a * BT));
  return StepWith(I.tok_host.data(), I.tgt_host.data());
}

Result<StepReport> Trainer::StepWith(const int32_t* tokens, const int32_t* targets) {
  Impl& I = *impl_;
  Result<StepReport> r = I.RunStep(tokens, targets);
  if (I.job_in_backward) {
    // Failed with its streaming job posted.
    I.job_in_backward = false;
    I.AbortJob(r.status());
  }
  return r;
}

Result<StepReport> Trainer::Impl::RunStep(const int32_t* tokens, const int32_t* targets) {
  {
    std::lock_guard<std::mutex> lk(mu);
    RETURN_IF_ERROR(opt_error);
  }
  RETURN_IF_ERROR(CheckSwapFiles());
  if (!prefetcher->at_cycle_start())
    return FailedPrecondition("a previous step of this trainer failed midway (at " +
                              prefetcher->schedule().EventString(prefetcher->tick()) +
                              "); create the trainer again (from the last checkpoint)");
  StepReport r;
  double t0 = NowSeconds();
  // Inputs for all micro-batches, checked: a token outside the vocabulary
  // would index past the embedding.
  const size_t n = tok_host.size();
  const int32_t V = static_cast<int32_t>(gcfg.vocab_size);
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
  RETURN_IF_ERROR(backend->CopyToDevice(tokens_dev.data(), tok_host.data(), tok_host.size() * 4));
  RETURN_IF_ERROR(backend->CopyToDevice(targets_dev.data(), tgt_host.data(), tgt_host.size() * 4));
  RETURN_IF_ERROR(backend->Memset(stats_dev.data(), 0, StatsBytes()));
  RETURN_IF_ERROR(prefetcher->Poll());  // parameters updated meanwhile start up
  const double scale = scaler->scale();
  const int64_t next = step + 1;  // the optimizer step this one takes
  const optim::LrValue lr = schedule->ForStep(next);
  r.lr = lr.lr;

  double wait = 0;
  const double dloss = scale / static_cast<double>(std::max<int64_t>(valid, 1));
  double fwd_s = 0;
  // Layer-major: one pass over the layers with every micro-batch; micro-
  // batch-major: one pass per micro-batch (forward, head, backward).
  const int64_t per = layer_major ? A : 1;
  OptJob job_now;  // the job this step posts
  const bool speculate = SpeculateNow();
  last_clip_one = false;  // until this step succeeds with a clip coefficient of 1
  for (int64_t a0 = 0; a0 < A; a0 += per) {
    double f0 = a0 == 0 ? t0 : NowSeconds();  // the first forward counts the step's input checks and copies
    RETURN_IF_ERROR(Forward(a0, a0 + per, &wait));
    if (cfg.wall_clock_breakdown) RETURN_IF_ERROR(backend->Synchronize());
    fwd_s += NowSeconds() - f0;
    if ((streaming || speculate) && a0 + per >= A) {
      // The update runs during the backward's last pass, each shard as its
      // gradient is final, with the multiplier it would have after it: no
      // clipping and a static scale (UpdateModeFor), or, speculating, a
      // clip coefficient of 1, which the verdict below checks.
      job_now = MakeJob(next, lr, optim::GradMultiplier(scale, 1.0), true);
      job_now.speculative = speculate;
      RETURN_IF_ERROR(PostJob(job_now));
      job_in_backward = true;
    }
    RETURN_IF_ERROR(Head(a0, a0 + per, dloss));
    RETURN_IF_ERROR(Backward(a0, a0 + per, &wait));
  }
  RETURN_IF_ERROR(backend->Synchronize());
  // The gradients' write-backs: the optimizer needs them first thing, and the
  // step's bytes are all counted before it starts.
  RETURN_IF_ERROR(prefetcher->WaitEvictions());
  if (job_in_backward) {
    // Every shard's non-finite count has come down (the workers may not
    // have asked for the last ones yet) before the next step's statistics
    // overwrite stats_dev.
    std::vector<CopyTicket> counts;
    {
      std::lock_guard<std::mutex> lk(mu);
      counts = grad_counted;
    }
    for (const CopyTicket& c : counts) RETURN_IF_ERROR(c.Wait());
  }
  double t2 = NowSeconds();
  // The links' counters and the optimizer's own copies, read together (bytes_mu).
  LinkBytes moved, opt_now, prev_job;
  {
    std::lock_guard<std::mutex> bl(bytes_mu);
    moved = Bytes();
    opt_now = opt_copied;
    prev_job = job_copied[(next - 1) % 2];  // complete: the forward waited for all its shards
  }

  // Loss and gradient statistics.
  RETURN_IF_ERROR(backend->CopyToHost(loss_host.data(), losses_dev.data(), loss_host.size() * 4));
  double total = 0;
  for (size_t i = 0; i < loss_host.size(); ++i)
    if (tgt_host[i] >= 0) total += loss_host[i];
  r.loss = total / static_cast<double>(std::max<int64_t>(valid, 1));
  float sumsq = 0;
  std::vector<int32_t> nonfinite(shards.size(), 0);
  RETURN_IF_ERROR(backend->CopyToHost(&sumsq, stats_dev.data(), 4));
  RETURN_IF_ERROR(backend->CopyToHost(nonfinite.data(), NonfiniteDev(0), nonfinite.size() * 4));
  optim::GradStats gs;
  gs.sum_sq = sumsq;
  for (int32_t c : nonfinite) gs.nonfinite += static_cast<uint64_t>(c);
  const bool overflow = gs.overflow() || !std::isfinite(sumsq);
  r.grad_norm = optim::GlobalGradNorm(gs, scale);
  r.loss_scale = scale;

  const double clip = optim::ClipCoefficient(r.grad_norm, cfg.gradient_clipping);
  if (job_in_backward && job_now.speculative) {
    if (overflow) {
      // Nothing is committed: the speculated shards wrote only their other
      // sets, and StepWith's AbortJob restores the parameters they wrote.
      // The state stays the last step's, so the error does not stick.
      return FailedPrecondition(
          "non-finite gradients at step " + std::to_string(next) + " (loss " + std::to_string(r.loss) +
          "); with bf16/fp32 (or a static fp16 loss scale) there is no loss scale to lower: lower the learning "
          "rate or check the data. The update was speculative and nothing of it was committed: the state is "
          "step " + std::to_string(step) + "'s");
    }
    // A hit needs the very multiplier the updates assumed: a clip
    // coefficient of exactly 1, the norm within gradient_clipping.
    const double multiplier = optim::GradMultiplier(scale, clip);
    const bool hit = clip == 1.0 && multiplier == job_now.grad_multiplier;
    RETURN_IF_ERROR(scaler->Update(false));
    GiveVerdict(next, hit, multiplier);
    job_now.grad_multiplier = multiplier;  // for the GPU-state prefix
    r.speculation = hit ? Speculation::kCommitted : Speculation::kMissed;
    step = next;
    job_in_backward = false;
  } else if (job_in_backward) {
    if (overflow) {
      // Some shards may hold this step's update already (never one whose own
      // gradient is non-finite: CheckFinite). Which ones is settled once the
      // workers have left the job; the error then sticks.
      Status e = NonFiniteError(next, "loss " + std::to_string(r.loss));
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return !job.has_value(); });
      if (opt_error.ok()) opt_error = e;
      job_in_backward = false;
      return e;
    }
    RETURN_IF_ERROR(scaler->Update(false));
    step = next;
    job_in_backward = false;
  } else {
    if (overflow && scaler->dynamic()) {
      job_now.step = next;
      job_now.skip = true;
      r.skipped = true;
    } else if (overflow) {
      return FailedPrecondition("non-finite gradients at step " + std::to_string(next) + " (loss " +
                                std::to_string(r.loss) +
                                "); with bf16/fp32 there is no loss scale to lower: lower the learning rate or "
                                "check the data");
    } else {
      job_now = MakeJob(next, lr, optim::GradMultiplier(scale, clip), false);
    }
    RETURN_IF_ERROR(scaler->Update(overflow));
    RETURN_IF_ERROR(PostJob(job_now));
    step = next;
  }
  last_clip_one = !overflow && clip == 1.0;
  RETURN_IF_ERROR(UpdateGpuPrefix(job_now));
  // Parameters the update has written already start up now (counted in the
  // next step, as they are used there).
  if (job_now.streaming) RETURN_IF_ERROR(prefetcher->Poll());

  r.step = step;
  r.tokens = A * B * T;
  r.seconds = t2 - t0;
  r.forward_s = fwd_s;
  r.backward_s = t2 - t0 - fwd_s;  // head and backward (and, micro-batch-major, everything but the forwards)
  r.wait_s = wait;
  {
    std::lock_guard<std::mutex> lk(mu);
    const size_t prev = static_cast<size_t>((next - 1) % 2);  // the previous step's update (it overlaps this forward)
    r.optimizer_s = job_seconds[prev];
    r.optimizer_gpu_share = assist ? job_assist_share[prev] : 0;
  }
  // What moved since the last step, less what Evaluate/Save moved: this
  // step's own transfers, and the previous step's update (whose copies may
  // fall before, in or after this step: OptCopy counts them apart). NVMe
  // traffic still running now counts in the next step.
  LinkBytes& last = last_bytes;
  LinkBytes& ex = excluded_bytes;
  r.h2d = moved.h2d - last.h2d - ex.h2d - (opt_now.h2d - last_opt_copied.h2d) + prev_job.h2d;
  r.d2h = moved.d2h - last.d2h - ex.d2h - (opt_now.d2h - last_opt_copied.d2h) + prev_job.d2h;
  r.nvme_read = moved.nvme_read - last.nvme_read - ex.nvme_read;
  r.nvme_write = moved.nvme_write - last.nvme_write - ex.nvme_write;
  last = moved;
  last_opt_copied = opt_now;
  ex = LinkBytes{};
  double flops = ModelFlopsPerToken(gcfg, T) * static_cast<double>(r.tokens);
  r.tflops = flops / std::max(r.seconds, 1e-9) / 1e12;
  r.mfu = peak_flops > 0 ? flops / std::max(r.seconds, 1e-9) / peak_flops : 0;
  return r;
}

// Runs `f` (after the optimizer is done) and keeps what it moves out of the
// next step's report.
template <class F>
Status Trainer::Impl::Aside(F&& f) {
  RETURN_IF_ERROR(WaitAllUpdated());
  const LinkBytes b = Bytes();
  Status s = f();
  const LinkBytes a = Bytes();
  excluded_bytes.h2d += a.h2d - b.h2d;
  excluded_bytes.d2h += a.d2h - b.d2h;
  excluded_bytes.nvme_read += a.nvme_read - b.nvme_read;
  excluded_bytes.nvme_write += a.nvme_write - b.nvme_write;
  return s;
}

Result<double> Trainer::Evaluate(int batches) {
  double loss = 0;
  RETURN_IF_ERROR(impl_->Aside([&] { return impl_->ForwardEval(batches, &loss); }));
  return loss;
}

Status Trainer::Save(const std::string& dir) {
  Impl& I = *impl_;
  return I.Aside([&] {
    nlohmann::json cfg_json = ConfigToJson(I.cfg);
    return SaveCheckpoint(dir, I.gcfg, I.CheckpointShards(), I.CurrentState(), cfg_json, &std::cerr);
  });
}

Result<std::vector<float>> Trainer::Parameter(const std::string& hf_name) {
  Impl& I = *impl_;
  if (!I.WaitAllUpdated().ok()) {
    // Failed (sticky): the state as the workers leave it.
    std::unique_lock<std::mutex> lk(I.mu);
    I.cv.wait(lk, [&] { return !I.job.has_value(); });
  }
  for (const auto& t : kernels::HfTensors(I.gcfg)) {
    if (t.name != hf_name) continue;
    size_t si = t.buffer == GptBuffer::kEmbedding ? 0
                : t.buffer == GptBuffer::kLnF    ? I.shards.size() - 1
                                                 : static_cast<size_t>(t.layer) + 1;
    std::vector<float> all(static_cast<size_t>(I.shards[si].numel));
    RETURN_IF_ERROR(I.ReadShardState(I.shards[si], all.data(), nullptr, nullptr));
    return std::vector<float>(all.begin() + t.offset, all.begin() + t.offset + t.numel);
  }
  return NotFound("no parameter named '" + hf_name + "'");
}


// ---- the run: steps, logs, evaluation, checkpoints -----------------------------------------

namespace {

std::string Sci(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}

std::string Fixed(double v, int prec) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

}  // namespace

Status Trainer::Run(std::ostream& out) {
  Impl& I = *impl_;
  const int64_t total = TotalSteps(I.opt);
  out << "strata: " << I.backend->name() << "; GEMM baseline " << I.peak_what << "\n";
  out << "model: " << I.gcfg.n_layer << " layers, d " << I.gcfg.n_embd << ", " << I.gcfg.n_head << " heads, vocab "
      << I.gcfg.vocab_size << ", seq " << I.T << ": " << I.gcfg.NumParameters() << " parameters, " << I.cfg.precision()
      << "; batch " << I.B << " x " << I.A << " micro-batches\n";
  out << "data: " << I.data->Describe() << "\n";
  out << "plan:\n" << PlanTable();
  if (I.gpu_overhead)
    out << "gpu: the tier's budget is the limit less " << FormatBytes(I.gpu_overhead)
        << " held outside it (CUDA context, cuBLASLt, a margin)\n";
  out.flush();
  std::ofstream json;
  if (!I.opt.log_json.empty()) {
    json.open(I.opt.log_json, std::ios::app);
    if (!json) return ErrnoStatus("cannot open the JSON log", I.opt.log_json);
  }
  const int64_t every = std::max<int64_t>(1, I.cfg.steps_per_print);
  double window_s = 0;
  int64_t window_tokens = 0, window_steps = 0, window_committed = 0, window_missed = 0;
  StepReport agg;
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
    window_s += r.seconds;
    window_tokens += r.tokens;
    ++window_steps;
    window_committed += r.speculation == Speculation::kCommitted;
    window_missed += r.speculation == Speculation::kMissed;
    agg.forward_s += r.forward_s, agg.backward_s += r.backward_s, agg.wait_s += r.wait_s;
    agg.optimizer_s += r.optimizer_s;
    agg.h2d += r.h2d, agg.d2h += r.d2h, agg.nvme_read += r.nvme_read, agg.nvme_write += r.nvme_write;
    bool print = r.step % every == 0 || r.step == 1 || r.step == total;
    if (I.opt.progress) {
      int width = 30, done = static_cast<int>(width * r.step / std::max<int64_t>(total, 1));
      std::cerr << "\r[" << std::string(static_cast<size_t>(done), '#') << std::string(static_cast<size_t>(width - done), '.')
                << "] " << r.step << "/" << total << " loss " << Fixed(r.loss, 4) << std::flush;
      if (r.step == total) std::cerr << "\n";
    }
    if (print) {
      double tps = window_s > 0 ? window_tokens / window_s : 0;
      double flops = ModelFlopsPerToken(I.gcfg, I.T) * tps;
      TierStoreStats st = I.store->stats();
      std::ostringstream line;
      line << "step " << r.step << "/" << total << " | loss " << Fixed(r.loss, 4) << " | lr " << Sci(r.lr)
           << " | scale " << r.loss_scale << (r.skipped ? " (overflow: step skipped)" : "") << " | grad norm "
           << Fixed(r.grad_norm, 3) << " | " << Fixed(tps, 0) << " tok/s | " << Fixed(flops / 1e12, 2)
           << " TFLOP/s | MFU " << Fixed(I.peak_flops > 0 ? 100 * flops / I.peak_flops : 0, 1) << "%";
      if (I.cfg.wall_clock_breakdown)
        line << " | fwd " << Fixed(agg.forward_s, 2) << "s bwd " << Fixed(agg.backward_s, 2) << "s opt "
             << Fixed(agg.optimizer_s, 2) << "s";
      if (I.assist) line << " (" << Fixed(100 * r.optimizer_gpu_share, 0) << "% on the GPU)";
      if (I.cfg.wall_clock_breakdown) line << " wait " << Fixed(agg.wait_s, 2) << "s";
      if (I.speculative) {
        // Of the steps since the last line, how many speculated, and with what outcome.
        line << " | speculative " << window_committed + window_missed << "/" << window_steps << " ("
             << window_committed << " committed, " << window_missed << " missed)";
      }
      line << " | H2D " << FormatBytes(agg.h2d) << " D2H " << FormatBytes(agg.d2h);
      if (agg.nvme_read || agg.nvme_write)
        line << " NVMe r " << FormatBytes(agg.nvme_read) << " w " << FormatBytes(agg.nvme_write);
      line << " | gpu " << FormatBytes(st.tiers[0].usage.used) << " host " << FormatBytes(st.tiers[1].usage.used);
      if (I.opt.progress) std::cerr << "\r" << std::string(60, ' ') << "\r";
      out << line.str() << "\n";
      out.flush();
      if (json.is_open()) {
        nlohmann::json j = {{"step", r.step},          {"loss", r.loss},
                            {"lr", r.lr},              {"loss_scale", r.loss_scale},
                            {"skipped", r.skipped},    {"grad_norm", r.grad_norm},
                            {"speculation", SpeculationName(r.speculation)},
                            {"speculation_committed", window_committed},
                            {"speculation_missed", window_missed},
                            {"tokens_per_s", tps},     {"tflops", flops / 1e12},
                            {"mfu", I.peak_flops > 0 ? flops / I.peak_flops : 0},
                            {"forward_s", agg.forward_s}, {"backward_s", agg.backward_s},
                            {"optimizer_s", agg.optimizer_s}, {"wait_s", agg.wait_s},
                            {"optimizer_gpu_share", r.optimizer_gpu_share},
                            {"h2d_bytes", agg.h2d},    {"d2h_bytes", agg.d2h},
                            {"nvme_read_bytes", agg.nvme_read}, {"nvme_write_bytes", agg.nvme_write},
                            {"gpu_bytes", st.tiers[0].usage.used}, {"host_bytes", st.tiers[1].usage.used},
                            {"nvme_bytes", st.nvme.used}};
        json << j.dump() << "\n";
        json.flush();
      }
      window_s = 0;
      window_tokens = window_steps = window_committed = window_missed = 0;
      agg = StepReport{};
    }
    if (I.cfg.trainer.eval_interval > 0 && r.step % I.cfg.trainer.eval_interval == 0 && I.data->val_tokens()) {
      ASSIGN_OR_RETURN(double vl, Evaluate(I.cfg.trainer.eval_batches));
      out << "step " << r.step << " | val loss " << Fixed(vl, 4) << "\n";
    }
    if (!I.opt.save_dir.empty() && I.opt.save_every > 0 && r.step % I.opt.save_every == 0 && r.step != total)
      RETURN_IF_ERROR(Save(I.opt.save_dir));
  }
  if (I.data->val_tokens()) {
    ASSIGN_OR_RETURN(double vl, Evaluate(I.cfg.trainer.eval_batches));
    out << "step " << I.step << " | val loss " << Fixed(vl, 4) << "\n";
  }
  if (!I.opt.save_dir.empty()) RETURN_IF_ERROR(Save(I.opt.save_dir));
  RETURN_IF_ERROR(I.WaitAllUpdated());
  TierStoreStats st = I.store->stats();
  out << "memory: gpu tier peak " << FormatBytes(st.tiers[0].usage.peak_used) << " of its budget "
      << FormatBytes(st.tiers[0].usage.budget) << "; host tier peak " << FormatBytes(st.tiers[1].usage.peak_used);
  if (I.cuda()) {
    auto info = QueryGpu(0);
    if (info.ok())
      out << "; device in use now (cudaMemGetInfo, all of this process) " << FormatBytes(info->total_bytes - info->free_bytes);
  }
  out << "\n";
  return Status::OK();
}

}  // namespace strata
