// SPDX-License-Identifier: Apache-2.0
// ExtentAllocator: best fit over the holes, coalescing, tail give-back
// (tiers/nvme/extent_allocator.h). Not thread-safe: the owner serializes.
#include "tiers/nvme/extent_allocator.h"

#include <string>

#include "base/bytes.h"

namespace strata {

ExtentAllocator::ExtentAllocator(uint64_t alignment, uint64_t limit)
    : alignment_(IsPowerOfTwo(alignment) ? alignment : 4096), limit_(limit & ~(alignment_ - 1)) {}

uint64_t ExtentAllocator::largest_hole() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

void ExtentAllocator::AddHole(uint64_t offset, uint64_t bytes) {
  by_offset_.emplace(offset, bytes);
  by_size_.emplace(bytes, offset);
}

void ExtentAllocator::RemoveHole(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

std::optional<uint64_t> ExtentAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0 || bytes > limit_) return std::nullopt;
  bytes = AlignUp(bytes, alignment_);
  auto fit = by_size_.lower_bound({bytes, 0});
  if (fit != by_size_.end()) {
    const uint64_t hole_len = fit->first, hole_off = fit->second;
    RemoveHole(by_offset_.find(hole_off));
    if (hole_len > bytes) AddHole(hole_off + bytes, hole_len - bytes);
    used_ += bytes;
    return hole_off;
  }
  if (bytes > limit_ - end_) return std::nullopt;
  uint64_t off = end_;
  end_ += bytes;
  used_ += bytes;
  return off;
}

Status ExtentAllocator::Free(uint64_t offset, uint64_t bytes) {
  auto range = [&] {
    std::string r(1, '[');  // (not "[" + ...: GCC 12 warns falsely on that with -O2)
    r += std::to_string(offset);
    r += ", ";
    r += std::to_string(offset + bytes);
    r += ')';
    return r;
  };
  if (bytes == 0 || offset % alignment_ != 0 || bytes % alignment_ != 0)
    return InvalidArgument("extent free of " + range() + ": not a non-empty multiple of " +
                           std::to_string(alignment_) + " bytes");
  if (offset > end_ || bytes > end_ - offset)
    return InvalidArgument("extent free of " + range() + ": beyond the allocated end " +
                           std::to_string(end_));
  // Overlap with a hole means this range (or part of it) is already free.
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first < offset + bytes)
    return InvalidArgument("extent free of " + range() + ": overlaps free space at " +
                           std::to_string(next->first) + " (double free?)");
  auto prev = next == by_offset_.begin() ? by_offset_.end() : std::prev(next);
  if (prev != by_offset_.end() && prev->first + prev->second > offset)
    return InvalidArgument("extent free of " + range() + ": overlaps free space at " +
                           std::to_string(prev->first) + " (double free?)");

  used_ -= bytes;
  uint64_t start = offset, len = bytes;
  if (prev != by_offset_.end() && prev->first + prev->second == start) {
    start = prev->first;
    len += prev->second;
    RemoveHole(prev);
  }
  if (next != by_offset_.end() && next->first == offset + bytes) {
    len += next->second;
    RemoveHole(next);
  }
  if (start + len == end_) {
    end_ = start;  // the tail is free: give it back
  } else {
    AddHole(start, len);
  }
  return Status::OK();
}

}  // namespace strata
