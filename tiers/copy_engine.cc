// SPDX-License-Identifier: Apache-2.0
#include "tiers/copy_engine.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/cuda_check.h"
#include "base/device.h"
#include "base/thread_annotations.h"
#include "tiers/gpu_event.h"

namespace strata {

namespace detail {

// One copy. `submitted` turns true once all of its GPU work is queued (or,
// in the stand-in and for staged device-to-host copies, once the bytes have
// landed); `event` then completes when the GPU is done (empty: nothing left
// to wait for).
struct CopyState {
  std::mutex mu;
  std::condition_variable cv;
  bool submitted GUARDED_BY(mu) = false;
  Status status GUARDED_BY(mu);
  // Written before `submitted` is set (under mu) and only read after a
  // reader saw `submitted` under mu: the mutex orders the two.
  GpuEvent event;
  std::shared_ptr<EventPool> pool;

  ~CopyState() {
    if (pool) pool->Put(std::move(event));
  }
  void Finish(Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    submitted = true;
    cv.notify_all();
  }
  Status WaitSubmitted() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return submitted; });
    return status;
  }
  // nullopt while not submitted.
  std::optional<Status> PollSubmitted() {
    std::lock_guard<std::mutex> lock(mu);
    if (!submitted) return std::nullopt;
    return status;
  }
};

}  // namespace detail

Status CopyTicket::Wait() const {
  if (!state_) return Status::OK();
  RETURN_IF_ERROR(state_->WaitSubmitted());
  return state_->event.Synchronize();
}

Result<bool> CopyTicket::Poll() const {
  if (!state_) return true;
  std::optional<Status> s = state_->PollSubmitted();
  if (!s) return false;
  if (!s->ok()) return *s;
  return state_->event.Query();
}

Status CopyTicket::StreamWait(void* stream) const {
  if (!state_) return Status::OK();
  RETURN_IF_ERROR(state_->WaitSubmitted());
  if (state_->event.empty()) return Status::OK();
  return state_->event.StreamWait(stream);
}

namespace {

struct Job {
  void* dst;
  const void* src;
  uint64_t bytes;
  std::shared_ptr<detail::CopyState> state;
};

struct Counters {
  std::atomic<uint64_t> copies{0}, bytes{0}, chunks{0}, staged_copies{0}, staged_bytes{0}, failures{0};
  CopyDirectionStats Get() const {
    CopyDirectionStats s;
    s.copies = copies.load(std::memory_order_relaxed);
    s.bytes = bytes.load(std::memory_order_relaxed);
    s.chunks = chunks.load(std::memory_order_relaxed);
    s.staged_copies = staged_copies.load(std::memory_order_relaxed);
    s.staged_bytes = staged_bytes.load(std::memory_order_relaxed);
    s.failures = failures.load(std::memory_order_relaxed);
    return s;
  }
};

}  // namespace

struct CopyEngine::Impl {
  struct Staging {
    void* buf = nullptr;  // pinned (cudaHostAlloc)
    GpuEvent done;        // the last GPU copy from/to this buffer
    bool used = false;
  };

  // One direction: its stream, its worker (staged and stand-in copies) and
  // its staging buffers (touched by the worker only).
  struct Lane {
    CopyDirection dir = CopyDirection::kHostToDevice;
    void* stream = nullptr;
    // Held while queuing GPU work on `stream`, so that a copy's chunks, its
    // dependencies and its event stay together in stream order.
    std::mutex submit_mu;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> jobs GUARDED_BY(mu);
    bool busy GUARDED_BY(mu) = false;
    bool stop GUARDED_BY(mu) = false;
    Status first_error GUARDED_BY(mu);  // since the last Drain
    std::thread worker;
    std::vector<Staging> staging;  // worker only
    Counters counters;
  };

  CopyEngineOptions options;
  bool stand_in = true;
  std::string description;
  std::shared_ptr<EventPool> events;
  Lane lanes[2];

  ~Impl();
  void Worker(Lane& lane);
  Status RunStaged(Lane& lane, const Job& job);
  Status RunStandIn(Lane& lane, const Job& job);
  Status SubmitPinned(Lane& lane, void* dst, const void* src, uint64_t bytes, const CopyAfter& after,
                      detail::CopyState& state);
  Status ApplyAfter(Lane& lane, const CopyAfter& after);
  Status EnsureStaging(Lane& lane);
  void RecordFailure(Lane& lane, const Status& s) {
    lane.counters.failures.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(lane.mu);
    if (lane.first_error.ok()) lane.first_error = s;
  }
};

