// SPDX-License-Identifier: Apache-2.0
// StepBuffers: the GPU memory a training step works in beside the model's
// tensors, carved from the store's GPU tier so that the GPU budget covers
// everything the step touches: the block's recompute scratch, the head's,
// the residual-stream gradients (one per micro-batch set), an activation
// for evaluation, tokens/targets/losses of every micro-batch, the gradient
// statistics, and — when the store's gradient is not the backward's
// accumulator (narrower than fp32, or a ZeRO slice) — the fp32
// accumulators of one block (or two, alternating), the embedding and the
// final unit.
//
// Allocated before the model's tensors (the working set must be there
// whatever the store caches). Ownership: owns its blocks (returned to the
// tier on destruction). Thread-safety: the step thread's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "models/model_spec.h"
#include "tiers/gpu_tier.h"

namespace strata {

struct StepBuffers {
  struct Sizes {
    size_t block_scratch = 0, head_scratch = 0;
    int64_t batch = 1, seq = 1, micro_batches = 1;
    int64_t residual_sets = 1;  // layer-major: one per micro-batch; else one
    DType dtype = DType::kF32;
    // The fp32 accumulators below (ModelState::Layout::grad_is_accumulator
    // false: the gradients the optimizer reads are narrower than fp32, or
    // ZeRO stage >= 2 keeps only a slice of them).
    bool accumulators = false;
    // Each accumulator padded to world × ceil(numel / world) values (a ZeRO
    // flat partition's, reduce-scattered in place; engine/grad_reduce.h).
    int64_t world = 1;
    // A second block accumulator, alternated with the first by the block's
    // unit (StepShape::reduce_beside: a block's sum runs under the next
    // block's backward, which then writes the other).
    bool second_block_accumulator = false;
  };
  static Result<StepBuffers> Allocate(GpuTier* gpu, const models::ModelSpec& spec, const Sizes& sizes);

  TierBlock block_scratch, head_scratch;
  std::vector<TierBlock> dx;  // [residual_sets] residual-stream gradients [B, T, C]
  TierBlock eval_x;           // [B, T, C]: evaluation's second activation (with dx[0])
  TierBlock tokens, targets, losses;  // [micro_batches, B, T] int32 / int32 / f32
  // The squared norm (float, at 0) and each unit's non-finite count (int32
  // per unit, from byte 64).
  TierBlock stats;
  TierBlock block_acc, embedding_acc, final_acc;  // fp32 accumulators (Sizes::accumulators)
  TierBlock block_acc2;                           // Sizes::second_block_accumulator

  size_t stats_bytes = 0;
  float* sumsq() const { return stats.as<float>(); }
  int32_t* nonfinite(size_t unit) const { return reinterpret_cast<int32_t*>(stats.as<char>() + 64) + unit; }
};

}  // namespace strata
