// SPDX-License-Identifier: Apache-2.0
// TierStore implementation. Contents:
//   TicketState / Ticket          completion of one asynchronous move
//   Tensor, CopySlot, Job         the bookkeeping, all guarded by Impl::mu
//   Impl::LoadLocked              make one copy valid (the heart: choose a
//                                 source, allocate, transfer outside the lock)
//   Impl::EnsureAllocated         allocate on a tier, evicting by policy
//   Impl::DropCopy                write back if needed, wait for release
//                                 events, free
//   Impl::Hop / Staged            the transfers themselves (no lock held)
//   workers, Drain                per-tensor call order for async moves
//   public methods                validation, then the above
#include "tiers/tier_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/cuda_check.h"
#include "base/thread_annotations.h"
#include "base/trace.h"
#include "tiers/gpu_event.h"

namespace strata {

// ---- tickets ------------------------------------------------------------------

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

Status Ticket::Wait() const {
  if (!state_) return Status::OK();
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (!state_->status.ok()) state_->reported.store(true);
  return state_->status;
}

Result<bool> Ticket::Poll() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->done) return false;
  if (!state_->status.ok()) {
    state_->reported.store(true);
    return state_->status;
  }
  return true;
}

// ---- bookkeeping --------------------------------------------------------------

namespace {

constexpr uint64_t kNoHint = UINT64_MAX;
constexpr int kGpu = 0, kHost = 1, kNvme = 2;
int Ix(TierKind k) { return static_cast<int>(k); }
TierKind Kind(int i) { return static_cast<TierKind>(i); }
std::string TierStr(int i) { return std::string(TierName(Kind(i))); }

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

// Completion of one asynchronous NVMe write in a pipeline.
struct Latch {
  std::mutex mu;
  std::condition_variable cv;
  bool pending = false;
  Status status;
  void Start() {
    std::lock_guard<std::mutex> l(mu);
    pending = true;
  }
  void Done(Status s) {
    std::lock_guard<std::mutex> l(mu);
    if (status.ok()) status = std::move(s);
    pending = false;
    cv.notify_all();
  }
  Status Wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return !pending; });
    return status;
  }
};

Status SyncAll(const std::vector<EventRef>& events) {
  for (const auto& e : events) RETURN_IF_ERROR(e->Synchronize());
  return Status::OK();
}

void RemoveEvents(CopySlot& c, const std::vector<EventRef>& done) {
  if (done.empty()) return;
  c.events.erase(std::remove_if(c.events.begin(), c.events.end(),
                                [&](const EventRef& e) {
                                  return std::find(done.begin(), done.end(), e) != done.end();
                                }),
                 c.events.end());
}

}  // namespace

// ---- Impl ---------------------------------------------------------------------

struct TierStore::Impl {
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
  LinkStats links[kNumLinks] GUARDED_BY(mu);
  TierStoreStats::PerTier counters[kNumTiers] GUARDED_BY(mu);
  uint64_t n_acquires GUARDED_BY(mu) = 0, n_releases GUARDED_BY(mu) = 0,
           n_prefetches GUARDED_BY(mu) = 0, n_evicts GUARDED_BY(mu) = 0,
           n_flushes GUARDED_BY(mu) = 0, n_failures GUARDED_BY(mu) = 0;
  uint64_t queue_depth GUARDED_BY(mu) = 0, max_queue_depth GUARDED_BY(mu) = 0;

  ~Impl();

  MemoryTier* Mem(int tier) const {
    return tier == kGpu ? static_cast<MemoryTier*>(gpu.get()) : static_cast<MemoryTier*>(host.get());
  }
  bool HasTier(int tier) const {
    return tier == kHost || (tier == kGpu && gpu != nullptr) || (tier == kNvme && nvme != nullptr);
  }
  uint64_t CopyBytes(const Tensor& t, int tier) const {
    uint64_t b = std::max<uint64_t>(t.bytes, 1);
    return tier == kGpu ? b : AlignUp(b, 4096);  // host and nvme: whole pages for O_DIRECT
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

TierStore::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  work_cv.notify_all();
  for (auto& w : workers)
    if (w.joinable()) w.join();
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [id, t] : tensors) {
    for (Job& j : t->jobs) j.ticket->Complete(Cancelled(j.ticket->what + ": the store was destroyed"));
    t->jobs.clear();
    for (int k = 0; k < kNumTiers; ++k) {
      CopySlot& c = t->copies[k];
      (void)SyncAll(c.events);  // caller work still using the memory
      c.events.clear();
      c.block.Reset();
      if (c.extent.valid() && nvme) nvme->Free(c.extent);
      c.extent = Extent{};
    }
  }
  tensors.clear();
  staging_blocks.clear();
}

Result<Tensor*> TierStore::Impl::Lookup(TensorId id) const {
  auto it = tensors.find(id.value);
  if (it == tensors.end()) return NotFound("no tensor with id " + std::to_string(id.value));
  return it->second.get();
}

Status TierStore::Impl::TakeFailure(Tensor* t) {
  if (!t->failure) return Status::OK();
  std::shared_ptr<detail::TicketState> f = std::move(t->failure);
  t->failure.reset();
  if (f->reported.exchange(true)) return Status::OK();
  return f->Get().WithContext("an earlier " + f->what + " failed");
}

Status TierStore::Impl::CheckTier(const Tensor& t, int tier, bool acquire) const {
  if (!HasTier(tier))
    return InvalidArgument("tensor '" + t.name + "': the store has no " + TierStr(tier) + " tier");
  if (tier > t.home)
    return InvalidArgument("tensor '" + t.name + "' lives on " + TierStr(t.home) +
                           "; copies are kept only on that tier or faster ones, not on " + TierStr(tier));
  if (acquire && tier == kNvme)
    return InvalidArgument("tensor '" + t.name +
                           "': nvme copies have no address and cannot be acquired; acquire it on "
                           "host or gpu");
  return Status::OK();
}

