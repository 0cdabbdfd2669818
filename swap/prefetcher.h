// SPDX-License-Identifier: Apache-2.0
// Prefetcher: runs an AccessSchedule against a TierStore. It keeps the
// upcoming uses resident on the schedule's tier within a byte budget, drops
// copies as soon as everything that fits is needed before them, and tells
// the store each copy's next use so that, should the store ever have to make
// room itself (EvictionPolicy::kNextUse), it drops the copy used farthest in
// the future.
//
// The driver makes its Acquire/Release calls on the tier through the
// prefetcher, in exactly the schedule's order (a call that does not match the
// next event is refused with FailedPrecondition naming both). Per event:
//   - the window (swap/window.h) moves on: tensors whose uses come into it
//     are prefetched (reads; a write-discard use only reserves room), in
//     schedule order, each only once there is physical room for it (the
//     evictions queued before have finished) and, for a `refresh` use, once
//     `ready(tensor, cycle)` says its new contents exist (a shard's
//     parameters after the optimizer's update) and no earlier use of it is
//     left;
//   - a tensor released and not in the window any more, or whose next use
//     overwrites it (its life ended), is evicted (written back when it holds
//     the only valid contents: a gradient goes home as soon as it is made);
//   - before an acquire of a copy not yet made, room is made by waiting for
//     queued evictions (never by dropping a copy the window still needs).
// Room means both bytes within the budget and a free block big enough (the
// tier's allocator can be fragmented): a prefetch waits until the tier's
// largest free block holds it beside the prefetches in flight.
// So with a budget the tier really has free (and a tier not so fragmented
// that a needed block does not fit: then the store drops the copy used
// farthest ahead), the store never evicts by itself and nothing is loaded
// twice: what moves per cycle is exactly what SimulateTraffic says (when
// every refresh use does get new contents).
//
// Costs: O(1) amortized per call besides the store calls it makes (one
// Acquire/Release, one SetNextUse, the Prefetch/Evict calls of the tensors
// entering or leaving the window, and, only when the tier's largest free
// block may be short, one Info per prefetch in flight); memory O(tensors +
// events). Measured (stand-in, 512 tensors all resident): about 50-70 ns per
// acquire+release pair over the store's own 60 ns.
//
// Errors: a failed background move (a write-back, a prefetch) is sticky:
// every later call returns it, so it surfaces at the next Acquire at the
// latest. (A prefetch that found no room is not an error: the acquire loads
// the tensor.)
//
// Ownership: the prefetcher borrows the store (which must outlive it) and owns
// its copy of the schedule.
//
// Thread-safety: none: one driver thread. `ready` is called on that thread.
// Other threads may use the store meanwhile (an optimizer writing parameters
// on another tier); copies they make on the schedule's tier are not budgeted.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "swap/schedule.h"
#include "swap/window.h"
#include "tiers/tier_store.h"

namespace strata {

struct PrefetcherOptions {
  // Bytes the schedule's managed copies may take on the tier, all together
  // (what the tier has free for caches). Sizes are rounded as the tier's
  // allocator rounds them.
  uint64_t budget_bytes = 0;
  // May tensor `id` be loaded for its `refresh` use in cycle `cycle` (0: the
  // cycle the prefetcher started in)? Null: always.
  std::function<bool(TensorId id, uint64_t cycle)> ready;
  // Set the store's next-use hints (for EvictionPolicy::kNextUse).
  bool hints = true;
};

struct PrefetcherStats {
  uint64_t prefetches = 0;  // Prefetch calls made
  uint64_t evictions = 0;   // Evict calls made
  uint64_t room_waits = 0;  // acquires that waited for evictions to finish
  double room_wait_seconds = 0;
  uint64_t forced = 0;          // acquires admitted beyond the budget
  uint64_t fragmented = 0;      // acquires that found no free block big enough (the store made room)
  uint64_t window_bytes = 0;    // room the window holds now
  uint64_t resident_bytes = 0;  // copies made and not evicted, plus evictions in flight
  uint64_t peak_resident_bytes = 0;
};

class Prefetcher {
 public:
  // InvalidArgument when the schedule is not finished, its tier is nvme (no
  // addressable copies) or absent from the store.
  static Result<std::unique_ptr<Prefetcher>> Create(TierStore* store, AccessSchedule schedule,
                                                    PrefetcherOptions options);
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next event must be the acquire of `id` with `access`. Returns the
  // store's view (TierStore::Acquire on the schedule's tier).
  Result<TensorView> Acquire(TensorId id, Access access);
  // The next event must be the release of `id`. TierStore::Release.
  Status Release(TensorId id, bool dirty, void* stream = nullptr);
  // Issues the prefetches that became possible since the last call (readiness
  // or room); the driver may call it while it waits for something else.
  Status Poll();
  // Waits for every eviction in flight (e.g. the write-backs of a step).
  Status WaitEvictions();

