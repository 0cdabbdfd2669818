// SPDX-License-Identifier: Apache-2.0
// SlabTier: the part GpuTier and HostTier share — an Arena over slabs taken
// from the system, grown on demand within an exact budget.
//
// Growth: when no free block fits, a new slab of max(request,
// min(slab_bytes, budget - reserved)) is mapped (cudaMalloc, pinned mmap,
// ...). When the budget has no room left for a slab that fits the request
// but some slabs are empty, those are given back first and the tier tries
// again, so a large request is not refused only because the budget is
// reserved as small empty slabs. Slabs are otherwise kept for reuse: nothing
// is mapped or pinned per allocation.
//
// Subclasses implement MapSlab/UnmapSlab and must call ReleaseSlabs() in their
// destructor (a base destructor cannot call them).
//
// Thread-safety: all public methods are thread-safe (one mutex). MapSlab and
// UnmapSlab are called with that mutex held.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "base/thread_annotations.h"
#include "tiers/arena.h"
#include "tiers/tier.h"

namespace strata {

struct SlabTierConfig {
  TierKind kind = TierKind::kHost;
  uint64_t budget = 0;       // exact cap on live bytes and on mapped slabs
  uint64_t slab_bytes = 0;   // growth step (0: the whole budget at once)
  uint64_t alignment = 256;  // block alignment, power of two >= 256
};

class SlabTier : public MemoryTier {
 public:
  ~SlabTier() override;

  TierKind kind() const override { return config_.kind; }
  Result<TierBlock> Allocate(uint64_t bytes, std::string_view what = {},
                             Placement placement = Placement::kLow) override;
  TierUsage usage() const override;
  uint64_t alignment() const override { return config_.alignment; }
  uint64_t Trim() override;

 protected:
  explicit SlabTier(SlabTierConfig config);
  // Maps the whole budget now (one slab per slab_bytes), so that no
  // allocation later waits for the system.
  Status ReserveAll();
  // Takes `bytes` (a multiple of alignment) from the system, aligned to at
  // least alignment(). Errors are returned to the caller of Allocate.
  virtual Result<void*> MapSlab(uint64_t bytes) = 0;
  virtual void UnmapSlab(void* base, uint64_t bytes) = 0;
  // Unmaps every slab. Subclass destructors call it; blocks still live then
  // are a caller bug (they would dangle) and are reported on stderr.
  void ReleaseSlabs();
  void Free(void* data) override;

  const SlabTierConfig& config() const { return config_; }

 private:
  Status GrowLocked(uint64_t need) REQUIRES(mu_);
  uint64_t TrimLocked() REQUIRES(mu_);

  const SlabTierConfig config_;
  mutable std::mutex mu_;
  Arena arena_ GUARDED_BY(mu_);
  struct Slab {
    void* base;
    uint64_t bytes;
  };
  std::vector<Slab> slabs_ GUARDED_BY(mu_);
  uint64_t reserved_ GUARDED_BY(mu_) = 0;
  uint64_t failures_ GUARDED_BY(mu_) = 0;
};

}  // namespace strata