Side TierStore::Impl::SideOf(Tensor* t, int tier) {
  CopySlot& c = t->copies[tier];
  Side s;
  s.tier = tier;
  s.ptr = static_cast<uint8_t*>(c.block.data());
  s.extent = c.extent;
  s.events = c.events;
  return s;
}

void TierStore::Impl::FreeCopy(Tensor* t, int tier) {
  CopySlot& c = t->copies[tier];
  c.block.Reset();
  c.valid = false;
  c.events.clear();
  resident[tier].erase(t);
}

// Makes t's copy on `dst` valid. May release and retake the lock.
Status TierStore::Impl::LoadLocked(std::unique_lock<std::mutex>& lock, Tensor* t, int dst, bool* hit) {
  CopySlot& d = t->copies[dst];
  bool first = true;
  for (;;) {
    if (d.valid && !d.loading && !d.writer) {
      if (hit) *hit = first;
      return Status::OK();
    }
    if (t->AnyWriter())
      return FailedPrecondition("tensor '" + t->name + "' is " + t->Holder() +
                                "; it cannot be loaded onto " + TierStr(dst) + " until released");
    if (d.loading) {
      first = false;
      cv.wait(lock);
      continue;
    }
    break;
  }
  if (hit) *hit = false;
  d.loading = true;

  if (!t->initialized) {  // nothing to move: allocate only
    Status s = EnsureAllocated(lock, t, dst);
    d.loading = false;
    if (s.ok()) {
      d.valid = true;
      d.last_use = ++clock;
    }
    cv.notify_all();
    return s;
  }

  // Source: a valid copy, the nearest one (host is next to both gpu and nvme).
  static const int kPrefer[kNumTiers][2] = {{kHost, kNvme}, {kGpu, kNvme}, {kHost, kGpu}};
  int src = -1;
  for (int k : kPrefer[dst])
    if (t->copies[k].valid) {
      src = k;
      break;
    }
  if (src < 0) {
    d.loading = false;
    cv.notify_all();
    return Internal("tensor '" + t->name + "' has no valid copy to load " + TierStr(dst) + " from");
  }
  // gpu<->nvme: through the host copy when one is allocated (it becomes valid
  // too), else through staging buffers.
  int mid = -1;
  if ((src == kGpu && dst == kNvme) || (src == kNvme && dst == kGpu)) {
    CopySlot& h = t->copies[kHost];
    if (h.allocated() && !h.busy() && !h.pinned()) mid = kHost;
  }
  t->copies[src].io++;
  if (mid >= 0) t->copies[mid].loading = true;
  bool had_block = d.allocated();
  Status s = EnsureAllocated(lock, t, dst);
  if (!s.ok()) {
    t->copies[src].io--;
    if (mid >= 0) t->copies[mid].loading = false;
    d.loading = false;
    cv.notify_all();
    return s;
  }
  Side S = SideOf(t, src), D = SideOf(t, dst), M;
  if (mid >= 0) M = SideOf(t, mid);
  transfers_on[src]++;
  transfers_on[dst]++;
  if (mid >= 0) transfers_on[mid]++;
  const uint64_t bytes = t->bytes;
  std::optional<trace::Span> span;  // (the name is built only when tracing)
  if (trace::On())
    span.emplace("move", t->name + " " + TierStr(src) + " to " + TierStr(dst) + (mid >= 0 ? " through the host" : ""));
  lock.unlock();

  LinkDelta delta;
  bool mid_ok = false;
  if (mid >= 0) {
    s = Hop(S, M, bytes, delta);
    mid_ok = s.ok();
    if (s.ok()) {
      M.events.clear();  // nothing new can be attached while it is loading
      s = Hop(M, D, bytes, delta);
    }
  } else if ((src == kGpu && dst == kNvme) || (src == kNvme && dst == kGpu)) {
    s = Staged(S, D, bytes, delta);
  } else {
    s = Hop(S, D, bytes, delta);
  }
  span.reset();

  lock.lock();
  for (int l = 0; l < kNumLinks; ++l) {
    links[l].bytes += delta.bytes[l];
    links[l].transfers += delta.count[l];
    links[l].seconds += delta.seconds[l];
  }
  transfers_on[src]--;
  transfers_on[dst]--;
  if (mid >= 0) transfers_on[mid]--;
  CopySlot& sc = t->copies[src];
  sc.io--;
  if (mid >= 0) {
    CopySlot& mc = t->copies[mid];
    mc.loading = false;
    if (mid_ok) {
      mc.valid = true;
      mc.last_use = ++clock;
      mc.events.clear();
    }
  }
  d.loading = false;
  if (s.ok()) {
    // The events the transfer waited for are complete.
    RemoveEvents(sc, S.events);
    RemoveEvents(d, D.events);
    d.valid = true;
    d.last_use = ++clock;
  } else if (!had_block && dst != t->home) {
    FreeCopy(t, dst);  // nothing worth keeping in a half-written copy
  }
  cv.notify_all();
  if (!s.ok())
    return s.WithContext("moving tensor '" + t->name + "' from " + TierStr(src) + " to " + TierStr(dst));
  return Status::OK();
}

Tensor* TierStore::Impl::PickVictim(int tier, const Tensor* requester,
                                    const std::unordered_set<Tensor*>& skip) {
  Tensor* best = nullptr;
  auto better = [&](Tensor* a, Tensor* b) {  // a is a better victim than b
    const CopySlot& ca = a->copies[tier];
    const CopySlot& cb = b->copies[tier];
    if (ca.valid != cb.valid) return !ca.valid;  // stale copies cost nothing to drop
    if (options.eviction == EvictionPolicy::kNextUse && a->next_use != b->next_use)
      return a->next_use > b->next_use;
    return ca.last_use < cb.last_use;
  };
  for (Tensor* u : resident[tier]) {
    if (u == requester || skip.count(u)) continue;
    const CopySlot& c = u->copies[tier];
    if (!c.allocated() || u->home == tier || c.pinned() || c.busy()) continue;
    if (best == nullptr || better(u, best)) best = u;
  }
  return best;
}