  uint64_t tick() const { return window_.head(); }  // the next event
  uint64_t cycle() const { return window_.head() / schedule_.size(); }
  bool at_cycle_start() const { return window_.head() % schedule_.size() == 0; }
  const AccessSchedule& schedule() const { return schedule_; }
  uint64_t budget() const { return window_.budget(); }
  PrefetcherStats stats() const;

 private:
  struct Pending {
    uint64_t tick;  // the use it is for
    uint32_t tensor;
    bool refresh;
  };
  struct Eviction {
    uint32_t tensor;
    uint64_t bytes;
    Ticket ticket;
  };
  struct Inflight {  // a prefetch issued and not known finished
    uint32_t tensor;
    uint64_t bytes;
    Ticket ticket;
  };

  Prefetcher(TierStore* store, const MemoryTier* tier, AccessSchedule schedule, PrefetcherOptions options);
  Status Check(uint64_t tick, ScheduleEvent::Type type, TensorId id, Access access) const;
  void Extend();
  Status Issue();
  // Room for a new copy of `bytes`: within the budget, and a free block that
  // holds it after the prefetches in flight have taken theirs.
  bool BudgetRoom(uint64_t bytes) const { return resident_bytes_ + bytes <= window_.budget(); }
  bool ContiguousRoom(uint64_t bytes);
  Status MakeRoom(uint32_t t);
  Status PollEvictions();
  Status WaitOldestEviction();
  Status PollPrefetches();
  Status WaitOldestPrefetch();
  Status PrefetchDone(const Inflight& f, const Status& s);
  Status Evict(uint32_t t);
  Status Failed(const Status& s, uint32_t t, const char* what);

  TierStore* store_;
  const MemoryTier* tier_;
  const AccessSchedule schedule_;
  PrefetcherOptions options_;
  ScheduleWindow window_;
  std::deque<Pending> pending_;    // prefetches to issue, in schedule order
  std::deque<Inflight> inflight_;  // in the order issued
  uint64_t inflight_bytes_ = 0;    // their sizes
  std::deque<Eviction> evicting_;  // in the order issued
  std::vector<bool> resident_;     // per tensor: a copy was made (prefetch or acquire) and not evicted
  uint64_t resident_bytes_ = 0;    // resident copies + evictions in flight
  Status error_;                   // sticky: the first failed eviction or prefetch
  PrefetcherStats stats_;
};

// What a Prefetcher with this budget moves per cycle when the driver follows
// the schedule and every refresh use gets new contents: load_bytes onto the
// schedule's tier (host->gpu for a gpu schedule) and writeback_bytes off it.
// One entry per cycle from the first (nothing resident); from the second on
// the figures repeat.
struct ScheduleTraffic {
  uint64_t load_bytes = 0, writeback_bytes = 0;
  uint64_t loads = 0, writebacks = 0;
};
Result<std::vector<ScheduleTraffic>> SimulateTraffic(const AccessSchedule& schedule, uint64_t budget_bytes,
                                                     uint64_t alignment, int cycles = 3);

}  // namespace strata
