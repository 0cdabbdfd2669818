// SPDX-License-Identifier: Apache-2.0
#include "engine/planner.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <vector>

#include "base/bytes.h"

namespace strata {

namespace {

constexpr char kSpeculativeRow[] = "optimizer, second set (speculative update)";

uint64_t TotalParams(const PlanInputs& in) {
  return static_cast<uint64_t>(in.n_layer) * in.layer_params + in.embedding_params + in.final_params;
}

// Parameters of the first k shards in forward order (embedding, blocks, ln_f).
uint64_t PrefixParams(const PlanInputs& in, int64_t k) {
  const uint64_t L = static_cast<uint64_t>(in.n_layer);
  if (k <= 0) return 0;
  const uint64_t blocks = std::min<uint64_t>(static_cast<uint64_t>(k - 1), L);
  return in.embedding_params + blocks * in.layer_params + (static_cast<uint64_t>(k) > L + 1 ? in.final_params : 0);
}

std::string RatioText(double r) {
  std::ostringstream os;
  os << r;
  return os.str();
}

}  // namespace

namespace {

Status CheckInputs(const PlanInputs& in) {
  if (in.n_layer < 1 || in.layer_params == 0 || in.param_bytes == 0)
    return InvalidArgument("planner: the model has no layers or parameters");
  if (in.moment_bytes != 4 && in.moment_bytes != 2)
    return InvalidArgument("planner: " + std::to_string(in.moment_bytes) +
                           " bytes per Adam moment is not allowed (allowed: 4 for fp32, 2 for bf16)");
  for (const auto* d : {&in.offload_param, &in.offload_optimizer})
    if (*d != "none" && *d != "cpu" && *d != "nvme")
      return InvalidArgument("planner: offload device \"" + *d + "\" is not allowed (allowed: none, cpu, nvme)");
  if ((in.offload_param == "nvme" || in.offload_optimizer == "nvme") && !in.have_nvme)
    return InvalidArgument("planner: NVMe offload requested but no nvme_path was given");
  const double ratio = in.optimizer_offload_ratio;
  if (!(ratio >= 0 && ratio <= 1))
    return InvalidArgument("planner: zero_optimization.offload_optimizer.ratio " + RatioText(ratio) +
                           " is out of range (allowed: [0, 1])");
  if (ratio < 1 && in.offload_optimizer == "none")
    return InvalidArgument("planner: zero_optimization.offload_optimizer.ratio " + RatioText(ratio) +
                           " needs offload_optimizer.device \"cpu\" or \"nvme\" (the ratio is the fraction of "
                           "the optimizer state offloaded there; with device \"none\" the planner places it)");
  return Status::OK();
}

// What every placement is computed from.
struct Sizes {
  uint64_t n = 0, L = 0, A = 1;
  int64_t n_shards = 0;
  // Partial offload: the longest forward-order prefix of K whole shards whose
  // parameters are at most (1 - ratio) of all stays on the GPU.
  int64_t K = 0;
  uint64_t gpuN = 0, restN = 0;  // parameters whose optimizer state is on the GPU / offloaded
  // ... of them this rank keeps the optimizer state of (ZeRO stage >= 1
  // across ranks: its slice of each unit, 1/zero_partitions; else all).
  uint64_t opt_gpuN = 0, opt_restN = 0;
  uint64_t Kb = 0;               // blocks among the GPU-state shards
  bool emb_gpu = false, lnf_gpu = false;
  uint64_t param_all = 0;
  // Gradients are stored in one dtype wherever they live (fp32 accumulation
  // happens in the working set's accumulator); ZeRO stage >= 2 keeps this
  // rank's slices of them: of the GPU-state shards' / the others'.
  uint64_t gb = 4, grad_gpu_all = 0;
  uint64_t g_gpuN = 0, g_restN = 0;
  // Optimizer state per parameter: the fp32 master and the two moments.
  uint64_t opt_pp = 12;
  // One layer's inputs: of all micro-batches (layer-major) or of the one in
  // flight (micro-batch-major); the residual-stream gradients likewise.
  uint64_t ck_set = 0, ck_sets = 0;  // x_0 .. x_L
  // Micro-batch-major with accumulation keeps an fp32 accumulator per layer
  // across the micro-batches (fp32 gradients are their own accumulators).
  uint64_t acc_pp = 0, acc_all = 0;  // bytes per parameter, all
  uint64_t layer_p = 0, emb_p = 0;
  // The GPU-state shards' blocks' parameters (resident whatever `params`
  // says), and the embedding's and ln_f's that a host optimizer uploads.
  uint64_t gpu_blocks_p = 0, emb_rest_p = 0;
  uint64_t max_block = 0;
  // The largest shard whose optimizer state is offloaded (what a host
  // optimizer's staging buffers are sized for), and how many there are.
  uint64_t max_offloaded = 0, n_offloaded = 0;
  uint64_t align = 4096, opt_staging = 0;
  // What the GPU needs whatever the placement: one layer computing, its fp32
  // gradient accumulator, the residual gradients of A micro-batches, the head.
  uint64_t base = 0;
};

Sizes SizesFor(const PlanInputs& in) {
  Sizes z;
  z.n = TotalParams(in);
  z.L = static_cast<uint64_t>(in.n_layer);
  z.n_shards = in.n_layer + 2;
  const double ratio = in.optimizer_offload_ratio;
  if (ratio < 1) {
    const long double keep = (1.0L - static_cast<long double>(ratio)) * static_cast<long double>(z.n);
    while (z.K < z.n_shards && static_cast<long double>(PrefixParams(in, z.K + 1)) <= keep) ++z.K;
  }
  z.gpuN = PrefixParams(in, z.K);
  z.restN = z.n - z.gpuN;
  const uint64_t W = static_cast<uint64_t>(std::max(in.zero_partitions, 1));
  z.opt_gpuN = (z.gpuN + W - 1) / W;
  z.opt_restN = (z.restN + W - 1) / W;
  z.Kb = static_cast<uint64_t>(std::clamp<int64_t>(z.K - 1, 0, in.n_layer));
  z.emb_gpu = z.K >= 1, z.lnf_gpu = z.K == z.n_shards;
  z.A = static_cast<uint64_t>(std::max<int64_t>(1, in.grad_accum));
  z.param_all = z.n * in.param_bytes;
  z.gb = in.grad_host_bytes;
  z.g_gpuN = in.partitions_grads ? z.opt_gpuN : z.gpuN;
  z.g_restN = in.partitions_grads ? z.opt_restN : z.restN;
  z.grad_gpu_all = (z.g_gpuN + z.g_restN) * z.gb;
  z.opt_pp = 4 + 2 * in.moment_bytes;
  z.ck_set = (in.layer_major ? z.A : 1) * in.checkpoint_bytes;
  // (fp32 gradients are their own accumulators, but for slices.)
  z.acc_pp = !in.layer_major && z.A > 1 && (z.gb != 4 || in.partitions_grads) ? 4 : 0;
  z.acc_all = z.n * z.acc_pp;
  z.ck_sets = z.L + 1;
  z.layer_p = in.layer_params * in.param_bytes;
  z.emb_p = (in.embedding_params + in.final_params) * in.param_bytes;
  z.gpu_blocks_p = z.Kb * z.layer_p;
  z.emb_rest_p = ((z.emb_gpu ? 0 : in.embedding_params) + (z.lnf_gpu ? 0 : in.final_params)) * in.param_bytes;
  z.max_block = std::max(in.layer_params, in.embedding_params + in.final_params);
  // The largest offloaded shards, largest first: the embedding unless the
  // GPU keeps it, up to three of the blocks it does not keep, ln_f unless kept.
  std::vector<uint64_t> offloaded;
  if (z.K == 0) offloaded.push_back(in.embedding_params);
  offloaded.insert(offloaded.end(), std::min<uint64_t>(3, z.L - z.Kb), in.layer_params);
  if (!z.lnf_gpu) offloaded.push_back(in.final_params);
  std::sort(offloaded.begin(), offloaded.end(), std::greater<>());
  z.max_offloaded = offloaded.empty() ? 0 : offloaded.front();
  z.n_offloaded = static_cast<uint64_t>(z.n_shards - z.K);
  z.align = std::max<uint64_t>(in.host_alignment, 1);
  // Optimizer state on NVMe passes through host memory a whole shard at a
  // time (engine/shard_update.h): the one updating, the next one read ahead,
  // the last one written behind. Three shards' state at once, at most the
  // three largest offloaded ones (this rank's slices of them).
  for (size_t i = 0; i < std::min<size_t>(3, offloaded.size()); ++i)
    z.opt_staging += (offloaded[i] + W - 1) / W * z.opt_pp;
  z.base = in.layer_workspace + in.head_workspace + in.fixed_gpu + z.max_block * 4 + z.ck_set;
  if (in.second_block_accumulator) z.base += in.layer_params * 4;
  return z;
}

constexpr TierKind kG = TierKind::kGpu, kH = TierKind::kHost, kN = TierKind::kNvme;

// Where each kind of state lives in one candidate.
struct Placement {
  TierKind params, optimizer, grads, checkpoints;
};

bool Allowed(const PlanInputs& in, const Sizes& z, const Placement& c) {
  auto allowed = [&](const std::string& req, TierKind t) {
    if (req == "cpu") return t == kH;
    if (req == "nvme") return t == kN;
    return t != kN || in.have_nvme;
  };
  // ZeRO stage 3: one placement of the parameters, the slices on the host
  // (whatever offload_param asks: a rank holds no unit whole to place).
  if (in.gathers_params) {
    if (c.params != kG) return false;
  } else if (!allowed(in.offload_param, c.params)) {
    return false;
  }
  if (!allowed(in.offload_optimizer, c.optimizer)) return false;
  if (in.cpu_checkpointing && c.checkpoints == kG) return false;
  // GPU Adam reads GPU gradients and writes GPU parameters.
  if (c.optimizer == kG && (c.params != kG || c.grads != kG)) return false;
  // Every block's parameters on the GPU already (GPU-state shards): nothing streams.
  return !(c.params != kG && z.Kb == z.L);
}

// The parameters', gradients' and optimizer state's rows (and the prefetch
// depth), on a GPU that has `gpu` bytes taken already.
void PlaceState(const PlanInputs& in, const Sizes& z, const Placement& c, uint64_t gpu, Plan* p) {
  Plan::Row prow{"parameters"}, grow{"gradients"};
  Plan::Row orow{in.moment_bytes == 2 ? "optimizer (fp32 master, bf16 m, v)" : "optimizer (fp32 master, m, v)"};
  // GPU bytes of the GPU-state shards beyond what this placement keeps there
  // anyway (their optimizer state, their gradients when the others' leave,
  // their blocks' parameters when the others stream).
  const uint64_t split_gpu = z.opt_gpuN * z.opt_pp + (c.grads == kH ? z.g_gpuN * z.gb + z.gpuN * z.acc_pp : 0) +
                             (c.params != kG ? z.gpu_blocks_p : 0);
  int depth = 0;
  if (in.gathers_params) {
    prow.kind = "parameters (ZeRO stage 3: gathered at each use)";  // (c.params is kG: Allowed)
  } else if (c.params == kG) {
    prow.gpu = z.param_all;
  } else {
    // Embedding and ln_f stay on the GPU (used at both ends of the step);
    // blocks stream through prefetch buffers.
    const uint64_t fixed = gpu + z.emb_p + split_gpu;
    const uint64_t left = in.gpu_budget > fixed ? in.gpu_budget - fixed : 0;
    const int want = in.prefetch_depth > 0 ? in.prefetch_depth : 4;
    depth = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(want) + 1, left / z.layer_p));
    depth = std::max(depth - 1, 1);  // one buffer computes, `depth` prefetch
    prow.gpu = z.emb_p + static_cast<uint64_t>(depth + 1) * z.layer_p + z.gpu_blocks_p;
    (c.params == kH ? prow.host : prow.nvme) = z.param_all - z.gpu_blocks_p;
    if (c.params == kN) prow.host = static_cast<uint64_t>(depth + 1) * z.layer_p;  // staging
  }
  p->prefetch_depth = p->params_resident ? 0 : depth;
  if (c.grads == kG) {
    grow.gpu = z.grad_gpu_all + z.acc_all;
  } else {
    grow.gpu = z.g_gpuN * z.gb + z.gpuN * z.acc_pp;
    grow.host = z.g_restN * z.gb + z.restN * z.acc_pp;
  }
  grow.kind = z.gb == 4 ? "gradients (fp32)" : c.grads == kG ? "gradients (bf16)" : "gradients (bf16 on the host)";
  if (in.partitions_grads) grow.kind += ", this rank's slices";
  orow.gpu = z.opt_gpuN * z.opt_pp;
  (c.optimizer == kG ? orow.gpu : c.optimizer == kH ? orow.host : orow.nvme) += z.opt_restN * z.opt_pp;
  if (c.optimizer == kN && z.restN > 0) orow.host = z.opt_staging;
  p->rows = {prow, grow, orow};
}