// Drops v's copy on `tier`: write-back when it holds the only valid data,
// then waits for release events, then frees. Cancelled when the copy was
// pinned meanwhile (the caller picks another victim).
Status TierStore::Impl::DropCopy(std::unique_lock<std::mutex>& lock, Tensor* v, int tier) {
  CopySlot& c = v->copies[tier];
  for (;;) {
    if (!c.allocated()) return Status::OK();
    if (c.pinned())
      return FailedPrecondition("tensor '" + v->name + "' is " + v->Holder() + "; its " + TierStr(tier) +
                                " copy cannot be dropped");
    if (c.busy()) {
      cv.wait(lock);
      continue;
    }
    if (c.valid && v->OnlyValid(tier)) {
      Status s = LoadLocked(lock, v, v->home, nullptr);
      if (!s.ok()) return s.WithContext("write-back before dropping the " + TierStr(tier) + " copy");
      counters[tier].writebacks++;
      counters[tier].writeback_bytes += v->bytes;
      continue;  // the lock was released: look again
    }
    if (!c.events.empty()) {
      std::vector<EventRef> evs = c.events;
      c.io++;
      lock.unlock();
      Status s = SyncAll(evs);
      lock.lock();
      c.io--;
      cv.notify_all();
      if (!s.ok()) return s.WithContext("waiting for work on tensor '" + v->name + "' before freeing it");
      RemoveEvents(c, evs);
      continue;
    }
    FreeCopy(v, tier);
    counters[tier].evictions++;
    cv.notify_all();
    return Status::OK();
  }
}

Status TierStore::Impl::EnsureAllocated(std::unique_lock<std::mutex>& lock, Tensor* t, int tier) {
  CopySlot& c = t->copies[tier];
  if (c.allocated()) return Status::OK();
  if (tier == kNvme) return Internal("nvme copies are allocated with the tensor");
  const uint64_t size = CopyBytes(*t, tier);
  std::unordered_set<Tensor*> skip;  // victims that failed to drop this time
  // The trace's: how long the copy waited for room (evictions, write-backs,
  // copies in flight), from the first refusal to the allocation.
  struct RoomSpan {
    double begin = -1;
    std::string name;
    ~RoomSpan() {
      if (begin >= 0) trace::Complete("room", name, begin, NowSeconds());
    }
  } room;
  for (;;) {
    Result<TierBlock> r =
        Mem(tier)->Allocate(size, t->name, tier == t->home ? Placement::kLow : Placement::kHigh);
    if (!r.ok() && room.begin < 0 && trace::On()) {
      room.begin = NowSeconds();
      room.name = "room for " + t->name + " on " + TierStr(tier);
    }
    if (r.ok()) {
      c.block = std::move(r).value();
      if (tier == kHost && t->bytes < size)  // O_DIRECT writes whole pages: no stale bytes on disk
        std::memset(static_cast<uint8_t*>(c.block.data()) + t->bytes, 0, size - t->bytes);
      if (tier != t->home) resident[tier].insert(t);
      return Status::OK();
    }
    if (r.status().code() != StatusCode::kOutOfMemory) return r.status();
    Tensor* v = PickVictim(tier, t, skip);
    if (v != nullptr) {
      Status s = DropCopy(lock, v, tier);
      if (!s.ok()) {
        skip.insert(v);
        if (s.code() != StatusCode::kFailedPrecondition && s.code() != StatusCode::kCancelled) {
          // A failed write-back: the dirty copy stays; the owner hears of it.
          auto f = std::make_shared<detail::TicketState>();
          f->what = "write-back of '" + v->name + "' (evicted from " + TierStr(tier) + ")";
          f->Complete(s);
          if (!v->failure || v->failure->reported) v->failure = f;
          n_failures++;
        }
      }
      if (c.allocated()) return Status::OK();  // cannot happen (c is claimed), but be safe
      continue;
    }
    if (transfers_on[tier] > 0) {  // copies in flight will become droppable
      cv.wait(lock);
      continue;
    }
    // Nothing can be dropped: say why.
    uint64_t pinned_n = 0, pinned_b = 0, busy_n = 0, home_b = 0;
    for (Tensor* u : resident[tier]) {
      const CopySlot& uc = u->copies[tier];
      if (uc.pinned()) {
        pinned_n++;
        pinned_b += uc.block.bytes();
      } else if (uc.busy()) {
        busy_n++;
      }
    }
    for (auto& [id, u] : tensors)
      if (u->home == tier) home_b += u->copies[tier].block.bytes();
    TierUsage use = Mem(tier)->usage();
    std::string msg = "no room for tensor '" + t->name + "' (" + FormatBytes(size) + ") on " +
                      TierStr(tier) + ": budget " + FormatBytes(use.budget) + ", in use " +
                      FormatBytes(use.used) + ", largest free block " + FormatBytes(use.largest_free) +
                      " (home copies " + FormatBytes(home_b) + ", " +
                      std::to_string(pinned_n) + " pinned copies " + FormatBytes(pinned_b) + ", " +
                      std::to_string(busy_n) + " busy, " + std::to_string(skip.size()) +
                      " that failed to drop)";
    if (tier == kHost && nvme) msg += ", staging " + FormatBytes(options.staging_buffers * options.staging_chunk_bytes);
    return OutOfMemory(Kind(tier), size, use.available(), std::move(msg));
  }
}

// ---- transfers ----------------------------------------------------------------

