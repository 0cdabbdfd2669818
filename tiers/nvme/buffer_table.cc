// SPDX-License-Identifier: Apache-2.0
// BufferTable: registering and looking up fixed buffers
// (tiers/nvme/buffer_table.h).
#include "tiers/nvme/buffer_table.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "base/bytes.h"
#include "tiers/nvme/common.h"
#include "tiers/nvme/io_env.h"

namespace strata::nvme {

BufferTable::BufferTable(IoEnv* env, std::vector<io_uring*> rings, bool enabled)
    : env_(env), rings_(std::move(rings)), enabled_(enabled) {
  std::lock_guard<std::mutex> l(mu_);
  slot_used_.assign(kSlots, false);
}

int BufferTable::Find(const void* buf, uint64_t len) const {
  // Fast path without the lock when nothing is registered (a registration
  // racing with this only means one more unregistered I/O).
  if (!enabled_ || registered_bytes_.load(std::memory_order_relaxed) == 0) return -1;
  const uintptr_t a = reinterpret_cast<uintptr_t>(buf);
  std::lock_guard<std::mutex> l(mu_);
  auto it = slots_.upper_bound(a);
  if (it == slots_.begin()) return -1;
  --it;
  if (a + len <= it->second.end) return static_cast<int>(it->second.index);
  return -1;
}

Status BufferTable::ClaimRange(uintptr_t a, uint64_t bytes) {
  auto next = regs_.lower_bound(a);
  auto overlap = [&](uintptr_t other) {
    return InvalidArgument("NvmeTier::RegisterBuffer: [" + Hex(a) + ", " + Hex(a + bytes) +
                           ") overlaps the registered buffer at " + Hex(other));
  };
  if (next != regs_.end() && next->first < a + bytes) return overlap(next->first);
  if (next != regs_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > a) return overlap(prev->first);
  }
  regs_.emplace(a, Registration{bytes, {}});  // the slots come later
  return Status::OK();
}

std::string BufferTable::ClaimSlots(size_t need, std::vector<unsigned>* slots) {
  for (unsigned s = 0; s < kSlots && slots->size() < need; ++s)
    if (!slot_used_[s]) slots->push_back(s);
  if (slots->size() < need) {
    slots->clear();
    return "all " + std::to_string(kSlots) + " buffer slots are in use";
  }
  for (unsigned s : *slots) slot_used_[s] = true;
  return {};
}

std::string BufferTable::FillSlotsInKernel(uintptr_t a, uint64_t bytes,
                                           const std::vector<unsigned>& slots) {
  for (size_t i = 0; i < slots.size(); ++i) {
    const uint64_t off = i * kMaxSlotBytes;
    iovec iov{reinterpret_cast<void*>(a + off), std::min(kMaxSlotBytes, bytes - off)};
    for (io_uring* r : rings_) {
      int rc = env_->UpdateBuffers(r, slots[i], &iov, 1);
      if (rc < 0)
        return std::string(strerror(-rc)) +
               (rc == -ENOMEM ? " (is RLIMIT_MEMLOCK too low for io_uring to pin it?)" : "");
    }
  }
  return {};
}

// Called without mu_: the registration syscalls may take a while (pinning
// pages), and ring threads look up slots under mu_ for every piece.
void BufferTable::ClearSlotsInKernel(const std::vector<unsigned>& slots) {
  iovec empty{nullptr, 0};
  for (unsigned s : slots)
    for (io_uring* r : rings_) {
      int rc = env_->UpdateBuffers(r, s, &empty, 1);
      if (rc < 0) Note("clearing registered buffer slot failed: " + std::string(strerror(-rc)));
    }
}

Status BufferTable::Register(void* base, uint64_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(base);
  if (base == nullptr || bytes == 0)
    return InvalidArgument("NvmeTier::RegisterBuffer: empty range");
  if (bytes > UINTPTR_MAX - a)
    return InvalidArgument("NvmeTier::RegisterBuffer: range wraps around the address space");
  std::vector<unsigned> slots;
  std::string refused;
  {
    std::lock_guard<std::mutex> l(mu_);
    RETURN_IF_ERROR(ClaimRange(a, bytes));
    if (!enabled_) return Status::OK();  // noted once at Open
    refused = ClaimSlots((bytes + kMaxSlotBytes - 1) / kMaxSlotBytes, &slots);
  }
  if (refused.empty()) refused = FillSlotsInKernel(a, bytes, slots);
  if (!refused.empty()) {
    ClearSlotsInKernel(slots);
    Note("registering buffer [" + Hex(a) + ", +" + FormatBytes(bytes) +
         ") with io_uring failed: " + refused + "; its transfers use unregistered I/O");
  }
  std::lock_guard<std::mutex> l(mu_);
  if (!refused.empty()) {
    for (unsigned s : slots) slot_used_[s] = false;
    return Status::OK();
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    const uintptr_t start = a + i * kMaxSlotBytes;
    slots_[start] = Slot{start + std::min(kMaxSlotBytes, bytes - i * kMaxSlotBytes), slots[i]};
  }
  auto it = regs_.find(a);
  if (it != regs_.end()) it->second.slots = slots;
  registered_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return Status::OK();
}

void BufferTable::Unregister(void* base) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(base);
  std::vector<unsigned> slots;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = regs_.find(a);
    if (it == regs_.end()) {
      Note("UnregisterBuffer of " + Hex(a) + ", which is not registered: ignored");
      return;
    }
    slots = it->second.slots;
    for (size_t i = 0; i < slots.size(); ++i) slots_.erase(a + i * kMaxSlotBytes);
    if (!slots.empty()) registered_bytes_.fetch_sub(it->second.bytes, std::memory_order_relaxed);
    regs_.erase(it);
  }
  ClearSlotsInKernel(slots);
  std::lock_guard<std::mutex> l(mu_);
  for (unsigned s : slots) slot_used_[s] = false;
}

}  // namespace strata::nvme