// Checkpoints: all on the GPU, or as many of the last sets as fit beside `gpu`.
Plan::Row PlaceCheckpoints(const PlanInputs& in, const Sizes& z, const Placement& c, uint64_t gpu, Plan* p) {
  uint64_t gpu_sets = 0;
  if (c.checkpoints == kG) {
    gpu_sets = z.ck_sets;
  } else if (!in.cpu_checkpointing && z.ck_set > 0) {
    const uint64_t left = in.gpu_budget > gpu ? in.gpu_budget - gpu : 0;
    gpu_sets = std::min<uint64_t>(z.ck_sets - 1, left / z.ck_set);  // on the host: at least one set there
  }
  p->checkpoint_gpu_layers = static_cast<int64_t>(gpu_sets);
  Plan::Row crow{"activation checkpoints"};
  crow.gpu = gpu_sets * z.ck_set;
  crow.host = (z.ck_sets - gpu_sets) * z.ck_set;
  return crow;
}

// The host tier's own: a host optimizer's staging, the non-finite counts,
// the NVMe staging, each host allocation's page rounding.
Plan::Row HostStaging(const PlanInputs& in, const Sizes& z, const Placement& c, const Plan& p) {
  Plan::Row srow{"host staging (optimizer, nvme) and page rounding"};
  const uint64_t host_sets = z.ck_sets - static_cast<uint64_t>(p.checkpoint_gpu_layers);
  uint64_t host_tensors = (c.params == kH ? z.L - z.Kb : 0) + host_sets * (in.layer_major ? z.A : 1);
  if (c.optimizer != kG && z.restN > 0) {
    if (c.grads == kG) srow.host += AlignUp(z.max_offloaded * z.gb, z.align);
    const bool params_up = c.params == kG || !z.emb_gpu || !z.lnf_gpu;  // offloaded shards with GPU-homed parameters
    if (params_up) srow.host += 2 * AlignUp(z.max_offloaded * in.param_bytes, z.align);
    srow.host += AlignUp(4 * static_cast<uint64_t>(z.n_shards), z.align);  // non-finite counts
    host_tensors += z.n_offloaded * ((c.grads == kH ? 1 + (z.acc_pp ? 1 : 0) : 0) + (c.optimizer == kH ? 3 : 0));
    if (c.optimizer == kN) host_tensors += 9;  // three shards' master/m/v in the host window
  }
  if (c.optimizer == kN || c.params == kN) srow.host += in.nvme_staging_bytes;
  srow.host += host_tensors * z.align;
  return srow;
}

