// SPDX-License-Identifier: Apache-2.0
// ExtentAllocator: hands out aligned byte ranges of one growable file.
//
// Free space is a set of holes below the high-water mark `end()`. An
// allocation takes the best-fitting hole (the smallest that is large enough;
// the lowest offset among equals) and carves it from the hole's start; when no
// hole fits, it is placed at `end()` and the end moves up (the caller grows the
// file to cover it). Freeing coalesces with the neighbouring holes, and a hole
// that reaches `end()` is given back to the tail, so `end()` is always the end
// of the highest live extent and no hole touches it.
//
// Best fit keeps large holes intact for large requests; with the tail
// give-back, a workload that frees everything returns to end() == 0.
//
// Ownership: a value (its hole maps); the file it describes is the caller's.
//
// Thread-safety: none; the owner serializes calls (NvmeTier holds its mutex).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "base/status.h"

namespace strata {

class ExtentAllocator {
 public:
  // `alignment`: a power of two; every offset and length is a multiple of it.
  // `limit`: end() never exceeds it (the largest file this allocator may need).
  explicit ExtentAllocator(uint64_t alignment = 4096, uint64_t limit = UINT64_MAX);

  // An offset for `bytes` (rounded up to the alignment; 0 is invalid), or
  // nullopt when neither a hole nor the room up to `limit` can hold it.
  std::optional<uint64_t> Allocate(uint64_t bytes);

  // Returns [offset, offset + bytes) to the free space. InvalidArgument (and
  // no change) when the range is misaligned, empty, beyond end(), or overlaps
  // free space (a double free).
  Status Free(uint64_t offset, uint64_t bytes);

  uint64_t alignment() const { return alignment_; }
  uint64_t limit() const { return limit_; }
  uint64_t end() const { return end_; }                 // high-water mark
  uint64_t used() const { return used_; }               // bytes in live extents
  uint64_t hole_bytes() const { return end_ - used_; }  // free bytes below end()
  size_t hole_count() const { return by_offset_.size(); }
  uint64_t largest_hole() const;

 private:
  void AddHole(uint64_t offset, uint64_t bytes);
  void RemoveHole(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t alignment_;
  uint64_t limit_;
  uint64_t end_ = 0;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;           // hole offset -> length
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (length, offset)
};

}  // namespace strata
