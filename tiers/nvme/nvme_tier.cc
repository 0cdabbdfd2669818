// SPDX-License-Identifier: Apache-2.0
// NvmeTier: the tier that composes swap files, extents, rings, block
// checksums and the registered-buffer table (tiers/nvme/nvme_tier.h).
//
// Contents
//   NvmeTier::Impl   options, open and shutdown; extents (Allocate/Free);
//                    transfers (validate, split over the rings, complete);
//                    stats
//   NvmeTier         the public methods
//
// How a transfer moves: Read/Write validate the request on the caller's
// thread and split it into at most `rings` contiguous parts (whole blocks),
// one per ring, handed over through each ring's inbox (tiers/nvme/ring.h).
// A ring's thread cuts its parts into pieces of `block_size` bytes and reads
// every completion. When the last part of a transfer finishes (on whichever
// ring), checksums are recorded or verified (tiers/nvme/block_checksums.h)
// and the caller's callback runs, exactly once.
#include "tiers/nvme/nvme_tier.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include "base/bytes.h"
#include "base/thread_annotations.h"
#include "tiers/nvme/block_checksums.h"
#include "tiers/nvme/buffer_table.h"
#include "tiers/nvme/common.h"
#include "tiers/nvme/extent_allocator.h"
#include "tiers/nvme/io_env.h"
#include "tiers/nvme/leftovers.h"
#include "tiers/nvme/ring.h"
#include "tiers/nvme/swap_file.h"
#include "tiers/nvme/transfer.h"

namespace strata {

namespace {

using nvme::kAlign;
using nvme::Note;

constexpr int kMaxRings = 64;
constexpr uint32_t kMaxQueueDepth = 16384;

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

// Owns the files, rings and buffer table; is the rings' RingHost. Members
// fixed after Open are read without a lock; mu_ guards the extents.
struct NvmeTier::Impl final : nvme::RingHost {
  // A live extent; `sums` only with checksums on.
  struct ExtentInfo {
    uint64_t bytes = 0;
    nvme::ExtentSums sums;
  };

  explicit Impl(const NvmeOptions& o)
      : opt(o),
        env(o.env ? o.env : IoEnv::Default()),
        capacity_(o.capacity_bytes & ~(kAlign - 1)),
        checksums_(o.checksum, o.checksum_block) {}

  ~Impl() override {
    {
      std::unique_lock<std::mutex> l(drain_mu_);
      drain_cv_.wait(l, [&] { return outstanding_.load(std::memory_order_acquire) == 0; });
    }
    for (auto& r : rings_) r->Stop();
    buffers_.reset();  // refers to the rings' io_urings
    rings_.clear();
    files_.clear();  // closes them; removes those still at their paths
  }

  static uint64_t Key(uint32_t file, uint64_t offset) {
    return (static_cast<uint64_t>(file) << 48) | (offset / kAlign);
  }

  // ---- RingHost ---------------------------------------------------------------------

  const nvme::SwapFile& file(uint32_t i) const override { return *files_[i]; }
  int FindSlot(const void* buf, uint64_t len) const override { return buffers_->Find(buf, len); }
  Status PieceDone(nvme::Transfer* t, uint64_t pos, uint64_t len) override {
    return checksums_.PieceDone(t, pos, len, files_[t->extent.file]->path());
  }

  // ---- Open -------------------------------------------------------------------------

  static Status ValidateOptions(const NvmeOptions& o) {
    if (o.dirs.empty())
      return InvalidArgument("NvmeOptions.dirs is empty: give at least one directory");
    if (o.block_size == 0 || o.block_size % kAlign != 0)
      return InvalidArgument("NvmeOptions.block_size " + std::to_string(o.block_size) +
                             " must be a positive multiple of 4096 (aio.block_size)");
    if (o.queue_depth == 0 || o.queue_depth > kMaxQueueDepth)
      return InvalidArgument("NvmeOptions.queue_depth " + std::to_string(o.queue_depth) +
                             " must be in [1, " + std::to_string(kMaxQueueDepth) +
                             "] (aio.queue_depth)");
    if (o.rings < 1 || o.rings > kMaxRings)
      return InvalidArgument("NvmeOptions.rings " + std::to_string(o.rings) + " must be in [1, " +
                             std::to_string(kMaxRings) + "] (aio.intra_op_parallelism)");
    if (o.checksum != ChecksumKind::kNone &&
        (o.checksum_block == 0 || o.checksum_block % kAlign != 0))
      return InvalidArgument("NvmeOptions.checksum_block " + std::to_string(o.checksum_block) +
                             " must be a positive multiple of 4096");
    return Status::OK();
  }