// ZeRO across ranks: the rank's slice of every unit's compute-dtype
// parameters, which its update writes and the gathers read (Shard::ps,
// homed on the host: engine/model_state.h).
Plan::Row ParamSlices(const PlanInputs& in, const Sizes& z) {
  Plan::Row r{"parameter slices (ZeRO: this rank's 1/W of every unit)"};
  const uint64_t W = static_cast<uint64_t>(std::max(in.zero_partitions, 1));
  if (!in.partitioned) return r;
  auto slice = [&](uint64_t numel) { return AlignUp((numel + W - 1) / W * in.param_bytes, z.align); };
  r.host = slice(in.embedding_params) + z.L * slice(in.layer_params) + slice(in.final_params);
  return r;
}

// Bytes over each link per step.
void AddTraffic(const PlanInputs& in, const Sizes& z, const Placement& c, uint64_t host_ck, Plan* p) {
  const uint64_t passes = in.layer_major ? 1 : z.A;
  if (!p->params_resident) p->h2d += 2 * passes * (z.L - z.Kb) * z.layer_p;  // forward and backward
  if (c.optimizer != kG && z.restN > 0) {
    // The optimizer reads every offloaded shard's gradient once; every
    // updated parameter with a GPU home goes back once (all of them when
    // resident; the embedding's and ln_f's when the blocks stream: streamed
    // ones come back through the uploads above). The GPU-state shards' stay
    // on the GPU.
    p->d2h += z.g_restN * z.gb;
    // (Stage 3: the update writes the host slices, which the gathers read.)
    if (!in.gathers_params) p->h2d += p->params_resident ? z.restN * in.param_bytes : z.emb_rest_p;
  }
  // Stage 3: each gather uploads this rank's slice of the unit (forward and
  // backward of every pass; a unit still held from its last use is not
  // gathered again, so this is the most).
  if (in.gathers_params) {
    const uint64_t W = static_cast<uint64_t>(std::max(in.zero_partitions, 1));
    p->h2d += 2 * passes * ((z.n + W - 1) / W) * in.param_bytes;
  }
  // Host checkpoints go down in the forward and come back for the backward,
  // but for the head's input (x_L, the last set: on the host only when none
  // stays on the GPU), which the backward never reads.
  p->d2h += passes * host_ck;
  p->h2d += passes * (host_ck - (p->checkpoint_gpu_layers == 0 && c.checkpoints == kH ? z.ck_set : 0));
  // Micro-batch-major: host accumulators go up and down between micro-batches.
  if (!in.layer_major && z.A > 1 && c.grads == kH) {
    const uint64_t acc = z.restN * (z.acc_pp ? z.acc_pp : z.gb);
    p->d2h += (z.A - 1) * acc;
    p->h2d += (z.A - 1) * acc;
  }
  if (c.optimizer == kN) p->nvme_read += z.opt_restN * z.opt_pp, p->nvme_write += z.opt_restN * z.opt_pp;
  if (c.params == kN) {
    p->nvme_read += 2 * passes * (z.L - z.Kb) * z.layer_p;
    p->nvme_write += z.param_all - z.gpu_blocks_p;
  }
}

