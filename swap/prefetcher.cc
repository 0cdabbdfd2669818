// SPDX-License-Identifier: Apache-2.0
#include "swap/prefetcher.h"

#include <algorithm>

#include "base/clock.h"

namespace strata {

namespace {

// Failures of an eviction that lose nothing: the tensor was acquired again
// before the eviction ran (the copy is kept), or the store is going away.
bool Benign(const Status& s) {
  return s.code() == StatusCode::kFailedPrecondition || s.code() == StatusCode::kCancelled;
}

}  // namespace

Result<std::unique_ptr<Prefetcher>> Prefetcher::Create(TierStore* store, AccessSchedule schedule,
                                                       PrefetcherOptions options) {
  if (store == nullptr) return InvalidArgument("prefetcher: no store");
  if (!schedule.finished()) return InvalidArgument("prefetcher: the access schedule is not finished");
  const MemoryTier* tier = nullptr;
  if (schedule.tier() == TierKind::kGpu) tier = store->gpu_tier();
  if (schedule.tier() == TierKind::kHost) tier = store->host_tier();
  if (tier == nullptr)
    return InvalidArgument("prefetcher: the store has no addressable " + std::string(TierName(schedule.tier())) +
                           " tier for the schedule");
  std::unique_ptr<Prefetcher> p(new Prefetcher(store, tier, std::move(schedule), std::move(options)));
  p->Extend();
  RETURN_IF_ERROR(p->Issue());
  return p;
}

Prefetcher::Prefetcher(TierStore* store, const MemoryTier* tier, AccessSchedule schedule, PrefetcherOptions options)
    : store_(store),
      tier_(tier),
      schedule_(std::move(schedule)),
      options_(std::move(options)),
      window_(&schedule_, options_.budget_bytes, tier->alignment()),
      resident_(schedule_.tensors().size(), false) {}

Status Prefetcher::Check(uint64_t tick, ScheduleEvent::Type type, TensorId id, Access access) const {
  const ScheduleEvent& e = schedule_.event(tick);
  if (e.type == type && schedule_.tensors()[e.tensor].id == id &&
      (type == ScheduleEvent::kRelease || e.access == access))
    return Status::OK();
  auto t = schedule_.IndexOf(id);
  std::string who =
      t ? "'" + schedule_.tensors()[*t].name + "'" : "tensor " + std::to_string(id.value) + " (not in the schedule)";
  std::string call = type == ScheduleEvent::kAcquire
                         ? "acquire of " + who + " (" + std::string(AccessName(access)) + ")"
                         : "release of " + who;
  return FailedPrecondition("prefetcher: the " + call + " at tick " + std::to_string(tick) + " (event " +
                            std::to_string(tick % schedule_.size()) + " of cycle " +
                            std::to_string(tick / schedule_.size()) + ") does not follow the schedule, which has " +
                            schedule_.EventString(tick) + " there");
}

void Prefetcher::Extend() {
  window_.Extend([this](uint64_t tick, const ScheduleEvent& e, bool newly) {
    // A read needs the contents: of a tensor new to the window, or new
    // contents after a refresh. A write-discard use only needs the room.
    if (e.reads() && (newly || e.refresh)) pending_.push_back(Pending{tick, e.tensor, e.refresh});
  });
}

bool Prefetcher::ContiguousRoom(uint64_t bytes) {
  const TierUsage u = tier_->usage();
  const uint64_t align = tier_->alignment();
  const uint64_t cap = u.budget / align * align;
  // Slabs not mapped yet can still hold a block of what is left.
  const uint64_t largest = std::max(u.largest_free, cap > u.reserved ? cap - u.reserved : 0);
  if (largest < bytes) return false;
  if (largest >= inflight_bytes_ + bytes) return true;
  // Prefetches in flight that have not allocated their copy yet may take
  // their blocks from the largest free one (asked only when it matters).
  uint64_t unallocated = 0;
  for (const Inflight& f : inflight_) {
    auto info = store_->Info(schedule_.tensors()[f.tensor].id);
    if (info.ok() && !info->copies[static_cast<int>(schedule_.tier())].allocated) unallocated += f.bytes;
    if (unallocated + bytes > largest) return false;
  }
  return true;
}

Status Prefetcher::Issue() {
  const TierKind tier = schedule_.tier();
  while (!pending_.empty()) {
    const Pending p = pending_.front();
    if (p.tick < window_.head()) {  // its acquire came first and loaded it
      pending_.pop_front();
      continue;
    }
    const uint32_t t = p.tensor;
    const TensorId id = schedule_.tensors()[t].id;
    if (p.refresh) {
      // New contents: not while the old ones are still used, and not before
      // they exist.
      if (window_.pins(t) > 0) break;
      if (schedule_.UseFrom(id, window_.head()) != p.tick) break;
      if (options_.ready && !options_.ready(id, p.tick / schedule_.size())) break;
    }
    const uint64_t b = window_.size_of(t);
    if (!resident_[t]) {
      if (!BudgetRoom(b) || !ContiguousRoom(b)) {
        RETURN_IF_ERROR(PollEvictions());
        RETURN_IF_ERROR(PollPrefetches());
        if (!BudgetRoom(b) || !ContiguousRoom(b)) break;  // room comes with the moves in flight
      }
      resident_[t] = true;
      resident_bytes_ += b;
      stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, resident_bytes_);
    }
    pending_.pop_front();
    if (options_.hints) RETURN_IF_ERROR(store_->SetNextUse(id, p.tick));
    Result<Ticket> r = store_->Prefetch(id, tier);
    if (!r.ok()) {
      // Held for writing by another thread: the acquire will load it.
      if (r.status().code() == StatusCode::kFailedPrecondition) continue;
      return Failed(r.status(), t, "prefetching");
    }
    stats_.prefetches++;
    inflight_.push_back(Inflight{t, b, *r});
    inflight_bytes_ += b;
  }
  return Status::OK();
}

