// SPDX-License-Identifier: Apache-2.0
// AccessSchedule: the known access order of one cycle (one training step) on
// one tier — the input of the prefetcher (swap/prefetcher.h).
//
// A schedule is the exact sequence of the driver's Acquire and Release calls
// on the tier, in the order it makes them, repeated every cycle. Ticks count
// events: tick t of an unbounded run is event t % size() of cycle
// t / size(). "The next use of X after tick t" is the tick of X's next
// acquire, in this cycle or a later one.
//
// Each acquire says how the contents are used (Access: kRead and kReadWrite
// need them, kWriteDiscard overwrites them) and whether they are replaced
// outside the schedule before it (`refresh`: the optimizer writes new
// parameters between steps, so a copy kept from before is stale; it is
// loaded again once the driver says the new contents are ready). A
// kWriteDiscard or refresh acquire starts a new life of the tensor: the
// release that ends the life before it is marked `ends_life`.
//
// Tensors are described once (bytes, home tier). Uses of tensors whose home
// is the schedule's tier stay in the sequence (the driver's calls must match
// it) but take no room and never move.
//
// Thread-safety: building is single-threaded; a finished schedule is
// immutable and may be read from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "base/tier_kind.h"
#include "tiers/tier_store.h"

namespace strata {

struct ScheduleEvent {
  enum Type : uint8_t { kAcquire, kRelease };
  Type type = kAcquire;
  uint32_t tensor = 0;            // index into AccessSchedule::tensors()
  Access access = Access::kRead;  // acquires only
  bool refresh = false;           // acquires only: contents replaced outside the schedule before it
  // Releases only: the tensor's next acquire overwrites it (kWriteDiscard) or
  // refreshes it, so once nothing holds it the copy is not needed on the tier
  // any more (the contents it has are wanted at home or nowhere).
  bool ends_life = false;
  // Releases only: the holder's writes are not wanted anywhere (the caller
  // releases the copy clean: nothing goes home for it).
  bool discard = false;
  bool reads() const { return type == kAcquire && access != Access::kWriteDiscard; }
  bool writes() const { return type == kAcquire && access != Access::kRead; }
};

struct ScheduledTensor {
  TensorId id;
  std::string name;    // for messages
  uint64_t bytes = 0;  // the tensor's size
  TierKind home = TierKind::kHost;
  bool described = false;
};

class AccessSchedule {
 public:
  explicit AccessSchedule(TierKind tier = TierKind::kGpu) : tier_(tier) {}

  // ---- building (before Finish) ----
  // Size and home of a tensor the schedule uses (before or after its uses
  // are added). DescribeFrom asks the store about every tensor used.
  void Describe(TensorId id, uint64_t bytes, TierKind home, std::string name = {});
  Status DescribeFrom(const TierStore& store);
  void Acquire(TensorId id, Access access, bool refresh = false);
  // `discard`: the writes made under this hold are dropped, not written home
  // (the caller's Release says dirty = false; e.g. an accumulator whose
  // contents the next cycle overwrites).
  void Release(TensorId id, bool discard = false);
  // Checks the sequence and indexes it. InvalidArgument when it is empty, a
  // tensor used is not described or cannot have a copy on the schedule's
  // tier (its home is faster), a tensor is released without being acquired,
  // acquired for writing while acquired, or still acquired at the end of the
  // cycle.
  Status Finish();

  // ---- queries (after Finish) ----
  TierKind tier() const { return tier_; }
  bool finished() const { return finished_; }
  uint64_t size() const { return events_.size(); }  // events per cycle
  const ScheduleEvent& event(uint64_t tick) const { return events_[tick % events_.size()]; }
  const std::vector<ScheduleEvent>& events() const { return events_; }
  const std::vector<ScheduledTensor>& tensors() const { return tensors_; }
  // The tensor's index in tensors(); nullopt when the schedule does not use it.
  std::optional<uint32_t> IndexOf(TensorId id) const;
  // True when copies of the tensor on the schedule's tier are caches (its home
  // is a slower tier): those take room and move.
  bool managed(uint32_t tensor) const { return tensors_[tensor].home != tier_; }
  // The tick of the tensor's first acquire strictly after `tick` (NextUse) or
  // at or after it (UseFrom); nullopt when the schedule never acquires it.
  // O(log of the tensor's uses).
  std::optional<uint64_t> NextUse(TensorId id, uint64_t tick) const { return UseFrom(id, tick + 1); }
  std::optional<uint64_t> UseFrom(TensorId id, uint64_t tick) const;
  // For the acquire at `tick`: the tick of the same tensor's next acquire
  // (later in this cycle, or its first one in the next). O(1).
  uint64_t NextAcquireAfter(uint64_t tick) const;
  // Event `tick` in words, for messages: "acquire 'x3.0' (read)".
  std::string EventString(uint64_t tick) const;

 private:
  uint32_t Index(TensorId id);

  TierKind tier_;
  bool finished_ = false;
  std::vector<ScheduleEvent> events_;
  std::vector<ScheduledTensor> tensors_;
  std::unordered_map<uint64_t, uint32_t> index_;  // TensorId.value -> index in tensors_
  std::vector<std::vector<uint32_t>> acquires_;   // per tensor: positions of its acquires
  std::vector<uint32_t> next_same_;               // per acquire position: ticks to its tensor's next acquire
};

}  // namespace strata
