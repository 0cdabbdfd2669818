// SPDX-License-Identifier: Apache-2.0
// PassEnv: what the passes of a training step (models/passes.h) need from
// whoever runs them — tensor access, gradient accumulation, buffers — so that
// the passes are written once for three users:
//   - the resident model (models/resident_model.h): every tensor is a buffer
//     of its own on the backend;
//   - the offloaded step (engine/step_env.h): tensors live in the tier store
//     and every access goes through the prefetcher, which keeps what comes
//     next on the GPU within its budget;
//   - the schedule recorder (the same engine env with a recording access):
//     the passes run without computing and their accesses become the step's
//     access schedule (swap/schedule.h), which therefore cannot drift from
//     what runs.
//
// Tensors the passes acquire are named by role (PassTensor): a unit's
// parameters, or the checkpoint (a layer's input) of one micro-batch.
// Gradients are the env's business (its accumulation policy: the resident
// model writes them in place in their dtype; the offloaded step accumulates
// in fp32 and rounds once), reached through BeginGrads/EndGrads/GradsDone.
//
// Thread-safety: an env is used by the one thread that runs the passes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/access.h"
#include "base/dtype.h"
#include "base/status.h"

namespace strata::models {

struct PassTensor {
  enum Role : uint8_t {
    kParams,      // the parameters of unit `unit`
    kCheckpoint,  // x_layer of micro-batch `micro`: the input of block `layer` (layer n_layer: the head's)
  };
  Role role = kParams;
  int unit = 0;
  int layer = 0;
  int64_t micro = 0;
  static PassTensor Params(int unit) { return PassTensor{kParams, unit, 0, 0}; }
  static PassTensor Checkpoint(int layer, int64_t micro) { return PassTensor{kCheckpoint, 0, layer, micro}; }
};

// The micro-batches one pass runs: [first, end). A step runs all of them in
// one pass (layer-major) or one per pass (micro-batch-major); `last`: this
// pass ends the step's micro-batches (its gradients are then complete).
struct MicroBatches {
  int64_t first = 0, end = 1;
  bool last = true;
  bool one() const { return end - first == 1; }
};

// Where a unit's gradients accumulate during a pass: `data` in `dtype`, and
// whether the pass's first micro-batch adds to what is there (later ones
// always add).
struct GradTarget {
  void* data = nullptr;
  DType dtype = DType::kF32;
  bool accumulate = false;
};

struct ScratchSpace {
  void* data = nullptr;
  size_t bytes = 0;
};

class PassEnv {
 public:
  virtual ~PassEnv() = default;

  // False for an env that only records the passes' accesses: the passes then
  // call no kernel (the pointers they get are null).
  virtual bool computes() const { return true; }

  // A tensor for the duration of its use; Release ends it (dirty: written).
  virtual Result<void*> Acquire(const PassTensor& t, Access access) = 0;
  virtual Status Release(const PassTensor& t, bool dirty) = 0;

  // The gradients of unit `unit` over this pass's micro-batches: BeginGrads
  // before the first contribution, EndGrads after the last (and after the
  // unit's parameters are released in the head; before, in a block),
  // GradsDone once the pass is done with the unit (parameters released).
  virtual Result<GradTarget> BeginGrads(int unit, const MicroBatches& mb) = 0;
  virtual Status EndGrads(int unit, const MicroBatches& mb, const GradTarget& g) = 0;
  virtual Status GradsDone(int unit, const MicroBatches& mb) { return Status::OK(); }

  // Per micro-batch backend buffers: tokens and targets [B, T] int32, the
  // per-token losses [B, T], the residual stream's gradient [B, T, C].
  virtual const int32_t* tokens(int64_t micro) = 0;
  virtual const int32_t* targets(int64_t micro) = 0;
  virtual float* losses(int64_t micro) = 0;
  virtual void* residual_grad(int64_t micro) = 0;
  // d loss / d losses[i] (1 / the number of counted targets, times the loss scale).
  virtual float dloss() const = 0;
  virtual ScratchSpace block_scratch() = 0;
  virtual ScratchSpace head_scratch() = 0;
  // With one micro-batch per pass, whether the last block's forward leaves
  // its internals in the block scratch for its backward (which follows the
  // head, whose scratch must then be its own), skipping one recompute.
  virtual bool keep_last_block() const = 0;
  virtual int64_t head_chunk_rows() const { return 0; }
};

}  // namespace strata::models
