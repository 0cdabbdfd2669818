// SPDX-License-Identifier: Apache-2.0
#include "bench/offload_bound.h"

#include <algorithm>

#include "base/bytes.h"
#include "engine/budgets.h"
#include "engine/config.h"
#include "engine/model_config.h"
#include "optim/cpu_adam.h"

namespace strata::bench {

const std::vector<ModelShape>& KnownModelShapes() {
  static const std::vector<ModelShape> shapes = {
      {"gpt-1.3b", 24, 2048, 16}, {"gpt-2.7b", 32, 2560, 32}, {"gpt-6.7b", 32, 4096, 32},
      {"gpt-13b", 40, 5120, 40},  {"gpt-30b", 48, 7168, 56},  {"gpt-66b", 64, 9216, 72},
      {"gpt-175b", 96, 12288, 96},
  };
  return shapes;
}

std::string PlacementText(const Plan& p) {
  auto t = [](TierKind k) { return std::string(TierName(k)); };
  std::string s = "params " + t(p.params) + ", grads " + t(p.grads) + ", optimizer " + t(p.optimizer) +
                  ", checkpoints " + t(p.checkpoints);
  if (p.checkpoints == TierKind::kHost && p.checkpoint_gpu_layers > 0)
    s += " (last " + std::to_string(p.checkpoint_gpu_layers) + " on the gpu)";
  return s;
}

namespace {

double Seconds(uint64_t bytes, double gbs) { return bytes == 0 ? 0 : gbs > 0 ? bytes / (gbs * 1e9) : 1e30; }

}  // namespace

uint64_t HostMemoryBytes(uint64_t offloaded, DType moments, uint64_t h2d, uint64_t d2h, uint64_t nvme_read,
                         uint64_t nvme_write) {
  return offloaded * optim::AdamBytesPerParam(DType::kBF16, moments, true, DType::kBF16) + h2d + d2h + nvme_read +
         nvme_write;
}

double NvmeStepBound::overlapped_s() const { return std::max({read_s, write_s, mixed_s}); }
double NvmeStepBound::sum_s() const { return read_s + write_s; }

NvmeStepBound NvmeBoundOf(uint64_t read_bytes, uint64_t write_bytes, double read_gbs, double write_gbs,
                          double mixed_gbs) {
  NvmeStepBound b;
  b.read_s = Seconds(read_bytes, read_gbs);
  b.write_s = Seconds(write_bytes, write_gbs);
  b.mixed_s = mixed_gbs > 0 ? Seconds(read_bytes + write_bytes, mixed_gbs) : 0;
  return b;
}

namespace {

// The GPT model of shape `m` as the config's model section.
ModelConfig GptModelConfig(const ModelShape& m) {
  ModelConfig mc;
  mc.n_layer = m.layers;
  mc.n_embd = m.d;
  mc.n_head = m.heads;
  mc.vocab_size = m.vocab;
  mc.seq_len = m.seq;
  return mc;
}

BoundRow Analyze(const OffloadRates& r, const ModelShape& m, const kernels::Backend& be, int64_t accum) {
  BoundRow row;
  row.model = m;
  row.grad_accum = accum;
  Config model_only = DefaultConfig();
  model_only.model = GptModelConfig(m);
  Result<models::ModelSpec> spec = ModelSpecFor(model_only);
  if (!spec.ok()) {
    row.why_not = spec.status().ToString();
    return row;
  }
  row.params = static_cast<uint64_t>(spec->NumParameters());
  Status last;
  for (int64_t B : {8, 4, 2, 1}) {
    Config c = DefaultConfig();
    c.model = GptModelConfig(m);
    c.micro_batch = B;
    c.grad_accum = accum;
    c.train_batch_size = B * accum;
    c.bf16 = true;
    c.fp16.enabled = false;
    c.zero.offload_optimizer.device = c.zero.offload_param.device = "none";  // the planner decides
    if (r.nvme_free > 0) c.zero.offload_optimizer.nvme_path = "(the NVMe path)";
    // The planner's inputs as strata train makes them (engine/budgets.h),
    // without the speculative update's second set (a speed-up, not a need).
    Result<PlanInputs> in = PlanInputsFor(c, be, *spec, Budgets{r.gpu_budget, r.host_budget, 0}, false);
    Result<Plan> p = in.ok() ? MakePlan(*in) : Result<Plan>(in.status());
    if (!p.ok()) {
      last = p.status();
      continue;
    }
    if (p->nvme_total > r.nvme_free) {
      last = OutOfMemory(TierKind::kNvme, p->nvme_total, r.nvme_free,
                         "the plan puts " + FormatBytes(p->nvme_total) + " on NVMe, " +
                             FormatBytes(r.nvme_free) + " free there");
      break;  // a smaller micro-batch moves no state off the NVMe
    }
    row.fits = true;
    row.micro_batch = B;
    row.plan = *p;
    break;
  }
  if (!row.fits) {
    row.why_not = std::string(last.message());
    return row;
  }
  const Plan& p = row.plan;
  row.tokens_per_step = row.micro_batch * accum * m.seq;
  row.compute_s = ModelFlopsPerToken(*spec, m.seq) * static_cast<double>(row.tokens_per_step) /
                  std::max(r.compute_flops, 1.0);
  row.pcie_s = std::max({Seconds(p.h2d, r.h2d_gbs), Seconds(p.d2h, r.d2h_gbs), Seconds(p.h2d + p.d2h, r.both_gbs)});
  row.nvme_s = NvmeBoundOf(p.nvme_read, p.nvme_write, r.nvme_read_gbs, r.nvme_write_gbs, r.nvme_mixed_gbs)
                   .overlapped_s();
  const uint64_t offloaded = p.offloaded_optimizer_params();
  row.adam_s = offloaded == 0 ? 0 : r.adam_params_per_s > 0 ? offloaded / r.adam_params_per_s : 1e30;
  const uint64_t host_bytes = HostMemoryBytes(offloaded, DType::kF32, p.h2d, p.d2h, p.nvme_read, p.nvme_write);
  row.host_s = r.host_roof_gbs > 0 ? Seconds(host_bytes, r.host_roof_gbs) : 0;
  const std::pair<double, const char*> parts[] = {{row.compute_s, "compute"}, {row.pcie_s, "PCIe"},
                                                  {row.nvme_s, "NVMe"},       {row.adam_s, "CPU Adam"},
                                                  {row.host_s, "host memory"}};
  const auto* worst = std::max_element(std::begin(parts), std::end(parts),
                                       [](const auto& a, const auto& b) { return a.first < b.first; });
  row.bound = worst->second;
  row.step_s = worst->first;
  row.tokens_per_s = row.step_s > 0 ? row.tokens_per_step / row.step_s : 0;
  return row;
}

}  // namespace

std::vector<BoundRow> AnalyzeBounds(const OffloadRates& rates, const std::vector<ModelShape>& models,
                                    const kernels::Backend& backend, int64_t grad_accum) {
  std::vector<BoundRow> rows;
  for (const ModelShape& m : models) rows.push_back(Analyze(rates, m, backend, grad_accum));
  return rows;
}

}  // namespace strata::bench