// GPU room for the tensors with a home off the GPU that pass through it
// when no streamed parameters lend theirs (the parameters resident, or at
// ZeRO stage 3 gathered into buffers beside the tiers): an offloaded
// unit's gradient (this rank's slice at stage >= 2), written on the GPU and
// on its way home, and a host checkpoint on its way back for the backward.
// Two of the largest: one in flight while the next is written or read
// ahead (the prefetcher keeps the largest free, engine/step_schedule.cc).
uint64_t TransitBytes(const PlanInputs& in, const Sizes& z, const Placement& c) {
  if (c.params != kG) return 0;  // (the prefetch buffers' room)
  const uint64_t W = static_cast<uint64_t>(std::max(in.zero_partitions, 1));
  uint64_t largest = 0;
  if (c.grads == kH && z.restN > 0)
    largest = (in.partitions_grads ? (z.max_offloaded + W - 1) / W : z.max_offloaded) * z.gb;
  if (c.checkpoints == kH) largest = std::max(largest, in.checkpoint_bytes);
  return 2 * AlignUp(largest, z.align);
}

// One candidate: its rows and totals, and its traffic (the totals first: the
// caller keeps only what fits).
Plan Place(const PlanInputs& in, const Sizes& z, const Placement& c) {
  Plan p;
  p.layer_major = in.layer_major;
  p.params = c.params;
  p.grads = c.grads;
  p.optimizer = c.optimizer;
  p.checkpoints = c.checkpoints;
  p.params_resident = c.params == kG;
  p.gathers_params = in.gathers_params;
  p.grad_host_bytes = in.grad_host_bytes;
  p.optimizer_offload_ratio = in.optimizer_offload_ratio;
  p.shards = z.n_shards;
  p.optimizer_gpu_shards = z.K;
  p.optimizer_gpu_params = z.gpuN;
  p.total_params = z.n;
  if (z.restN == 0) p.optimizer = p.grads = kG;  // ratio 0: everything on the GPU
  const uint64_t transit = TransitBytes(in, z, c);
  uint64_t gpu = z.base + transit, host = 0, nvme = 0;
  PlaceState(in, z, c, gpu, &p);
  for (const Plan::Row& r : p.rows) gpu += r.gpu, host += r.host, nvme += r.nvme;
  const Plan::Row crow = PlaceCheckpoints(in, z, c, gpu, &p);
  gpu += crow.gpu;
  host += crow.host;
  const Plan::Row srow = HostStaging(in, z, c, p);
  host += srow.host;
  Plan::Row wrow{in.second_block_accumulator ? "working set (scratch, two grad accumulators, head)"
                                             : "working set (scratch, grad accumulator, head)"};
  wrow.gpu = z.base;
  p.rows.push_back(crow);
  p.rows.push_back(wrow);
  if (transit) p.rows.push_back(Plan::Row{"transit (host-homed gradients, checkpoints)", transit, 0, 0});
  p.rows.push_back(srow);
  if (const Plan::Row slices = ParamSlices(in, z); slices.host) {
    host += slices.host;
    p.rows.push_back(slices);
  }
  p.gpu_total = gpu;
  p.host_total = host;
  p.nvme_total = nvme;
  AddTraffic(in, z, c, crow.host, &p);
  return p;
}