CopyEngine::Impl::~Impl() {
  for (Lane& lane : lanes) {
    {
      std::lock_guard<std::mutex> lock(lane.mu);
      lane.stop = true;
    }
    lane.cv.notify_all();
    if (lane.worker.joinable()) lane.worker.join();
  }
#if STRATA_WITH_CUDA
  if (!stand_in) {
    (void)cudaSetDevice(options.device);
    for (Lane& lane : lanes) {
      if (lane.stream) (void)cudaStreamSynchronize(static_cast<cudaStream_t>(lane.stream));
      for (Staging& s : lane.staging) {
        s.done = GpuEvent();
        if (s.buf) (void)cudaFreeHost(s.buf);
      }
      if (lane.stream) (void)cudaStreamDestroy(static_cast<cudaStream_t>(lane.stream));
    }
    (void)cudaGetLastError();
  }
#endif
}

void CopyEngine::Impl::Worker(Lane& lane) {
#if STRATA_WITH_CUDA
  if (!stand_in) (void)cudaSetDevice(options.device);
#endif
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(lane.mu);
      lane.cv.wait(lock, [&] { return lane.stop || !lane.jobs.empty(); });
      if (lane.jobs.empty()) return;  // stop, and nothing left
      job = std::move(lane.jobs.front());
      lane.jobs.pop_front();
      lane.busy = true;
    }
    Status s = stand_in ? RunStandIn(lane, job) : RunStaged(lane, job);
    if (!s.ok()) RecordFailure(lane, s);
    job.state->Finish(s);
    {
      std::lock_guard<std::mutex> lock(lane.mu);
      lane.busy = false;
    }
    lane.cv.notify_all();
  }
}

Status CopyEngine::Impl::RunStandIn(Lane& lane, const Job& job) {
  const uint64_t chunk = options.chunk_bytes;
  auto* d = static_cast<uint8_t*>(job.dst);
  auto* s = static_cast<const uint8_t*>(job.src);
  for (uint64_t off = 0; off < job.bytes; off += chunk) {
    uint64_t n = std::min(chunk, job.bytes - off);
    std::memcpy(d + off, s + off, n);
    lane.counters.chunks.fetch_add(1, std::memory_order_relaxed);
  }
  return Status::OK();
}

#if STRATA_WITH_CUDA

Status CopyEngine::Impl::EnsureStaging(Lane& lane) {
  if (!lane.staging.empty()) return Status::OK();
  int n = std::max(2, options.staging_buffers);
  lane.staging.resize(n);
  for (Staging& s : lane.staging) {
    CUDA_RETURN_IF_ERROR(cudaHostAlloc(&s.buf, options.staging_bytes, cudaHostAllocPortable));
    ASSIGN_OR_RETURN(s.done, GpuEvent::Create(options.device, true));
  }
  return Status::OK();
}

Status CopyEngine::Impl::ApplyAfter(Lane& lane, const CopyAfter& after) {
  if (after.stream != nullptr) {
    ASSIGN_OR_RETURN(GpuEvent e, events->Get());
    Status s = e.Record(after.stream);
    if (s.ok()) s = e.StreamWait(lane.stream);
    // The wait captured the event's state at this call: the event can be reused.
    events->Put(std::move(e));
    RETURN_IF_ERROR(s);
  }
  for (void* ev : after.events) RETURN_IF_ERROR(StreamWaitEvent(lane.stream, ev));
  return Status::OK();
}

Status CopyEngine::Impl::SubmitPinned(Lane& lane, void* dst, const void* src, uint64_t bytes,
                                      const CopyAfter& after, detail::CopyState& state) {
  const cudaMemcpyKind kind =
      lane.dir == CopyDirection::kHostToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  auto stream = static_cast<cudaStream_t>(lane.stream);
  ASSIGN_OR_RETURN(GpuEvent done, events->Get());
  std::lock_guard<std::mutex> lock(lane.submit_mu);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  RETURN_IF_ERROR(ApplyAfter(lane, after));
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  for (uint64_t off = 0; off < bytes; off += options.chunk_bytes) {
    uint64_t n = std::min(options.chunk_bytes, bytes - off);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d + off, s + off, n, kind, stream));
    lane.counters.chunks.fetch_add(1, std::memory_order_relaxed);
  }
  RETURN_IF_ERROR(done.Record(lane.stream));
  state.event = std::move(done);
  return Status::OK();
}