Status TierStore::Impl::EngineCopy(CopyDirection dir, void* dst, const void* src, uint64_t bytes,
                                   const std::vector<EventRef>& a, const std::vector<EventRef>& b,
                                   CopyTicket* out) {
  std::vector<void*> evs;
  for (const auto* list : {&a, &b})
    for (const auto& e : *list)
      if (e && !e->empty()) evs.push_back(e->native());
  CopyAfter after;
  after.events = evs;
  HostMemory hm = host->pinned() ? HostMemory::kPinned : HostMemory::kPageable;
  ASSIGN_OR_RETURN(*out, engine->Copy(dir, dst, src, bytes, after, hm));
  return Status::OK();
}

Status TierStore::Impl::Hop(const Side& s, const Side& d, uint64_t bytes, LinkDelta& delta) {
  const uint64_t io_bytes = AlignUp(std::max<uint64_t>(bytes, 1), 4096);
  double t0 = NowSeconds();
  if (s.tier == kGpu && d.tier == kHost) {
    CopyTicket tk;
    RETURN_IF_ERROR(EngineCopy(CopyDirection::kDeviceToHost, d.ptr, s.ptr, bytes, s.events, d.events, &tk));
    RETURN_IF_ERROR(tk.Wait());
    delta.Add(kGpuToHost, bytes, NowSeconds() - t0);
  } else if (s.tier == kHost && d.tier == kGpu) {
    CopyTicket tk;
    RETURN_IF_ERROR(EngineCopy(CopyDirection::kHostToDevice, d.ptr, s.ptr, bytes, s.events, d.events, &tk));
    RETURN_IF_ERROR(tk.Wait());
    delta.Add(kHostToGpu, bytes, NowSeconds() - t0);
  } else if (s.tier == kHost && d.tier == kNvme) {
    RETURN_IF_ERROR(SyncAll(s.events));
    RETURN_IF_ERROR(nvme->WriteSync(d.extent, 0, s.ptr, io_bytes));
    delta.Add(kHostToNvme, io_bytes, NowSeconds() - t0);
  } else if (s.tier == kNvme && d.tier == kHost) {
    RETURN_IF_ERROR(SyncAll(d.events));
    RETURN_IF_ERROR(nvme->ReadSync(s.extent, 0, d.ptr, io_bytes));
    delta.Add(kNvmeToHost, io_bytes, NowSeconds() - t0);
  } else {
    return Internal("no direct link from " + TierStr(s.tier) + " to " + TierStr(d.tier));
  }
  return Status::OK();
}

std::vector<uint8_t*> TierStore::Impl::TakeStaging(size_t n) {
  std::unique_lock<std::mutex> lock(staging_mu);
  staging_cv.wait(lock, [&] { return staging_free.size() >= n; });
  std::vector<uint8_t*> out(staging_free.end() - n, staging_free.end());
  staging_free.resize(staging_free.size() - n);
  return out;
}

void TierStore::Impl::GiveStaging(const std::vector<uint8_t*>& bufs) {
  {
    std::lock_guard<std::mutex> lock(staging_mu);
    staging_free.insert(staging_free.end(), bufs.begin(), bufs.end());
  }
  staging_cv.notify_all();
}

// gpu <-> nvme in chunks through `staging_per_move` pinned staging buffers:
// up to that many NVMe transfers are in flight while the PCIe copies of the
// chunks before them run. A buffer is reused only once both its NVMe
// transfer and its PCIe copy are complete.
Status TierStore::Impl::Staged(const Side& s, const Side& d, uint64_t bytes, LinkDelta& delta) {
  const uint64_t chunk = options.staging_chunk_bytes;
  const size_t nb = static_cast<size_t>(options.staging_per_move);
  std::vector<uint8_t*> buf = TakeStaging(nb);
  const uint64_t total = std::max<uint64_t>(bytes, 1);  // a 0-byte tensor still has one page on disk
  const size_t chunks = static_cast<size_t>((total + chunk - 1) / chunk);
  auto len_of = [&](size_t i) { return std::min(chunk, bytes - std::min(bytes, i * chunk)); };
  auto io_of = [&](size_t i) { return AlignUp(std::max<uint64_t>(len_of(i), 1), 4096); };
  std::vector<Latch> nv(nb);          // the buffer's NVMe transfer
  std::vector<CopyTicket> pcie(nb);   // the buffer's PCIe copy
  double t0 = NowSeconds();
  Status first;
  auto keep = [&first](Status st) {
    if (first.ok() && !st.ok()) first = std::move(st);
  };
  if (s.tier == kGpu) {  // gpu -> staging -> nvme
    for (size_t i = 0; i < chunks && first.ok(); ++i) {
      const size_t b = i % nb;
      keep(nv[b].Wait());  // the buffer's previous write is done
      if (!first.ok()) break;
      const uint64_t off = i * chunk, len = len_of(i), io = io_of(i);
      if (len > 0) {
        Status st = EngineCopy(CopyDirection::kDeviceToHost, buf[b], s.ptr + off, len, s.events, {}, &pcie[b]);
        if (st.ok()) st = pcie[b].Wait();
        keep(st);
        if (!first.ok()) break;
      }
      if (io > len) std::memset(buf[b] + len, 0, io - len);  // no stale bytes on disk
      nv[b].Start();
      nvme->Write(d.extent, off, buf[b], io, [&w = nv[b]](Status st) { w.Done(std::move(st)); });
    }
  } else {  // nvme -> staging -> gpu
    auto read = [&](size_t i) {
      const size_t b = i % nb;
      nv[b].Start();
      nvme->Read(s.extent, i * chunk, buf[b], io_of(i), [&w = nv[b]](Status st) { w.Done(std::move(st)); });
    };
    for (size_t i = 0; i < std::min(nb, chunks); ++i) read(i);
    for (size_t i = 0; i < chunks && first.ok(); ++i) {
      const size_t b = i % nb;
      keep(nv[b].Wait());
      if (!first.ok()) break;
      const uint64_t len = len_of(i);
      if (len > 0) {
        keep(EngineCopy(CopyDirection::kHostToDevice, d.ptr + i * chunk, buf[b], len, d.events, {}, &pcie[b]));
        if (!first.ok()) break;
      }
      if (i + nb < chunks) {
        keep(pcie[b].Wait());  // the buffer is about to be refilled
        if (!first.ok()) break;
        read(i + nb);
      }
    }
  }
  // Never hand the buffers back with a transfer in flight, failed or not.
  for (size_t b = 0; b < nb; ++b) {
    keep(nv[b].Wait());
    keep(pcie[b].Wait());
  }
  GiveStaging(buf);
  if (!first.ok()) return first;
  double dt = NowSeconds() - t0;
  const uint64_t io_bytes = AlignUp(total, 4096);
  if (s.tier == kGpu) {
    delta.Add(kGpuToHost, bytes, dt);
    delta.Add(kHostToNvme, io_bytes, dt);
  } else {
    delta.Add(kNvmeToHost, io_bytes, dt);
    delta.Add(kHostToGpu, bytes, dt);
  }
  return Status::OK();
}

