// SPDX-License-Identifier: Apache-2.0
// TierStore: named tensors over GPU, pinned host and NVMe memory, moved
// between tiers asynchronously. The embeddable API of strata.
//
// MODEL
// - A tensor has a name, a DType, a Shape and a home tier (gpu, host or
//   nvme). Its home copy exists for the tensor's whole life and is the
//   backing store; copies on faster tiers (gpu is faster than host, host than
//   nvme) are caches, made on demand and dropped under budget pressure.
//   Copies are never kept on a tier slower than the home.
// - Contents are unspecified until first written (Acquire with a write mode,
//   then Release); loading an unwritten tensor moves no bytes.
// - Each copy is valid (holds the latest contents) or stale. Releasing a
//   copy dirty makes it the only valid one; the others become stale. Dirty
//   data is written back to the home tier before the last valid copy is
//   dropped (eviction) or on Flush. A failed write-back keeps the dirty copy:
//   no data is lost, the error is reported.
//
// ACCESS
// - Acquire(id, tier, access) waits until the copy on `tier` is valid (or,
//   for kWriteDiscard, allocated), pins it and returns a view valid until
//   the matching Release. gpu views are device pointers, host views host
//   pointers; nvme copies cannot be acquired (they have no address).
//   * kRead: shared with other readers on any tier.
//   * kReadWrite: exclusive (no other pin on any tier of the tensor).
//   * kWriteDiscard: exclusive; the copy is allocated but not loaded (for
//     activations and gradients that will be overwritten). The caller must
//     overwrite the whole tensor: at Release the copy becomes the tensor's
//     contents whether or not `dirty` is set.
//   A conflicting Acquire fails at once with FailedPrecondition naming the
//   holder; the store never waits for another caller's pin (so it cannot
//   deadlock on one). It does wait for its own transfers in flight.
// - A gpu view returned by Acquire is safe to use at once on any stream: the
//   copy into it has completed (the host waited for it). To overlap that wait
//   with compute, Prefetch early and Acquire late.
// - Release(id, tier, dirty, stream): with a `stream` (a cudaStream_t as
//   void*), the store records an event on it and orders every later use of
//   that memory after it: write-back copies wait for it on the GPU,
//   eviction and reuse of the memory for another tensor wait for it on the
//   host. Without a stream, the caller promises its work on the view is done.
//
// ASYNCHRONOUS MOVES
// - Prefetch(id, tier) and Evict(id, tier) return at once with a Ticket
//   (Wait, Poll). Moves run on the store's worker threads; the operations on
//   one tensor run in call order (an Acquire first finishes the moves queued
//   before it on that tensor, running queued ones on the calling thread
//   instead of waiting for a worker).
// - Multi-hop moves (nvme -> host -> gpu and back) are pipelined in chunks
//   through pinned staging buffers (or through the tensor's host copy when
//   one is allocated, which then becomes valid too), unseen by the caller.
// - A failed background move is reported by its ticket and, until reported,
//   at the next Acquire/Prefetch/Evict/Flush on that tensor ("sticky until
//   reported"), once. It is never turned into wrong data: the destination
//   copy stays stale and the source copy intact.
//
// BUDGETS AND EVICTION
// - Each tier's budget is exact (tiers/tier.h). When an allocation does not
//   fit, the store drops copies of other tensors on that tier: stale ones
//   first, then by policy — LRU by default; with EvictionPolicy::kNextUse the
//   copy whose hinted next use (SetNextUse) is farthest, copies without a
//   hint first. Home copies and pinned or busy copies are never dropped.
//   When nothing can be dropped the error is OutOfMemory naming the tier,
//   the bytes requested and the bytes available.
// - The host tier also holds `staging_buffers` x `staging_chunk_bytes` of
//   staging, taken from its budget at Open.
//
// THREAD-SAFETY
// - Every method may be called from any thread. Bookkeeping is under one
//   mutex held for microseconds (longer only when a tier maps a new slab:
//   cudaMalloc or pinning, once per slab); transfers run outside it. Views are plain
//   pointers: synchronizing the caller's own use of a view between its
//   threads is the caller's business.
// - Tickets may be waited on from any thread, and outlive the store.
//
// OWNERSHIP
// - The store owns its tiers, copy engine, workers and all tensor memory.
//   Views must not be used after the store is destroyed; destroying it
//   cancels queued moves (their tickets report Cancelled) and waits for
//   running ones.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/access.h"
#include "base/dtype.h"
#include "base/shape.h"
#include "base/status.h"
#include "base/tier_kind.h"
#include "tiers/copy_engine.h"
#include "tiers/gpu_tier.h"
#include "tiers/host_tier.h"
#include "tiers/nvme/nvme_tier.h"

namespace strata {

struct TensorId {
  uint64_t value = 0;  // 0 is never a tensor
  bool valid() const { return value != 0; }
  bool operator==(const TensorId& o) const { return value == o.value; }
  bool operator!=(const TensorId& o) const { return value != o.value; }
};

enum class EvictionPolicy : uint8_t {
  kLru,      // least recently used copy first
  kNextUse,  // farthest next use first (SetNextUse); no hint = never used again
};

struct TensorView {
  void* data = nullptr;   // device pointer for gpu, host pointer for host
  uint64_t bytes = 0;     // numel * dtype size
  DType dtype = DType::kF32;
  Shape shape;
  TierKind tier = TierKind::kHost;
  TensorId id;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t bytes = 0;
  TierKind home = TierKind::kHost;
  bool written = false;  // has been written at least once
  struct CopyInfo {
    bool allocated = false;
    bool valid = false;
    bool dirty = false;   // valid and newer than the home copy
    int readers = 0;
    bool writer = false;
  } copies[kNumTiers];
  std::optional<uint64_t> next_use;
};

namespace detail {
struct TicketState;
}

// The handle of one Prefetch/Evict/Flush. Copyable; a default-constructed
// ticket is complete and OK.
class Ticket {
 public:
  Ticket() = default;
  // Blocks until the move has finished; its status. Reporting a failure here
  // counts as reporting it (the next call on the tensor will not repeat it).
  Status Wait() const;
  // True when finished OK, false while pending, the error when it failed
  // (which then counts as reported).
  Result<bool> Poll() const;