  // One swap file per directory, then the rings (which register the files),
  // then the buffer table over the rings; the threads start last.
  Status Open() {
    const uint64_t file_limit = capacity_ ? capacity_ : (UINT64_MAX & ~(kAlign - 1));
    std::vector<int> fds;
    for (const std::string& dir : opt.dirs) {
      // What killed runs left here goes first (tiers/nvme/leftovers.h).
      if (Result<std::vector<nvme::LeftoverSwapFile>> gone = nvme::ReclaimLeftoverSwapFiles(env, dir); gone.ok())
        for (const nvme::LeftoverSwapFile& f : *gone)
          Note("removed " + f.path + " (" + FormatBytes(f.bytes) + "), a swap file left by process " +
               std::to_string(f.pid) + ", which has exited");
      ASSIGN_OR_RETURN(std::unique_ptr<nvme::SwapFile> f,
                       nvme::SwapFile::Create(env, dir, opt.buffered_fallback));
      if (!f->direct()) direct_ = false;
      paths_.push_back(f->path());
      fds.push_back(f->fd());
      files_.push_back(std::move(f));
      std::lock_guard<std::mutex> l(mu_);
      allocs_.emplace_back(kAlign, file_limit);
    }
    const nvme::RingOptions ro{opt.block_size, opt.queue_depth, opt.single_submit,
                               opt.overlap_events};
    bool fixed_buffers = true;
    std::vector<io_uring*> urings;
    for (int i = 0; i < opt.rings; ++i) {
      rings_.push_back(std::make_unique<nvme::Ring>(this, env, ro, i));
      RETURN_IF_ERROR(rings_.back()->Init(fds, nvme::BufferTable::kSlots, &fixed_buffers));
      urings.push_back(rings_.back()->ring());
    }
    buffers_ = std::make_unique<nvme::BufferTable>(env, std::move(urings), fixed_buffers);
    for (auto& r : rings_) r->Start();
    return Status::OK();
  }

  // ---- Extents ------------------------------------------------------------------------

  Result<Extent> Allocate(uint64_t bytes) {
    if (bytes == 0) return InvalidArgument("NvmeTier::Allocate of 0 bytes");
    if (bytes > (UINT64_MAX & ~(kAlign - 1)))
      return InvalidArgument("NvmeTier::Allocate of " + std::to_string(bytes) + " bytes");
    const uint64_t aligned = AlignUp(bytes, kAlign);
    std::lock_guard<std::mutex> l(mu_);
    if (capacity_ != 0 && aligned > capacity_ - used_)
      return OutOfMemory(TierKind::kNvme, aligned, capacity_ - used_,
                         "NVMe extent of " + FormatBytes(aligned) + " (capacity " +
                             FormatBytes(capacity_) + ", " + FormatBytes(used_) + " in use)");
    // Least-used file first, so several directories share the load.
    std::vector<uint32_t> order(files_.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return allocs_[a].used() < allocs_[b].used();
    });
    Status first_error;
    for (uint32_t fi : order) {
      ExtentAllocator& alloc = allocs_[fi];
      std::optional<uint64_t> off = alloc.Allocate(aligned);
      if (!off) continue;
      if (*off + aligned > files_[fi]->size()) {
        Status g = files_[fi]->Grow(*off + aligned);
        if (!g.ok()) {
          Status undo = alloc.Free(*off, aligned);
          if (!undo.ok()) Note("internal: " + undo.ToString());
          if (first_error.ok()) first_error = g;
          continue;  // try the next directory
        }
      }
      used_ += aligned;
      ExtentInfo& info = live_[Key(fi, *off)];
      info.bytes = aligned;
      info.sums = checksums_.NewExtent(aligned);
      return Extent{fi, *off, aligned};
    }
    if (!first_error.ok()) return first_error;
    return OutOfMemory(TierKind::kNvme, aligned, 0,
                       "NVMe extent of " + FormatBytes(aligned) + ": no swap file can hold it");
  }

