// SPDX-License-Identifier: Apache-2.0
// GradientCounts: each unit's non-finite gradient count, copied down from the
// GPU's gradient statistics after the unit's gradient work, for the update
// that runs during the backward (it must never apply a shard whose own
// gradient holds a non-finite value, and the step's overflow flag comes only
// at the backward's end).
//
// The copies have a copy engine of their own: each waits on the GPU for the
// compute stream to reach its unit's end, and on the store's shared D2H
// stream that wait would hold up every copy queued after it (the step thread
// queues the backward far ahead of the GPU) — the workers' own gradient
// downloads included. A copy's ticket thus also says that the GPU is done
// with the unit's gradient and parameters.
//
// Ownership: owns the pinned counts (from the host tier) and the engine; its
// destructor waits for the copies into them. Thread-safety: CopyDown from the
// step thread; Count from any thread, after its copy's ticket is waited for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/status.h"
#include "tiers/copy_engine.h"
#include "tiers/host_tier.h"

namespace strata {

class GradientCounts {
 public:
  // `stand_in`: the CPU backend (no CUDA stream to order on).
  static Result<std::unique_ptr<GradientCounts>> Create(HostTier* host, size_t units, bool stand_in);

  // The copy of unit `u`'s device count, after everything queued on
  // `stream` so far (null: the stand-in).
  Result<CopyTicket> CopyDown(size_t u, const int32_t* device_count, void* stream);
  // Unit u's count, once `counted` (its CopyDown) is done.
  Result<int32_t> Count(size_t u, const CopyTicket& counted) const;

 private:
  GradientCounts() = default;
  TierBlock host_;  // [units] int32, pinned
  bool pinned_ = false;
  std::unique_ptr<CopyEngine> copies_;  // after host_: destroyed first, waiting for its copies
};

}  // namespace strata
