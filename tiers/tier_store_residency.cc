// SPDX-License-Identifier: Apache-2.0
// TierStore::Impl, which copies of a tensor exist (tier_store_impl.h): make
// one valid, find room for one by the eviction policy, drop one.
#include "tiers/tier_store_impl.h"

#include <cstring>
#include <optional>

#include "base/clock.h"
#include "base/trace.h"

namespace strata {

using namespace tier_store_internal;  // the store's bookkeeping (tier_store_impl.h)

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

}  // namespace strata
