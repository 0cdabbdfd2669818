// SPDX-License-Identifier: Apache-2.0
// TierStore: tickets and the public methods, each validating its arguments
// and then calling TierStore::Impl (tier_store_impl.h says which file holds
// which part of it).
#include "tiers/tier_store.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/bytes.h"
#include "base/cuda_check.h"
#include "base/trace.h"
#include "tiers/tier_store_impl.h"

namespace strata {

using namespace tier_store_internal;  // the store's bookkeeping (tier_store_impl.h)

// ---- tickets ------------------------------------------------------------------

Status Ticket::Wait() const {
  if (!state_) return Status::OK();
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (!state_->status.ok()) state_->reported.store(true);
  return state_->status;
}

Result<bool> Ticket::Poll() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->done) return false;
  if (!state_->status.ok()) {
    state_->reported.store(true);
    return state_->status;
  }
  return true;
}

Result<std::unique_ptr<TierStore>> TierStore::Open(TierStoreOptions options) {
  if (options.staging_per_move < 2 || options.staging_buffers < options.staging_per_move)
    return InvalidArgument("staging needs 2 <= staging_per_move <= staging_buffers, got " +
                           std::to_string(options.staging_per_move) + " and " +
                           std::to_string(options.staging_buffers));
  if (options.staging_chunk_bytes == 0 || options.staging_chunk_bytes % 4096 != 0)
    return InvalidArgument("staging_chunk_bytes must be a positive multiple of 4096, got " +
                           std::to_string(options.staging_chunk_bytes));
  if (options.worker_threads < 1)
    return InvalidArgument("worker_threads must be >= 1, got " + std::to_string(options.worker_threads));
  std::unique_ptr<TierStore> store(new TierStore());
  store->impl_ = std::make_unique<Impl>();
  Impl& m = *store->impl_;
  m.options = options;

  if (options.nvme) {
    ASSIGN_OR_RETURN(m.nvme, NvmeTier::Open(*options.nvme));
  }
  if (options.gpu) {
    ASSIGN_OR_RETURN(m.gpu, GpuTier::Open(options.gpu_tier));
    CopyEngineOptions copy = options.copy;
    copy.device = m.gpu->device();
    // The engine must match the tier: memcpy for the stand-in (which it finds
    // out itself when there is no GPU, and then says why), CUDA otherwise.
    copy.stand_in = m.gpu->stand_in() && options.gpu_tier.stand_in;
    ASSIGN_OR_RETURN(m.engine, CopyEngine::Create(copy));
    if (m.engine->stand_in() != m.gpu->stand_in())
      return Internal("the copy engine and the gpu tier disagree about the GPU: " + m.engine->description() +
                      " vs " + m.gpu->description());
    if (!m.gpu->stand_in()) m.event_pool = std::make_unique<EventPool>(m.gpu->device(), true);
  }
  HostTierOptions host = options.host_tier;
  if (m.gpu && !m.gpu->stand_in()) host.gpu_device = m.gpu->device();
  if (m.nvme && options.register_host_buffers) {
    NvmeTier* nv = m.nvme.get();
    host.on_map = [nv](void* base, uint64_t bytes) { return nv->RegisterBuffer(base, bytes); };
    host.on_unmap = [nv](void* base) { nv->UnregisterBuffer(base); };
  }
  if (m.gpu && m.gpu->stand_in() && host.pin_method == PinMethod::kAuto)
    host.pin_method = PinMethod::kMlock;  // no CUDA registration for a stand-in
  ASSIGN_OR_RETURN(m.host, HostTier::Open(host));

  if (m.nvme) {  // staging for gpu<->nvme moves (and only then)
    for (int i = 0; i < options.staging_buffers; ++i) {
      auto b = m.host->Allocate(options.staging_chunk_bytes, "staging buffer");
      if (!b.ok())
        return b.status().WithContext("the host tier cannot hold " + std::to_string(options.staging_buffers) +
                                      " staging buffers of " + FormatBytes(options.staging_chunk_bytes));
      std::lock_guard<std::mutex> lock(m.staging_mu);
      m.staging_free.push_back(static_cast<uint8_t*>(b->data()));
      m.staging_blocks.push_back(std::move(b).value());
    }
  }
  for (int i = 0; i < options.worker_threads; ++i) m.workers.emplace_back([&m] { m.WorkerLoop(); });
  return store;
}

