// SPDX-License-Identifier: Apache-2.0
#include "tiers/arena.h"

#include <algorithm>
#include <string>

#include "base/bytes.h"

namespace strata {

namespace {
std::string Hex(uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

Arena::Arena(uint64_t alignment) : alignment_(std::max<uint64_t>(alignment, 256)) {
  if (!IsPowerOfTwo(alignment_)) alignment_ = uint64_t{1} << (64 - __builtin_clzll(alignment_));
}

uint64_t Arena::RoundUp(uint64_t bytes) const {
  return bytes == 0 ? alignment_ : AlignUp(bytes, alignment_);
}

int Arena::RegionOf(uintptr_t addr) const {
  auto it = region_by_base_.upper_bound(addr);
  if (it == region_by_base_.begin()) return -1;
  --it;
  const Region& r = regions_.at(it->second);
  return addr < r.base + r.bytes ? it->second : -1;
}

Status Arena::AddRegion(uintptr_t base, uint64_t bytes) {
  if (bytes == 0) return InvalidArgument("arena region of 0 bytes");
  if (base % alignment_ != 0 || bytes % alignment_ != 0)
    return InvalidArgument("arena region " + Hex(base) + " + " + std::to_string(bytes) +
                           " is not aligned to " + std::to_string(alignment_) + " bytes");
  if (base + bytes < base) return InvalidArgument("arena region wraps around the address space");
  // Overlap with the region starting at or before base, or the next one.
  auto next = region_by_base_.lower_bound(base);
  if (next != region_by_base_.end() && next->first < base + bytes)
    return InvalidArgument("arena region " + Hex(base) + " overlaps region " + Hex(next->first));
  if (RegionOf(base) >= 0) return InvalidArgument("arena region " + Hex(base) + " overlaps a region");
  int id = next_region_++;
  regions_[id] = Region{base, bytes, 0};
  region_by_base_[base] = id;
  capacity_ += bytes;
  InsertFree(base, bytes, id);
  return Status::OK();
}

Status Arena::RemoveRegion(uintptr_t base) {
  auto it = region_by_base_.find(base);
  if (it == region_by_base_.end()) return NotFound("no arena region at " + Hex(base));
  Region& r = regions_.at(it->second);
  if (r.live != 0)
    return FailedPrecondition("arena region " + Hex(base) + " still has " + std::to_string(r.live) +
                              " live blocks");
  // An empty region is exactly one free block (coalescing guarantees it).
  auto fit = free_by_addr_.find(base);
  if (fit == free_by_addr_.end() || fit->second.bytes != r.bytes)
    return Internal("arena region " + Hex(base) + " is empty but not one free block");
  EraseFree(fit);
  capacity_ -= r.bytes;
  regions_.erase(it->second);
  region_by_base_.erase(it);
  return Status::OK();
}

std::vector<std::pair<uintptr_t, uint64_t>> Arena::EmptyRegions() const {
  std::vector<std::pair<uintptr_t, uint64_t>> out;
  for (const auto& [id, r] : regions_)
    if (r.live == 0) out.emplace_back(r.base, r.bytes);
  return out;
}

void Arena::InsertFree(uintptr_t addr, uint64_t bytes, int region) {
  free_by_addr_.emplace(addr, FreeBlock{bytes, region});
  free_by_size_.emplace(bytes, addr);
}

void Arena::EraseFree(std::map<uintptr_t, FreeBlock>::iterator it) {
  free_by_size_.erase({it->second.bytes, it->first});
  free_by_addr_.erase(it);
}

uintptr_t Arena::Allocate(uint64_t bytes, bool from_top) {
  uint64_t need = RoundUp(bytes);
  if (need < bytes) {  // overflow
    ++failures_;
    return 0;
  }
  auto sit = free_by_size_.lower_bound({need, 0});
  if (sit == free_by_size_.end()) {
    ++failures_;
    return 0;
  }
  uintptr_t addr = sit->second;
  auto fit = free_by_addr_.find(addr);
  FreeBlock fb = fit->second;
  EraseFree(fit);
  if (fb.bytes > need) {
    if (from_top) {
      InsertFree(addr, fb.bytes - need, fb.region);
      addr += fb.bytes - need;
    } else {
      InsertFree(addr + need, fb.bytes - need, fb.region);
    }
  }
  live_.emplace(addr, Live{need, fb.region});
  regions_.at(fb.region).live++;
  used_ += need;
  peak_used_ = std::max(peak_used_, used_);
  ++allocations_;
  return addr;
}

Status Arena::Free(uintptr_t addr) {
  auto lit = live_.find(addr);
  if (lit == live_.end())
    return InvalidArgument("arena free of " + Hex(addr) + ", which is not a live block");
  uint64_t bytes = lit->second.bytes;
  int region = lit->second.region;
  live_.erase(lit);
  regions_.at(region).live--;
  used_ -= bytes;
  uintptr_t start = addr;
  uint64_t size = bytes;
  // Merge with the following free block of the same region.
  auto next = free_by_addr_.lower_bound(addr);
  if (next != free_by_addr_.end() && next->first == addr + bytes && next->second.region == region) {
    size += next->second.bytes;
    EraseFree(next);
  }
  // Merge with the preceding free block of the same region.
  auto after = free_by_addr_.lower_bound(addr);
  if (after != free_by_addr_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second.bytes == addr && prev->second.region == region) {
      start = prev->first;
      size += prev->second.bytes;
      EraseFree(prev);
    }
  }
  InsertFree(start, size, region);
  return Status::OK();
}

uint64_t Arena::BlockSize(uintptr_t addr) const {
  auto it = live_.find(addr);
  return it == live_.end() ? 0 : it->second.bytes;
}

ArenaStats Arena::stats() const {
  ArenaStats s;
  s.capacity = capacity_;
  s.used = used_;
  s.peak_used = peak_used_;
  s.free = capacity_ - used_;
  s.largest_free = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  s.free_blocks = free_by_addr_.size();
  s.live_blocks = live_.size();
  s.allocations = allocations_;
  s.failures = failures_;
  s.regions = static_cast<int>(regions_.size());
  return s;
}

}  // namespace strata
