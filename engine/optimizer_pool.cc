// SPDX-License-Identifier: Apache-2.0
#include "engine/optimizer_pool.h"

#include <algorithm>
#include <utility>

#include "base/clock.h"
#include "base/trace.h"

namespace strata {

OptimizerPool::OptimizerPool(ModelState* state, GradientCounts* counts, OptimizerCopies* copies, ShardUpdater* cpu,
                             ShardUpdater* gpu, Options options)
    : state_(state), counts_(counts), copies_(copies), cpu_(cpu), gpu_(gpu), options_(std::move(options)) {
  for (size_t i = state->gpu_prefix(); i < state->size(); ++i) forward_order_.push_back(i);
  backward_order_.assign(forward_order_.rbegin(), forward_order_.rend());
  MutexLock lock(&mu_);
  const size_t n = state->size();
  shard_state_.assign(n, ShardState::kWaiting);
  grad_final_.assign(n, 0);
  grad_counted_.assign(n, CopyTicket{});
  uploads_.assign(n, CopyTicket{});
  updated_.assign(n, 0);
}

OptimizerPool::~OptimizerPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (cpu_thread_.joinable()) cpu_thread_.join();
  if (gpu_thread_.joinable()) gpu_thread_.join();
}

void OptimizerPool::Start() {
  cpu_thread_ = std::thread([this] { Loop(false); });
  if (gpu_) gpu_thread_ = std::thread([this] { Loop(true); });
}

// ---- the step thread -------------------------------------------------------------

Status OptimizerPool::Post(const OptJob& j) {
  MutexLock lock(&mu_);
  while (has_job_) cv_.Wait(&mu_);
  job_ = j;
  has_job_ = true;
  ++job_seq_;
  queue_ = j.streaming ? backward_order_ : forward_order_;
  next_claim_ = 0;
  std::fill(shard_state_.begin(), shard_state_.end(), ShardState::kWaiting);
  verdict_ = Judged::kPending;
  job_multiplier_ = j.grad_multiplier;
  job_params_ = assist_params_ = 0;
  job_workers_ = gpu_ ? 2 : 1;
  job_t0_ = NowSeconds();
  job_writes_ = 0;
  job_abort_ = false;
  std::fill(grad_final_.begin(), grad_final_.end(), 0);
  std::fill(grad_counted_.begin(), grad_counted_.end(), CopyTicket{});
  // No worker copies now (none is on a job).
  copies_->BeginJob(j.step);
  cv_.SignalAll();
  return Status::OK();
}

void OptimizerPool::MarkGradFinal(size_t s, const CopyTicket& counted) {
  MutexLock lock(&mu_);
  grad_counted_[s] = counted;
  grad_final_[s] = 1;
  cv_.SignalAll();
}

// A hit (the multiplier assumed) commits every speculated shard; a miss
// queues each to be redone in place from its current set, which the
// speculation never wrote (the redo rewrites its parameters too). The shards
// not claimed yet are updated in place with `multiplier`; these and the
// redone ones in forward order, the next forward's. A shard a worker holds
// now is settled by that worker when it is done (Settle).
void OptimizerPool::Verdict(int64_t job_step, bool hit, double multiplier) {
  MutexLock lock(&mu_);
  verdict_ = hit ? Judged::kCommit : Judged::kMiss;
  job_multiplier_ = multiplier;
  std::vector<size_t> rest;
  for (size_t s : forward_order_) {
    if (shard_state_[s] == ShardState::kSpeculated) {
      if (hit) {
        Commit(s, job_step);
        continue;
      }
      shard_state_[s] = ShardState::kWaiting;
    }
    if (shard_state_[s] == ShardState::kWaiting) rest.push_back(s);
  }
  queue_ = std::move(rest);
  next_claim_ = 0;
  cv_.SignalAll();
}