TierStore::~TierStore() = default;

Result<TensorId> TierStore::Create(std::string name, DType dtype, const Shape& shape, TierKind home) {
  Impl& m = *impl_;
  if (name.empty()) return InvalidArgument("tensor name is empty");
  const int h = Ix(home);
  if (!m.HasTier(h))
    return InvalidArgument("tensor '" + name + "': home tier " + TierStr(h) + " is not configured in this store");
  const uint64_t elem = DTypeSize(dtype);
  const int64_t numel = shape.numel();
  if (numel < 0 || (elem != 0 && static_cast<uint64_t>(numel) > UINT64_MAX / elem))
    return InvalidArgument("tensor '" + name + "': shape " + shape.ToString() + " is too large");
  std::unique_lock<std::mutex> lock(m.mu);
  if (m.by_name.count(name)) return AlreadyExists("tensor '" + name + "' exists already");
  auto t = std::make_unique<Tensor>();
  t->id = m.next_id++;
  t->name = name;
  t->dtype = dtype;
  t->shape = shape;
  t->bytes = static_cast<uint64_t>(numel) * elem;
  t->home = h;
  Tensor* raw = t.get();
  CopySlot& c = raw->copies[h];
  if (h == kNvme) {
    ASSIGN_OR_RETURN(c.extent, m.nvme->Allocate(m.CopyBytes(*raw, kNvme)));
  } else {
    c.loading = true;  // claimed while eviction may release the lock
    Status s = m.EnsureAllocated(lock, raw, h);
    c.loading = false;
    if (!s.ok()) return s;
    if (m.by_name.count(name)) {  // created by another thread meanwhile
      c.block.Reset();
      return AlreadyExists("tensor '" + name + "' exists already");
    }
  }
  c.valid = true;
  c.last_use = ++m.clock;
  m.by_name.emplace(name, raw->id);
  TensorId id{raw->id};
  m.tensors.emplace(raw->id, std::move(t));
  return id;
}

Result<TensorId> TierStore::Find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->by_name.find(std::string(name));
  if (it == impl_->by_name.end()) return NotFound("no tensor named '" + std::string(name) + "'");
  return TensorId{it->second};
}

Status TierStore::Remove(TensorId id) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  for (;;) {
    m.Drain(lock, t);
    if (t->AnyPinned())
      return FailedPrecondition("cannot remove tensor '" + t->name + "': it is " + t->Holder());
    if (t->AnyBusy()) {
      m.cv.wait(lock);
      continue;
    }
    // Caller work recorded on its streams must finish before the memory is reused.
    std::vector<EventRef> evs;
    for (auto& c : t->copies) evs.insert(evs.end(), c.events.begin(), c.events.end());
    if (!evs.empty()) {
      for (auto& c : t->copies) c.io++;
      lock.unlock();
      Status s = SyncAll(evs);
      lock.lock();
      for (auto& c : t->copies) {
        c.io--;
        RemoveEvents(c, evs);
      }
      m.cv.notify_all();
      RETURN_IF_ERROR(s);
      continue;  // the lock was released: look again
    }
    if (t->jobs.empty() && !t->job_running) break;
  }
  for (int k = 0; k < kNumTiers; ++k) {
    m.FreeCopy(t, k);
    if (t->copies[k].extent.valid()) m.nvme->Free(t->copies[k].extent);
    t->copies[k].extent = Extent{};
  }
  if (t->in_ready) m.ready.erase(std::remove(m.ready.begin(), m.ready.end(), t), m.ready.end());
  m.by_name.erase(t->name);
  m.tensors.erase(id.value);
  m.cv.notify_all();
  return Status::OK();
}

