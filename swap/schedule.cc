// SPDX-License-Identifier: Apache-2.0
#include "swap/schedule.h"

#include <algorithm>

namespace strata {

uint32_t AccessSchedule::Index(TensorId id) {
  auto [it, inserted] = index_.try_emplace(id.value, static_cast<uint32_t>(tensors_.size()));
  if (inserted) {
    ScheduledTensor t;
    t.id = id;
    tensors_.push_back(std::move(t));
  }
  return it->second;
}

void AccessSchedule::Describe(TensorId id, uint64_t bytes, TierKind home, std::string name) {
  ScheduledTensor& t = tensors_[Index(id)];
  t.bytes = bytes;
  t.home = home;
  t.name = name.empty() ? "tensor " + std::to_string(id.value) : std::move(name);
  t.described = true;
}

Status AccessSchedule::DescribeFrom(const TierStore& store) {
  for (ScheduledTensor& t : tensors_) {
    ASSIGN_OR_RETURN(TensorInfo info, store.Info(t.id));
    t.bytes = info.bytes;
    t.home = info.home;
    t.name = info.name;
    t.described = true;
  }
  return Status::OK();
}

void AccessSchedule::Acquire(TensorId id, Access access, bool refresh) {
  ScheduleEvent e;
  e.type = ScheduleEvent::kAcquire;
  e.tensor = Index(id);
  e.access = access;
  e.refresh = refresh;
  events_.push_back(e);
  finished_ = false;
}

void AccessSchedule::Release(TensorId id, bool discard) {
  ScheduleEvent e;
  e.type = ScheduleEvent::kRelease;
  e.tensor = Index(id);
  e.discard = discard;
  events_.push_back(e);
  finished_ = false;
}

Status AccessSchedule::Finish() {
  if (events_.empty()) return InvalidArgument("access schedule: no events");
  if (events_.size() > UINT32_MAX) return InvalidArgument("access schedule: too many events");
  for (const ScheduledTensor& t : tensors_) {
    if (!t.described)
      return InvalidArgument("access schedule: tensor " + std::to_string(t.id.value) +
                             " is used but not described (bytes, home)");
    if (static_cast<int>(t.home) < static_cast<int>(tier_))
      return InvalidArgument("access schedule: tensor '" + t.name + "' lives on " + std::string(TierName(t.home)) +
                             ", which is faster than the schedule's tier " + std::string(TierName(tier_)));
  }
  // Pins must balance within the cycle, and writers are exclusive (as the
  // store enforces).
  std::vector<int> readers(tensors_.size(), 0);
  std::vector<bool> writer(tensors_.size(), false);
  for (size_t i = 0; i < events_.size(); ++i) {
    const ScheduleEvent& e = events_[i];
    const std::string& name = tensors_[e.tensor].name;
    if (e.type == ScheduleEvent::kAcquire) {
      if (writer[e.tensor] || (e.access != Access::kRead && readers[e.tensor] > 0))
        return InvalidArgument("access schedule: event " + std::to_string(i) + " acquires '" + name +
                               "' while it is acquired" + (writer[e.tensor] ? " for writing" : ""));
      if (e.access == Access::kRead)
        readers[e.tensor]++;
      else
        writer[e.tensor] = true;
    } else {
      if (writer[e.tensor])
        writer[e.tensor] = false;
      else if (readers[e.tensor] > 0)
        readers[e.tensor]--;
      else
        return InvalidArgument("access schedule: event " + std::to_string(i) + " releases '" + name +
                               "', which is not acquired");
    }
  }
  for (size_t t = 0; t < tensors_.size(); ++t)
    if (writer[t] || readers[t] > 0)
      return InvalidArgument("access schedule: '" + tensors_[t].name + "' is still acquired at the end of the cycle");

  acquires_.assign(tensors_.size(), {});
  for (size_t i = 0; i < events_.size(); ++i)
    if (events_[i].type == ScheduleEvent::kAcquire) acquires_[events_[i].tensor].push_back(static_cast<uint32_t>(i));
  const uint64_t n = events_.size();
  next_same_.assign(n, 0);
  for (const auto& pos : acquires_)
    for (size_t k = 0; k < pos.size(); ++k)
      next_same_[pos[k]] = k + 1 < pos.size() ? pos[k + 1] - pos[k] : static_cast<uint32_t>(n - pos[k] + pos[0]);
  for (size_t i = 0; i < events_.size(); ++i) {
    ScheduleEvent& e = events_[i];
    if (e.type != ScheduleEvent::kRelease) continue;
    const auto& pos = acquires_[e.tensor];
    auto it = std::upper_bound(pos.begin(), pos.end(), static_cast<uint32_t>(i));
    const ScheduleEvent& next = events_[it != pos.end() ? *it : pos.front()];
    e.ends_life = next.access == Access::kWriteDiscard || next.refresh;
  }
  finished_ = true;
  return Status::OK();
}

std::optional<uint32_t> AccessSchedule::IndexOf(TensorId id) const {
  auto it = index_.find(id.value);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

std::optional<uint64_t> AccessSchedule::UseFrom(TensorId id, uint64_t tick) const {
  auto t = IndexOf(id);
  if (!t || acquires_[*t].empty()) return std::nullopt;
  const auto& pos = acquires_[*t];
  const uint64_t n = events_.size(), cycle = tick / n, p = tick % n;
  auto it = std::lower_bound(pos.begin(), pos.end(), p);
  if (it != pos.end()) return cycle * n + *it;
  return (cycle + 1) * n + pos.front();
}

uint64_t AccessSchedule::NextAcquireAfter(uint64_t tick) const { return tick + next_same_[tick % events_.size()]; }

std::string AccessSchedule::EventString(uint64_t tick) const {
  const ScheduleEvent& e = event(tick);
  const std::string& name = tensors_[e.tensor].name;
  if (e.type == ScheduleEvent::kRelease) return "release '" + name + "'";
  return "acquire '" + name + "' (" + std::string(AccessName(e.access)) + (e.refresh ? ", refreshed" : "") + ")";
}

}  // namespace strata
