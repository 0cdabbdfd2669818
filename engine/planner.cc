#include "engine/planner.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "tiers/bytes.h"

namespace strata {

namespace {

uint64_t TotalParams(const PlanInputs& in) {
  return static_cast<uint64_t>(in.n_layer) * in.layer_params + in.embedding_params + in.final_params;
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

  const uint64_t n = TotalParams(in);
  const uint64_t L = static_cast<uint64_t>(in.n_layer);
  const uint64_t A = static_cast<uint64_t>(std::max<int64_t>(1, in.grad_accum));
  const uint64_t param_all = n * in.param_bytes;
  const uint64_t grad_all = n * 4;
  const uint64_t opt_all = n * 12;
  const uint64_t ck_all = L * A * in.checkpoint_bytes;
  const uint64_t layer_p = in.layer_params * in.param_bytes;
  const uint64_t emb_p = (in.embedding_params + in.final_params) * in.param_bytes;
  const uint64_t max_block = std::max(in.layer_params, in.embedding_params + in.final_params);
  const uint64_t opt_staging = 3 * std::min<uint64_t>(max_block, std::max<uint64_t>(1, in.optimizer_chunk_params)) * 12;

  // What the GPU needs whatever the placement: one layer computing, its fp32
  // gradient accumulator, the residual gradients of A micro-batches (one
  // checkpoint each), the head.
  const uint64_t base = in.layer_workspace + in.head_workspace + in.fixed_gpu + max_block * 4 +
                        A * in.checkpoint_bytes;

  Plan p;
  p.layer_major = in.layer_major;
  // Try placements from most to least resident; the first that fits wins.
  struct Choice {
    TierKind params, grads, opt, ck;
  };
  std::vector<Choice> choices;
  auto allowed_p = [&](TierKind t) {
    if (in.offload_param == "cpu") return t == TierKind::kHost;
    if (in.offload_param == "nvme") return t == TierKind::kNvme;
    return t != TierKind::kNvme || in.have_nvme;
  };
  auto allowed_o = [&](TierKind t) {
    if (in.offload_optimizer == "cpu") return t == TierKind::kHost;
    if (in.offload_optimizer == "nvme") return t == TierKind::kNvme;
    return t != TierKind::kNvme || in.have_nvme;
  };
  const TierKind kG = TierKind::kGpu, kH = TierKind::kHost, kN = TierKind::kNvme;
  for (TierKind pt : {kG, kH, kN})
    for (TierKind ot : {kG, kH, kN})
      for (TierKind gt : {kG, kH})
        for (TierKind ct : {kG, kH}) {
          if (!allowed_p(pt) || !allowed_o(ot)) continue;
          if (in.cpu_checkpointing && ct == kG) continue;
          // Demotion order: optimizer before checkpoints before grads before params.
          auto rank = [](TierKind t) { return static_cast<int>(t); };
          if (rank(ot) < rank(ct) || rank(ct) < rank(gt) || rank(gt) < rank(std::min(pt, kH))) continue;
          if (ot == kG && pt != kG) continue;  // GPU Adam needs resident params
          choices.push_back({pt, gt, ot, ct});
        }
  std::sort(choices.begin(), choices.end(), [](const Choice& a, const Choice& b) {
    auto score = [](const Choice& c) {
      // Less traffic first: params streaming costs most per step, then grads,
      // then checkpoints, then optimizer state.
      return static_cast<int>(c.params) * 1000 + static_cast<int>(c.grads) * 100 +
             static_cast<int>(c.ck) * 10 + static_cast<int>(c.opt);
    };
    return score(a) < score(b);
  });

  std::string gpu_short, host_short;
  uint64_t best_gpu_need = UINT64_MAX, best_host_need = UINT64_MAX;
  for (const Choice& c : choices) {
    uint64_t gpu = base, host = 0, nvme = 0;
    int depth = 0;
    if (c.params == kG) {
      gpu += param_all;
    } else {
      // Embedding and ln_f stay on the GPU (used at both ends of the step);
      // blocks stream through prefetch buffers.
      gpu += emb_p;
      uint64_t left = in.gpu_budget > gpu ? in.gpu_budget - gpu : 0;
      int want = in.prefetch_depth > 0 ? in.prefetch_depth : 4;
      depth = static_cast<int>(std::min<uint64_t>(want, left / std::max<uint64_t>(1, layer_p)));
      depth = std::max(depth - 1, 1);  // one buffer computes, `depth` prefetch
      gpu += static_cast<uint64_t>(depth + 1) * layer_p;
      (c.params == kH ? host : nvme) += param_all;
      if (c.params == kN) host += static_cast<uint64_t>(depth + 1) * layer_p;  // staging
    }
    (c.grads == kG ? gpu : host) += grad_all;
    // Gradients kept on the GPU for a host/NVMe optimizer stream down one
    // layer at a time through two staging buffers.
    const uint64_t grad_staging = (c.grads == kG && c.opt != kG) ? 2 * max_block * 4 : 0;
    host += grad_staging;
    (c.opt == kG ? gpu : c.opt == kH ? host : nvme) += opt_all;
    if (c.opt == kN) host += opt_staging;  // read-ahead, updating, write-behind chunks
    (c.ck == kG ? gpu : host) += ck_all;
    bool gpu_ok = gpu <= in.gpu_budget;
    bool host_ok = host <= in.host_budget;
    if (!gpu_ok) best_gpu_need = std::min(best_gpu_need, gpu);
    if (gpu_ok && !host_ok) best_host_need = std::min(best_host_need, host);
    if (!gpu_ok || !host_ok) continue;

    p.params = c.params;
    p.grads = c.grads;
    p.optimizer = c.opt;
    p.checkpoints = c.ck;
    p.params_resident = c.params == kG;
    p.prefetch_depth = p.params_resident ? 0 : depth;
    auto row = [&](std::string kind, TierKind t, uint64_t bytes) {
      Plan::Row r{std::move(kind)};
      (t == kG ? r.gpu : t == kH ? r.host : r.nvme) = bytes;
      p.rows.push_back(r);
    };
    if (p.params_resident) {
      row("parameters", kG, param_all);
    } else {
      Plan::Row r{"parameters"};
      r.gpu = emb_p + static_cast<uint64_t>(depth + 1) * layer_p;
      (c.params == kH ? r.host : r.nvme) = param_all;
      if (c.params == kN) r.host = static_cast<uint64_t>(depth + 1) * layer_p;
      p.rows.push_back(r);
    }
    {
      Plan::Row r{"gradients (fp32)"};
      (c.grads == kG ? r.gpu : r.host) = grad_all;
      if (c.grads == kG) r.host = grad_staging;
      p.rows.push_back(r);
    }
    {
      Plan::Row r{"optimizer (fp32 master, m, v)"};
      (c.opt == kG ? r.gpu : c.opt == kH ? r.host : r.nvme) = opt_all;
      if (c.opt == kN) r.host = opt_staging;
      p.rows.push_back(r);
    }
    row("activation checkpoints", c.ck, ck_all);
    Plan::Row w{"working set (scratch, grad accumulator, head)"};
    w.gpu = base;
    p.rows.push_back(w);
    p.gpu_total = gpu;
    p.host_total = host;
    p.nvme_total = nvme;

    // Bytes over each link per step.
    const uint64_t passes = in.layer_major ? 1 : A;  // param uploads per direction of the step
    if (!p.params_resident) p.h2d += 2 * passes * L * layer_p;  // forward and backward
    // A host/NVMe optimizer reads every gradient once per step and, with
    // resident parameters, sends every updated parameter back once (streamed
    // parameters come back through the forward pass's uploads above).
    if (c.opt != kG) {
      p.d2h += grad_all;
      if (p.params_resident) p.h2d += param_all;
    }
    if (c.ck == kH) {
      p.d2h += ck_all;
      p.h2d += ck_all;
    }
    if (c.opt == kN) {
      p.nvme_read += opt_all;
      p.nvme_write += opt_all;
    }
    if (c.params == kN) {
      p.nvme_read += 2 * passes * L * layer_p;
      p.nvme_write += param_all;
    }
    return p;
  }
  if (best_gpu_need != UINT64_MAX && best_host_need == UINT64_MAX) {
    return OutOfMemory(TierKind::kGpu, best_gpu_need, in.gpu_budget,
                       "no placement fits the GPU budget: the smallest plan needs " + FormatBytes(best_gpu_need) +
                           " of GPU memory, " + FormatBytes(best_gpu_need - in.gpu_budget) +
                           " more than the budget of " + FormatBytes(in.gpu_budget) +
                           " (raise --gpu-memory-limit, or lower the micro-batch / sequence length)");
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
  os << "prefetch depth: " << (params_resident ? std::string("- (parameters resident)") : std::to_string(prefetch_depth))
     << ", schedule: " << (layer_major ? "layer-major" : "micro-batch-major") << "\n";
  os << "per step: H2D " << FormatBytes(h2d) << ", D2H " << FormatBytes(d2h) << ", NVMe read "
     << FormatBytes(nvme_read) << ", NVMe write " << FormatBytes(nvme_write) << "\n";
  return os.str();
}

}  // namespace strata
