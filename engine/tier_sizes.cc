// SPDX-License-Identifier: Apache-2.0
#include "engine/tier_sizes.h"

#include <algorithm>

#include "base/bytes.h"
#include "engine/model_config.h"

namespace strata {

namespace {

bool Streams(const Plan::Row& r) {
  for (const char* k : {"parameters", "gradients", "activation checkpoints"})
    if (r.kind.rfind(k, 0) == 0) return true;
  return false;
}

// The GPU-assisted optimizer's three chunk buffers, when it may run
// (engine/shard_update.h AssistShardUpdate).
uint64_t AssistBytes(const TrainOptions& o, const Plan& plan, const models::ModelSpec& spec, bool cuda) {
  const std::string& mode = o.config.trainer.gpu_assisted_optimizer;
  if (mode == "off" || (mode == "auto" && !cuda) || plan.optimizer == TierKind::kGpu) return 0;
  int64_t largest = 0;
  for (const auto& u : spec.units) largest = std::max(largest, u.numel);
  uint64_t chunk = std::min<uint64_t>(4ull << 20, static_cast<uint64_t>(largest));
  if (o.assist_chunk_params) chunk = std::min(chunk, o.assist_chunk_params);
  // Three chunk buffers, and the room it keeps free beside them (one activation).
  const uint64_t act = static_cast<uint64_t>(o.config.micro_batch * o.config.model.seq_len * spec.d_model) *
                       DTypeSize(ComputeDType(o.config));
  const uint64_t per = 4 + 2 * DTypeSize(MomentDType(o.config)) + DTypeSize(GradDType(ComputeDType(o.config)));
  return 3 * (chunk * per + 4096) + act;
}

}  // namespace

std::string NvmeDirOf(const Config& cfg) {
  return !cfg.zero.offload_optimizer.nvme_path.empty() ? cfg.zero.offload_optimizer.nvme_path
                                                       : cfg.zero.offload_param.nvme_path;
}

TierSizes TierSizesFor(const TrainOptions& o, const RunPlan& run, const models::ModelSpec& spec, bool cuda) {
  const Plan& p = run.plan;
  const PlanInputs& in = run.inputs;
  TierSizes t;
  // GPU: the plan, the most the swap window can use, the assist's chunks, a margin.
  uint64_t streamed = 0;
  for (const Plan::Row& r : p.rows)
    if (Streams(r)) streamed += r.host + r.nvme;
  const uint64_t largest_streamed =
      std::max({in.layer_params * in.param_bytes, in.embedding_params * in.param_bytes, in.checkpoint_bytes});
  const uint64_t window = streamed ? streamed + largest_streamed : 0;
  const uint64_t assist = AssistBytes(o, p, spec, cuda);
  t.gpu = std::min(run.budgets.gpu, p.gpu_total + window + assist + kTierMargin);

  // Host: the plan and a margin; slabs io_uring can register when NVMe is in the plan.
  const bool nvme = p.optimizer == TierKind::kNvme || p.params == TierKind::kNvme;
  const bool pin = o.config.zero.offload_optimizer.pin_memory && o.config.zero.offload_param.pin_memory;
  uint64_t host_margin = kTierMargin;
  if (p.host_total == 0) {
    t.host_pin = false;
  } else {
    t.host_pin = pin;
    host_margin += p.host_total / 16;
    if (nvme) {
      t.host_slab = 1ull << 30;
      int64_t unit = 0;
      for (const auto& u : spec.units) unit = std::max(unit, u.numel);
      const uint64_t largest = std::min<uint64_t>(std::max<uint64_t>(static_cast<uint64_t>(unit) * 4, in.checkpoint_bytes),
                                                  t.host_slab);
      host_margin += (p.host_total / t.host_slab + 1) * largest;
    }
  }
  const uint64_t host_budget = run.budgets.host / 4096 * 4096;  // what the host tier would take of it
  t.host = std::min(host_budget, AlignUp(p.host_total + host_margin, 4096));
  // NVMe: the budget's room beyond the plan is where the write-behind trails
  // into the next step's forward (when the disk has no reads to serve)
  // instead of taking turns with the backward's read-ahead.
  const bool io_room = nvme && t.host < host_budget;
  if (io_room) t.host = host_budget;

  t.what = "tiers: gpu " + FormatBytes(t.gpu) + " (the plan's " + FormatBytes(p.gpu_total);
  if (window) t.what += " + a swap window of up to " + FormatBytes(window);
  if (assist) t.what += " + " + FormatBytes(assist) + " for the GPU-assisted optimizer";
  t.what += " + a " + FormatBytes(kTierMargin) + " margin" +
            (t.gpu == run.budgets.gpu ? ", capped at the budget" : "") + "); host " + FormatBytes(t.host) +
            " (the plan's " + FormatBytes(p.host_total) + " + a " + FormatBytes(host_margin) + " margin" +
            (io_room ? ", and the rest of the budget as room for the NVMe write-behind"
                     : t.host == host_budget ? ", capped at the budget" : "") + ", " +
            (t.host_pin ? "pinned" : p.host_total == 0 ? "unpinned: nothing planned there" : "unpinned: pin_memory false") +
            ")\n";
  return t;
}

}  // namespace strata