// The speculative update's second master/m/v, beside the first, if the host
// budget has room: three more host tensors per offloaded shard, each
// page-rounded.
void AddSpeculativeSet(const PlanInputs& in, const Sizes& z, Plan* p) {
  if (!in.speculative_state || p->optimizer != kH || z.restN == 0) return;
  p->speculative_bytes = z.opt_restN * z.opt_pp;
  const uint64_t rounding = 3 * z.n_offloaded * z.align;
  p->speculative_fits = p->host_total + p->speculative_bytes + rounding <= in.host_budget;
  if (!p->speculative_fits) return;
  // Right after the optimizer's own row (rows: params, grads, optimizer, checkpoints, working set, staging).
  p->rows.insert(p->rows.begin() + 3, Plan::Row{kSpeculativeRow, 0, p->speculative_bytes, 0});
  p->rows.back().host += rounding;
  p->host_total += p->speculative_bytes + rounding;
}

// No candidate fits: the budget that is short, by how much, and what to do.
Status NoPlanFits(const PlanInputs& in, const Sizes& z, uint64_t gpu_need, uint64_t host_need) {
  if (gpu_need != UINT64_MAX && host_need == UINT64_MAX) {
    std::string because, hint = "raise --gpu-memory-limit, or lower the micro-batch / sequence length";
    if (z.K > 0) {
      // Is the ratio the cause? The same request with everything offloaded.
      PlanInputs all = in;
      all.optimizer_offload_ratio = 1.0;
      auto r = MakePlan(all);
      const bool fits = r.ok() || r.status().tier() != TierKind::kGpu;
      because = " with zero_optimization.offload_optimizer.ratio " + RatioText(in.optimizer_offload_ratio) + " (" +
                (z.K == z.n_shards ? "all " + std::to_string(z.n_shards)
                                   : "the first " + std::to_string(z.K) + " of " + std::to_string(z.n_shards)) +
                " shards' optimizer state, gradients and parameters, " + std::to_string(z.gpuN) +
                " parameters, on the GPU)";
      if (fits)
        hint = "raise zero_optimization.offload_optimizer.ratio or --gpu-memory-limit; at ratio 1 the plan fits";
    }
    return OutOfMemory(TierKind::kGpu, gpu_need, in.gpu_budget,
                       "no placement fits the GPU budget" + because + ": the smallest plan needs " +
                           FormatBytes(gpu_need) + " of GPU memory, " + FormatBytes(gpu_need - in.gpu_budget) +
                           " more than the budget of " + FormatBytes(in.gpu_budget) + " (" + hint + ")");
  }
  const uint64_t need = host_need == UINT64_MAX ? 0 : host_need;
  const std::string hint = in.have_nvme ? "raise --host-memory-limit"
                                        : "raise --host-memory-limit, or give an nvme_path in "
                                          "zero_optimization.offload_optimizer to put optimizer state on NVMe";
  return OutOfMemory(TierKind::kHost, need, in.host_budget,
                     "no placement fits the host budget: the smallest plan that fits the GPU needs " +
                         FormatBytes(need) + " of host memory, " +
                         FormatBytes(need > in.host_budget ? need - in.host_budget : 0) + " more than the budget of " +
                         FormatBytes(in.host_budget) + " (" + hint + ")");
}

}  // namespace