// Shard s's speculative update becomes its state: the two sets swap (ids only).
void OptimizerPool::Commit(size_t s, int64_t job_step) {
  Shard& sh = state_->shard(s);
  std::swap(sh.w, sh.w2);
  std::swap(sh.m, sh.m2);
  std::swap(sh.v, sh.v2);
  shard_state_[s] = ShardState::kFinal;
  updated_[s] = job_step;
}

void OptimizerPool::Abort(const Status& why, int64_t step) {
  std::vector<size_t> restore;
  {
    MutexLock lock(&mu_);
    job_abort_ = true;
    cv_.SignalAll();
    while (has_job_) cv_.Wait(&mu_);
    job_abort_ = false;
    if (job_writes_ > 0 || verdict_ != Judged::kPending) {
      if (error_.ok())
        error_ = FailedPrecondition(
            "step " + std::to_string(step + 1) + " failed after the optimizer had begun updating during the " +
            "backward (" + std::to_string(job_writes_) + " shards hold its update, the others the last step's): " +
            "the in-memory state is partly updated and cannot be saved; resume from the last checkpoint. The " +
            "failure: " + why.ToString());
      return;
    }
    for (size_t s : forward_order_)
      if (shard_state_[s] == ShardState::kSpeculated) restore.push_back(s);
  }
  // A speculated shard's parameters back to the last step's: its untouched
  // master rounded, which is what the update that made them wrote beside
  // them, bit for bit (after the speculative upload into their GPU home).
  for (size_t s : restore) {
    Status st = Upload(s).Wait();
    if (st.ok()) st = state_->RestoreParams(s);  // (partitioned: the slice's, in `ps`)
    if (st.ok()) continue;
    MutexLock lock(&mu_);
    if (error_.ok())
      error_ = FailedPrecondition("step " + std::to_string(step + 1) +
                                  " failed during its speculative update, and the parameters of " +
                                  state_->shard(s).name +
                                  " that it had written could not be restored from the untouched master weights (" +
                                  st.ToString() + "): resume from the last checkpoint. The failure: " + why.ToString());
    return;
  }
}

// Here the step's thread updates the prefix with the fused GPU Adam on the
// compute stream (idle then: the backward has been synchronized) as soon as
// the job is posted, while the workers start on the offloaded shards. The
// workers are not given these shards: the GPU path synchronizes the compute
// stream, and from a worker that would wait behind the next step's forward
// kernels, holding the CPU Adam back by about the prefix's forward time.
Status OptimizerPool::UpdateGpuPrefix(const OptJob& j, ShardUpdater* updater) {
  const size_t prefix = state_->gpu_prefix();
  for (size_t s = 0; s < prefix; ++s) {
    Status st = error();
    CopyTicket up;
    if (!j.skip && st.ok()) {
      Result<CopyTicket> r = updater->Update(s, j, ShardHow{j.grad_multiplier, false}, Upload(s));
      if (r.ok()) up = *r;
      else st = r.status().WithContext("optimizer step of " + state_->shard(s).name + " (gpu state)");
    }
    MutexLock lock(&mu_);
    if (up.valid()) uploads_[s] = up;
    if (!st.ok() && error_.ok()) error_ = st;
    updated_[s] = j.step;
    cv_.SignalAll();
    if (!st.ok()) return st;
  }
  // The job's time spans the prefix too (the workers, when still on the
  // job, set it when they finish, later than now).
  MutexLock lock(&mu_);
  double& secs = stats_[j.step % 2].seconds;
  if (prefix > 0 && !has_job_) secs = std::max(secs, NowSeconds() - job_t0_);
  return Status::OK();
}

Status OptimizerPool::WaitForShard(size_t s, int64_t step, double* wait_s, CopyTicket* upload) {
  MutexLock lock(&mu_);
  if (updated_[s] < step || !error_.ok()) {
    const double t0 = NowSeconds();
    while (updated_[s] < step && error_.ok()) cv_.Wait(&mu_);
    if (wait_s) *wait_s += NowSeconds() - t0;
  }
  RETURN_IF_ERROR(error_);
  *upload = uploads_[s];
  return Status::OK();
}

