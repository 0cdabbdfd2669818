// SPDX-License-Identifier: Apache-2.0
// TierStore::Impl, the transfers (tier_store_impl.h): run with no lock held,
// on the sides a caller took under the lock; each adds its bytes and time to
// a LinkDelta that the caller folds into the store's link statistics.
#include "tiers/tier_store_impl.h"

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "base/clock.h"

namespace strata {

using namespace tier_store_internal;  // the store's bookkeeping (tier_store_impl.h)

namespace {

// Completion of one asynchronous NVMe transfer of a staged move.
struct Latch {
  std::mutex mu;
  std::condition_variable cv;
  bool pending = false;
  Status status;
  void Start() {
    std::lock_guard<std::mutex> l(mu);
    pending = true;
  }
  void Done(Status s) {
    std::lock_guard<std::mutex> l(mu);
    if (status.ok()) status = std::move(s);
    pending = false;
    cv.notify_all();
  }
  Status Wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return !pending; });
    return status;
  }
};

}  // namespace

Status TierStore::Impl::EngineCopy(CopyDirection dir, void* dst, const void* src, uint64_t bytes,
                                   const std::vector<EventRef>& a, const std::vector<EventRef>& b,
                                   CopyTicket* out) {
  std::vector<void*> evs;
  for (const auto* list : {&a, &b})
    for (const auto& e : *list)
      if (e && !e->empty()) evs.push_back(e->native());
  CopyAfter after;
  after.events = evs;
  HostMemory hm = host->pinned() ? HostMemory::kPinned : HostMemory::kPageable;
  ASSIGN_OR_RETURN(*out, engine->Copy(dir, dst, src, bytes, after, hm));
  return Status::OK();
}

Status TierStore::Impl::Hop(const Side& s, const Side& d, uint64_t bytes, LinkDelta& delta) {
  const uint64_t io_bytes = AlignUp(std::max<uint64_t>(bytes, 1), 4096);
  double t0 = NowSeconds();
  if (s.tier == kGpu && d.tier == kHost) {
    CopyTicket tk;
    RETURN_IF_ERROR(EngineCopy(CopyDirection::kDeviceToHost, d.ptr, s.ptr, bytes, s.events, d.events, &tk));
    RETURN_IF_ERROR(tk.Wait());
    delta.Add(kGpuToHost, bytes, NowSeconds() - t0);
  } else if (s.tier == kHost && d.tier == kGpu) {
    CopyTicket tk;
    RETURN_IF_ERROR(EngineCopy(CopyDirection::kHostToDevice, d.ptr, s.ptr, bytes, s.events, d.events, &tk));
    RETURN_IF_ERROR(tk.Wait());
    delta.Add(kHostToGpu, bytes, NowSeconds() - t0);
  } else if (s.tier == kHost && d.tier == kNvme) {
    RETURN_IF_ERROR(SyncAll(s.events));
    RETURN_IF_ERROR(nvme->WriteSync(d.extent, 0, s.ptr, io_bytes));
    delta.Add(kHostToNvme, io_bytes, NowSeconds() - t0);
  } else if (s.tier == kNvme && d.tier == kHost) {
    RETURN_IF_ERROR(SyncAll(d.events));
    RETURN_IF_ERROR(nvme->ReadSync(s.extent, 0, d.ptr, io_bytes));
    delta.Add(kNvmeToHost, io_bytes, NowSeconds() - t0);
  } else {
    return Internal("no direct link from " + TierStr(s.tier) + " to " + TierStr(d.tier));
  }
  return Status::OK();
}

std::vector<uint8_t*> TierStore::Impl::TakeStaging(size_t n) {
  std::unique_lock<std::mutex> lock(staging_mu);
  staging_cv.wait(lock, [&] { return staging_free.size() >= n; });
  std::vector<uint8_t*> out(staging_free.end() - n, staging_free.end());
  staging_free.resize(staging_free.size() - n);
  return out;
}

void TierStore::Impl::GiveStaging(const std::vector<uint8_t*>& bufs) {
  {
    std::lock_guard<std::mutex> lock(staging_mu);
    staging_free.insert(staging_free.end(), bufs.begin(), bufs.end());
  }
  staging_cv.notify_all();
}

