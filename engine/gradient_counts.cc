// SPDX-License-Identifier: Apache-2.0
#include "engine/gradient_counts.h"

namespace strata {

Result<std::unique_ptr<GradientCounts>> GradientCounts::Create(HostTier* host, size_t units, bool stand_in) {
  std::unique_ptr<GradientCounts> g(new GradientCounts());
  ASSIGN_OR_RETURN(g->host_, host->Allocate(4 * units, "non-finite gradient counts"));
  g->pinned_ = host->pinned();
  CopyEngineOptions co;
  co.stand_in = stand_in;
  co.staging_bytes = 4096;  // (only pinned memory is copied)
  ASSIGN_OR_RETURN(g->copies_, CopyEngine::Create(co));
  return g;
}

Result<CopyTicket> GradientCounts::CopyDown(size_t u, const int32_t* device_count, void* stream) {
  CopyAfter after;
  after.stream = stream;
  // (Unpinned, the copy goes through the engine's staging on its own thread:
  // the step thread never waits for the compute stream here.)
  return copies_->DeviceToHost(host_.as<int32_t>() + u, device_count, 4, after,
                               pinned_ ? HostMemory::kPinned : HostMemory::kPageable);
}

Result<int32_t> GradientCounts::Count(size_t u, const CopyTicket& counted) const {
  RETURN_IF_ERROR(counted.Wait());
  return host_.as<int32_t>()[u];
}

}  // namespace strata
