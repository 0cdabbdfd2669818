// SPDX-License-Identifier: Apache-2.0
// The tier store's private half, for tiers/tier_store*.cc alone: a tensor's
// bookkeeping and TierStore::Impl, whose members are defined in
//   tier_store.cc            tickets, and the public methods (validation,
//                            then the Impl calls below)
//   tier_store_residency.cc  which copies exist: LoadLocked makes one copy
//                            valid (chooses a source, allocates, transfers
//                            outside the lock), EnsureAllocated finds room by
//                            the eviction policy, DropCopy writes back if
//                            needed, waits for release events and frees
//   tier_store_transfers.cc  the transfers themselves, no lock held (Hop: one
//                            link; Staged: gpu <-> nvme through staging
//                            buffers)
//   tier_store_jobs.cc       the asynchronous moves: per-tensor call order,
//                            the worker threads, Drain
// Thread-safety: what is marked GUARDED_BY(mu) is touched under Impl::mu;
// a Tensor's fields are all guarded by it.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/bytes.h"
#include "base/status.h"
#include "base/thread_annotations.h"
#include "tiers/gpu_event.h"
#include "tiers/tier_store.h"

namespace strata {

namespace detail {

struct TicketState {
  std::mutex mu;
  std::condition_variable cv;
  bool done GUARDED_BY(mu) = false;
  Status status GUARDED_BY(mu);
  // Set by whoever hands a failure to the caller first (Ticket::Wait/Poll or
  // the next call on the tensor), so it is reported once. exchange() is the
  // only operation; relaxed would do, the default is clearer.
  std::atomic<bool> reported{false};
  std::string what;  // "prefetch of 'w' to gpu"

  void Complete(Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    done = true;
    cv.notify_all();
  }
  Status Get() {
    std::lock_guard<std::mutex> lock(mu);
    return status;
  }
};

}  // namespace detail

namespace tier_store_internal {

constexpr uint64_t kNoHint = UINT64_MAX;
constexpr int kGpu = 0, kHost = 1, kNvme = 2;
inline int Ix(TierKind k) { return static_cast<int>(k); }
inline TierKind Kind(int i) { return static_cast<TierKind>(i); }
inline std::string TierStr(int i) { return std::string(TierName(Kind(i))); }

using EventRef = std::shared_ptr<GpuEvent>;

// One tier's copy of a tensor.
struct CopySlot {
  TierBlock block;       // gpu / host memory
  Extent extent;         // nvme (home only)
  bool valid = false;    // holds the latest contents
  int readers = 0;       // caller pins for reading
  bool writer = false;   // caller pin for writing
  bool discard = false;  // the writer acquired with kWriteDiscard
  int io = 0;            // transfers in flight reading this copy (or waiting on its events)
  bool loading = false;  // a transfer into this copy is claimed or in flight
  uint64_t last_use = 0;
  std::vector<EventRef> events;  // Release(stream) events not yet known complete

  bool allocated() const { return static_cast<bool>(block) || extent.valid(); }
  bool pinned() const { return readers > 0 || writer; }
  bool busy() const { return io > 0 || loading; }
};

struct Job {
  enum Kind { kLoad, kEvict, kFlush } kind = kLoad;
  int tier = kHost;
  std::shared_ptr<detail::TicketState> ticket;
};

struct Tensor {
  uint64_t id = 0;
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t bytes = 0;
  int home = kHost;
  CopySlot copies[kNumTiers];
  bool initialized = false;  // written at least once
  uint64_t next_use = kNoHint;
  std::shared_ptr<detail::TicketState> failure;  // first unreported background failure
  std::deque<Job> jobs;                          // queued moves, in call order
  bool job_running = false;
  bool in_ready = false;  // listed in Impl::ready

  bool AnyWriter() const {
    for (const auto& c : copies)
      if (c.writer) return true;
    return false;
  }
  bool AnyPinned() const {
    for (const auto& c : copies)
      if (c.pinned()) return true;
    return false;
  }
  bool AnyBusy() const {
    for (const auto& c : copies)
      if (c.busy()) return true;
    return false;
  }
  // The only valid copy is the one on `tier`.
  bool OnlyValid(int tier) const {
    if (!copies[tier].valid) return false;
    for (int k = 0; k < kNumTiers; ++k)
      if (k != tier && copies[k].valid) return false;
    return true;
  }
  std::string Holder() const {
    for (int k = 0; k < kNumTiers; ++k) {
      if (copies[k].writer) return "acquired for writing on " + TierStr(k);
      if (copies[k].readers) return "acquired for reading on " + TierStr(k);
    }
    return "not acquired";
  }
};

enum Link { kGpuToHost = 0, kHostToGpu, kHostToNvme, kNvmeToHost, kNumLinks };

struct LinkDelta {
  uint64_t bytes[kNumLinks] = {};
  uint64_t count[kNumLinks] = {};
  double seconds[kNumLinks] = {};
  void Add(Link l, uint64_t b, double s) {
    bytes[l] += b;
    count[l] += 1;
    seconds[l] += s;
  }
};

// A copy as seen by a transfer running without the lock.
struct Side {
  int tier = kHost;
  uint8_t* ptr = nullptr;
  Extent extent;
  std::vector<EventRef> events;
};

inline Status SyncAll(const std::vector<EventRef>& events) {
  for (const auto& e : events) RETURN_IF_ERROR(e->Synchronize());
  return Status::OK();
}

inline void RemoveEvents(CopySlot& c, const std::vector<EventRef>& done) {
  if (done.empty()) return;
  c.events.erase(std::remove_if(c.events.begin(), c.events.end(),
                                [&](const EventRef& e) {
                                  return std::find(done.begin(), done.end(), e) != done.end();
                                }),
                 c.events.end());
}

}  // namespace tier_store_internal

struct TierStore::Impl {
  using Tensor = tier_store_internal::Tensor;
  using Job = tier_store_internal::Job;
  using Side = tier_store_internal::Side;
  using LinkDelta = tier_store_internal::LinkDelta;
  using EventRef = tier_store_internal::EventRef;

