// SPDX-License-Identifier: Apache-2.0
// Evaluation: the mean loss over validation batches, by the same passes as
// training (models/passes.h Evaluate) in an environment of their own: the
// parameters are acquired from the store directly (a streamed block's are
// prefetched one block ahead and evicted after use), the activations
// alternate between two GPU buffers, nothing is kept for a backward. It
// runs between steps (at ZeRO stage 3 across ranks, the parameters are
// gathered from the ranks' slices instead: engine/param_gather.h, on every
// rank alike), with no optimizer job running (the trainer waits for
// the last update first) and the prefetcher at a cycle start.
//
// Thread-safety: the step thread's.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "engine/data.h"
#include "engine/model_state.h"
#include "engine/param_gather.h"
#include "engine/step_buffers.h"
#include "kernels/backend.h"
#include "models/model_program.h"
#include "models/pass_env.h"

namespace strata {

struct EvalContext {
  const models::ModelProgram* model = nullptr;
  ModelState* state = nullptr;
  StepBuffers* buffers = nullptr;
  TierStore* store = nullptr;
  kernels::Backend* backend = nullptr;
  bool params_resident = true;  // the plan's: streamed blocks are evicted after use
  // ZeRO stage 3 across ranks: the parameters are gathered from the ranks'
  // slices (a collective: every rank evaluates alike); else null.
  ParamGather* gather = nullptr;
};

// The mean loss of the first `batches` validation batches of `data`.
Result<double> EvaluateLoss(const EvalContext& ctx, DataLoader* data, int64_t batches);

// The loop both evaluations run (the trainer's above, strata eval's in
// engine/inference_eval.h), so that their numbers compare: each batch's
// tokens and targets uploaded to `tokens`/`targets` (the env's), the
// evaluation pass, the per-token `losses` summed in double over the counted
// targets; the mean over all of them.
struct EvalBuffers {
  void* tokens = nullptr;         // [B, T] int32, backend memory
  void* targets = nullptr;        // [B, T] int32
  const void* losses = nullptr;   // [B, T] f32
};
Result<double> MeanValLoss(const models::ModelProgram& model, models::PassEnv& env, kernels::Backend* backend,
                           const EvalBuffers& buffers, DataLoader* data, int64_t batches);

}  // namespace strata
