// The planner's inputs for a model and budgets, as strata train builds them.
//
// The one place strata-bench makes PlanInputs (bench/offload_bound.cc uses
// it): a copy of the trainer's MakePlanInputs (engine/trainer.cc), which is
// private to the trainer, until the shared budget function that --dry-run
// and a real run will both call lands (engine/budgets.h); then this
// function becomes a call of that one. Keep it field for field the same as
// the trainer's until then.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "engine/config.h"
#include "engine/planner.h"
#include "kernels/gpt.h"

namespace strata::bench {

// `block_scratch` and `head_scratch` are GptLayers::BlockScratchBytes /
// HeadScratchBytes of the backend the run would use; the budgets are the
// GPU tier's and the host tier's. The speculative update's second set is
// not asked for (a speed-up, not a need; the plan is made without it).
PlanInputs BenchPlanInputs(const Config& cfg, const kernels::GptConfig& g, DType dtype, size_t block_scratch,
                           size_t head_scratch, uint64_t gpu_budget, uint64_t host_budget);

// FLOPs per trained token as strata train's MFU counts them (the trainer's
// ModelFlopsPerToken): 6 N for the parameter GEMMs forward and backward,
// plus 12 L d T for attention.
double ModelFlopsPerToken(const kernels::GptConfig& g, int64_t seq);

}  // namespace strata::bench