  TierStoreOptions options;
  // Declaration order is destruction order reversed: tensors and staging go
  // first, then the engine, the host tier (whose slabs unregister from the
  // NVMe tier), the gpu tier, and the NVMe tier last.
  std::unique_ptr<NvmeTier> nvme;
  std::unique_ptr<GpuTier> gpu;
  std::unique_ptr<HostTier> host;
  std::unique_ptr<CopyEngine> engine;
  std::unique_ptr<EventPool> event_pool;  // events for Release(stream)

  // Staging buffers for gpu<->nvme moves (host tier blocks).
  std::mutex staging_mu;
  std::condition_variable staging_cv;
  std::vector<TierBlock> staging_blocks;
  std::vector<uint8_t*> staging_free GUARDED_BY(staging_mu);

  mutable std::mutex mu;
  std::condition_variable cv;       // any copy's state changed
  std::condition_variable work_cv;  // a tensor became ready for a worker
  std::unordered_map<uint64_t, std::unique_ptr<Tensor>> tensors GUARDED_BY(mu);
  std::unordered_map<std::string, uint64_t> by_name GUARDED_BY(mu);
  std::unordered_set<Tensor*> resident[kNumTiers] GUARDED_BY(mu);  // non-home copies allocated
  std::deque<Tensor*> ready GUARDED_BY(mu);
  uint64_t next_id GUARDED_BY(mu) = 1;
  uint64_t clock GUARDED_BY(mu) = 0;
  int transfers_on[kNumTiers] GUARDED_BY(mu) = {};
  bool stop GUARDED_BY(mu) = false;
  std::vector<std::thread> workers;

  // Statistics (under mu).
  LinkStats links[tier_store_internal::kNumLinks] GUARDED_BY(mu);
  TierStoreStats::PerTier counters[kNumTiers] GUARDED_BY(mu);
  uint64_t n_acquires GUARDED_BY(mu) = 0, n_releases GUARDED_BY(mu) = 0,
           n_prefetches GUARDED_BY(mu) = 0, n_evicts GUARDED_BY(mu) = 0,
           n_flushes GUARDED_BY(mu) = 0, n_failures GUARDED_BY(mu) = 0;
  uint64_t queue_depth GUARDED_BY(mu) = 0, max_queue_depth GUARDED_BY(mu) = 0;

  ~Impl();

  MemoryTier* Mem(int tier) const {
    if (tier == tier_store_internal::kGpu) return gpu.get();
    return host.get();
  }
  bool HasTier(int tier) const {
    switch (tier) {
      case tier_store_internal::kHost: return true;
      case tier_store_internal::kGpu: return gpu != nullptr;
      case tier_store_internal::kNvme: return nvme != nullptr;
      default: return false;
    }
  }
  uint64_t CopyBytes(const Tensor& t, int tier) const {
    uint64_t b = std::max<uint64_t>(t.bytes, 1);
    return tier == tier_store_internal::kGpu ? b : AlignUp(b, 4096);  // host and nvme: whole pages for O_DIRECT
  }

  Result<Tensor*> Lookup(TensorId id) const REQUIRES(mu);
  Status TakeFailure(Tensor* t) REQUIRES(mu);
  Status CheckTier(const Tensor& t, int tier, bool acquire) const;

  Status LoadLocked(std::unique_lock<std::mutex>& lock, Tensor* t, int dst, bool* hit) REQUIRES(mu);
  Status EnsureAllocated(std::unique_lock<std::mutex>& lock, Tensor* t, int tier) REQUIRES(mu);
  Tensor* PickVictim(int tier, const Tensor* requester, const std::unordered_set<Tensor*>& skip) REQUIRES(mu);
  Status DropCopy(std::unique_lock<std::mutex>& lock, Tensor* v, int tier) REQUIRES(mu);
  Side SideOf(Tensor* t, int tier) REQUIRES(mu);
  void FreeCopy(Tensor* t, int tier) REQUIRES(mu);

  // Transfers (no lock held).
  Status Hop(const Side& s, const Side& d, uint64_t bytes, LinkDelta& delta);
  Status Staged(const Side& s, const Side& d, uint64_t bytes, LinkDelta& delta);
  Status EngineCopy(CopyDirection dir, void* dst, const void* src, uint64_t bytes,
                    const std::vector<EventRef>& a, const std::vector<EventRef>& b, CopyTicket* out);
  std::vector<uint8_t*> TakeStaging(size_t n);
  void GiveStaging(const std::vector<uint8_t*>& bufs);

  // Asynchronous moves.
  Ticket Enqueue(Tensor* t, Job::Kind kind, int tier, std::string what) REQUIRES(mu);
  void RunNextJob(std::unique_lock<std::mutex>& lock, Tensor* t) REQUIRES(mu);
  void Drain(std::unique_lock<std::mutex>& lock, Tensor* t) REQUIRES(mu);
  void WorkerLoop();
};

}  // namespace strata
