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

#include "tiers/bytes.h"
#include "tiers/slab_tier.h"
#include "tiers/thread_annotations.h"

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

// RLIMIT_MEMLOCK's soft limit in bytes (UINT64_MAX for unlimited).
uint64_t MemlockLimit();
// True when the process may lock memory beyond RLIMIT_MEMLOCK (CAP_IPC_LOCK).
bool HasIpcLockCapability();

}  // namespace strata