// gpu <-> nvme in chunks through `staging_per_move` pinned staging buffers:
// up to that many NVMe transfers are in flight while the PCIe copies of the
// chunks before them run. A buffer is reused only once both its NVMe
// transfer and its PCIe copy are complete.
Status TierStore::Impl::Staged(const Side& s, const Side& d, uint64_t bytes, LinkDelta& delta) {
  const uint64_t chunk = options.staging_chunk_bytes;
  const size_t nb = static_cast<size_t>(options.staging_per_move);
  std::vector<uint8_t*> buf = TakeStaging(nb);
  const uint64_t total = std::max<uint64_t>(bytes, 1);  // a 0-byte tensor still has one page on disk
  const size_t chunks = static_cast<size_t>((total + chunk - 1) / chunk);
  auto len_of = [&](size_t i) { return std::min(chunk, bytes - std::min(bytes, i * chunk)); };
  auto io_of = [&](size_t i) { return AlignUp(std::max<uint64_t>(len_of(i), 1), 4096); };
  std::vector<Latch> nv(nb);          // the buffer's NVMe transfer
  std::vector<CopyTicket> pcie(nb);   // the buffer's PCIe copy
  double t0 = NowSeconds();
  Status first;
  auto keep = [&first](Status st) {
    if (first.ok() && !st.ok()) first = std::move(st);
  };
  if (s.tier == kGpu) {  // gpu -> staging -> nvme
    for (size_t i = 0; i < chunks && first.ok(); ++i) {
      const size_t b = i % nb;
      keep(nv[b].Wait());  // the buffer's previous write is done
      if (!first.ok()) break;
      const uint64_t off = i * chunk, len = len_of(i), io = io_of(i);
      if (len > 0) {
        Status st = EngineCopy(CopyDirection::kDeviceToHost, buf[b], s.ptr + off, len, s.events, {}, &pcie[b]);
        if (st.ok()) st = pcie[b].Wait();
        keep(st);
        if (!first.ok()) break;
      }
      if (io > len) std::memset(buf[b] + len, 0, io - len);  // no stale bytes on disk
      nv[b].Start();
      nvme->Write(d.extent, off, buf[b], io, [&w = nv[b]](Status st) { w.Done(std::move(st)); });
    }
  } else {  // nvme -> staging -> gpu
    auto read = [&](size_t i) {
      const size_t b = i % nb;
      nv[b].Start();
      nvme->Read(s.extent, i * chunk, buf[b], io_of(i), [&w = nv[b]](Status st) { w.Done(std::move(st)); });
    };
    for (size_t i = 0; i < std::min(nb, chunks); ++i) read(i);
    for (size_t i = 0; i < chunks && first.ok(); ++i) {
      const size_t b = i % nb;
      keep(nv[b].Wait());
      if (!first.ok()) break;
      const uint64_t len = len_of(i);
      if (len > 0) {
        keep(EngineCopy(CopyDirection::kHostToDevice, d.ptr + i * chunk, buf[b], len, d.events, {}, &pcie[b]));
        if (!first.ok()) break;
      }
      if (i + nb < chunks) {
        keep(pcie[b].Wait());  // the buffer is about to be refilled
        if (!first.ok()) break;
        read(i + nb);
      }
    }
  }
  // Never hand the buffers back with a transfer in flight, failed or not.
  for (size_t b = 0; b < nb; ++b) {
    keep(nv[b].Wait());
    keep(pcie[b].Wait());
  }
  GiveStaging(buf);
  if (!first.ok()) return first;
  double dt = NowSeconds() - t0;
  const uint64_t io_bytes = AlignUp(total, 4096);
  if (s.tier == kGpu) {
    delta.Add(kGpuToHost, bytes, dt);
    delta.Add(kHostToNvme, io_bytes, dt);
  } else {
    delta.Add(kNvmeToHost, io_bytes, dt);
    delta.Add(kHostToGpu, bytes, dt);
  }
  return Status::OK();
}

}  // namespace strata