Status OptimizerPool::WaitAll(int64_t step) {
  std::vector<CopyTicket> ups;
  {
    MutexLock lock(&mu_);
    auto all = [&]() REQUIRES(mu_) {
      for (int64_t u : updated_)
        if (u < step) return false;
      return true;
    };
    while (error_.ok() && (has_job_ || !all())) cv_.Wait(&mu_);
    RETURN_IF_ERROR(error_);
    ups = uploads_;
  }
  for (const CopyTicket& t : ups) RETURN_IF_ERROR(t.Wait());
  return Status::OK();
}

void OptimizerPool::WaitIdle() {
  MutexLock lock(&mu_);
  while (has_job_) cv_.Wait(&mu_);
}

bool OptimizerPool::Updated(size_t s, int64_t step) const {
  MutexLock lock(&mu_);
  return updated_[s] >= step;
}

void OptimizerPool::SetAllUpdated(int64_t step) {
  MutexLock lock(&mu_);
  std::fill(updated_.begin(), updated_.end(), step);
}

Status OptimizerPool::error() const {
  MutexLock lock(&mu_);
  return error_;
}

void OptimizerPool::SetError(const Status& s) {
  MutexLock lock(&mu_);
  if (error_.ok()) error_ = s;
  cv_.SignalAll();
}

CopyTicket OptimizerPool::Upload(size_t s) const {
  MutexLock lock(&mu_);
  return uploads_[s];
}

OptimizerPool::JobStats OptimizerPool::Stats(int64_t job_step) const {
  MutexLock lock(&mu_);
  return stats_[job_step % 2];
}

Status OptimizerPool::NonFiniteError(int64_t job_step, const std::string& what) const {
  return FailedPrecondition(
      "non-finite gradients at step " + std::to_string(job_step) + " (" + what +
      "); with bf16/fp32 (or a static fp16 loss scale) there is no loss scale to lower: lower the learning rate or "
      "check the data. The optimizer was updating during the backward (" + options_.update_mode +
      "): shards taken before this was known may hold step " + std::to_string(job_step) +
      "'s update, so the in-memory state may be partly updated and cannot be saved; resume from the last "
      "checkpoint");
}

// ---- the workers -------------------------------------------------------------------

void OptimizerPool::Loop(bool gpu_worker) {
  trace::NameThread(gpu_worker ? "optimizer (gpu-assisted)" : "optimizer (cpu)");
  int64_t seen = 0;
  for (;;) {
    OptJob j;
    {
      MutexLock lock(&mu_);
      while (!stop_ && !(has_job_ && job_seq_ > seen)) cv_.Wait(&mu_);
      if (!(has_job_ && job_seq_ > seen)) return;  // stopping, nothing posted
      j = job_;
      seen = job_seq_;
    }
    RunJob(j, gpu_worker);
    MutexLock lock(&mu_);
    if (--job_workers_ == 0) {
      JobStats& st = stats_[j.step % 2];
      st.seconds = NowSeconds() - job_t0_;
      st.assist_share =
          job_params_ ? static_cast<double>(assist_params_) / static_cast<double>(job_params_) : 0;
      has_job_ = false;
    }
    cv_.SignalAll();
  }
}

