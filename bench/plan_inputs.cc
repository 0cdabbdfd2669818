#include "bench/plan_inputs.h"

#include <algorithm>

namespace strata::bench {

PlanInputs BenchPlanInputs(const Config& cfg, const kernels::GptConfig& g, DType dtype, size_t block_scratch,
                           size_t head_scratch, uint64_t gpu_budget, uint64_t host_budget) {
  PlanInputs in;
  const int64_t B = cfg.micro_batch, T = cfg.model.seq_len, C = g.n_embd;
  in.n_layer = g.n_layer;
  in.layer_params = static_cast<uint64_t>(kernels::BlockLayout::For(C).numel);
  in.embedding_params = static_cast<uint64_t>(kernels::EmbeddingLayout::For(g.Vp(), g.seq_len, C).numel);
  in.final_params = static_cast<uint64_t>(kernels::LnFLayout::For(C).numel);
  in.param_bytes = DTypeSize(dtype);
  in.checkpoint_bytes = static_cast<uint64_t>(B * T * C) * DTypeSize(dtype);
  in.grad_host_bytes = dtype == DType::kBF16 ? 2 : 4;
  in.grad_accum = cfg.grad_accum;
  in.layer_major = cfg.trainer.schedule != "micro-batch-major";
  in.layer_workspace = block_scratch;
  // The head's scratch, the embedding/ln_f gradients held through backward,
  // one spare activation (evaluation), tokens/targets/losses.
  in.head_workspace = head_scratch + (in.embedding_params + in.final_params) * 4 + in.checkpoint_bytes;
  in.fixed_gpu = static_cast<uint64_t>(cfg.grad_accum * B * T) * 12 + (1 << 20);
  in.gpu_budget = gpu_budget;
  in.host_budget = host_budget;
  const auto& zo = cfg.zero;
  in.have_nvme = !zo.offload_optimizer.nvme_path.empty() || !zo.offload_param.nvme_path.empty();
  in.offload_param = zo.offload_param.device;
  in.offload_optimizer = zo.offload_optimizer.device;
  in.cpu_checkpointing = cfg.activation_checkpointing.cpu_checkpointing;
  in.optimizer_chunk_params = std::max<uint64_t>(in.layer_params, 1);
  in.optimizer_offload_ratio = zo.offload_optimizer.ratio;
  in.speculative_state = false;
  return in;
}

double ModelFlopsPerToken(const kernels::GptConfig& g, int64_t seq) {
  return 6.0 * static_cast<double>(g.NumParameters()) +
         12.0 * static_cast<double>(g.n_layer) * static_cast<double>(g.n_embd) * static_cast<double>(seq);
}

}  // namespace strata::bench
