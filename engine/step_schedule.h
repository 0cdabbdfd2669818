// SPDX-License-Identifier: Apache-2.0
// The step's access schedule, derived from the step itself: the passes
// (models/passes.h) run once through a StepEnv whose access records every
// Acquire and Release into an AccessSchedule (swap/schedule.h) and computes
// nothing. The first acquire of a unit's parameters in a step is a refresh
// (the optimizer has written new ones since); a release of a tensor acquired
// for writing that is not dirty discards what was written.
//
// Then the prefetcher that runs it: its budget is the GPU tier's free room
// once homes and scratch are in, less one copy of the largest streamed
// tensor (the tier's allocator does not compact, and that slack keeps its
// free room from coming in pieces too small for the next copy). What it will
// move per step (swap/prefetcher.h SimulateTraffic), with the optimizer's own
// copies, is its own report (ScheduledTraffic), printed beside the plan.
//
// Thread-safety: the step thread's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "engine/model_state.h"
#include "engine/step_buffers.h"
#include "engine/step_env.h"
#include "models/model_program.h"
#include "swap/prefetcher.h"
#include "swap/schedule.h"
#include "tiers/tier_store.h"

namespace strata {

// The step's schedule, recorded from its passes; with `gathers` (ZeRO
// stage 3), the units whose parameters they acquire, in order
// (StepEnv::recorded_gathers).
Result<AccessSchedule> RecordStepSchedule(const models::ModelProgram& model, ModelState* state, StepBuffers* buffers,
                                          kernels::Backend* backend, const StepShape& shape, const TierStore& store,
                                          std::vector<size_t>* gathers = nullptr);

struct StepPrefetcher {
  std::unique_ptr<Prefetcher> prefetcher;
  ScheduledTraffic traffic;
};
// `ready(id, cycle)`: may parameters `id` be loaded for step `cycle` (0: the
// first step the prefetcher runs)? (PrefetcherOptions::ready)
Result<StepPrefetcher> StartStepPrefetcher(TierStore* store, AccessSchedule schedule, const ModelState& state,
                                           std::function<bool(TensorId, uint64_t)> ready);

}  // namespace strata