// ---- asynchronous moves -------------------------------------------------------

Ticket TierStore::Impl::Enqueue(Tensor* t, Job::Kind kind, int tier, std::string what) {
  auto ts = std::make_shared<detail::TicketState>();
  ts->what = std::move(what);
  t->jobs.push_back(Job{kind, tier, ts});
  queue_depth++;
  max_queue_depth = std::max(max_queue_depth, queue_depth);
  if (!t->job_running && !t->in_ready) {
    ready.push_back(t);
    t->in_ready = true;
    work_cv.notify_one();
  }
  return Ticket(ts);
}

void TierStore::Impl::RunNextJob(std::unique_lock<std::mutex>& lock, Tensor* t) {
  Job job = std::move(t->jobs.front());
  t->jobs.pop_front();
  t->job_running = true;
  Status s;
  switch (job.kind) {
    case Job::kLoad: {
      bool hit = false;
      s = LoadLocked(lock, t, job.tier, &hit);
      (hit ? counters[job.tier].hits : counters[job.tier].misses)++;
      break;
    }
    case Job::kEvict: {
      s = DropCopy(lock, t, job.tier);
      if (s.code() == StatusCode::kFailedPrecondition)
        s = FailedPrecondition("evicting tensor '" + t->name + "' from " + TierStr(job.tier) +
                               ": it was acquired again before the eviction ran; the copy is kept");
      break;
    }
    case Job::kFlush: s = LoadLocked(lock, t, t->home, nullptr); break;
  }
  if (!s.ok()) {
    n_failures++;
    // Conflicts with the caller's own pins are reported by the ticket only;
    // failed transfers also stick to the tensor until reported.
    if (s.code() != StatusCode::kFailedPrecondition && s.code() != StatusCode::kCancelled &&
        (!t->failure || t->failure->reported))
      t->failure = job.ticket;
  }
  job.ticket->Complete(s);
  t->job_running = false;
  queue_depth--;
  if (!t->jobs.empty() && !t->in_ready) {
    ready.push_back(t);
    t->in_ready = true;
    work_cv.notify_one();
  }
  cv.notify_all();
}

// Runs or waits for every move queued on t so far (call order per tensor).
void TierStore::Impl::Drain(std::unique_lock<std::mutex>& lock, Tensor* t) {
  while (t->job_running || !t->jobs.empty()) {
    if (!t->job_running)
      RunNextJob(lock, t);  // on this thread rather than waiting for a worker
    else
      cv.wait(lock);
  }
}

void TierStore::Impl::WorkerLoop() {
  trace::NameThread("store mover");
#if STRATA_WITH_CUDA
  if (gpu && !gpu->stand_in()) (void)cudaSetDevice(gpu->device());
#endif
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    work_cv.wait(lock, [&] { return stop || !ready.empty(); });
    if (stop) return;
    Tensor* t = ready.front();
    ready.pop_front();
    t->in_ready = false;
    if (t->job_running || t->jobs.empty()) continue;
    RunNextJob(lock, t);
  }
}

// ---- public API ---------------------------------------------------------------