Result<TensorInfo> TierStore::Info(TensorId id) const {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  TensorInfo info;
  info.name = t->name;
  info.dtype = t->dtype;
  info.shape = t->shape;
  info.bytes = t->bytes;
  info.home = Kind(t->home);
  info.written = t->initialized;
  for (int k = 0; k < kNumTiers; ++k) {
    const CopySlot& c = t->copies[k];
    info.copies[k].allocated = c.allocated();
    info.copies[k].valid = c.valid;
    info.copies[k].dirty = c.valid && !t->copies[t->home].valid;
    info.copies[k].readers = c.readers;
    info.copies[k].writer = c.writer;
  }
  if (t->next_use != kNoHint) info.next_use = t->next_use;
  return info;
}

Result<TensorView> TierStore::Acquire(TensorId id, TierKind tier_kind, Access access) {
  Impl& m = *impl_;
  const int tier = Ix(tier_kind);
  std::unique_lock<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  RETURN_IF_ERROR(m.TakeFailure(t));
  RETURN_IF_ERROR(m.CheckTier(*t, tier, /*acquire=*/true));
  m.n_acquires++;
  CopySlot& c = t->copies[tier];
  bool first = true;
  for (;;) {
    m.Drain(lock, t);
    // Conflicts with other callers' pins fail at once.
    if (access == Access::kRead) {
      if (t->AnyWriter())
        return FailedPrecondition("cannot acquire tensor '" + t->name + "' for reading on " + TierStr(tier) +
                                  ": it is " + t->Holder());
    } else {
      if (t->AnyPinned())
        return FailedPrecondition("cannot acquire tensor '" + t->name + "' for " +
                                  std::string(AccessName(access)) + " on " + TierStr(tier) + ": it is " +
                                  t->Holder());
      if (t->AnyBusy()) {  // our own transfers: they finish by themselves
        m.cv.wait(lock);
        continue;
      }
    }
    const bool ready = access == Access::kWriteDiscard ? (c.allocated() && !c.loading)
                                                       : (c.valid && !c.loading);
    if (ready) break;
    first = false;
    if (access == Access::kWriteDiscard) {
      if (c.loading) {
        m.cv.wait(lock);
        continue;
      }
      c.loading = true;
      Status s = m.EnsureAllocated(lock, t, tier);
      c.loading = false;
      m.cv.notify_all();
      RETURN_IF_ERROR(s);
    } else {
      RETURN_IF_ERROR(m.LoadLocked(lock, t, tier, nullptr));
    }
    // The lock was released: check everything again.
  }
  (first ? m.counters[tier].hits : m.counters[tier].misses)++;
  if (access == Access::kRead) {
    c.readers++;
  } else {
    c.writer = true;
    c.discard = access == Access::kWriteDiscard;
  }
  c.last_use = ++m.clock;
  TensorView v;
  v.data = c.block.data();
  v.bytes = t->bytes;
  v.dtype = t->dtype;
  v.shape = t->shape;
  v.tier = tier_kind;
  v.id = id;
  return v;
}