// Of the placements that fit both budgets, the one with the least expected
// transfer time (PCIe ~25x faster than a disk); ties go to less host memory.
Result<Plan> MakePlan(const PlanInputs& in) {
  RETURN_IF_ERROR(CheckInputs(in));
  const Sizes z = SizesFor(in);
  std::optional<Plan> best;
  double best_cost = 0;
  uint64_t gpu_need = UINT64_MAX, host_need = UINT64_MAX;
  for (TierKind pt : {kG, kH, kN})
    for (TierKind ot : {kG, kH, kN})
      for (TierKind gt : {kG, kH})
        for (TierKind ct : {kG, kH}) {
          const Placement c{pt, ot, gt, ct};
          if (!Allowed(in, z, c)) continue;
          const Plan p = Place(in, z, c);
          const bool gpu_ok = p.gpu_total <= in.gpu_budget, host_ok = p.host_total <= in.host_budget;
          if (!gpu_ok) gpu_need = std::min(gpu_need, p.gpu_total);
          if (gpu_ok && !host_ok) host_need = std::min(host_need, p.host_total);
          if (!gpu_ok || !host_ok) continue;
          const double cost =
              static_cast<double>(p.h2d + p.d2h) + 25.0 * static_cast<double>(p.nvme_read + p.nvme_write);
          if (!best || cost < best_cost || (cost == best_cost && p.host_total < best->host_total)) {
            best = p;
            best_cost = cost;
          }
        }
  if (!best) return NoPlanFits(in, z, gpu_need, host_need);
  AddSpeculativeSet(in, z, &*best);
  return *best;
}