Result<std::unique_ptr<TierStore>> TierStore::Open(TierStoreOptions options) {
  if (options.staging_per_move < 2 || options.staging_buffers < options.staging_per_move)
    return InvalidArgument("staging needs 2 <= staging_per_move <= staging_buffers, got " +
                           std::to_string(options.staging_per_move) + " and " +
                           std::to_string(options.staging_buffers));
  if (options.staging_chunk_bytes == 0 || options.staging_chunk_bytes % 4096 != 0)
    return InvalidArgument("staging_chunk_bytes must be a positive multiple of 4096, got " +
                           std::to_string(options.staging_chunk_bytes));
  if (options.worker_threads < 1)
    return InvalidArgument("worker_threads must be >= 1, got " + std::to_string(options.worker_threads));
  std::unique_ptr<TierStore> store(new TierStore());
  store->impl_ = std::make_unique<Impl>();
  Impl& m = *store->impl_;
  m.options = options;

  if (options.nvme) {
    ASSIGN_OR_RETURN(m.nvme, NvmeTier::Open(*options.nvme));
  }
  if (options.gpu) {
    ASSIGN_OR_RETURN(m.gpu, GpuTier::Open(options.gpu_tier));
    CopyEngineOptions copy = options.copy;
    copy.device = m.gpu->device();
    // The engine must match the tier: memcpy for the stand-in (which it finds
    // out itself when there is no GPU, and then says why), CUDA otherwise.
    copy.stand_in = m.gpu->stand_in() && options.gpu_tier.stand_in;
    ASSIGN_OR_RETURN(m.engine, CopyEngine::Create(copy));
    if (m.engine->stand_in() != m.gpu->stand_in())
      return Internal("the copy engine and the gpu tier disagree about the GPU: " + m.engine->description() +
                      " vs " + m.gpu->description());
    if (!m.gpu->stand_in()) m.event_pool = std::make_unique<EventPool>(m.gpu->device(), true);
  }
  HostTierOptions host = options.host_tier;
  if (m.gpu && !m.gpu->stand_in()) host.gpu_device = m.gpu->device();
  if (m.nvme && options.register_host_buffers) {
    NvmeTier* nv = m.nvme.get();
    host.on_map = [nv](void* base, uint64_t bytes) { return nv->RegisterBuffer(base, bytes); };
    host.on_unmap = [nv](void* base) { nv->UnregisterBuffer(base); };
  }
  if (m.gpu && m.gpu->stand_in() && host.pin_method == PinMethod::kAuto)
    host.pin_method = PinMethod::kMlock;  // no CUDA registration for a stand-in
  ASSIGN_OR_RETURN(m.host, HostTier::Open(host));

  if (m.nvme) {  // staging for gpu<->nvme moves (and only then)
    for (int i = 0; i < options.staging_buffers; ++i) {
      auto b = m.host->Allocate(options.staging_chunk_bytes, "staging buffer");
      if (!b.ok())
        return b.status().WithContext("the host tier cannot hold " + std::to_string(options.staging_buffers) +
                                      " staging buffers of " + FormatBytes(options.staging_chunk_bytes));
      std::lock_guard<std::mutex> lock(m.staging_mu);
      m.staging_free.push_back(static_cast<uint8_t*>(b->data()));
      m.staging_blocks.push_back(std::move(b).value());
    }
  }
  for (int i = 0; i < options.worker_threads; ++i) m.workers.emplace_back([&m] { m.WorkerLoop(); });
  return store;
}

TierStore::~TierStore() = default;

Result<TensorId> TierStore::Create(std::string name, DType dtype, const Shape& shape, TierKind home) {
  Impl& m = *impl_;
  if (name.empty()) return InvalidArgument("tensor name is empty");
  const int h = Ix(home);
  if (!m.HasTier(h))
    return InvalidArgument("tensor '" + name + "': home tier " + TierStr(h) + " is not configured in this store");
  const uint64_t elem = DTypeSize(dtype);
  const int64_t numel = shape.numel();
  if (numel < 0 || (elem != 0 && static_cast<uint64_t>(numel) > UINT64_MAX / elem))
    return InvalidArgument("tensor '" + name + "': shape " + shape.ToString() + " is too large");
  std::unique_lock<std::mutex> lock(m.mu);
  if (m.by_name.count(name)) return AlreadyExists("tensor '" + name + "' exists already");
  auto t = std::make_unique<Tensor>();
  t->id = m.next_id++;
  t->name = name;
  t->dtype = dtype;
  t->shape = shape;
  t->bytes = static_cast<uint64_t>(numel) * elem;
  t->home = h;
  Tensor* raw = t.get();
  CopySlot& c = raw->copies[h];
  if (h == kNvme) {
    ASSIGN_OR_RETURN(c.extent, m.nvme->Allocate(m.CopyBytes(*raw, kNvme)));
  } else {
    c.loading = true;  // claimed while eviction may release the lock
    Status s = m.EnsureAllocated(lock, raw, h);
    c.loading = false;
    if (!s.ok()) return s;
    if (m.by_name.count(name)) {  // created by another thread meanwhile
      c.block.Reset();
      return AlreadyExists("tensor '" + name + "' exists already");
    }
  }
  c.valid = true;
  c.last_use = ++m.clock;
  m.by_name.emplace(name, raw->id);
  TensorId id{raw->id};
  m.tensors.emplace(raw->id, std::move(t));
  return id;
}

Result<TensorId> TierStore::Find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->by_name.find(std::string(name));
  if (it == impl_->by_name.end()) return NotFound("no tensor named '" + std::string(name) + "'");
  return TensorId{it->second};
}

Status TierStore::Remove(TensorId id) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  for (;;) {
    m.Drain(lock, t);
    if (t->AnyPinned())
      return FailedPrecondition("cannot remove tensor '" + t->name + "': it is " + t->Holder());
    if (t->AnyBusy()) {
      m.cv.wait(lock);
      continue;
    }
    // Caller work recorded on its streams must finish before the memory is reused.
    std::vector<EventRef> evs;
    for (auto& c : t->copies) evs.insert(evs.end(), c.events.begin(), c.events.end());
    if (!evs.empty()) {
      for (auto& c : t->copies) c.io++;
      lock.unlock();
      Status s = SyncAll(evs);
      lock.lock();
      for (auto& c : t->copies) {
        c.io--;
        RemoveEvents(c, evs);
      }
      m.cv.notify_all();
      RETURN_IF_ERROR(s);
      continue;  // the lock was released: look again
    }
    if (t->jobs.empty() && !t->job_running) break;
  }
  for (int k = 0; k < kNumTiers; ++k) {
    m.FreeCopy(t, k);
    if (t->copies[k].extent.valid()) m.nvme->Free(t->copies[k].extent);
    t->copies[k].extent = Extent{};
  }
  if (t->in_ready) m.ready.erase(std::remove(m.ready.begin(), m.ready.end(), t), m.ready.end());
  m.by_name.erase(t->name);
  m.tensors.erase(id.value);
  m.cv.notify_all();
  return Status::OK();
}

Result<TensorInfo> TierStore::Info(TensorId id) const {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  TensorInfo info;
  info.name = t->name;
  info.dtype = t->dtype;
  info.shape = t->shape;
  info.bytes = t->bytes;
  info.home = Kind(t->home);
  info.written = t->initialized;
  for (int k = 0; k < kNumTiers; ++k) {
    const CopySlot& c = t->copies[k];
    info.copies[k].allocated = c.allocated();
    info.copies[k].valid = c.valid;
    info.copies[k].dirty = c.valid && !t->copies[t->home].valid;
    info.copies[k].readers = c.readers;
    info.copies[k].writer = c.writer;
  }
  if (t->next_use != kNoHint) info.next_use = t->next_use;
  return info;
}