Status TierStore::Release(TensorId id, TierKind tier_kind, bool dirty, void* stream) {
  Impl& m = *impl_;
  const int tier = Ix(tier_kind);
  if (tier < 0 || tier >= kNumTiers) return InvalidArgument("bad tier");
  std::unique_lock<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  CopySlot& c = t->copies[tier];
  if (!c.pinned())
    return FailedPrecondition("release of tensor '" + t->name + "' on " + TierStr(tier) +
                              ", which is not acquired there");
  m.n_releases++;
  Status result;
  if (stream != nullptr) {
    if (!m.event_pool) {
      result = InvalidArgument("release of tensor '" + t->name +
                               "' with a CUDA stream, but the store has no CUDA device (stand-in)");
    } else {
      Result<GpuEvent> ev = m.event_pool->Get();
      Status s = ev.status();
      if (s.ok()) s = ev->Record(stream);
      if (s.ok()) {
        EventPool* pool = m.event_pool.get();
        c.events.push_back(EventRef(new GpuEvent(std::move(ev).value()), [pool](GpuEvent* e) {
          pool->Put(std::move(*e));
          delete e;
        }));
      } else {
        // Without the event the memory's reuse cannot be ordered: wait now.
        result = s;
#if STRATA_WITH_CUDA
        (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
#endif
      }
    }
  }
  if (c.writer) {
    c.writer = false;
    if (dirty || c.discard) {
      c.valid = true;
      t->initialized = true;
      for (int k = 0; k < kNumTiers; ++k)
        if (k != tier) t->copies[k].valid = false;
    }
    c.discard = false;
  } else {
    c.readers--;
    if (dirty && result.ok())
      result = FailedPrecondition("tensor '" + t->name + "' was released dirty on " + TierStr(tier) +
                                  " but acquired for reading; the change is not recorded");
  }
  c.last_use = ++m.clock;
  m.cv.notify_all();
  return result;
}

Result<Ticket> TierStore::Prefetch(TensorId id, TierKind tier_kind) {
  Impl& m = *impl_;
  const int tier = Ix(tier_kind);
  std::lock_guard<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  RETURN_IF_ERROR(m.TakeFailure(t));
  RETURN_IF_ERROR(m.CheckTier(*t, tier, /*acquire=*/false));
  m.n_prefetches++;
  if (t->AnyWriter())
    return FailedPrecondition("cannot prefetch tensor '" + t->name + "' to " + TierStr(tier) + ": it is " +
                              t->Holder());
  const CopySlot& c = t->copies[tier];
  if (t->jobs.empty() && !t->job_running && c.valid && !c.loading) {
    m.counters[tier].hits++;
    return Ticket();
  }
  return m.Enqueue(t, Job::kLoad, tier, "prefetch of '" + t->name + "' to " + TierStr(tier));
}

Result<Ticket> TierStore::Evict(TensorId id, TierKind tier_kind) {
  Impl& m = *impl_;
  const int tier = Ix(tier_kind);
  std::lock_guard<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  RETURN_IF_ERROR(m.TakeFailure(t));
  RETURN_IF_ERROR(m.CheckTier(*t, tier, /*acquire=*/false));
  if (tier == t->home)
    return InvalidArgument("cannot evict tensor '" + t->name + "' from " + TierStr(tier) +
                           ": that is its home copy");
  m.n_evicts++;
  const CopySlot& c = t->copies[tier];
  if (c.pinned())
    return FailedPrecondition("cannot evict tensor '" + t->name + "' from " + TierStr(tier) + ": it is " +
                              t->Holder());
  if (t->jobs.empty() && !t->job_running && !c.allocated()) return Ticket();
  return m.Enqueue(t, Job::kEvict, tier, "eviction of '" + t->name + "' from " + TierStr(tier));
}

Result<Ticket> TierStore::Flush(TensorId id) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(Tensor * t, m.Lookup(id));
  RETURN_IF_ERROR(m.TakeFailure(t));
  m.n_flushes++;
  if (t->AnyWriter())
    return FailedPrecondition("cannot flush tensor '" + t->name + "': it is " + t->Holder());
  if (t->jobs.empty() && !t->job_running && t->copies[t->home].valid && !t->copies[t->home].loading)
    return Ticket();
  return m.Enqueue(t, Job::kFlush, t->home, "flush of '" + t->name + "' to " + TierStr(t->home));
}

Status TierStore::FlushAll() {
  std::vector<TensorId> ids;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& [id, t] : impl_->tensors) ids.push_back(TensorId{id});
  }
  std::vector<Ticket> tickets;
  Status first;
  for (TensorId id : ids) {
    Result<Ticket> r = Flush(id);
    if (r.ok()) {
      tickets.push_back(*r);
    } else if (r.status().code() != StatusCode::kNotFound && first.ok()) {
      first = r.status();
    }
  }
  for (const Ticket& tk : tickets) {
    Status s = tk.Wait();
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status TierStore::SetNextUse(TensorId id, uint64_t tick) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ASSIGN_OR_RETURN(Tensor * t, impl_->Lookup(id));
  t->next_use = tick;
  return Status::OK();
}