  void Free(const Extent& e) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = e.file < files_.size() ? live_.find(Key(e.file, e.offset)) : live_.end();
    if (it == live_.end() || it->second.bytes != e.bytes) {
      Note("Free of an extent that is not allocated (file " + std::to_string(e.file) + ", offset " +
           std::to_string(e.offset) + ", " + std::to_string(e.bytes) + " bytes): ignored");
      return;
    }
    Status s = allocs_[e.file].Free(e.offset, e.bytes);
    if (!s.ok()) Note("internal: " + s.ToString());
    used_ -= e.bytes;
    live_.erase(it);
  }

  // ---- Transfers ----------------------------------------------------------------------

  // Checks a transfer's arguments against the live extents and, with
  // checksums on, prepares its checksum blocks.
  Status Validate(nvme::Transfer* t) {
    const Extent& e = t->extent;
    const uint64_t offset = t->offset, bytes = t->bytes;
    const void* buf = t->buf;
    std::string where = std::string("NvmeTier::") + (t->write ? "Write" : "Read") + ": ";
    if (e.file >= files_.size())
      return InvalidArgument(where + "extent names file " + std::to_string(e.file) + " of " +
                             std::to_string(files_.size()));
    if (offset % kAlign != 0 || bytes % kAlign != 0)
      return InvalidArgument(where + "offset " + std::to_string(offset) + " and length " +
                             std::to_string(bytes) + " must be multiples of 4096");
    if (bytes != 0 && (buf == nullptr || reinterpret_cast<uintptr_t>(buf) % kAlign != 0))
      return InvalidArgument(where + "buffer " + nvme::Hex(reinterpret_cast<uintptr_t>(buf)) +
                             " is not 4096-aligned");
    if (offset > e.bytes || bytes > e.bytes - offset)
      return InvalidArgument(where + "range [" + std::to_string(offset) + ", " +
                             std::to_string(offset + bytes) + ") exceeds the extent of " +
                             std::to_string(e.bytes) + " bytes");
    std::lock_guard<std::mutex> l(mu_);
    auto it = live_.find(Key(e.file, e.offset));
    if (it == live_.end() || it->second.bytes != e.bytes)
      return InvalidArgument(where + "extent (file " + std::to_string(e.file) + ", offset " +
                             std::to_string(e.offset) + ", " + std::to_string(e.bytes) +
                             " bytes) is not allocated in this tier");
    checksums_.Begin(t, it->second.sums);
    return Status::OK();
  }

  void Submit(bool write, const Extent& e, uint64_t offset, void* buf, uint64_t bytes,
              IoCallback done) {
    outstanding_.fetch_add(1, std::memory_order_relaxed);
    auto* t = new nvme::Transfer;
    t->write = write;
    t->extent = e;
    t->offset = offset;
    t->buf = static_cast<char*>(buf);
    t->bytes = bytes;
    t->done = std::move(done);
    t->start_ns = NowNs();
    t->early = Validate(t);
    const uint32_t first_ring = next_ring_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t block = opt.block_size;
    // Whole blocks per part, as evenly as possible over the rings.
    uint64_t nparts = 1, chunk = bytes;
    if (t->early.ok() && rings_.size() > 1 && bytes > block) {
      const uint64_t blocks = (bytes + block - 1) / block;
      nparts = std::min<uint64_t>(rings_.size(), blocks);
      chunk = (blocks + nparts - 1) / nparts * block;
      nparts = (bytes + chunk - 1) / chunk;
    }
    if (!t->early.ok()) bytes = 0;
    t->parts.resize(nparts);
    t->parts_left.store(static_cast<uint32_t>(nparts), std::memory_order_relaxed);
    for (uint64_t i = 0; i < nparts; ++i) {
      nvme::Part& p = t->parts[i];
      p.t = t;
      p.file = e.file < files_.size() ? e.file : 0;
      p.file_offset = e.offset + offset + i * chunk;
      p.buf = t->buf + i * chunk;
      p.bytes = std::min(chunk, bytes - std::min(bytes, i * chunk));
    }
    // `t` is not touched after the last Enqueue: a ring may complete and free
    // it at once (nparts is a local).
    for (uint64_t i = 0; i < nparts; ++i)
      rings_[(first_ring + i) % rings_.size()]->Enqueue(&t->parts[i]);
  }