Result<TensorView> TierStore::Acquire(TensorId id, TierKind tier_kind, Access access) {
  Impl& m = *impl_;
  const int tier = Ix(tier_kind);
  std::unique_lock<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  RETURN_IF_ERROR(m.TakeFailure(t));
  RETURN_IF_ERROR(m.CheckTier(*t, tier, /*acquire=*/true));
  m.n_acquires++;
  CopySlot& c = t->copies[tier];
  bool first = true;
  for (;;) {
    m.Drain(lock, t);
    // Conflicts with other callers' pins fail at once.
    if (access == Access::kRead) {
      if (t->AnyWriter())
        return FailedPrecondition("cannot acquire tensor '" + t->name + "' for reading on " + TierStr(tier) +
                                  ": it is " + t->Holder());
    } else {
      if (t->AnyPinned())
        return FailedPrecondition("cannot acquire tensor '" + t->name + "' for " +
                                  std::string(AccessName(access)) + " on " + TierStr(tier) + ": it is " +
                                  t->Holder());
      if (t->AnyBusy()) {  // our own transfers: they finish by themselves
        m.cv.wait(lock);
        continue;
      }
    }
    const bool ready = access == Access::kWriteDiscard ? (c.allocated() && !c.loading)
                                                       : (c.valid && !c.loading);
    if (ready) break;
    first = false;
    if (access == Access::kWriteDiscard) {
      if (c.loading) {
        m.cv.wait(lock);
        continue;
      }
      c.loading = true;
      Status s = m.EnsureAllocated(lock, t, tier);
      c.loading = false;
      m.cv.notify_all();
      RETURN_IF_ERROR(s);
    } else {
      RETURN_IF_ERROR(m.LoadLocked(lock, t, tier, nullptr));
    }
    // The lock was released: check everything again.
  }
  (first ? m.counters[tier].hits : m.counters[tier].misses)++;
  if (access == Access::kRead) {
    c.readers++;
  } else {
    c.writer = true;
    c.discard = access == Access::kWriteDiscard;
  }
  c.last_use = ++m.clock;
  TensorView v;
  v.data = c.block.data();
  v.bytes = t->bytes;
  v.dtype = t->dtype;
  v.shape = t->shape;
  v.tier = tier_kind;
  v.id = id;
  return v;
}

Status TierStore::Release(TensorId id, TierKind tier_kind, bool dirty, void* stream) {
  Impl& m = *impl_;
  const int tier = Ix(tier_kind);
  if (tier < 0 || tier >= kNumTiers) return InvalidArgument("bad tier");
  std::unique_lock<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  CopySlot& c = t->copies[tier];
  if (!c.pinned())
    return FailedPrecondition("release of tensor '" + t->name + "' on " + TierStr(tier) +
                              ", which is not acquired there");
  m.n_releases++;
  Status result;
  if (stream != nullptr) {
    if (!m.event_pool) {
      result = InvalidArgument("release of tensor '" + t->name +
                               "' with a CUDA stream, but the store has no CUDA device (stand-in)");
    } else {
      Result<GpuEvent> ev = m.event_pool->Get();
      Status s = ev.status();
      if (s.ok()) s = ev->Record(stream);
      if (s.ok()) {
        EventPool* pool = m.event_pool.get();
        c.events.push_back(EventRef(new GpuEvent(std::move(ev).value()), [pool](GpuEvent* e) {
          pool->Put(std::move(*e));
          delete e;
        }));
      } else {
        // Without the event the memory's reuse cannot be ordered: wait now.
        result = s;
#if STRATA_WITH_CUDA
        (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
#endif
      }
    }
  }
  if (c.writer) {
    c.writer = false;
    if (dirty || c.discard) {
      c.valid = true;
      t->initialized = true;
      for (int k = 0; k < kNumTiers; ++k)
        if (k != tier) t->copies[k].valid = false;
    }
    c.discard = false;
  } else {
    c.readers--;
    if (dirty && result.ok())
      result = FailedPrecondition("tensor '" + t->name + "' was released dirty on " + TierStr(tier) +
                                  " but acquired for reading; the change is not recorded");
  }
  c.last_use = ++m.clock;
  m.cv.notify_all();
  return result;
}

Result<Ticket> TierStore::Prefetch(TensorId id, TierKind tier_kind) {
  Impl& m = *impl_;
  const int tier = Ix(tier_kind);
  std::lock_guard<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  RETURN_IF_ERROR(m.TakeFailure(t));
  RETURN_IF_ERROR(m.CheckTier(*t, tier, /*acquire=*/false));
  m.n_prefetches++;
  if (t->AnyWriter())
    return FailedPrecondition("cannot prefetch tensor '" + t->name + "' to " + TierStr(tier) + ": it is " +
                              t->Holder());
  const CopySlot& c = t->copies[tier];
  if (t->jobs.empty() && !t->job_running && c.valid && !c.loading) {
    m.counters[tier].hits++;
    return Ticket();
  }
  return m.Enqueue(t, Job::kLoad, tier, "prefetch of '" + t->name + "' to " + TierStr(tier));
}

Result<Ticket> TierStore::Evict(TensorId id, TierKind tier_kind) {
  Impl& m = *impl_;
  const int tier = Ix(tier_kind);
  std::lock_guard<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  RETURN_IF_ERROR(m.TakeFailure(t));
  RETURN_IF_ERROR(m.CheckTier(*t, tier, /*acquire=*/false));
  if (tier == t->home)
    return InvalidArgument("cannot evict tensor '" + t->name + "' from " + TierStr(tier) +
                           ": that is its home copy");
  m.n_evicts++;
  const CopySlot& c = t->copies[tier];
  if (c.pinned())
    return FailedPrecondition("cannot evict tensor '" + t->name + "' from " + TierStr(tier) + ": it is " +
                              t->Holder());
  if (t->jobs.empty() && !t->job_running && !c.allocated()) return Ticket();
  return m.Enqueue(t, Job::kEvict, tier, "eviction of '" + t->name + "' from " + TierStr(tier));
}

Result<Ticket> TierStore::Flush(TensorId id) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  RETURN_IF_ERROR(m.TakeFailure(t));
  m.n_flushes++;
  if (t->AnyWriter())
    return FailedPrecondition("cannot flush tensor '" + t->name + "': it is " + t->Holder());
  if (t->jobs.empty() && !t->job_running && t->copies[t->home].valid && !t->copies[t->home].loading)
    return Ticket();
  return m.Enqueue(t, Job::kFlush, t->home, "flush of '" + t->name + "' to " + TierStr(t->home));
}