Status TierStore::ClearNextUse(TensorId id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ASSIGN_OR_RETURN(Tensor * t, impl_->Lookup(id));
  t->next_use = kNoHint;
  return Status::OK();
}

namespace {
// Where Write/Read touch a tensor: its gpu copy for a gpu-home tensor, else host.
TierKind AccessTier(TierKind home) { return home == TierKind::kGpu ? TierKind::kGpu : TierKind::kHost; }
}  // namespace

Status TierStore::Write(TensorId id, const void* src, uint64_t bytes) {
  ASSIGN_OR_RETURN(TensorInfo info, Info(id));
  if (bytes != info.bytes)
    return InvalidArgument("write of " + std::to_string(bytes) + " bytes to tensor '" + info.name + "' of " +
                           std::to_string(info.bytes) + " bytes");
  TierKind tier = AccessTier(info.home);
  ASSIGN_OR_RETURN(TensorView v, Acquire(id, tier, Access::kWriteDiscard));
  Status s;
  if (tier == TierKind::kGpu && impl_->engine && !impl_->engine->stand_in()) {
    auto tk = impl_->engine->HostToDevice(v.data, src, bytes);
    s = tk.ok() ? tk->Wait() : tk.status();
  } else if (bytes > 0) {
    std::memcpy(v.data, src, bytes);
  }
  Status r = Release(id, tier, /*dirty=*/true);
  return s.ok() ? r : s;
}

Status TierStore::Read(TensorId id, void* dst, uint64_t bytes) {
  ASSIGN_OR_RETURN(TensorInfo info, Info(id));
  if (bytes != info.bytes)
    return InvalidArgument("read of " + std::to_string(bytes) + " bytes from tensor '" + info.name + "' of " +
                           std::to_string(info.bytes) + " bytes");
  TierKind tier = AccessTier(info.home);
  ASSIGN_OR_RETURN(TensorView v, Acquire(id, tier, Access::kRead));
  Status s;
  if (tier == TierKind::kGpu && impl_->engine && !impl_->engine->stand_in()) {
    auto tk = impl_->engine->DeviceToHost(dst, v.data, bytes);
    s = tk.ok() ? tk->Wait() : tk.status();
  } else if (bytes > 0) {
    std::memcpy(dst, v.data, bytes);
  }
  Status r = Release(id, tier, /*dirty=*/false);
  return s.ok() ? r : s;
}

TierStoreStats TierStore::stats() const {
  Impl& m = *impl_;
  TierStoreStats s;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    s.gpu_to_host = m.links[kGpuToHost];
    s.host_to_gpu = m.links[kHostToGpu];
    s.host_to_nvme = m.links[kHostToNvme];
    s.nvme_to_host = m.links[kNvmeToHost];
    for (int k = 0; k < kNumTiers; ++k) {
      s.tiers[k] = m.counters[k];
      s.tiers[k].resident = 0;
    }
    for (auto& [id, t] : m.tensors)
      for (int k = 0; k < kNumTiers; ++k)
        if (t->copies[k].allocated()) s.tiers[k].resident++;
    s.tensors = m.tensors.size();
    s.acquires = m.n_acquires;
    s.releases = m.n_releases;
    s.prefetches = m.n_prefetches;
    s.evicts = m.n_evicts;
    s.flushes = m.n_flushes;
    s.queue_depth = m.queue_depth;
    s.max_queue_depth = m.max_queue_depth;
    s.failures = m.n_failures;
  }
  if (m.gpu) s.tiers[kGpu].usage = m.gpu->usage();
  s.tiers[kHost].usage = m.host->usage();
  if (m.engine) s.copy = m.engine->stats();
  if (m.nvme) s.nvme = m.nvme->stats();
  return s;
}

GpuTier* TierStore::gpu_tier() const { return impl_->gpu.get(); }
HostTier* TierStore::host_tier() const { return impl_->host.get(); }
NvmeTier* TierStore::nvme_tier() const { return impl_->nvme.get(); }
CopyEngine* TierStore::copy_engine() const { return impl_->engine.get(); }

}  // namespace strata
