// SPDX-License-Identifier: Apache-2.0
// The memory-tier interface: byte-addressable tiers that hand out blocks
// within a budget. GpuTier (tiers/gpu_tier.h) and HostTier
// (tiers/host_tier.h) implement it; the NVMe tier (tiers/nvme/nvme_tier.h) is
// file-backed and has its own extent-based API.
//
// Budgets are exact: the sum of the (rounded) sizes of live blocks never
// exceeds budget(), and neither does the memory the tier has taken from the
// system (its slabs). A request the budget cannot satisfy is OutOfMemory
// naming the tier, the bytes requested and the bytes available — the tier
// never evicts anything itself (the TierStore decides what to drop).
//
// Thread-safety: every method may be called from any thread. A TierBlock is
// owned by one thread at a time (it is a move-only handle); it must be
// destroyed (or Reset) before its tier.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include "base/status.h"
#include "base/tier_kind.h"

namespace strata {

class MemoryTier;

// Where in its free space a tier places a block: long-lived blocks (home
// copies, staging) low, short-lived ones (caches) high, so that the churn of
// the caches does not cut the free space between long-lived blocks into
// pieces.
enum class Placement : uint8_t { kLow, kHigh };

// A block of a memory tier: [data(), data() + bytes()). Move-only; gives the
// memory back to its tier when destroyed or Reset.
class TierBlock {
 public:
  TierBlock() = default;
  TierBlock(TierBlock&& o) noexcept { *this = std::move(o); }
  TierBlock& operator=(TierBlock&& o) noexcept {
    if (this != &o) {
      Reset();
      tier_ = std::exchange(o.tier_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  TierBlock(const TierBlock&) = delete;
  TierBlock& operator=(const TierBlock&) = delete;
  ~TierBlock() { Reset(); }

  void Reset();
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  // The usable size: the request rounded up to the tier's alignment.
  uint64_t bytes() const { return bytes_; }
  MemoryTier* tier() const { return tier_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  friend class MemoryTier;
  TierBlock(MemoryTier* tier, void* data, uint64_t bytes) : tier_(tier), data_(data), bytes_(bytes) {}
  MemoryTier* tier_ = nullptr;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

struct TierUsage {
  uint64_t budget = 0;        // the most this tier hands out and takes from the system
  uint64_t used = 0;          // bytes in live blocks (rounded sizes)
  uint64_t reserved = 0;      // bytes taken from the system (slabs), <= budget
  uint64_t peak_used = 0;
  uint64_t largest_free = 0;  // largest block that fits in the reserved slabs now
  uint64_t live_blocks = 0;
  uint64_t allocations = 0;   // successful Allocate calls
  uint64_t failures = 0;      // Allocate calls answered with OutOfMemory
  int slabs = 0;
  double fragmentation = 0;   // 1 - largest_free / (reserved - used)
  uint64_t available() const { return budget - used; }
};

class MemoryTier {
 public:
  virtual ~MemoryTier() = default;

  virtual TierKind kind() const = 0;
  // A block of at least `bytes` (rounded up to alignment()). `what` names the
  // request in errors ("tensor layer3.w"). OutOfMemory (tier, requested,
  // available) when the budget cannot hold it; the system's own errors
  // (cudaMalloc, mlock with the RLIMIT_MEMLOCK value) when growing fails.
  virtual Result<TierBlock> Allocate(uint64_t bytes, std::string_view what = {},
                                     Placement placement = Placement::kLow) = 0;
  virtual TierUsage usage() const = 0;
  virtual uint64_t alignment() const = 0;
  // True when blocks are CUDA device memory (the CPU cannot touch them).
  virtual bool device_memory() const = 0;
  // True when blocks are page-locked, so DMA (CUDA copies, O_DIRECT) reaches
  // them without staging.
  virtual bool pinned() const = 0;
  // Gives slabs that hold no live block back to the system; returns the bytes
  // released.
  virtual uint64_t Trim() = 0;

  uint64_t budget() const { return usage().budget; }

 protected:
  TierBlock MakeBlock(void* data, uint64_t bytes) { return TierBlock(this, data, bytes); }
  // Called by TierBlock::Reset with a pointer this tier handed out.
  virtual void Free(void* data) = 0;
  friend class TierBlock;
};

inline void TierBlock::Reset() {
  if (data_ != nullptr) tier_->Free(data_);
  tier_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace strata