Status TierStore::FlushAll() {
  std::vector<TensorId> ids;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& [id, t] : impl_->tensors) ids.push_back(TensorId{id});
  }
  std::vector<Ticket> tickets;
  Status first;
  for (TensorId id : ids) {
    Result<Ticket> r = Flush(id);
    if (r.ok()) {
      tickets.push_back(*r);
    } else if (r.status().code() != StatusCode::kNotFound && first.ok()) {
      first = r.status();
    }
  }
  for (const Ticket& tk : tickets) {
    Status s = tk.Wait();
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status TierStore::SetNextUse(TensorId id, uint64_t tick) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ASSIGN_OR_RETURN(Tensor * t, impl_->Lookup(id));
  t->next_use = tick;
  return Status::OK();
}

Status TierStore::ClearNextUse(TensorId id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ASSIGN_OR_RETURN(Tensor * t, impl_->Lookup(id));
  t->next_use = kNoHint;
  return Status::OK();
}

namespace {
// Where Write/Read touch a tensor: its gpu copy for a gpu-home tensor, else host.
TierKind AccessTier(TierKind home) { return home == TierKind::kGpu ? TierKind::kGpu : TierKind::kHost; }
}  // namespace

Status TierStore::Write(TensorId id, const void* src, uint64_t bytes) {
  ASSIGN_OR_RETURN(TensorInfo info, Info(id));
  if (bytes != info.bytes)
    return InvalidArgument("write of " + std::to_string(bytes) + " bytes to tensor '" + info.name + "' of " +
                           std::to_string(info.bytes) + " bytes");
  TierKind tier = AccessTier(info.home);
  ASSIGN_OR_RETURN(TensorView v, Acquire(id, tier, Access::kWriteDiscard));
  Status s;
  if (tier == TierKind::kGpu && impl_->engine && !impl_->engine->stand_in()) {
    auto tk = impl_->engine->HostToDevice(v.data, src, bytes);
    s = tk.ok() ? tk->Wait() : tk.status();
  } else if (bytes > 0) {
    std::memcpy(v.data, src, bytes);
  }
  Status r = Release(id, tier, /*dirty=*/true);
  return s.ok() ? r : s;
}

Status TierStore::Read(TensorId id, void* dst, uint64_t bytes) {
  ASSIGN_OR_RETURN(TensorInfo info, Info(id));
  if (bytes != info.bytes)
    return InvalidArgument("read of " + std::to_string(bytes) + " bytes from tensor '" + info.name + "' of " +
                           std::to_string(info.bytes) + " bytes");
  TierKind tier = AccessTier(info.home);
  ASSIGN_OR_RETURN(TensorView v, Acquire(id, tier, Access::kRead));
  Status s;
  if (tier == TierKind::kGpu && impl_->engine && !impl_->engine->stand_in()) {
    auto tk = impl_->engine->DeviceToHost(dst, v.data, bytes);
    s = tk.ok() ? tk->Wait() : tk.status();
  } else if (bytes > 0) {
    std::memcpy(dst, v.data, bytes);
  }
  Status r = Release(id, tier, /*dirty=*/false);
  return s.ok() ? r : s;
}

TierStoreStats TierStore::stats() const {
  Impl& m = *impl_;
  TierStoreStats s;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    s.gpu_to_host = m.links[kGpuToHost];
    s.host_to_gpu = m.links[kHostToGpu];
    s.host_to_nvme = m.links[kHostToNvme];
    s.nvme_to_host = m.links[kNvmeToHost];
    for (int k = 0; k < kNumTiers; ++k) {
      s.tiers[k] = m.counters[k];
      s.tiers[k].resident = 0;
    }
    for (auto& [id, t] : m.tensors)
      for (int k = 0; k < kNumTiers; ++k)
        if (t->copies[k].allocated()) s.tiers[k].resident++;
    s.tensors = m.tensors.size();
    s.acquires = m.n_acquires;
    s.releases = m.n_releases;
    s.prefetches = m.n_prefetches;
    s.evicts = m.n_evicts;
    s.flushes = m.n_flushes;
    s.queue_depth = m.queue_depth;
    s.max_queue_depth = m.max_queue_depth;
    s.failures = m.n_failures;
  }
  if (m.gpu) s.tiers[kGpu].usage = m.gpu->usage();
  s.tiers[kHost].usage = m.host->usage();
  if (m.engine) s.copy = m.engine->stats();
  if (m.nvme) s.nvme = m.nvme->stats();
  return s;
}

GpuTier* TierStore::gpu_tier() const { return impl_->gpu.get(); }
HostTier* TierStore::host_tier() const { return impl_->host.get(); }
NvmeTier* TierStore::nvme_tier() const { return impl_->nvme.get(); }
CopyEngine* TierStore::copy_engine() const { return impl_->engine.get(); }

}  // namespace strata
