// Evaluation: the mean loss over validation batches, by the same passes as
// training (models/passes.h Evaluate) in an environment of their own: the
// parameters are acquired from the store directly (a streamed block's are
// prefetched one block ahead and evicted after use), the activations
// alternate between two GPU buffers, nothing is kept for a backward. It
// runs between steps, with no optimizer job running (the trainer waits for
// the last update first) and the prefetcher at a cycle start.
//
// Thread-safety: the step thread's.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "engine/data.h"
#include "engine/model_state.h"
#include "engine/step_buffers.h"
#include "kernels/backend.h"
#include "models/model_program.h"

namespace strata {

struct EvalContext {
  const models::ModelProgram* model = nullptr;
  ModelState* state = nullptr;
  StepBuffers* buffers = nullptr;
  TierStore* store = nullptr;
  kernels::Backend* backend = nullptr;
  bool params_resident = true;  // the plan's: streamed blocks are evicted after use
};

// The mean loss of the first `batches` validation batches of `data`.
Result<double> EvaluateLoss(const EvalContext& ctx, DataLoader* data, int64_t batches);

}  // namespace strata