  // The transfer's checksum blocks: a read verifies what no piece verified;
  // a write records what it left on disk, unless the extent was freed
  // meanwhile.
  Status FinishChecksums(nvme::Transfer* t, bool ok) {
    Status s = checksums_.Finish(t, ok, files_[t->extent.file]->path());
    if (!t->write) return s;
    std::lock_guard<std::mutex> l(mu_);
    auto it = live_.find(Key(t->extent.file, t->extent.offset));
    if (it != live_.end()) checksums_.Publish(*t, ok, &it->second.sums);
    return s;
  }

  void CompleteTransfer(nvme::Transfer* t) override {
    Status s = t->early;
    if (s.ok())
      for (const nvme::Part& p : t->parts)
        if (nvme::ErrorBefore(p.error, s)) s = p.error;
    if (!t->sums.empty()) {
      Status c = FinishChecksums(t, s.ok());
      if (s.ok()) s = c;
    }
    const uint64_t ns = NowNs() - t->start_ns;
    if (t->write) {
      writes_.fetch_add(1, std::memory_order_relaxed);
      write_ns_.fetch_add(ns, std::memory_order_relaxed);
      if (s.ok()) bytes_written_.fetch_add(t->bytes, std::memory_order_relaxed);
    } else {
      reads_.fetch_add(1, std::memory_order_relaxed);
      read_ns_.fetch_add(ns, std::memory_order_relaxed);
      if (s.ok()) bytes_read_.fetch_add(t->bytes, std::memory_order_relaxed);
    }
    if (!s.ok()) errors_.fetch_add(1, std::memory_order_relaxed);
    IoCallback done = std::move(t->done);
    delete t;
    if (done) done(std::move(s));
    if (outstanding_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> l(drain_mu_);
      drain_cv_.notify_all();
    }
  }

  Status SyncTransfer(bool write, const Extent& e, uint64_t offset, void* buf, uint64_t bytes) {
    if (nvme::Ring::OnIoThreadOf(this))
      return FailedPrecondition(std::string("NvmeTier::") + (write ? "WriteSync" : "ReadSync") +
                                " called on an NVMe I/O thread (inside a completion callback): "
                                "it would wait for itself");
    struct Wait {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      Status s;
    };
    auto w = std::make_shared<Wait>();
    Submit(write, e, offset, buf, bytes, [w](Status s) {
      std::lock_guard<std::mutex> l(w->mu);
      w->s = std::move(s);
      w->done = true;
      w->cv.notify_one();
    });
    std::unique_lock<std::mutex> l(w->mu);
    w->cv.wait(l, [&] { return w->done; });
    return w->s;
  }

  NvmeStats Stats() const {
    NvmeStats s;
    s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
    s.bytes_written = bytes_written_.load(std::memory_order_relaxed);
    s.reads = reads_.load(std::memory_order_relaxed);
    s.writes = writes_.load(std::memory_order_relaxed);
    s.read_seconds = read_ns_.load(std::memory_order_relaxed) * 1e-9;
    s.write_seconds = write_ns_.load(std::memory_order_relaxed) * 1e-9;
    s.errors = errors_.load(std::memory_order_relaxed);
    s.checksum_failures = checksums_.failures();
    s.registered_bytes = buffers_->registered_bytes();
    s.fixed_buffers = buffers_->enabled();
    s.fixed_files = !rings_.empty();
    for (const auto& r : rings_) {
      s.ios_submitted += r->ios_submitted.load(std::memory_order_relaxed);
      s.short_requeued += r->short_requeued.load(std::memory_order_relaxed);
      s.retried += r->retried.load(std::memory_order_relaxed);
      s.fixed_ios += r->fixed_ios.load(std::memory_order_relaxed);
      s.max_inflight = std::max(s.max_inflight, r->max_inflight.load(std::memory_order_relaxed));
      s.fixed_files = s.fixed_files && r->fixed_files();
    }
    s.capacity = capacity_;
    std::lock_guard<std::mutex> l(mu_);
    s.used = used_;
    return s;
  }