 private:
  friend class TierStore;
  explicit Ticket(std::shared_ptr<detail::TicketState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::TicketState> state_;
};

struct TierStoreOptions {
  bool gpu = true;                      // have a gpu tier (the stand-in without a GPU)
  GpuTierOptions gpu_tier;
  HostTierOptions host_tier;            // on_map/on_unmap are set by the store
  std::optional<NvmeOptions> nvme;      // an nvme tier when set
  CopyEngineOptions copy;               // device and stand-in follow gpu_tier
  uint64_t staging_chunk_bytes = 8 * kMiB;  // multi-hop pieces, multiple of 4096
  int staging_buffers = 8;              // pinned staging buffers in all
  int staging_per_move = 4;             // taken by each gpu<->nvme move (>= 2): its pipeline depth
  int worker_threads = 2;               // run Prefetch/Evict/Flush moves
  EvictionPolicy eviction = EvictionPolicy::kLru;
  bool register_host_buffers = true;    // NvmeTier::RegisterBuffer for host slabs
};

struct LinkStats {
  uint64_t bytes = 0;
  uint64_t transfers = 0;
  double seconds = 0;  // summed wall time of the transfers (they may overlap)
  double gb_per_s() const { return seconds > 0 ? bytes / seconds / 1e9 : 0.0; }
};

struct TierStoreStats {
  // Per link and direction. A gpu<->nvme move through staging counts on both
  // of its links.
  LinkStats gpu_to_host, host_to_gpu, host_to_nvme, nvme_to_host;
  struct PerTier {
    uint64_t hits = 0;        // Acquire/Prefetch found a valid copy
    uint64_t misses = 0;      // ... had to load (or allocate) it
    uint64_t evictions = 0;   // copies dropped (budget pressure or Evict)
    uint64_t writebacks = 0;  // dirty copies written home before a drop
    uint64_t writeback_bytes = 0;
    uint64_t resident = 0;    // allocated copies now (homes included)
    TierUsage usage;          // the tier's own accounting (zero without the tier)
  } tiers[kNumTiers];
  uint64_t tensors = 0;
  uint64_t acquires = 0, releases = 0, prefetches = 0, evicts = 0, flushes = 0;
  uint64_t queue_depth = 0;      // moves queued or running now
  uint64_t max_queue_depth = 0;
  uint64_t failures = 0;         // background moves that failed
  CopyEngineStats copy;
  NvmeStats nvme;
};

class TierStore {
 public:
  static Result<std::unique_ptr<TierStore>> Open(TierStoreOptions options);
  ~TierStore();
  TierStore(const TierStore&) = delete;
  TierStore& operator=(const TierStore&) = delete;

  // ---- tensors ----
  // AlreadyExists for a taken name; InvalidArgument for an empty name, an
  // absent home tier; OutOfMemory when the home tier cannot hold it (after
  // dropping caches).
  Result<TensorId> Create(std::string name, DType dtype, const Shape& shape, TierKind home);
  Result<TensorId> Find(std::string_view name) const;
  // Frees every copy. FailedPrecondition while a copy is pinned.
  Status Remove(TensorId id);
  Result<TensorInfo> Info(TensorId id) const;

  // ---- access ----
  Result<TensorView> Acquire(TensorId id, TierKind tier, Access access);
  // `dirty`: the view was written (only with a write mode). `stream`:
  // cudaStream_t whose queued work uses the view (nullptr: none).
  Status Release(TensorId id, TierKind tier, bool dirty, void* stream = nullptr);

  // ---- asynchronous moves ----
  // Makes the copy on `tier` valid. A hit returns a completed ticket.
  Result<Ticket> Prefetch(TensorId id, TierKind tier);
  // Drops the copy on `tier` (never the home), writing it back first when it
  // holds the only valid data. FailedPrecondition when pinned.
  Result<Ticket> Evict(TensorId id, TierKind tier);
  // Writes the latest contents to the home copy; keeps every copy.
  Result<Ticket> Flush(TensorId id);
  // Flush of every tensor; waits; the first error.
  Status FlushAll();

  // ---- eviction hints ----
  // The caller's logical time of the tensor's next use (with kNextUse).
  Status SetNextUse(TensorId id, uint64_t tick);
  Status ClearNextUse(TensorId id);

  // ---- convenience: whole-tensor copies to and from host memory ----
  // Write goes through a host copy (or the gpu copy of a gpu-home tensor) and
  // leaves it dirty; Read loads such a copy.
  Status Write(TensorId id, const void* src, uint64_t bytes);
  Status Read(TensorId id, void* dst, uint64_t bytes);

  TierStoreStats stats() const;
  GpuTier* gpu_tier() const;      // nullptr without a gpu tier
  HostTier* host_tier() const;
  NvmeTier* nvme_tier() const;    // nullptr without an nvme tier
  CopyEngine* copy_engine() const;  // nullptr without a gpu tier

 private:
  TierStore() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
