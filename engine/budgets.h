// SPDX-License-Identifier: Apache-2.0
// The budgets a run plans within, and the plan: one function that both
// `strata train --dry-run` and a real run call, so the printed plan is the
// plan that runs.
//
// The GPU limit covers the whole process: what the CUDA context, cuBLASLt
// and the backend hold when the run plans (measured after the backend has
// run its GEMM baseline, which is when the run plans too) comes off the GPU
// tier's budget, with a margin for what the driver takes later for mapping
// pinned host memory (it grows with the host tier: 4 MiB per GiB of host
// budget, plus 128 MiB). Without a limit the GPU tier gets the card's free
// memory less 512 MiB. The CPU backend's stand-in gets the limit, or 4 GiB.
// The host tier gets --host-memory-limit, or 80% of the host's available
// memory (base/host_memory.h).
//
// Thread-safety: free functions.
#pragma once

#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "base/status.h"
#include "engine/config.h"
#include "engine/planner.h"
#include "engine/train_options.h"
#include "engine/update_mode.h"
#include "kernels/backend.h"
#include "models/model_spec.h"

namespace strata {

struct Budgets {
  uint64_t gpu = 0, host = 0;  // of the tiers
  uint64_t gpu_overhead = 0;   // device memory outside the GPU tier, inside the limit
  uint64_t ranks_device = 0;   // of it, the ranks' collectives' (below)
};

// OutOfMemory naming --gpu-memory-limit when the limit is below what the
// process already uses.
Result<Budgets> MeasureBudgets(const TrainOptions& options, const kernels::Backend& backend);

// The planner's inputs for the run of `cfg`'s model on `backend` within
// `budgets` (the scratch sizes are the backend's: its attention workspace
// depends on the kernel it would choose). `speculative_state`: the plan
// counts the speculative update's second set if it has room.
Result<PlanInputs> PlanInputsFor(const Config& cfg, const kernels::Backend& backend, const models::ModelSpec& spec,
                                 const Budgets& budgets, bool speculative_state);

// Everything a run decides before it allocates anything: the budgets, the
// plan within them, and the update mode that follows from both.
struct RunPlan {
  Budgets budgets;
  PlanInputs inputs;
  Plan plan;
  UpdateMode mode;
};

Result<RunPlan> PlanRun(const TrainOptions& options, const kernels::Backend& backend, const models::ModelSpec& spec);

// The device memory a run on the ranks' path takes on the CUDA backend
// beside the tiers, which PlanRun takes off the GPU tier's budget: the
// collectives' staging buffer (DataParallel::RoundsFor), and at ZeRO
// stage 3 partitioned the gathered parameters' buffers
// (engine/param_gather.h). 0 on one plain rank and on the CPU backend
// (whose staging is host memory beside the tiers' budgets).
uint64_t RanksDeviceBytes(const TrainOptions& options, const kernels::Backend& backend,
                          const models::ModelSpec& spec);

// What `zero_optimization.stage` means for this run's plan, for the plan's
// header line: on one rank every stage places alike (stages 1-3 partition
// over one rank, stage 0 does not partition; the planner places each tensor
// by the budgets), which a config written for many GPUs should be told
// rather than see its stage silently planned as another.
std::string ZeroStageNote(const Config& cfg);

}  // namespace strata
