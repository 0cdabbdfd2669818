// SPDX-License-Identifier: Apache-2.0
// ScheduleWindow: which tensors of an AccessSchedule should be resident on its
// tier now — the decision shared by the Prefetcher (which acts on it) and
// SimulateTraffic (which counts what acting on it moves), so the two cannot
// disagree.
//
// The window is the longest stretch of upcoming events [head, end) whose
// tensors fit in the byte budget together with the tensors the driver holds
// acquired now. A tensor occupies room from the moment its first upcoming use
// enters the window until the driver has released it and the window holds no
// more use of it; then it leaves (the prefetcher evicts it). This is Belady's
// rule with the schedule as the oracle: what is kept is what is used soonest,
// and a tensor is dropped exactly when everything in the budget is needed
// before it. A copy is also dropped when its life ends (ScheduleEvent::
// ends_life: its next use overwrites it), though the room stays reserved for
// that next use when it is in the window. Only the event sequence and the
// budget decide, never timing, so a run and its simulation take the same
// decisions.
//
// Sizes are those of a copy on the tier: the tensor's bytes rounded up as the
// tier's allocator does (`alignment`; host copies are whole pages).
//
// Thread-safety: none; one owner.
#pragma once

#include <cstdint>
#include <vector>

#include "base/bytes.h"
#include "swap/schedule.h"

namespace strata {

class ScheduleWindow {
 public:
  ScheduleWindow(const AccessSchedule* schedule, uint64_t budget, uint64_t alignment)
      : s_(schedule),
        budget_(budget),
        in_window_(schedule->tensors().size(), 0),
        pins_(schedule->tensors().size(), 0),
        size_(schedule->tensors().size(), 0) {
    const uint64_t page = schedule->tier() == TierKind::kGpu ? 1 : 4096;
    for (size_t t = 0; t < size_.size(); ++t)
      size_[t] = AlignUp(AlignUp(std::max<uint64_t>(schedule->tensors()[t].bytes, 1), page), alignment);
  }

  uint64_t head() const { return head_; }  // the next event the driver performs
  uint64_t end() const { return end_; }    // the first event beyond the window
  uint64_t budget() const { return budget_; }
  uint64_t occupied() const { return occupied_; }  // bytes of the tensors in the window or held
  uint64_t size_of(uint32_t t) const { return size_[t]; }
  bool occupying(uint32_t t) const { return in_window_[t] > 0 || pins_[t] > 0; }
  int pins(uint32_t t) const { return pins_[t]; }

  // Grows the window over the next events while their tensors fit (at most
  // one cycle ahead). Calls enter(tick, event, newly) for each acquire of a
  // managed tensor taken in; `newly`: the tensor was not occupying before.
  template <class Enter>
  void Extend(Enter&& enter) {
    const uint64_t n = s_->size();
    while (end_ - head_ < n) {
      const ScheduleEvent& e = s_->event(end_);
      if (e.type == ScheduleEvent::kRelease || !s_->managed(e.tensor)) {
        ++end_;
        continue;
      }
      const bool newly = !occupying(e.tensor);
      if (newly) {
        if (occupied_ + size_[e.tensor] > budget_) break;
        occupied_ += size_[e.tensor];
      }
      in_window_[e.tensor]++;
      enter(end_, e, newly);
      ++end_;
    }
  }

  // The driver performs the event at head.
  struct Moved {
    bool forced = false;  // an acquire that did not fit: admitted over the budget
    bool left = false;    // a release after which the tensor left the window
    bool drop = false;    // a release after which its copy is not needed: left, or its life ended
  };
  Moved Advance() {
    Moved m;
    const ScheduleEvent& e = s_->event(head_);
    const bool managed = s_->managed(e.tensor);
    if (end_ == head_) {  // the window is empty: the event itself did not fit
      ++end_;
      if (managed && e.type == ScheduleEvent::kAcquire) {
        if (!occupying(e.tensor)) occupied_ += size_[e.tensor];
        in_window_[e.tensor]++;
        m.forced = true;
      }
    }
    ++head_;
    if (!managed) return m;
    if (e.type == ScheduleEvent::kAcquire) {
      in_window_[e.tensor]--;
      pins_[e.tensor]++;
    } else {
      pins_[e.tensor]--;
      if (!occupying(e.tensor)) {
        occupied_ -= size_[e.tensor];
        m.left = true;
      }
      m.drop = m.left || (pins_[e.tensor] == 0 && e.ends_life);
    }
    return m;
  }

 private:
  const AccessSchedule* s_;
  uint64_t budget_;
  uint64_t head_ = 0, end_ = 0;
  uint64_t occupied_ = 0;
  std::vector<uint32_t> in_window_;  // per tensor: its acquires in [head, end)
  std::vector<int> pins_;            // per tensor: acquired and not released
  std::vector<uint64_t> size_;       // per tensor: bytes of a copy on the tier
};

}  // namespace strata