Status Prefetcher::Failed(const Status& s, uint32_t t, const char* what) {
  error_ = s.WithContext("prefetcher: " + std::string(what) + " '" + schedule_.tensors()[t].name + "' (" +
                         std::string(TierName(schedule_.tier())) + ")");
  return error_;
}

// A finished prefetch. No room is not an error (the acquire loads the tensor,
// the store making room by next use); a failed transfer is, and since asking
// the ticket reported it, it sticks here.
Status Prefetcher::PrefetchDone(const Inflight& f, const Status& s) {
  if (s.ok() || s.code() == StatusCode::kFailedPrecondition || s.code() == StatusCode::kCancelled) return Status::OK();
  if (s.code() == StatusCode::kOutOfMemory) {
    if (resident_[f.tensor]) {
      resident_[f.tensor] = false;
      resident_bytes_ -= f.bytes;
    }
    return Status::OK();
  }
  return Failed(s, f.tensor, "prefetching");
}

Status Prefetcher::PollPrefetches() {
  while (!inflight_.empty()) {
    Result<bool> done = inflight_.front().ticket.Poll();
    if (done.ok() && !*done) break;
    Inflight f = std::move(inflight_.front());
    inflight_.pop_front();
    inflight_bytes_ -= f.bytes;
    RETURN_IF_ERROR(PrefetchDone(f, done.status()));
  }
  return Status::OK();
}

Status Prefetcher::WaitOldestPrefetch() {
  Inflight f = std::move(inflight_.front());
  inflight_.pop_front();
  inflight_bytes_ -= f.bytes;
  return PrefetchDone(f, f.ticket.Wait());
}

Status Prefetcher::PollEvictions() {
  while (!evicting_.empty()) {
    Result<bool> done = evicting_.front().ticket.Poll();
    if (done.ok() && !*done) break;
    Eviction ev = std::move(evicting_.front());
    evicting_.pop_front();
    resident_bytes_ -= ev.bytes;
    if (!done.ok() && !Benign(done.status())) return Failed(done.status(), ev.tensor, "evicting");
  }
  return Status::OK();
}

Status Prefetcher::WaitOldestEviction() {
  Eviction ev = std::move(evicting_.front());
  evicting_.pop_front();
  Status s = ev.ticket.Wait();
  resident_bytes_ -= ev.bytes;
  if (!s.ok() && !Benign(s)) return Failed(s, ev.tensor, "evicting");
  return Status::OK();
}

Status Prefetcher::Evict(uint32_t t) {
  resident_[t] = false;
  const uint64_t b = window_.size_of(t);
  Result<Ticket> tk = store_->Evict(schedule_.tensors()[t].id, schedule_.tier());
  if (!tk.ok()) {
    resident_bytes_ -= b;
    // Pinned by another thread: the store drops it later by its next use.
    return Benign(tk.status()) ? Status::OK() : Failed(tk.status(), t, "evicting");
  }
  stats_.evictions++;
  evicting_.push_back(Eviction{t, b, *tk});
  return PollEvictions();
}

// Room for the acquire's new copy: what is evicting goes first, then the
// prefetches in flight take their blocks; never by dropping what the window
// keeps. When that is not enough (admitted over the budget, or no free block
// big enough), the store makes the room, dropping the copy used farthest ahead.
Status Prefetcher::MakeRoom(uint32_t t) {
  const uint64_t b = window_.size_of(t);
  double t0 = 0;
  for (;;) {
    RETURN_IF_ERROR(PollEvictions());
    RETURN_IF_ERROR(PollPrefetches());
    const bool budget = BudgetRoom(b), contiguous = ContiguousRoom(b);
    if (budget && contiguous) break;
    if (t0 == 0) {
      t0 = NowSeconds();
      stats_.room_waits++;
    }
    if (!evicting_.empty()) {
      RETURN_IF_ERROR(WaitOldestEviction());
    } else if (!contiguous && !inflight_.empty()) {
      RETURN_IF_ERROR(WaitOldestPrefetch());
    } else {
      if (!budget) stats_.forced++;
      if (!contiguous) stats_.fragmented++;
      break;
    }
  }
  if (t0 != 0) stats_.room_wait_seconds += NowSeconds() - t0;
  resident_[t] = true;
  resident_bytes_ += b;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, resident_bytes_);
  return Status::OK();
}

