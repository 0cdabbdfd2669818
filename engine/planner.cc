#include "engine/planner.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>

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

Result<Plan> MakePlan(const PlanInputs& in) {
  if (in.n_layer < 1 || in.layer_params == 0 || in.param_bytes == 0)
    return InvalidArgument("planner: the model has no layers or parameters");
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

  const uint64_t n = TotalParams(in);
  const uint64_t L = static_cast<uint64_t>(in.n_layer);
  const int64_t n_shards = in.n_layer + 2;
  // Partial offload: the longest forward-order prefix of whole shards whose
  // parameters are at most (1 - ratio) of all stays on the GPU.
  int64_t K = 0;
  if (ratio < 1) {
    const long double keep = (1.0L - static_cast<long double>(ratio)) * static_cast<long double>(n);
    while (K < n_shards && static_cast<long double>(PrefixParams(in, K + 1)) <= keep) ++K;
  }
  const uint64_t gpuN = PrefixParams(in, K);   // parameters whose optimizer state is on the GPU
  const uint64_t restN = n - gpuN;             // offloaded
  const uint64_t Kb = static_cast<uint64_t>(std::clamp<int64_t>(K - 1, 0, in.n_layer));  // blocks among them
  const bool emb_gpu = K >= 1, lnf_gpu = K == n_shards;
  const uint64_t A = static_cast<uint64_t>(std::max<int64_t>(1, in.grad_accum));
  const uint64_t param_all = n * in.param_bytes;
  // Gradients are stored in one dtype wherever they live (fp32 accumulation
  // happens in the working set's accumulator).
  const uint64_t gb = in.grad_host_bytes;
  const uint64_t grad_gpu_all = n * gb;
  // One layer's inputs: of all micro-batches (layer-major) or of the one in
  // flight (micro-batch-major); the residual-stream gradients likewise.
  const uint64_t ck_set = (in.layer_major ? A : 1) * in.checkpoint_bytes;
  // Micro-batch-major with accumulation keeps an fp32 accumulator per layer
  // across the micro-batches (fp32 gradients are their own accumulators).
  const uint64_t acc_pp = !in.layer_major && A > 1 && gb != 4 ? 4 : 0;  // bytes per parameter
  const uint64_t acc_all = n * acc_pp;
  const uint64_t ck_sets = L + 1;                   // x_0 .. x_L
  const uint64_t layer_p = in.layer_params * in.param_bytes;
  const uint64_t emb_p = (in.embedding_params + in.final_params) * in.param_bytes;
  // The GPU-state shards' blocks' parameters (resident whatever `params` says),
  // and the embedding's and ln_f's that a host optimizer uploads.
  const uint64_t gpu_blocks_p = Kb * layer_p;
  const uint64_t emb_rest_p =
      ((emb_gpu ? 0 : in.embedding_params) + (lnf_gpu ? 0 : in.final_params)) * in.param_bytes;
  const uint64_t max_block = std::max(in.layer_params, in.embedding_params + in.final_params);
  // The largest shard whose optimizer state is offloaded (what a host
  // optimizer's staging buffers are sized for), and how many there are.
  const uint64_t max_offloaded = std::max({K == 0 ? in.embedding_params : 0,
                                           Kb < L ? in.layer_params : 0, lnf_gpu ? 0 : in.final_params});
  const uint64_t n_offloaded = static_cast<uint64_t>(n_shards - K);
  const uint64_t align = std::max<uint64_t>(in.host_alignment, 1);
  const uint64_t opt_staging =
      3 * std::min<uint64_t>(max_block, std::max<uint64_t>(1, in.optimizer_chunk_params)) * 12;

  // What the GPU needs whatever the placement: one layer computing, its fp32
  // gradient accumulator, the residual gradients of A micro-batches, the head.
  const uint64_t base = in.layer_workspace + in.head_workspace + in.fixed_gpu + max_block * 4 + ck_set;

  const TierKind kG = TierKind::kGpu, kH = TierKind::kHost, kN = TierKind::kNvme;
  auto allowed = [&](const std::string& req, TierKind t) {
    if (req == "cpu") return t == kH;
    if (req == "nvme") return t == kN;
    return t != kN || in.have_nvme;
  };

  struct Candidate {
    Plan plan;
    double cost = 0;
  };
  std::optional<Candidate> best;
  uint64_t best_gpu_need = UINT64_MAX, best_host_need = UINT64_MAX;
  for (TierKind pt : {kG, kH, kN})
    for (TierKind ot : {kG, kH, kN})
      for (TierKind gt : {kG, kH})
        for (TierKind ct : {kG, kH}) {
          if (!allowed(in.offload_param, pt) || !allowed(in.offload_optimizer, ot)) continue;
          if (in.cpu_checkpointing && ct == kG) continue;
          // GPU Adam reads GPU gradients and writes GPU parameters.
          if (ot == kG && (pt != kG || gt != kG)) continue;
          // Every block's parameters on the GPU already (GPU-state shards): nothing streams.
          if (pt != kG && Kb == L) continue;
          Plan p;
          p.layer_major = in.layer_major;
          p.params = pt;
          p.grads = gt;
          p.optimizer = ot;
          p.checkpoints = ct;
          p.params_resident = pt == kG;
          p.grad_host_bytes = in.grad_host_bytes;
          p.optimizer_offload_ratio = ratio;
          p.shards = n_shards;
          p.optimizer_gpu_shards = K;
          p.optimizer_gpu_params = gpuN;
          p.total_params = n;
          if (restN == 0) p.optimizer = p.grads = kG;  // ratio 0: everything on the GPU
          uint64_t gpu = base, host = 0, nvme = 0;
          Plan::Row prow{"parameters"}, grow{"gradients"}, orow{"optimizer (fp32 master, m, v)"},
              crow{"activation checkpoints"}, wrow{"working set (scratch, grad accumulator, head)"};
          wrow.gpu = base;
          // GPU bytes of the GPU-state shards beyond what this placement keeps
          // there anyway (their optimizer state, their gradients when the
          // others' leave, their blocks' parameters when the others stream).
          const uint64_t split_gpu = gpuN * 12 + (gt == kH ? gpuN * (gb + acc_pp) : 0) + (pt != kG ? gpu_blocks_p : 0);
          int depth = 0;
          if (pt == kG) {
            prow.gpu = param_all;
          } else {
            // Embedding and ln_f stay on the GPU (used at both ends of the
            // step); blocks stream through prefetch buffers.
            const uint64_t fixed = gpu + emb_p + split_gpu;
            uint64_t left = in.gpu_budget > fixed ? in.gpu_budget - fixed : 0;
            int want = in.prefetch_depth > 0 ? in.prefetch_depth : 4;
            depth = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(want) + 1, left / layer_p));
            depth = std::max(depth - 1, 1);  // one buffer computes, `depth` prefetch
            prow.gpu = emb_p + static_cast<uint64_t>(depth + 1) * layer_p + gpu_blocks_p;
            (pt == kH ? prow.host : prow.nvme) = param_all - gpu_blocks_p;
            if (pt == kN) prow.host = static_cast<uint64_t>(depth + 1) * layer_p;  // staging
          }
          p.prefetch_depth = p.params_resident ? 0 : depth;
          if (gt == kG) {
            grow.gpu = grad_gpu_all + acc_all;
          } else {
            grow.gpu = gpuN * (gb + acc_pp);
            grow.host = restN * (gb + acc_pp);
          }
          grow.kind = gb == 4 ? "gradients (fp32)" : gt == kG ? "gradients (bf16)" : "gradients (bf16 on the host)";
          orow.gpu = gpuN * 12;
          (ot == kG ? orow.gpu : ot == kH ? orow.host : orow.nvme) += restN * 12;
          if (ot == kN && restN > 0) orow.host = opt_staging;
          for (const auto* r : {&prow, &grow, &orow}) gpu += r->gpu, host += r->host, nvme += r->nvme;
          // Checkpoints: all on the GPU, or as many of the last sets as fit.
          uint64_t gpu_sets = 0;
          if (ct == kG) {
            gpu_sets = ck_sets;
          } else if (!in.cpu_checkpointing && ck_set > 0) {
            uint64_t left = in.gpu_budget > gpu ? in.gpu_budget - gpu : 0;
            gpu_sets = std::min<uint64_t>(ck_sets - 1, left / ck_set);  // ct == kH: at least one on the host
          }
          crow.gpu = gpu_sets * ck_set;
          crow.host = (ck_sets - gpu_sets) * ck_set;
          gpu += crow.gpu;
          host += crow.host;
          // The host tier's own: staging, counts, NVMe staging, page rounding.
          Plan::Row srow{"host staging (optimizer, nvme) and page rounding"};
          uint64_t host_tensors = (pt == kH ? L - Kb : 0) + (ck_sets - gpu_sets) * (in.layer_major ? A : 1);
          if (ot != kG && restN > 0) {
            if (gt == kG) srow.host += AlignUp(max_offloaded * gb, align);
            const bool params_up = pt == kG || !emb_gpu || !lnf_gpu;  // offloaded shards with GPU-homed parameters
            if (params_up) srow.host += 2 * AlignUp(max_offloaded * in.param_bytes, align);
            srow.host += AlignUp(4 * static_cast<uint64_t>(n_shards), align);  // non-finite counts
            host_tensors += n_offloaded * ((gt == kH ? 1 + (acc_pp ? 1 : 0) : 0) + (ot == kH ? 3 : 0));
            if (ot == kN) host_tensors += 9;  // three shards' master/m/v in the host window
          }
          if (ot == kN || pt == kN) srow.host += in.nvme_staging_bytes;
          srow.host += host_tensors * align;
          host += srow.host;
          p.checkpoint_gpu_layers = static_cast<int64_t>(gpu_sets);
          const bool gpu_ok = gpu <= in.gpu_budget, host_ok = host <= in.host_budget;
          if (!gpu_ok) best_gpu_need = std::min(best_gpu_need, gpu);
          if (gpu_ok && !host_ok) best_host_need = std::min(best_host_need, host);
          if (!gpu_ok || !host_ok) continue;

          // Bytes over each link per step.
          const uint64_t passes = in.layer_major ? 1 : A;
          if (!p.params_resident) p.h2d += 2 * passes * (L - Kb) * layer_p;  // forward and backward
          if (ot != kG && restN > 0) {
            // The optimizer reads every offloaded shard's gradient once;
            // every updated parameter with a GPU home goes back once (all of
            // them when resident; the embedding's and ln_f's when the blocks
            // stream: streamed ones come back through the uploads above).
            // The GPU-state shards' stay on the GPU.
            p.d2h += restN * gb;
            p.h2d += p.params_resident ? restN * in.param_bytes : emb_rest_p;
          }
          // Host checkpoints go down in the forward and come back for the
          // backward, but for the head's input (x_L, the last set: on the host
          // only when none stays on the GPU), which the backward never reads.
          const uint64_t host_ck = crow.host;
          p.d2h += passes * host_ck;
          p.h2d += passes * (host_ck - (gpu_sets == 0 && ct == kH ? ck_set : 0));
          // Micro-batch-major: host accumulators go up and down between micro-batches.
          if (!in.layer_major && A > 1 && gt == kH) {
            const uint64_t acc = restN * (acc_pp ? acc_pp : gb);
            p.d2h += (A - 1) * acc;
            p.h2d += (A - 1) * acc;
          }
          if (ot == kN) p.nvme_read += restN * 12, p.nvme_write += restN * 12;
          if (pt == kN) p.nvme_read += 2 * passes * (L - Kb) * layer_p, p.nvme_write += param_all - gpu_blocks_p;
          p.rows = {prow, grow, orow, crow, wrow, srow};
          p.gpu_total = gpu;
          p.host_total = host;
          p.nvme_total = nvme;
          // Relative transfer time: PCIe ~25x faster than a disk.
          double cost = static_cast<double>(p.h2d + p.d2h) + 25.0 * static_cast<double>(p.nvme_read + p.nvme_write);
          if (!best || cost < best->cost || (cost == best->cost && host < best->plan.host_total))
            best = Candidate{p, cost};
        }
  if (best) {
    Plan& p = best->plan;
    // The speculative update's second master/m/v, beside the first.
    if (in.speculative_state && p.optimizer == kH && restN > 0) {
      // Three more host tensors per offloaded shard, each page-rounded.
      p.speculative_bytes = restN * 12;
      const uint64_t rounding = 3 * n_offloaded * align;
      p.speculative_fits = p.host_total + p.speculative_bytes + rounding <= in.host_budget;
      if (p.speculative_fits) {
        // Right after the optimizer's own row (rows: params, grads, optimizer, checkpoints, working set, staging).
        p.rows.insert(p.rows.begin() + 3, Plan::Row{kSpeculativeRow, 0, p.speculative_bytes, 0});
        p.rows.back().host += rounding;
        p.host_total += p.speculative_bytes + rounding;
      }
    }
    return p;
  }
  if (best_gpu_need != UINT64_MAX && best_host_need == UINT64_MAX) {
    std::string because, hint = "raise --gpu-memory-limit, or lower the micro-batch / sequence length";
    if (K > 0) {
      // Is the ratio the cause? The same request with everything offloaded.
      PlanInputs all = in;
      all.optimizer_offload_ratio = 1.0;
      auto r = MakePlan(all);
      const bool fits = r.ok() || r.status().tier() != TierKind::kGpu;
      because = " with zero_optimization.offload_optimizer.ratio " + RatioText(ratio) + " (" +
                (K == n_shards ? "all " + std::to_string(n_shards)
                               : "the first " + std::to_string(K) + " of " + std::to_string(n_shards)) +
                " shards' optimizer state, gradients and parameters, " + std::to_string(gpuN) +
                " parameters, on the GPU)";
      if (fits)
        hint = "raise zero_optimization.offload_optimizer.ratio or --gpu-memory-limit; at ratio 1 the plan fits";
    }
    return OutOfMemory(TierKind::kGpu, best_gpu_need, in.gpu_budget,
                       "no placement fits the GPU budget" + because + ": the smallest plan needs " +
                           FormatBytes(best_gpu_need) + " of GPU memory, " +
                           FormatBytes(best_gpu_need - in.gpu_budget) + " more than the budget of " +
                           FormatBytes(in.gpu_budget) + " (" + hint + ")");
  }
  uint64_t need = best_host_need == UINT64_MAX ? 0 : best_host_need;
  std::string hint = in.have_nvme ? "raise --host-memory-limit"
                                  : "raise --host-memory-limit, or give an nvme_path in "
                                    "zero_optimization.offload_optimizer to put optimizer state on NVMe";
  return OutOfMemory(TierKind::kHost, need, in.host_budget,
                     "no placement fits the host budget: the smallest plan that fits the GPU needs " +
                         FormatBytes(need) + " of host memory, " +
                         FormatBytes(need > in.host_budget ? need - in.host_budget : 0) +
                         " more than the budget of " + FormatBytes(in.host_budget) + " (" + hint + ")");
}

