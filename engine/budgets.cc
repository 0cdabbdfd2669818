// SPDX-License-Identifier: Apache-2.0
#include "engine/budgets.h"

#include <algorithm>

#include "base/bytes.h"
#include "base/device.h"
#include "base/host_memory.h"
#include "engine/model_config.h"
#include "engine/data_parallel.h"
#include "engine/param_gather.h"
#include "models/model_program.h"
#include "tiers/tier_store.h"

namespace strata {

namespace {

// What the plan needs to know of the model, the batch and the budgets.
PlanInputs MakePlanInputs(const Config& cfg, const models::ModelSpec& m, DType dtype, size_t block_scratch,
                          size_t head_scratch, const Budgets& b, bool speculative_state) {
  PlanInputs in;
  const int64_t B = cfg.micro_batch, T = cfg.model.seq_len, C = m.d_model;
  in.n_layer = m.n_layer;
  in.layer_params = static_cast<uint64_t>(m.units[1].numel);
  in.embedding_params = static_cast<uint64_t>(m.units.front().numel);
  in.final_params = static_cast<uint64_t>(m.units.back().numel);
  in.param_bytes = DTypeSize(dtype);
  in.checkpoint_bytes = static_cast<uint64_t>(B * T * C) * DTypeSize(dtype);
  in.grad_host_bytes = DTypeSize(GradDType(dtype));
  in.moment_bytes = DTypeSize(MomentDType(cfg));
  in.grad_accum = cfg.grad_accum;
  in.layer_major = cfg.trainer.schedule != "micro-batch-major";
  in.layer_workspace = block_scratch;
  // The head's scratch, the embedding/final gradients held through backward,
  // one spare activation (evaluation), tokens/targets/losses.
  in.head_workspace = head_scratch + (in.embedding_params + in.final_params) * 4 + in.checkpoint_bytes;
  in.fixed_gpu = static_cast<uint64_t>(cfg.grad_accum * B * T) * 12 + (1 << 20);
  in.gpu_budget = b.gpu;
  in.host_budget = b.host;
  const auto& zo = cfg.zero;
  in.have_nvme = !zo.offload_optimizer.nvme_path.empty() || !zo.offload_param.nvme_path.empty();
  in.offload_param = zo.offload_param.device;
  in.offload_optimizer = zo.offload_optimizer.device;
  in.cpu_checkpointing = cfg.activation_checkpointing.cpu_checkpointing;
  in.optimizer_offload_ratio = zo.offload_optimizer.ratio;
  in.speculative_state = speculative_state;
  in.zero_partitions = cfg.world_size > 1 && zo.stage >= 1 ? cfg.world_size : 1;  // (the plan is per rank)
  const TierStoreOptions store;
  in.nvme_staging_bytes = static_cast<uint64_t>(store.staging_buffers) * store.staging_chunk_bytes;
  return in;
}

Result<uint64_t> DefaultHostBudget() {
  ASSIGN_OR_RETURN(HostMemoryInfo m, QueryHostMemory());
  return m.available_bytes / 10 * 8;
}

}  // namespace

Result<Budgets> MeasureBudgets(const TrainOptions& o, const kernels::Backend& backend) {
  Budgets b;
  if (o.host_memory_limit) {
    b.host = o.host_memory_limit;
  } else {
    ASSIGN_OR_RETURN(b.host, DefaultHostBudget());
    b.host /= static_cast<uint64_t>(std::max(o.local_ranks, 1));  // each rank on this machine its share
  }
  if (backend.kind() != kernels::BackendKind::kCuda) {
    b.gpu = o.gpu_memory_limit ? o.gpu_memory_limit : 4 * kGiB;  // the stand-in: host memory
    return b;
  }
  ASSIGN_OR_RETURN(GpuInfo info, QueryGpu(0));
  const uint64_t in_use = info.total_bytes - info.free_bytes;
  // cuBLASLt heuristics and lazily made library state, plus what the driver
  // takes on the device for mapping pinned host memory, which grows with the
  // host tier: the 6.7B run (99.6 GiB pinned) ended 0.1 GiB over its 24 GiB
  // limit with a flat 128 MiB margin. 4 MiB per GiB of host budget.
  const uint64_t margin = 128 * kMiB + b.host / 256;
  b.gpu_overhead = in_use + margin;
  if (o.gpu_memory_limit) {
    if (o.gpu_memory_limit <= b.gpu_overhead)
      return OutOfMemory(TierKind::kGpu, b.gpu_overhead, o.gpu_memory_limit,
                         "--gpu-memory-limit is smaller than what is already in use on the device (" + FormatBytes(in_use) +
                             " by this process's CUDA context and libraries and by any other process on the GPU, "
                             "plus a " + FormatBytes(margin) + " margin)");
    b.gpu = o.gpu_memory_limit - b.gpu_overhead;
  } else {
    b.gpu = info.free_bytes > 512 * kMiB ? info.free_bytes - 512 * kMiB : info.free_bytes / 2;
  }
  return b;
}

Result<PlanInputs> PlanInputsFor(const Config& cfg, const kernels::Backend& backend, const models::ModelSpec& spec,
                                 const Budgets& budgets, bool speculative_state) {
  const DType dtype = ComputeDType(cfg);
  ASSIGN_OR_RETURN(size_t block,
                   models::ModelProgram::BlockScratchBytes(backend, spec, cfg.micro_batch, cfg.model.seq_len, dtype));
  const size_t head = models::ModelProgram::HeadScratchBytes(spec, cfg.micro_batch, cfg.model.seq_len, dtype);
  return MakePlanInputs(cfg, spec, dtype, block, head, budgets, speculative_state);
}

uint64_t RanksDeviceBytes(const TrainOptions& o, const kernels::Backend& backend, const models::ModelSpec& spec) {
  if (backend.kind() != kernels::BackendKind::kCuda || !TakesRanksPath(o)) return 0;
  uint64_t bytes = DataParallel::RoundsFor(o.config, spec.largest_unit()).stage_bytes;
  if (PartitionsRanksState(o) && o.config.zero.stage >= 3)
    bytes += ParamGather::DeviceBytes(spec, ComputeDType(o.config), o.config.world_size,
                                      o.config.zero.prefetch_bucket_size);
  return bytes;
}

Result<RunPlan> PlanRun(const TrainOptions& o, const kernels::Backend& backend, const models::ModelSpec& spec) {
  const Config& cfg = o.config;
  RunPlan r;
  ASSIGN_OR_RETURN(r.budgets, MeasureBudgets(o, backend));
  if (const uint64_t ranks = RanksDeviceBytes(o, backend, spec)) {
    if (ranks >= r.budgets.gpu)
      return OutOfMemory(TierKind::kGpu, r.budgets.gpu_overhead + ranks, r.budgets.gpu_overhead + r.budgets.gpu,
                         "the ranks' collectives need " + FormatBytes(ranks) +
                             " of device memory beside the tiers (staging, and at ZeRO stage 3 the gathered "
                             "parameters), more than the GPU budget leaves");
    r.budgets.gpu -= ranks;
    r.budgets.gpu_overhead += ranks;
    r.budgets.ranks_device = ranks;
  }
  ASSIGN_OR_RETURN(r.inputs, PlanInputsFor(cfg, backend, spec, r.budgets, WantsSpeculativeState(cfg, o)));
  r.inputs.partitioned = PartitionsRanksState(o);
  r.inputs.gathers_params = r.inputs.partitioned && cfg.zero.stage >= 3;
  r.inputs.partitions_grads = r.inputs.partitioned && cfg.zero.stage >= 2;
  r.inputs.second_block_accumulator = ReducesBesideBackward(o);
  ASSIGN_OR_RETURN(r.plan, MakePlan(r.inputs));
  r.mode = UpdateModeFor(cfg, r.plan, spec.num_units(), o, r.budgets.host);
  return r;
}

std::string ZeroStageNote(const Config& cfg) {
  const int stage = cfg.zero.stage;
  static const char* const kMeans[] = {
      "no partitioning",
      "the optimizer state partitioned",
      "the optimizer state and gradients partitioned",
      "the optimizer state, gradients and parameters partitioned",
  };
  const std::string means = stage >= 0 && stage <= 3 ? kMeans[stage] : "?";
  return "zero_optimization.stage " + std::to_string(stage) + " (" + means + ") on " +
         std::to_string(cfg.world_size) + " rank" + (cfg.world_size == 1 ? "" : "s") +
         (cfg.world_size == 1
              ? ": with one rank there is nothing to partition across, so every stage places alike: the planner puts "
                "parameters, gradients, optimizer state and checkpoints where the GPU and host budgets allow "
                "(offload_* devices where given)"
              : "");
}

}  // namespace strata