void OptimizerPool::RunJob(const OptJob& j, bool gpu_worker) {
  // NVMe state is read ahead: the next shard in claim order is read while
  // one updates. It has no GPU-assisted worker and is never speculated on,
  // so the claim order is the job's first. The first shard's read starts
  // with the job (during the backward, the wait for its gradient hides it).
  const std::vector<size_t>& order = j.streaming ? backward_order_ : forward_order_;
  auto read_ahead = [&](size_t k) {
    if (gpu_worker || j.skip || j.speculative || k >= order.size()) return;
    cpu_->ReadAhead(order[k], j);
  };
  read_ahead(0);
  for (;;) {
    if (!gpu_worker && gpu_ && options_.assist_takes_all) break;
    size_t k = 0, s = 0;
    bool ok = false;
    CopyTicket counted;
    ShardHow how;
    {
      MutexLock lock(&mu_);
      // A streaming job's shards are claimed once final, in claim order; a
      // speculative job is left only after its verdict (a miss queues more).
      auto claimable = [&]() REQUIRES(mu_) {
        if (stop_ || job_abort_) return true;
        if (next_claim_ < queue_.size()) return !j.streaming || grad_final_[queue_[next_claim_]] != 0;
        return !j.speculative || verdict_ != Judged::kPending;
      };
      while (!claimable()) cv_.Wait(&mu_);
      if (stop_ || job_abort_ || next_claim_ >= queue_.size()) break;
      k = next_claim_++;
      s = queue_[k];
      ok = error_.ok();
      counted = grad_counted_[s];
      how = ShardHow{job_multiplier_, j.speculative && verdict_ == Judged::kPending};
      shard_state_[s] = ShardState::kRunning;
    }
    read_ahead(k + 1);
    Settle(j, s, how, counted, ok, gpu_worker);
  }
}

void OptimizerPool::Settle(const OptJob& j, size_t s, ShardHow how, const CopyTicket& counted, bool ok,
                           bool gpu_worker) {
  ShardUpdater* updater = gpu_worker ? gpu_ : cpu_;
  const Shard& sh = state_->shard(s);
  const std::string what = "optimizer step of " + sh.name + updater->what();
  // Each update's upload is the shard's newest, kept once the update is done.
  auto update = [&]() -> Status {
    trace::Span span("optimizer", [&] {
      return std::string(how.speculative ? "speculative update of " : "update of ") + sh.name + updater->what();
    });
    Result<CopyTicket> r = updater->Update(s, j, how, Upload(s));
    if (!r.ok()) return r.status().WithContext(what);
    if (r->valid()) {
      MutexLock lock(&mu_);
      uploads_[s] = *r;
    }
    return Status::OK();
  };
  Status st;
  bool wrote = false, handed_back = false;
  if (!j.skip && ok) {
    if (j.streaming) {
      // Never update a shard whose own gradient holds a non-finite value
      // (NonFiniteError says what other shards may hold). Speculating, such
      // a shard is just handed back: nothing is committed before the
      // backward's end, which finds the overflow and fails the step.
      Result<int32_t> bad = counts_->Count(s, counted);
      if (!bad.ok()) st = bad.status().WithContext(what);
      else if (*bad != 0 && how.speculative) handed_back = true;
      else if (*bad != 0) st = NonFiniteError(j.step, std::to_string(*bad) + " in " + sh.name + ", which was not updated");
    }
    if (st.ok() && !handed_back) {
      st = update();
      wrote = st.ok();
    }
  }
  // A speculative update whose verdict came meanwhile is committed, or,
  // missed, redone here in place.
  mu_.Lock();
  auto count = [&]() REQUIRES(mu_) {
    job_params_ += static_cast<uint64_t>(sh.slice_len);
    if (gpu_worker) assist_params_ += static_cast<uint64_t>(sh.slice_len);
  };
  if (wrote) count();
  while (wrote && how.speculative && verdict_ == Judged::kMiss) {
    how = ShardHow{job_multiplier_, false};
    mu_.Unlock();
    st = update();
    wrote = st.ok();
    mu_.Lock();
    if (wrote) count();
  }
  if (!st.ok() && error_.ok()) error_ = st;  // sticky: the next call reports it
  if (handed_back) {
    shard_state_[s] = ShardState::kWaiting;
  } else if (wrote && how.speculative && verdict_ == Judged::kPending) {
    shard_state_[s] = ShardState::kSpeculated;
  } else if (wrote && how.speculative) {
    Commit(s, j.step);
  } else {
    shard_state_[s] = ShardState::kFinal;
    updated_[s] = j.step;
    if (wrote) ++job_writes_;
  }
  cv_.SignalAll();
  mu_.Unlock();
}

}  // namespace strata
