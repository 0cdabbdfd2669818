// SPDX-License-Identifier: Apache-2.0
// Arena: our own allocator that carves address ranges ("regions") into blocks.
//
// The GPU and host tiers get big regions from the system once (cudaMalloc,
// pinned slabs) and hand out pieces of them through an Arena, so that no
// allocation on the hot path touches the driver or the kernel.
//
// - Best fit: the smallest free block that can hold the request (ties: the
//   lowest address), split; the rest stays free.
// - Coalescing: a freed block merges with free neighbours of the same region
//   (never across regions, even when two regions happen to be adjacent).
// - Alignment: every block starts at a multiple of `alignment` (a power of two,
//   at least 256) and its size is rounded up to a multiple of it. Regions
//   must be aligned likewise.
// - Exact byte accounting: used() is the sum of the rounded sizes handed out,
//   free() = capacity() - used(); nothing is hidden in headers (the
//   bookkeeping lives in ordinary maps, not in the carved memory, which may be
//   device memory the CPU cannot touch).
//
// The arena works on addresses only; it never reads or writes the memory.
//
// Thread-safety: none. An Arena belongs to one owner that serializes calls
// (the tiers hold their mutex around it).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"

namespace strata {

struct ArenaStats {
  uint64_t capacity = 0;          // sum of region sizes
  uint64_t used = 0;              // sum of block sizes handed out (rounded)
  uint64_t peak_used = 0;         // highest `used` seen
  uint64_t free = 0;              // capacity - used
  uint64_t largest_free = 0;      // biggest single allocation that would succeed now
  uint64_t free_blocks = 0;       // number of free ranges
  uint64_t live_blocks = 0;       // number of blocks handed out
  uint64_t allocations = 0;       // successful Allocate calls so far
  uint64_t failures = 0;          // Allocate calls that found no block
  int regions = 0;
  // 1 - largest_free / free: 0 when all free space is one block (or none).
  double fragmentation() const {
    return free == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free) / static_cast<double>(free);
  }
};

class Arena {
 public:
  explicit Arena(uint64_t alignment = 256);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&&) = default;
  Arena& operator=(Arena&&) = default;

  uint64_t alignment() const { return alignment_; }
  // The size a request for `bytes` takes (rounded up; 0 bytes take one unit).
  uint64_t RoundUp(uint64_t bytes) const;

  // Adds [base, base + bytes) as a new region, all free. InvalidArgument when
  // base or bytes are not aligned, bytes is 0, or the range overlaps a region.
  Status AddRegion(uintptr_t base, uint64_t bytes);
  // Removes a region that has no live block. FailedPrecondition otherwise,
  // NotFound when `base` is not a region.
  Status RemoveRegion(uintptr_t base);
  // Regions with no live block (candidates for giving memory back).
  std::vector<std::pair<uintptr_t, uint64_t>> EmptyRegions() const;

  // Best-fit allocation of RoundUp(bytes). Returns 0 when no free block is big
  // enough (the caller turns that into OutOfMemory with its own context).
  // `from_top` carves the block from the top end of the chosen free range
  // instead of the bottom: long-lived blocks taken from the bottom and
  // short-lived ones from the top stay apart, which limits fragmentation.
  uintptr_t Allocate(uint64_t bytes, bool from_top = false);
  // Returns a block to the arena. InvalidArgument (and no change) when `addr`
  // is not the start of a live block.
  Status Free(uintptr_t addr);
  // The rounded size of the live block at `addr`, 0 if there is none.
  uint64_t BlockSize(uintptr_t addr) const;

  ArenaStats stats() const;

 private:
  struct FreeBlock {
    uint64_t bytes;
    int region;
  };
  struct Region {
    uintptr_t base;
    uint64_t bytes;
    uint64_t live = 0;  // blocks handed out from this region
  };
  void InsertFree(uintptr_t addr, uint64_t bytes, int region);
  void EraseFree(std::map<uintptr_t, FreeBlock>::iterator it);
  int RegionOf(uintptr_t addr) const;

  uint64_t alignment_;
  std::map<uintptr_t, FreeBlock> free_by_addr_;
  std::set<std::pair<uint64_t, uintptr_t>> free_by_size_;  // (bytes, addr)
  struct Live {
    uint64_t bytes;
    int region;
  };
  std::unordered_map<uintptr_t, Live> live_;
  std::map<int, Region> regions_;             // id -> region
  std::map<uintptr_t, int> region_by_base_;   // base -> id
  int next_region_ = 0;
  uint64_t capacity_ = 0, used_ = 0, peak_used_ = 0, allocations_ = 0, failures_ = 0;
};

}  // namespace strata
