// SPDX-License-Identifier: Apache-2.0
#include "engine/step_schedule.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "base/bytes.h"

namespace strata {

namespace {

// The recording access.
class ScheduleRecorder final : public StepAccess {
 public:
  ScheduleRecorder(AccessSchedule* schedule, const ModelState& state) : s_(schedule) {
    for (const Shard& sh : state.shards()) params_.insert(sh.p.value);
  }
  bool records() const override { return true; }
  Result<void*> Acquire(TensorId id, Access access) override {
    const bool refresh = params_.count(id.value) > 0 && refreshed_.insert(id.value).second;
    s_->Acquire(id, access, refresh);
    mode_[id.value] = access;
    return static_cast<void*>(nullptr);
  }
  Status Release(TensorId id, bool dirty) override {
    auto it = mode_.find(id.value);
    const bool wrote = it != mode_.end() && it->second != Access::kRead;
    s_->Release(id, /*discard=*/wrote && !dirty);
    return Status::OK();
  }

 private:
  AccessSchedule* s_;
  std::unordered_set<uint64_t> params_, refreshed_;
  std::unordered_map<uint64_t, Access> mode_;  // each tensor's current acquire
};

}  // namespace

Result<AccessSchedule> RecordStepSchedule(const models::ModelProgram& model, ModelState* state, StepBuffers* buffers,
                                          kernels::Backend* backend, const StepShape& shape, const TierStore& store,
                                          std::vector<size_t>* gathers) {
  AccessSchedule s(TierKind::kGpu);
  ScheduleRecorder recorder(&s, *state);
  StepEnv env(state, buffers, backend, &recorder, shape, StepEnv::Hooks{}, StepEnv::Options{});
  RETURN_IF_ERROR(RunStepPasses(model, env, shape, StepHooks{}).WithContext("recording the step's schedule"));
  if (gathers) *gathers = env.recorded_gathers();
  RETURN_IF_ERROR(s.DescribeFrom(store));
  RETURN_IF_ERROR(s.Finish());
  return s;
}

Result<StepPrefetcher> StartStepPrefetcher(TierStore* store, AccessSchedule s, const ModelState& state,
                                           std::function<bool(TensorId, uint64_t)> ready) {
  GpuTier* gt = store->gpu_tier();
  const TierUsage u = gt->usage();
  const uint64_t align = gt->alignment();
  const uint64_t cap = u.budget / align * align;
  uint64_t largest = 0;
  for (uint32_t t = 0; t < s.tensors().size(); ++t)
    if (s.managed(t)) largest = std::max(largest, AlignUp(std::max<uint64_t>(s.tensors()[t].bytes, 1), align));
  const uint64_t free = cap > u.used ? cap - u.used : 0;
  const uint64_t budget = free > largest ? free - largest : 0;
  ASSIGN_OR_RETURN(std::vector<ScheduleTraffic> traffic, SimulateTraffic(s, budget, align, 3));
  uint64_t opt_h2d = 0, opt_d2h = 0;
  const ModelState::Layout& lay = state.layout();
  for (const Shard& sh : state.shards()) {
    if (sh.opt_home == TierKind::kGpu) continue;
    if (sh.p_home == TierKind::kGpu) opt_h2d += static_cast<uint64_t>(sh.numel) * DTypeSize(lay.dtype);
    if (sh.g_home == TierKind::kGpu) opt_d2h += static_cast<uint64_t>(sh.g_numel()) * DTypeSize(lay.grad_dtype);
  }
  StepPrefetcher out;
  out.traffic.h2d = traffic.back().load_bytes + opt_h2d;
  out.traffic.d2h = traffic.back().writeback_bytes + opt_d2h;
  out.traffic.swap_window = budget;
  PrefetcherOptions po;
  po.budget_bytes = budget;
  po.ready = std::move(ready);
  ASSIGN_OR_RETURN(out.prefetcher, Prefetcher::Create(store, std::move(s), std::move(po)));
  return out;
}

}  // namespace strata
