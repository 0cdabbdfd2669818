// SPDX-License-Identifier: Apache-2.0
#include "engine/link_bytes.h"

namespace strata {

LinkBytes StoreLinkBytes(const TierStore& store) {
  const TierStoreStats st = store.stats();
  return LinkBytes{st.copy.h2d.bytes, st.copy.d2h.bytes, st.nvme_to_host.bytes, st.host_to_nvme.bytes};
}

Result<CopyTicket> OptimizerCopies::Copy(int64_t job_step, CopyDirection dir, void* dst, const void* src,
                                         uint64_t bytes, const CopyAfter& after) {
  MutexLock lock(&mu_);
  Result<CopyTicket> t = store_->copy_engine()->Copy(dir, dst, src, bytes, after, HostMemory::kPinned);
  if (t.ok()) {
    const bool up = dir == CopyDirection::kHostToDevice;
    LinkBytes& mine = job_[job_step % 2];
    (up ? all_.h2d : all_.d2h) += bytes;
    (up ? mine.h2d : mine.d2h) += bytes;
  }
  return t;
}

void OptimizerCopies::BeginJob(int64_t job_step) {
  MutexLock lock(&mu_);
  job_[job_step % 2] = LinkBytes{};
}

OptimizerCopies::Snapshot OptimizerCopies::Take(int64_t job_step) const {
  MutexLock lock(&mu_);
  return Snapshot{StoreLinkBytes(*store_), all_, job_[job_step % 2]};
}

}  // namespace strata
