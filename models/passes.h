// SPDX-License-Identifier: Apache-2.0
// The passes of a training step, written once over PassEnv
// (models/pass_env.h) for every model a ModelSpec describes:
//
//   Forward    embedding -> x_0; for each block l: x_{l+1} = block_l(x_l)
//              for every micro-batch of the pass (each block's parameters
//              are acquired once per pass), keeping x_l as its checkpoint.
//   Backward   the head first (final norm, LM head, loss and their backward,
//              for every micro-batch: the loss, d x_L and the head's
//              gradients); then for each block l from the last: recompute
//              from x_l and backpropagate every micro-batch, accumulating the
//              block's gradients; then the embedding's backward (its tied
//              token table has the head's part already).
//   Evaluate   Forward without keeping anything for a backward, then the
//              head's losses only.
//
// The order of every Acquire and Release is part of the contract: the
// offloaded step's prefetcher is driven by a schedule recorded from these
// same calls. With one micro-batch per pass and env.keep_last_block(), the
// last block's forward leaves its internals in the block scratch and its
// backward, right after the head, skips their recompute (same bits).
//
// Thread-safety: the passes run on the calling thread, using the env and the
// program's backend.
#pragma once

#include "base/status.h"
#include "models/model_program.h"
#include "models/pass_env.h"

namespace strata::models {

Status Forward(const ModelProgram& model, PassEnv& env, const MicroBatches& mb);
Status Backward(const ModelProgram& model, PassEnv& env, const MicroBatches& mb);
// Losses of the micro-batches into env.losses() (nothing else written).
Status Evaluate(const ModelProgram& model, PassEnv& env, const MicroBatches& mb);

}  // namespace strata::models