Status CopyEngine::Impl::RunStaged(Lane& lane, const Job& job) {
  RETURN_IF_ERROR(EnsureStaging(lane));
  auto stream = static_cast<cudaStream_t>(lane.stream);
  const uint64_t chunk = options.staging_bytes;
  const size_t n = lane.staging.size();
  auto* d = static_cast<uint8_t*>(job.dst);
  auto* s = static_cast<const uint8_t*>(job.src);
  if (lane.dir == CopyDirection::kHostToDevice) {
    // CPU fills buffer k while the GPU copies buffer k-1.
    size_t k = 0;
    for (uint64_t off = 0; off < job.bytes; off += chunk, ++k) {
      Staging& st = lane.staging[k % n];
      if (st.used) RETURN_IF_ERROR(st.done.Synchronize());
      uint64_t len = std::min(chunk, job.bytes - off);
      std::memcpy(st.buf, s + off, len);
      std::lock_guard<std::mutex> lock(lane.submit_mu);
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d + off, st.buf, len, cudaMemcpyHostToDevice, stream));
      RETURN_IF_ERROR(st.done.Record(lane.stream));
      st.used = true;
      lane.counters.chunks.fetch_add(1, std::memory_order_relaxed);
    }
    ASSIGN_OR_RETURN(GpuEvent done, events->Get());
    {
      std::lock_guard<std::mutex> lock(lane.submit_mu);
      RETURN_IF_ERROR(done.Record(lane.stream));
    }
    job.state->event = std::move(done);
    return Status::OK();
  }
  // Device to host: the GPU fills buffer k while the CPU drains buffer k-(n-1).
  struct Pending {
    size_t buf;
    uint64_t off, len;
  };
  std::deque<Pending> pending;
  auto drain_one = [&]() -> Status {
    Pending p = pending.front();
    pending.pop_front();
    Staging& st = lane.staging[p.buf];
    RETURN_IF_ERROR(st.done.Synchronize());
    std::memcpy(d + p.off, st.buf, p.len);
    return Status::OK();
  };
  size_t k = 0;
  for (uint64_t off = 0; off < job.bytes; off += chunk, ++k) {
    if (pending.size() == n) RETURN_IF_ERROR(drain_one());
    size_t b = k % n;
    Staging& st = lane.staging[b];
    uint64_t len = std::min(chunk, job.bytes - off);
    {
      std::lock_guard<std::mutex> lock(lane.submit_mu);
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(st.buf, s + off, len, cudaMemcpyDeviceToHost, stream));
      RETURN_IF_ERROR(st.done.Record(lane.stream));
    }
    st.used = true;
    pending.push_back({b, off, len});
    lane.counters.chunks.fetch_add(1, std::memory_order_relaxed);
  }
  while (!pending.empty()) RETURN_IF_ERROR(drain_one());
  return Status::OK();
}

#else  // !STRATA_WITH_CUDA

Status CopyEngine::Impl::EnsureStaging(Lane&) { return Internal("staging without CUDA"); }
Status CopyEngine::Impl::ApplyAfter(Lane&, const CopyAfter&) { return Internal("streams without CUDA"); }
Status CopyEngine::Impl::SubmitPinned(Lane&, void*, const void*, uint64_t, const CopyAfter&,
                                      detail::CopyState&) {
  return Internal("CUDA copy without CUDA");
}
Status CopyEngine::Impl::RunStaged(Lane&, const Job&) { return Internal("CUDA copy without CUDA"); }

#endif

Result<std::unique_ptr<CopyEngine>> CopyEngine::Create(const CopyEngineOptions& options) {
  if (options.chunk_bytes == 0 || options.staging_bytes == 0)
    return InvalidArgument("copy engine: chunk_bytes and staging_bytes must be > 0");
  if (options.staging_buffers < 2)
    return InvalidArgument("copy engine: staging_buffers must be >= 2 (double buffering), got " +
                           std::to_string(options.staging_buffers));
  std::unique_ptr<CopyEngine> engine(new CopyEngine());
  engine->impl_ = std::make_unique<Impl>();
  Impl& impl = *engine->impl_;
  impl.options = options;
  std::string why;
  impl.stand_in = options.stand_in || CudaDeviceCount(&why) == 0;
  impl.lanes[0].dir = CopyDirection::kHostToDevice;
  impl.lanes[1].dir = CopyDirection::kDeviceToHost;
  if (impl.stand_in) {
    impl.description = "stand-in (memcpy on 2 worker threads; " +
                       (options.stand_in ? std::string("requested") : why) + ")";
  } else {
#if STRATA_WITH_CUDA
    ASSIGN_OR_RETURN(GpuInfo info, QueryGpu(options.device));
    CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
    for (auto& lane : impl.lanes) {
      cudaStream_t s = nullptr;
      CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      lane.stream = s;
    }
    impl.events = std::make_shared<EventPool>(options.device, true);
    impl.description = "cuda:" + std::to_string(options.device) + " " + info.name +
                       " (2 copy streams, " + FormatBytes(options.chunk_bytes) + " chunks)";
#endif
  }
  for (auto& lane : impl.lanes) lane.worker = std::thread([&impl, &lane] { impl.Worker(lane); });
  return engine;
}