std::string Plan::Table(uint64_t gpu_budget, uint64_t host_budget) const {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-46s %12s %12s %12s\n", "state", "gpu", "host", "nvme");
  os << line;
  auto cell = [](uint64_t b) { return b ? FormatBytes(b) : std::string("-"); };
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "%-46s %12s %12s %12s\n", r.kind.c_str(), cell(r.gpu).c_str(),
                  cell(r.host).c_str(), cell(r.nvme).c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "%-46s %12s %12s %12s\n", "total", cell(gpu_total).c_str(),
                cell(host_total).c_str(), cell(nvme_total).c_str());
  os << line;
  std::snprintf(line, sizeof line, "%-46s %12s %12s %12s\n", "budget", FormatBytes(gpu_budget).c_str(),
                FormatBytes(host_budget).c_str(), "-");
  os << line;
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
  os << "prefetch depth: " << (params_resident ? std::string("- (parameters resident)") : std::to_string(prefetch_depth))
     << ", schedule: " << (layer_major ? "layer-major" : "micro-batch-major") << "\n";
  os << "per step: H2D " << FormatBytes(h2d) << ", D2H "
     << FormatBytes(d2h) << ", NVMe read " << FormatBytes(nvme_read) << ", NVMe write " << FormatBytes(nvme_write)
     << "\n";
  return os.str();
}

}  // namespace strata