  // Fixed after Open.
  const NvmeOptions opt;
  IoEnv* const env;              // not owned
  const uint64_t capacity_;      // 0: none
  nvme::BlockChecksums checksums_;
  std::vector<std::unique_ptr<nvme::SwapFile>> files_;
  std::vector<std::string> paths_;
  std::vector<std::unique_ptr<nvme::Ring>> rings_;
  std::unique_ptr<nvme::BufferTable> buffers_;
  bool direct_ = true;

  mutable std::mutex mu_;
  uint64_t used_ GUARDED_BY(mu_) = 0;
  std::vector<ExtentAllocator> allocs_ GUARDED_BY(mu_);  // one per file
  std::unordered_map<uint64_t, ExtentInfo> live_ GUARDED_BY(mu_);
  // (The swap files' Grow and size() are serialized by mu_ as well.)

  std::atomic<uint32_t> next_ring_{0};
  // Transfers submitted whose callback has not returned yet. The destructor
  // waits for zero before stopping the rings, so I/O that callbacks start
  // while the tier shuts down still finishes. acq_rel on the decrement: the
  // destructor's acquire sees everything the callbacks did.
  std::atomic<uint64_t> outstanding_{0};
  std::mutex drain_mu_;
  std::condition_variable drain_cv_;
  // Caller-level stats (relaxed: counters).
  std::atomic<uint64_t> bytes_read_{0}, bytes_written_{0}, reads_{0}, writes_{0};
  std::atomic<uint64_t> read_ns_{0}, write_ns_{0}, errors_{0};
};

// ---- NvmeTier ---------------------------------------------------------------------------

Result<std::unique_ptr<NvmeTier>> NvmeTier::Open(const NvmeOptions& options) {
  RETURN_IF_ERROR(Impl::ValidateOptions(options));
  std::unique_ptr<NvmeTier> tier(new NvmeTier());
  tier->impl_ = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(tier->impl_->Open());
  return tier;
}

NvmeTier::~NvmeTier() = default;

Result<Extent> NvmeTier::Allocate(uint64_t bytes) { return impl_->Allocate(bytes); }
void NvmeTier::Free(const Extent& e) { impl_->Free(e); }

void NvmeTier::Write(const Extent& e, uint64_t offset, const void* src, uint64_t bytes,
                     IoCallback done) {
  impl_->Submit(true, e, offset, const_cast<void*>(src), bytes, std::move(done));
}

void NvmeTier::Read(const Extent& e, uint64_t offset, void* dst, uint64_t bytes, IoCallback done) {
  impl_->Submit(false, e, offset, dst, bytes, std::move(done));
}

Status NvmeTier::WriteSync(const Extent& e, uint64_t offset, const void* src, uint64_t bytes) {
  return impl_->SyncTransfer(true, e, offset, const_cast<void*>(src), bytes);
}

Status NvmeTier::ReadSync(const Extent& e, uint64_t offset, void* dst, uint64_t bytes) {
  return impl_->SyncTransfer(false, e, offset, dst, bytes);
}

Status NvmeTier::RegisterBuffer(void* base, uint64_t bytes) {
  return impl_->buffers_->Register(base, bytes);
}
void NvmeTier::UnregisterBuffer(void* base) { impl_->buffers_->Unregister(base); }

const std::vector<std::string>& NvmeTier::files() const { return impl_->paths_; }
Status NvmeTier::CheckFiles() const {
  for (const auto& f : impl_->files_) RETURN_IF_ERROR(f->Check());
  return Status::OK();
}
bool NvmeTier::direct_io() const { return impl_->direct_; }
NvmeStats NvmeTier::stats() const { return impl_->Stats(); }

}  // namespace strata
