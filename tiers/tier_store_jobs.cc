// SPDX-License-Identifier: Apache-2.0
// TierStore::Impl, the asynchronous moves (tier_store_impl.h): Prefetch,
// Evict and Flush queue a job on the tensor, run in call order per tensor by
// the store's worker threads, or by a caller that needs the tensor first
// (Drain).
#include "tiers/tier_store_impl.h"

#include "base/cuda_check.h"
#include "base/trace.h"

namespace strata {

using namespace tier_store_internal;  // the store's bookkeeping (tier_store_impl.h)

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

}  // namespace strata
