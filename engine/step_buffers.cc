// SPDX-License-Identifier: Apache-2.0
#include "engine/step_buffers.h"

#include <algorithm>

namespace strata {

Result<StepBuffers> StepBuffers::Allocate(GpuTier* gt, const models::ModelSpec& spec, const Sizes& z) {
  StepBuffers b;
  const int64_t BT = z.batch * z.seq, ABT = z.micro_batches * BT;
  ASSIGN_OR_RETURN(b.block_scratch, gt->Allocate(std::max<size_t>(z.block_scratch, 256), "block scratch"));
  ASSIGN_OR_RETURN(b.head_scratch, gt->Allocate(std::max<size_t>(z.head_scratch, 256), "head scratch"));
  const uint64_t act = static_cast<uint64_t>(BT * spec.d_model) * DTypeSize(z.dtype);
  for (int64_t a = 0; a < z.residual_sets; ++a) {
    ASSIGN_OR_RETURN(TierBlock d, gt->Allocate(act, "residual gradient"));
    b.dx.push_back(std::move(d));
  }
  ASSIGN_OR_RETURN(b.eval_x, gt->Allocate(act, "evaluation activations"));
  ASSIGN_OR_RETURN(b.tokens, gt->Allocate(static_cast<uint64_t>(ABT) * 4, "tokens"));
  ASSIGN_OR_RETURN(b.targets, gt->Allocate(static_cast<uint64_t>(ABT) * 4, "targets"));
  ASSIGN_OR_RETURN(b.losses, gt->Allocate(static_cast<uint64_t>(ABT) * 4, "losses"));
  b.stats_bytes = 64 + 4 * spec.units.size();
  ASSIGN_OR_RETURN(b.stats, gt->Allocate(std::max<size_t>(256, b.stats_bytes), "gradient statistics"));
  if (z.accumulators) {
    const int64_t W = std::max<int64_t>(z.world, 1);
    auto acc = [&](int unit, const char* what) {
      const int64_t n = spec.units[static_cast<size_t>(unit)].numel;
      return gt->Allocate(static_cast<uint64_t>((n + W - 1) / W * W) * 4, what);
    };
    ASSIGN_OR_RETURN(b.block_acc, acc(1, "block gradient accumulator"));
    if (z.second_block_accumulator) {
      ASSIGN_OR_RETURN(b.block_acc2, acc(1, "second block gradient accumulator"));
    }
    ASSIGN_OR_RETURN(b.embedding_acc, acc(0, "embedding gradient accumulator"));
    ASSIGN_OR_RETURN(b.final_acc, acc(spec.final_unit(), "final gradient accumulator"));
  }
  return b;
}

}  // namespace strata