Result<TensorView> Prefetcher::Acquire(TensorId id, Access access) {
  RETURN_IF_ERROR(error_);
  const uint64_t tick = window_.head();
  RETURN_IF_ERROR(Check(tick, ScheduleEvent::kAcquire, id, access));
  const uint32_t t = schedule_.event(tick).tensor;
  ScheduleWindow::Moved moved = window_.Advance();
  if (schedule_.managed(t)) {
    if (moved.forced) stats_.forced++;
    if (!resident_[t]) RETURN_IF_ERROR(MakeRoom(t));
    if (options_.hints) RETURN_IF_ERROR(store_->SetNextUse(id, schedule_.NextAcquireAfter(tick)));
  }
  Extend();
  RETURN_IF_ERROR(Issue());
  return store_->Acquire(id, schedule_.tier(), access);
}

Status Prefetcher::Release(TensorId id, bool dirty, void* stream) {
  RETURN_IF_ERROR(error_);
  const uint64_t tick = window_.head();
  RETURN_IF_ERROR(Check(tick, ScheduleEvent::kRelease, id, Access::kRead));
  const uint32_t t = schedule_.event(tick).tensor;
  RETURN_IF_ERROR(store_->Release(id, schedule_.tier(), dirty, stream));
  ScheduleWindow::Moved moved = window_.Advance();
  if (moved.drop && resident_[t]) RETURN_IF_ERROR(Evict(t));
  Extend();
  return Issue();
}

Status Prefetcher::Poll() {
  RETURN_IF_ERROR(error_);
  RETURN_IF_ERROR(PollEvictions());
  RETURN_IF_ERROR(PollPrefetches());
  return Issue();
}

Status Prefetcher::WaitEvictions() {
  RETURN_IF_ERROR(error_);
  while (!evicting_.empty()) RETURN_IF_ERROR(WaitOldestEviction());
  return Status::OK();
}

PrefetcherStats Prefetcher::stats() const {
  PrefetcherStats s = stats_;
  s.window_bytes = window_.occupied();
  s.resident_bytes = resident_bytes_;
  return s;
}

// ---- simulation ------------------------------------------------------------------

Result<std::vector<ScheduleTraffic>> SimulateTraffic(const AccessSchedule& schedule, uint64_t budget_bytes,
                                                     uint64_t alignment, int cycles) {
  if (!schedule.finished()) return InvalidArgument("traffic simulation: the access schedule is not finished");
  if (cycles < 1) return InvalidArgument("traffic simulation: cycles must be >= 1");
  if (!IsPowerOfTwo(alignment)) return InvalidArgument("traffic simulation: alignment must be a power of two");
  ScheduleWindow w(&schedule, budget_bytes, alignment);
  const size_t nt = schedule.tensors().size();
  std::vector<bool> valid(nt, false), dirty(nt, false);  // the copy on the schedule's tier
  std::vector<ScheduleTraffic> out(static_cast<size_t>(cycles));
  auto none = [](uint64_t, const ScheduleEvent&, bool) {};
  w.Extend(none);
  const uint64_t n = schedule.size();
  for (uint64_t tick = 0; tick < n * static_cast<uint64_t>(cycles); ++tick) {
    ScheduleTraffic& c = out[tick / n];
    const ScheduleEvent& e = schedule.event(tick);
    const uint64_t bytes = schedule.tensors()[e.tensor].bytes;
    ScheduleWindow::Moved m = w.Advance();
    if (schedule.managed(e.tensor)) {
      if (e.type == ScheduleEvent::kAcquire) {
        // Loads happen when the tensor enters the window, or for a refresh
        // once ready; either way once per acquire that finds no valid copy.
        if (e.refresh) valid[e.tensor] = false;
        if (e.reads() && !valid[e.tensor]) {
          c.load_bytes += bytes;
          c.loads++;
        }
        valid[e.tensor] = true;
        if (e.writes()) dirty[e.tensor] = true;
      } else if (e.discard) {
        dirty[e.tensor] = false;
        if (m.drop) valid[e.tensor] = false;
      } else if (m.drop) {
        if (dirty[e.tensor]) {
          c.writeback_bytes += bytes;
          c.writebacks++;
        }
        valid[e.tensor] = dirty[e.tensor] = false;
      }
    }
    w.Extend(none);
  }
  return out;
}

}  // namespace strata
