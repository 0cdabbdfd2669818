// SPDX-License-Identifier: Apache-2.0
// BufferTable: the caller's buffers registered with io_uring for fixed-buffer
// I/O (IORING_OP_{READ,WRITE}_FIXED), mirrored in every ring of the tier.
//
// Each ring has a sparse table of kSlots buffer slots (Linux 5.19+). A
// registered range takes one slot per GiB (the kernel's limit for one
// registered buffer), the same slots in every ring. When the kernel refuses
// (no sparse table, RLIMIT_MEMLOCK too low to pin the pages, all slots used)
// the reason is noted and the range is still accepted: its transfers use
// unregistered I/O, and registered_bytes() says what the kernel took.
//
// Ownership: the table holds the slot bookkeeping; the buffers are the
// caller's, the io_urings the rings' (not owned; they outlive the table), the
// IoEnv the tier's.
//
// Thread-safety: all methods may be called from any thread. Find runs on
// the rings' I/O threads for every piece; Register and Unregister make their
// io_uring_register calls (which may pin pages for a while) without the
// table's mutex held, so lookups never wait for them.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_annotations.h"

struct io_uring;

namespace strata {
class IoEnv;
}

namespace strata::nvme {

class BufferTable {
 public:
  static constexpr unsigned kSlots = 64;             // buffer slots per ring
  static constexpr uint64_t kMaxSlotBytes = 1ull << 30;  // the kernel's limit for one buffer

  // `enabled` false: the rings have no sparse table (every range is accepted
  // and none is registered with the kernel; noted once at Open).
  BufferTable(IoEnv* env, std::vector<io_uring*> rings, bool enabled);
  BufferTable(const BufferTable&) = delete;
  BufferTable& operator=(const BufferTable&) = delete;

  // InvalidArgument for an empty range, one that wraps around the address
  // space, or one overlapping a registered range. Refusals of the kernel are
  // noted, not errors (see above).
  Status Register(void* base, uint64_t bytes);
  // `base` as registered; anything else is noted and ignored.
  void Unregister(void* base);

  // The slot holding [buf, buf + len) in every ring, or -1.
  int Find(const void* buf, uint64_t len) const;

  bool enabled() const { return enabled_; }
  uint64_t registered_bytes() const { return registered_bytes_.load(std::memory_order_relaxed); }

 private:
  // A registered range; `slots` empty when the kernel refused it.
  struct Registration {
    uint64_t bytes = 0;
    std::vector<unsigned> slots;
  };
  struct Slot {
    uintptr_t end = 0;
    unsigned index = 0;
  };

  // Claims [a, a + bytes) in regs_; InvalidArgument when it overlaps.
  Status ClaimRange(uintptr_t a, uint64_t bytes) REQUIRES(mu_);
  // Marks `need` free slots used into `slots`; the reason when too few are free.
  std::string ClaimSlots(size_t need, std::vector<unsigned>* slots) REQUIRES(mu_);
  // Sets `slots` to the range's GiB pieces in every ring; the kernel's
  // reason when it refuses one.
  std::string FillSlotsInKernel(uintptr_t a, uint64_t bytes, const std::vector<unsigned>& slots);
  // Empties `slots` in every ring's table.
  void ClearSlotsInKernel(const std::vector<unsigned>& slots);

  IoEnv* const env_;
  const std::vector<io_uring*> rings_;
  const bool enabled_;

  mutable std::mutex mu_;
  std::map<uintptr_t, Registration> regs_ GUARDED_BY(mu_);  // by base address
  std::map<uintptr_t, Slot> slots_ GUARDED_BY(mu_);         // by slot start address
  std::vector<bool> slot_used_ GUARDED_BY(mu_);
  // Bytes the kernel took. Relaxed: a counter, and Find's fast path (a
  // registration racing with it only means one more unregistered I/O).
  std::atomic<uint64_t> registered_bytes_{0};
};

}  // namespace strata::nvme