CopyEngine::~CopyEngine() = default;

Result<CopyTicket> CopyEngine::HostToDevice(void* dst, const void* src, uint64_t bytes,
                                            const CopyAfter& after, HostMemory host) {
  return Copy(CopyDirection::kHostToDevice, dst, src, bytes, after, host);
}

Result<CopyTicket> CopyEngine::DeviceToHost(void* dst, const void* src, uint64_t bytes,
                                            const CopyAfter& after, HostMemory host) {
  return Copy(CopyDirection::kDeviceToHost, dst, src, bytes, after, host);
}

Result<CopyTicket> CopyEngine::Copy(CopyDirection dir, void* dst, const void* src, uint64_t bytes,
                                    const CopyAfter& after, HostMemory host) {
  Impl& impl = *impl_;
  Impl::Lane& lane = impl.lanes[static_cast<int>(dir)];
  if (bytes == 0) return CopyTicket();
  if (dst == nullptr || src == nullptr)
    return InvalidArgument("copy of " + std::to_string(bytes) + " bytes with a null " +
                           (dst == nullptr ? "destination" : "source"));
  auto state = std::make_shared<detail::CopyState>();
  state->pool = impl.events;
  lane.counters.copies.fetch_add(1, std::memory_order_relaxed);
  lane.counters.bytes.fetch_add(bytes, std::memory_order_relaxed);

  bool staged = false;
  if (impl.stand_in) {
    bool has_after = after.stream != nullptr ||
                     std::any_of(after.events.begin(), after.events.end(), [](void* e) { return e != nullptr; });
    if (has_after)
      return InvalidArgument("the stand-in copy engine has no CUDA streams to order a copy after");
  } else {
#if STRATA_WITH_CUDA
    const void* host_ptr = dir == CopyDirection::kHostToDevice ? src : dst;
    if (host == HostMemory::kAuto) {
      cudaPointerAttributes attr{};
      cudaError_t err = cudaPointerGetAttributes(&attr, host_ptr);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        host = HostMemory::kPageable;
      } else {
        host = (attr.type == cudaMemoryTypeUnregistered) ? HostMemory::kPageable : HostMemory::kPinned;
      }
    }
    staged = host == HostMemory::kPageable;
    if (staged) {
      // Dependencies go on the stream now, in submission order; the worker's
      // chunks queue behind them.
      std::lock_guard<std::mutex> lock(lane.submit_mu);
      CUDA_RETURN_IF_ERROR(cudaSetDevice(impl.options.device));
      Status s = impl.ApplyAfter(lane, after);
      if (!s.ok()) {
        impl.RecordFailure(lane, s);
        return s;
      }
    } else {
      Status s = impl.SubmitPinned(lane, dst, src, bytes, after, *state);
      if (!s.ok()) {
        impl.RecordFailure(lane, s);
        return s;
      }
      state->Finish(Status::OK());
      return CopyTicket(std::move(state));
    }
#endif
  }
  if (staged) {
    lane.counters.staged_copies.fetch_add(1, std::memory_order_relaxed);
    lane.counters.staged_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    lane.jobs.push_back(Job{dst, src, bytes, state});
  }
  lane.cv.notify_all();
  return CopyTicket(std::move(state));
}

bool CopyEngine::stand_in() const { return impl_->stand_in; }
int CopyEngine::device() const { return impl_->options.device; }
void* CopyEngine::stream(CopyDirection dir) const { return impl_->lanes[static_cast<int>(dir)].stream; }
std::string CopyEngine::description() const { return impl_->description; }

Status CopyEngine::Drain() {
  Status first;
  for (auto& lane : impl_->lanes) {
    {
      std::unique_lock<std::mutex> lock(lane.mu);
      lane.cv.wait(lock, [&] { return lane.jobs.empty() && !lane.busy; });
    }
#if STRATA_WITH_CUDA
    if (!impl_->stand_in) {
      Status s = [&]() -> Status {
        CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->options.device));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(lane.stream)));
        return Status::OK();
      }();
      if (!s.ok() && first.ok()) first = s;
    }
#endif
    std::lock_guard<std::mutex> lock(lane.mu);
    if (!lane.first_error.ok() && first.ok()) first = lane.first_error;
    lane.first_error = Status::OK();
  }
  return first;
}

CopyEngineStats CopyEngine::stats() const {
  CopyEngineStats s;
  s.h2d = impl_->lanes[0].counters.Get();
  s.d2h = impl_->lanes[1].counters.Get();
  return s;
}

}  // namespace strata
