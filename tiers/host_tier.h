// SPDX-License-Identifier: Apache-2.0
// HostTier: pinned, NUMA-local host memory, pooled in slabs, within an exact
// byte budget.
//
// - Slabs are mmap'd, bound to a NUMA node with hwloc before their pages are
//   touched, and pinned once: with cudaHostRegister (portable) when a GPU is
//   usable, else with mlock. They are reused for the life of the tier; no
//   transfer pins or unpins anything. `pin = false` (DeepSpeed
//   `pin_memory: false`) keeps ordinary pageable memory.
// - mlock needs RLIMIT_MEMLOCK (or CAP_IPC_LOCK). When the limit is below the
//   budget Open fails at once, and when mlock is refused later the error names
//   the limit's current value and how to raise it; the tier never silently
//   runs unpinned.
// - Blocks are 4096-byte aligned (page size, and what O_DIRECT needs) and
//   their sizes are multiples of 4096.
// - `on_map`/`on_unmap` see every slab: the TierStore registers them with
//   the NvmeTier (RegisterBuffer) so NVMe I/O into host blocks uses fixed
//   buffers. A failing on_map does not fail the allocation (I/O still works,
//   unregistered); registration_status() keeps the first failure.
//
// Ownership: the tier owns its slabs and unpins/unmaps them at destruction;
// every TierBlock must be gone by then.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "base/bytes.h"
#include "base/thread_annotations.h"
#include "tiers/slab_tier.h"

namespace strata {

enum class NumaPlacement : uint8_t {
  kNearGpu,        // the node of GPU `gpu_device` (by PCI bus id); without a GPU: kCallingThread
  kCallingThread,  // the node of the CPU that calls Open
  kNode,           // `numa_node`
  kNone,           // no binding: the kernel's default policy
};

enum class PinMethod : uint8_t {
  kAuto,   // cudaHostRegister when a GPU is usable, else mlock
  kCuda,   // cudaHostRegister (Unavailable without a usable GPU)
  kMlock,  // mlock (needs RLIMIT_MEMLOCK >= budget, or CAP_IPC_LOCK)
};

// Transparent huge pages (2 MiB) for host memory. A pass that streams many
// large arrays (the CPU Adam: master, m, v, gradient, copy) touches a new
// 4 KiB page every 64 cache lines per array; with 2 MiB pages its dTLB
// misses and page walks all but vanish, and pinning tracks 512x fewer pages.
enum class HostHugePages : uint8_t {
  // madvise(MADV_HUGEPAGE) on the slab wherever mmap placed it: only the
  // whole 2 MiB-aligned stretches inside it can be huge (the default; what
  // the tier always did).
  kAdvise,
  // The slab is mapped 2 MiB-aligned, then madvise(MADV_HUGEPAGE), before
  // any page is touched: all of it can be huge. Off by default until
  // measured (scripts/adam-sweep.sh).
  kAligned,
  // madvise(MADV_NOHUGEPAGE): 4 KiB pages only (for comparison).
  kOff,
};
std::string_view HostHugePagesName(HostHugePages h);  // "advise", "aligned", "off"

struct HostTierOptions {
  // Bytes this tier may hand out and pin. 0: half of the machine's memory.
  uint64_t budget_bytes = 0;
  // Growth step, at most 1 GiB (the largest buffer io_uring registers).
  uint64_t slab_bytes = 256 * kMiB;
  bool pin = true;                 // DeepSpeed pin_memory
  PinMethod pin_method = PinMethod::kAuto;
  bool reserve_all = false;        // map and pin the whole budget at Open
  NumaPlacement numa = NumaPlacement::kNearGpu;
  int numa_node = -1;              // with kNode
  int gpu_device = 0;              // with kNearGpu, and the device cudaHostRegister runs on
  // Huge pages for the slabs (see HostHugePages). The kernel only obliges
  // when /sys/kernel/mm/transparent_hugepage/enabled is "always" or
  // "madvise"; pinning (mlock, cudaHostRegister) faults the pages in, after
  // the advice, so a pinned kAligned slab is backed by huge pages at once.
  HostHugePages huge_pages = HostHugePages::kAdvise;
  std::function<Status(void* base, uint64_t bytes)> on_map;  // after a slab is mapped and pinned
  std::function<void(void* base)> on_unmap;                  // before a slab is unpinned
};

class HostTier final : public SlabTier {
 public:
  // InvalidArgument for bad options; OutOfMemory naming RLIMIT_MEMLOCK when
  // mlock cannot pin the budget; Unavailable for kCuda without a GPU.
  static Result<std::unique_ptr<HostTier>> Open(const HostTierOptions& options);
  ~HostTier() override;