std::string Plan::Table(uint64_t gpu_budget, uint64_t host_budget) const {
  std::ostringstream os;
  // The first column as wide as its longest name, so the byte columns line up.
  int name_width = 6;  // "budget"
  for (const auto& r : rows) name_width = std::max(name_width, static_cast<int>(r.kind.size()));
  auto put = [&](const std::string& name, const std::string& gpu, const std::string& host, const std::string& nvme) {
    char line[64];
    std::snprintf(line, sizeof line, " %12s %12s %12s\n", gpu.c_str(), host.c_str(), nvme.c_str());
    os << name << std::string(static_cast<size_t>(name_width) - name.size(), ' ') << line;
  };
  auto cell = [](uint64_t b) { return b ? FormatBytes(b) : std::string("-"); };
  put("state", "gpu", "host", "nvme");
  for (const auto& r : rows) put(r.kind, cell(r.gpu), cell(r.host), cell(r.nvme));
  put("total", cell(gpu_total), cell(host_total), cell(nvme_total));
  put("budget", FormatBytes(gpu_budget), FormatBytes(host_budget), "-");
  if (optimizer_offload_ratio < 1) {
    // offload_optimizer.ratio: which shards keep their optimizer state on the GPU.
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.1f%%",
                  total_params ? 100.0 * static_cast<double>(optimizer_gpu_params) / static_cast<double>(total_params) : 0.0);
    std::ostringstream r;
    r << optimizer_offload_ratio;
    if (optimizer_gpu_shards == 0) {
      os << "optimizer: offload_optimizer.ratio " << r.str()
         << " keeps no whole shard on the GPU (the embedding alone is more than " << 100 * (1 - optimizer_offload_ratio)
         << "% of the parameters): all on the " << (optimizer == TierKind::kNvme ? "nvme" : "host") << "\n";
    } else if (optimizer_gpu_shards == shards) {
      os << "optimizer: offload_optimizer.ratio " << r.str() << ": all " << shards << " shards ("
         << optimizer_gpu_params << " params) on the GPU, updated by the GPU Adam\n";
    } else {
      os << "optimizer: first " << optimizer_gpu_shards << " of " << shards << " shards (" << optimizer_gpu_params
         << " params, " << pct << ") on the GPU (offload_optimizer.ratio " << r.str()
         << ", GPU Adam), the rest on the " << (optimizer == TierKind::kNvme ? "nvme" : "host") << " (CPU Adam)\n";
    }
  }
  if (checkpoints == TierKind::kHost && checkpoint_gpu_layers > 0)
    os << "checkpoints: the last " << checkpoint_gpu_layers << " layers' on the GPU, the rest on the host\n";
  os << "prefetch depth: "
     << (gathers_params    ? std::string("- (ZeRO stage 3: parameters gathered at each use)")
         : params_resident ? std::string("- (parameters resident)")
                           : std::to_string(prefetch_depth))
     << ", schedule: " << (layer_major ? "layer-major" : "micro-batch-major") << "\n";
  os << "per step: H2D " << FormatBytes(h2d) << ", D2H "
     << FormatBytes(d2h) << ", NVMe read " << FormatBytes(nvme_read) << ", NVMe write " << FormatBytes(nvme_write)
     << "\n";
  return os.str();
}

}  // namespace strata
