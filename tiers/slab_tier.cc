// SPDX-License-Identifier: Apache-2.0
#include "tiers/slab_tier.h"

#include <algorithm>
#include <cstdio>

#include "base/bytes.h"

namespace strata {

namespace {
uint64_t AlignDown(uint64_t v, uint64_t a) { return v & ~(a - 1); }
}  // namespace

SlabTier::SlabTier(SlabTierConfig config) : config_(config), arena_(config.alignment) {}

SlabTier::~SlabTier() {
  // Subclasses must have unmapped their slabs (UnmapSlab is gone by now).
  if (!slabs_.empty())
    std::fprintf(stderr, "strata: %s tier destroyed with %zu slabs still mapped (leaked)\n",
                 std::string(TierName(config_.kind)).c_str(), slabs_.size());
}

Status SlabTier::ReserveAll() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t budget = AlignDown(config_.budget, config_.alignment);
  while (reserved_ < budget) {
    uint64_t step = config_.slab_bytes == 0 ? budget : config_.slab_bytes;
    uint64_t bytes = AlignDown(std::min(step, budget - reserved_), config_.alignment);
    if (bytes == 0) break;
    ASSIGN_OR_RETURN(void* base, MapSlab(bytes));
    Status s = arena_.AddRegion(reinterpret_cast<uintptr_t>(base), bytes);
    if (!s.ok()) {
      UnmapSlab(base, bytes);
      return s;
    }
    slabs_.push_back({base, bytes});
    reserved_ += bytes;
  }
  return Status::OK();
}

Status SlabTier::GrowLocked(uint64_t need) {
  uint64_t budget = AlignDown(config_.budget, config_.alignment);
  uint64_t room = budget - std::min(budget, reserved_);
  if (room < need) {
    // Empty slabs hold budget that a bigger slab could use.
    TrimLocked();
    room = budget - std::min(budget, reserved_);
    if (room < need) return OutOfMemory(config_.kind, need, room, "");  // message made by caller
  }
  uint64_t step = config_.slab_bytes == 0 ? room : std::min(config_.slab_bytes, room);
  uint64_t bytes = AlignDown(std::max(need, step), config_.alignment);
  ASSIGN_OR_RETURN(void* base, MapSlab(bytes));
  Status s = arena_.AddRegion(reinterpret_cast<uintptr_t>(base), bytes);
  if (!s.ok()) {
    UnmapSlab(base, bytes);
    return s;
  }
  slabs_.push_back({base, bytes});
  reserved_ += bytes;
  return Status::OK();
}

Result<TierBlock> SlabTier::Allocate(uint64_t bytes, std::string_view what, Placement placement) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool top = placement == Placement::kHigh;
  uint64_t need = arena_.RoundUp(bytes);
  uintptr_t p = arena_.Allocate(bytes, top);
  if (p == 0) {
    Status grow = GrowLocked(need);
    if (grow.ok()) p = arena_.Allocate(bytes, top);
    if (p == 0) {
      ++failures_;
      ArenaStats a = arena_.stats();
      uint64_t available = config_.budget - std::min(config_.budget, a.used);
      if (!grow.ok() && grow.code() != StatusCode::kOutOfMemory) return grow;
      std::string msg = std::string(what.empty() ? "allocation" : what) + " of " +
                        FormatBytes(need) + " does not fit in the " +
                        std::string(TierName(config_.kind)) + " tier (budget " +
                        FormatBytes(config_.budget) + ", in use " + FormatBytes(a.used) +
                        ", largest free block " + FormatBytes(a.largest_free) + ")";
      if (!grow.ok() && grow.code() == StatusCode::kOutOfMemory && grow.message().size() > 0)
        msg += ": " + std::string(grow.message());  // the system's own OOM (cudaMalloc)
      else if (a.used + need <= config_.budget)
        msg += "; the free bytes are split across " + std::to_string(slabs_.size()) +
               " slabs (a block never spans two): a larger slab size avoids this";
      return OutOfMemory(config_.kind, need, available, std::move(msg));
    }
  }
  return MakeBlock(reinterpret_cast<void*>(p), need);
}

void SlabTier::Free(void* data) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = arena_.Free(reinterpret_cast<uintptr_t>(data));
  if (!s.ok())  // a TierBlock only ever frees what it was given: this is a bug
    std::fprintf(stderr, "strata: %s tier: %s\n", std::string(TierName(config_.kind)).c_str(),
                 s.ToString().c_str());
}

TierUsage SlabTier::usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  ArenaStats a = arena_.stats();
  TierUsage u;
  u.budget = config_.budget;
  u.used = a.used;
  u.reserved = reserved_;
  u.peak_used = a.peak_used;
  u.largest_free = a.largest_free;
  u.live_blocks = a.live_blocks;
  u.allocations = a.allocations;
  u.failures = failures_;
  u.slabs = static_cast<int>(slabs_.size());
  u.fragmentation = a.fragmentation();
  return u;
}

uint64_t SlabTier::TrimLocked() {
  uint64_t released = 0;
  for (auto [base, bytes] : arena_.EmptyRegions()) {
    if (!arena_.RemoveRegion(base).ok()) continue;
    auto it = std::find_if(slabs_.begin(), slabs_.end(),
                           [b = base](const Slab& s) { return reinterpret_cast<uintptr_t>(s.base) == b; });
    if (it != slabs_.end()) {
      UnmapSlab(it->base, it->bytes);
      slabs_.erase(it);
    }
    reserved_ -= bytes;
    released += bytes;
  }
  return released;
}

uint64_t SlabTier::Trim() {
  std::lock_guard<std::mutex> lock(mu_);
  return TrimLocked();
}

void SlabTier::ReleaseSlabs() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t live = arena_.stats().live_blocks;
  if (live != 0)
    std::fprintf(stderr,
                 "strata: %s tier destroyed with %llu blocks still allocated (they now dangle)\n",
                 std::string(TierName(config_.kind)).c_str(), static_cast<unsigned long long>(live));
  for (const Slab& s : slabs_) UnmapSlab(s.base, s.bytes);
  slabs_.clear();
  arena_ = Arena(config_.alignment);
  reserved_ = 0;
}

}  // namespace strata