  bool device_memory() const override { return false; }
  bool pinned() const override { return pin_ != Pin::kNone; }
  // "cudaHostRegister", "mlock" or "none".
  std::string_view pin_method() const;
  // The node slabs are bound to, or -1 (none / unknown).
  int numa_node() const { return numa_node_; }
  // OK, or the first failure of on_map or of NUMA binding.
  Status registration_status() const;

 protected:
  Result<void*> MapSlab(uint64_t bytes) override;
  void UnmapSlab(void* base, uint64_t bytes) override;

 private:
  enum class Pin : uint8_t { kNone, kCuda, kMlock };
  HostTier(SlabTierConfig config, const HostTierOptions& options, Pin pin, int node);

  const HostTierOptions options_;
  const Pin pin_;
  const int numa_node_;
  mutable std::mutex status_mu_;
  Status registration_status_ GUARDED_BY(status_mu_);
};

// ---- host memory outside the tier (benchmarks, the CPU Adam's own buffers) ----

// An anonymous private mapping, unmapped at destruction. Move-only.
class HostMapping {
 public:
  HostMapping() = default;
  // Takes ownership of [data, data + bytes), a region from mmap.
  HostMapping(void* data, uint64_t bytes) : data_(data), bytes_(bytes) {}
  HostMapping(HostMapping&& o) noexcept;
  HostMapping& operator=(HostMapping&& o) noexcept;
  HostMapping(const HostMapping&) = delete;
  HostMapping& operator=(const HostMapping&) = delete;
  ~HostMapping();
  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// Maps `bytes` (> 0) of anonymous memory, 2 MiB-aligned, with the huge-page
// advice of `huge_pages` given before any page is touched; with `prefault`
// every page is faulted in (written) before it returns, by the calling
// thread, so NUMA first touch places it on that thread's node (callers that
// want the pages where their workers run leave it false and touch them from
// those threads). OutOfMemory naming the size and errno when mmap fails;
// InvalidArgument for 0 bytes.
Result<HostMapping> MapHostMemory(uint64_t bytes, HostHugePages huge_pages, bool prefault = false);

// The active word of /sys/kernel/mm/transparent_hugepage/enabled: "always",
// "madvise" or "never"; "" when the file is missing or unreadable.
std::string TransparentHugePagesSetting();
// True when this process may get transparent huge pages at all: the setting
// is "always" or "madvise" and prctl(PR_GET_THP_DISABLE) is off.
bool TransparentHugePagesUsable();
// AnonHugePages of the whole process (/proc/self/smaps_rollup), in bytes.
Result<uint64_t> ProcessAnonHugePages();
// AnonHugePages of the mapping (VMA) that contains `p` (/proc/self/smaps),
// in bytes. Adjacent mappings with the same flags may have been merged into
// one VMA. NotFound when no mapping contains p.
Result<uint64_t> AnonHugePagesOfMapping(const void* p);

// RLIMIT_MEMLOCK's soft limit in bytes (UINT64_MAX for unlimited).
uint64_t MemlockLimit();
// OK when mlock may pin `bytes` (RLIMIT_MEMLOCK allows it, or CAP_IPC_LOCK);
// else the OutOfMemory HostTier::Open gives, naming the limit and how to
// raise it (a run checks this before it starts: engine/preflight.h).
Status CheckMlockLimit(uint64_t bytes);
// True when the process may lock memory beyond RLIMIT_MEMLOCK (CAP_IPC_LOCK).
bool HasIpcLockCapability();

}  // namespace strata
