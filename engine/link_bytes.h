// SPDX-License-Identifier: Apache-2.0
// Bytes over the step's links: the store's counters (every host<->GPU byte
// goes through its copy engine, the store's moves and the optimizer's copies
// alike; NVMe through its tier), and the optimizer workers' own PCIe copies
// counted apart, per job, so that each step reports its own transfers plus
// exactly the previous update's, wherever in time that update's copies fall.
//
// Thread-safety: OptimizerCopies may be used from any thread; a copy is
// counted and submitted under its lock, and Take reads the store's counters
// and its own under the same lock, so the two always agree.
#pragma once

#include <cstdint>

#include "base/mutex.h"
#include "base/status.h"
#include "tiers/copy_engine.h"
#include "tiers/tier_store.h"

namespace strata {

struct LinkBytes {
  uint64_t h2d = 0, d2h = 0, nvme_read = 0, nvme_write = 0;
};

// The store's link counters now.
LinkBytes StoreLinkBytes(const TierStore& store);

class OptimizerCopies {
 public:
  explicit OptimizerCopies(TierStore* store) : store_(store) {}

  // A copy for the update of optimizer step `job_step` (pinned host memory),
  // counted as that job's.
  Result<CopyTicket> Copy(int64_t job_step, CopyDirection dir, void* dst, const void* src, uint64_t bytes,
                          const CopyAfter& after = {}) EXCLUDES(mu_);
  // A new job of step `job_step` starts: its count starts at zero. (Its slot
  // last held the job two steps back, reported already.)
  void BeginJob(int64_t job_step) EXCLUDES(mu_);

  struct Snapshot {
    LinkBytes links;  // the store's counters
    LinkBytes all;    // every copy of the workers so far
    LinkBytes job;    // the copies of the job asked for
  };
  Snapshot Take(int64_t job_step) const EXCLUDES(mu_);

 private:
  TierStore* store_;
  mutable Mutex mu_;
  LinkBytes all_ GUARDED_BY(mu_);
  LinkBytes job_[2] GUARDED_BY(mu_);  // by the job's step parity
};

}  // namespace strata
