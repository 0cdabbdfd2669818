// SPDX-License-Identifier: Apache-2.0
// strata eval's computation: the mean loss of a loaded model
// (engine/inference_model.h) over the validation batches of a DataLoader, by
// the trainer's own evaluation loop (engine/evaluation.h MeanValLoss) and
// pass (models/passes.h Evaluate), in an environment whose parameters are
// the resident units and whose activations alternate between two buffers.
// On the same windows, parameters and backend it gives the trainer's val loss.
//
// Thread-safety: one thread at a time (the backend's rule).
#pragma once

#include <cstdint>

#include "base/status.h"
#include "engine/data.h"
#include "engine/inference_model.h"
#include "kernels/backend.h"

namespace strata {

// Batches of `batch` sequences of `seq` tokens (seq <= the model's max_seq).
Result<double> EvaluateModel(const InferenceModel& model, kernels::Backend* backend, DataLoader* data,
                             int64_t batch, int64_t seq, int64_t batches);

}  // namespace strata
