// NvmeTier: swap files, extents and the io_uring engine under them.
//
// Contents
//   Transfer / Part / Piece   a caller's transfer; its share on one ring; one block-level I/O
//   Ring                      one io_uring and the thread that owns it
//   NvmeTier::Impl            files, extents, checksums, buffer registry, stats
//   NvmeTier                  the public methods
//
// How a transfer moves: Read/Write validate the request on the caller's
// thread and split it into at most `rings` contiguous parts (whole blocks),
// one per ring, handed over through each ring's inbox. A ring's thread cuts
// its parts into pieces of `block_size` bytes, keeps up to `queue_depth` of
// them in flight, and reads every completion: a short transfer re-queues the
// rest of its piece, -EAGAIN/-EINTR retry it (bounded), anything else ends
// the part with an error naming file, offset and errno. When the last part of
// a transfer finishes (on whichever ring), checksums are recorded or verified
// and the caller's callback runs, exactly once.
//
// The ring thread is the only thread that touches its io_uring's SQ and CQ, so
// the ring needs no lock; callers reach it through the inbox (mutex) and wake
// it through an eventfd whose read is always armed in the ring.
#include "tiers/nvme_tier.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <unordered_map>

#include "base/bytes.h"
#include "base/thread_annotations.h"
#include "tiers/extent_allocator.h"
#include "tiers/io_env.h"

namespace strata {

namespace {

constexpr uint64_t kAlign = 4096;               // O_DIRECT alignment of offsets, lengths, buffers
constexpr unsigned kBufferSlots = 64;           // registered-buffer table size per ring
constexpr uint64_t kMaxSlotBytes = 1ull << 30;  // the kernel's limit for one registered buffer
constexpr uint32_t kMaxRetries = 16;            // -EAGAIN/-EINTR retries of one piece
constexpr uint64_t kWakeTag = ~0ull;            // user_data of the eventfd read
constexpr int kMaxRings = 64;
constexpr uint32_t kMaxQueueDepth = 16384;

void Note(const std::string& line) { std::fprintf(stderr, "strata nvme: %s\n", line.c_str()); }

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

Status UnavailableErrno(std::string message, int err, std::string path = {}) {
  Status::Rep rep;
  rep.code = StatusCode::kUnavailable;
  rep.message = std::move(message);
  rep.sys_errno = err;
  rep.path = std::move(path);
  return Status(std::move(rep));
}

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// A swap file. `path`, `fd`, `direct` are fixed after Open; `size`,
// `truncate_to_grow` and `alloc` are guarded by Impl::mu_.
struct SwapFile {
  std::string dir;
  std::string path;
  int fd = -1;
  bool direct = true;
  bool truncate_to_grow = false;  // fallocate unsupported: grow with ftruncate
  uint64_t size = 0;              // bytes reserved in the file (fallocate'd)
  ExtentAllocator alloc;
  explicit SwapFile(uint64_t limit) : alloc(kAlign, limit) {}
};

struct Transfer;

// One transfer's share on one ring: [file_offset, file_offset + bytes) of a
// file from/to buf. Fields below `bytes` belong to the ring thread.
struct Part {
  Transfer* t = nullptr;
  uint32_t file = 0;
  uint64_t file_offset = 0;
  char* buf = nullptr;
  uint64_t bytes = 0;

  uint64_t next = 0;    // bytes already cut into pieces (== bytes: nothing left to cut)
  uint32_t active = 0;  // pieces cut and not finished (in flight or waiting to be re-queued)
  bool queued = false;  // in the ring's pending list
  Status error;         // the error at the lowest offset of this part (see ErrorBefore)
};

// A caller's Read or Write.
struct Transfer {
  bool write = false;
  Extent extent;
  uint64_t offset = 0;  // within the extent
  char* buf = nullptr;
  uint64_t bytes = 0;
  IoCallback done;
  uint64_t start_ns = 0;
  Status early;  // a validation error: no I/O is done
  std::vector<Part> parts;
  // Checksum blocks touched, [first_block, first_block + sums.size()) of the
  // extent (only with checksums on). A piece that holds a whole block computes
  // its checksum as soon as the piece is done, so the work overlaps the I/O
  // still in flight; each element is written by that one piece's ring and
  // read by the ring completing the transfer (ordered by parts_left).
  size_t first_block = 0;
  std::vector<uint64_t> sums;         // the data's checksum per block
  std::vector<uint8_t> computed;      // sums[i] is set
  std::vector<uint8_t> expect_state;  // reads: the blocks' state at submission
  std::vector<uint64_t> expect;       // reads: the stored checksums at submission
  // The ring finishing the last part completes the transfer. acq_rel: that
  // ring's acquire sees every other ring's writes to its Part (released by
  // their decrement).
  std::atomic<uint32_t> parts_left{0};
  // Set by the first failing part; other rings stop cutting pieces. Relaxed:
  // only an early stop, the error itself travels through parts_left.
  std::atomic<bool> failed{false};
};

// A transfer reports one error: the one at the lowest file offset (the first
// in the transfer's byte order, whatever order pieces completed in), so the
// report does not depend on timing. Errors without an offset rank last.
bool ErrorBefore(const Status& a, const Status& b) {
  if (b.ok()) return !a.ok();
  if (a.ok()) return false;
  return a.offset().value_or(UINT64_MAX) < b.offset().value_or(UINT64_MAX);
}

// One block-level I/O.
struct Piece {
  Part* part = nullptr;
  uint64_t pos = 0;       // offset of the piece within the part
  uint32_t len = 0;       // full length of the piece
  uint32_t done = 0;      // bytes transferred so far
  uint32_t attempts = 0;  // submissions so far
  uint32_t retries = 0;   // -EAGAIN/-EINTR retries so far
  bool live = false;      // taken from the pool
  bool inflight = false;  // in the ring (SQ or kernel)
  IoOp op;                // the latest submission as PrepareIo left it
};

// What a ring needs from the tier.
class RingHost {
 public:
  virtual ~RingHost() = default;
  virtual const SwapFile& file(uint32_t i) const = 0;
  virtual IoEnv* env() const = 0;
  virtual const NvmeOptions& options() const = 0;
  // Registered-buffer slot holding [buf, buf + len), or -1.
  virtual int FindSlot(const void* buf, uint64_t len) const = 0;
  // A piece of `t` at [pos, pos + len) of the transfer is complete (ring
  // thread). Returns an error (a checksum mismatch) to fail the transfer.
  virtual Status PieceDone(Transfer* t, uint64_t pos, uint64_t len) = 0;
  // Runs on the ring thread that finished the transfer's last part.
  virtual void CompleteTransfer(Transfer* t) = 0;
};

// Tells ReadSync/WriteSync that they are running on an I/O thread (inside a
// callback), where waiting for I/O would deadlock.
thread_local const RingHost* tls_io_thread_host = nullptr;

// ---- Ring -------------------------------------------------------------------------
//
// One io_uring and its I/O thread. Thread-safety: Enqueue and Stop may be
// called from any thread; everything else runs on the ring's own thread
// (after Init, which runs on the opener's thread before the thread starts).
class Ring {
 public:
  Ring(RingHost* host, int index) : host_(host), index_(index) {}
  ~Ring() {
    Stop();
    if (ring_ok_) host_->env()->RingExit(&ring_);
    if (efd_ >= 0) host_->env()->Close(efd_);
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // Sets up the ring, its eventfd, registered files and the sparse buffer
  // table. Unavailable when io_uring cannot be set up.
  Status Init(const std::vector<int>& fds, bool* fixed_buffers) {
    IoEnv* env = host_->env();
    const NvmeOptions& o = host_->options();
    std::memset(&ring_, 0, sizeof ring_);
    int r = env->RingInit(o.queue_depth + 1, &ring_, 0);
    if (r < 0)
      return UnavailableErrno(
          "io_uring is not available: io_uring_queue_init failed (a kernel without io_uring, "
          "io_uring disabled by sysctl kernel.io_uring_disabled, or blocked by seccomp)",
          -r);
    ring_ok_ = true;
    efd_ = env->EventFd();
    if (efd_ < 0) {
      int err = -efd_;
      efd_ = -1;
      return IoError("cannot create the eventfd of NVMe ring " + std::to_string(index_), err);
    }
    r = env->RegisterFiles(&ring_, fds.data(), static_cast<unsigned>(fds.size()));
    fixed_files_ = r >= 0;
    if (r < 0 && index_ == 0)
      Note("registering the swap files with io_uring failed (" + std::string(strerror(-r)) +
           "): using plain descriptors");
    r = env->RegisterBuffersSparse(&ring_, kBufferSlots);
    if (r < 0) {
      *fixed_buffers = false;
      if (index_ == 0)
        Note("the kernel refused a sparse registered-buffer table (" + std::string(strerror(-r)) +
             "; needs Linux 5.19+): transfers use unregistered buffers");
    }
    return Status::OK();
  }

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }

  void Enqueue(Part* p) {
    bool was_empty;
    {
      std::lock_guard<std::mutex> l(mu_);
      was_empty = inbox_.empty();
      inbox_.push_back(p);
    }
    // A non-empty inbox already has a wake-up on its way (the push that made
    // it non-empty wrote the eventfd after pushing, and the thread drains the
    // whole inbox after every wake-up), so only that first push must wake.
    if (was_empty) Wake();
  }

  void Stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    Wake();
    thread_.join();
  }

  io_uring* ring() { return &ring_; }
  bool ring_ok() const { return ring_ok_; }
  bool fixed_files() const { return fixed_files_; }

  // Stats, written by the ring thread, read by anyone (relaxed: counters).
  std::atomic<uint64_t> ios_submitted{0}, short_requeued{0}, retried{0}, fixed_ios{0};
  std::atomic<uint32_t> max_inflight{0};

 private:
  void Wake() {
    // Not through IoEnv: waking the thread is not I/O of the tier.
    if (efd_ >= 0) (void)eventfd_write(efd_, 1);
    cv_.notify_one();  // only a failed ring waits on the condition variable
  }

  void Run() {
    tls_io_thread_host = host_;
    ArmWake();
    for (;;) {
      bool stopping = TakeInbox();
      if (!failed_.ok()) {
        if (stopping && pending_.empty()) break;
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return !inbox_.empty() || stopping_; });
        continue;
      }
      Fill();
      if (stopping && pending_.empty() && retry_.empty() && inflight_ == 0) break;
      WaitAndReap();
    }
    tls_io_thread_host = nullptr;
  }

  // Moves new parts into the pending list (or fails them on a failed ring).
  // Returns whether the tier is stopping.
  bool TakeInbox() {
    taken_.clear();
    bool stopping;
    {
      std::lock_guard<std::mutex> l(mu_);
      taken_.swap(inbox_);
      stopping = stopping_;
    }
    for (Part* p : taken_) {
      if (!failed_.ok()) {
        SetPartError(p, failed_);
        MaybeFinishPart(p);
        continue;
      }
      p->queued = true;
      pending_.push_back(p);
    }
    return stopping;
  }

  void ArmWake() {
    io_uring_sqe* sqe = GetSqe();
    if (sqe == nullptr) return;
    io_uring_prep_read(sqe, efd_, &wake_value_, sizeof wake_value_, 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }

  io_uring_sqe* GetSqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {  // SQ full (cannot happen with entries > depth, but be safe)
      int r = host_->env()->Submit(&ring_);
      if (r < 0 && r != -EAGAIN && r != -EBUSY && r != -EINTR)
        Fail(IoError("io_uring_submit failed on NVMe ring " + std::to_string(index_), -r));
      sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr && failed_.ok())
        Fail(Internal("NVMe ring " + std::to_string(index_) + ": submission queue stays full"));
    }
    return sqe;
  }

  Piece* NewPiece() {
    Piece* p;
    if (free_.empty()) {
      pool_.push_back(std::make_unique<Piece>());
      p = pool_.back().get();
    } else {
      p = free_.back();
      free_.pop_back();
    }
    *p = Piece();
    p->live = true;
    return p;
  }

  // The next piece to issue: a re-queued one first, else a new cut from the
  // first pending part. Parts with nothing left to cut leave the list.
  Piece* NextPiece() {
    while (!retry_.empty()) {
      Piece* p = retry_.front();
      retry_.pop_front();
      if (p->part->error.ok() && !p->part->t->failed.load(std::memory_order_relaxed)) return p;
      FinishPiece(p);  // its transfer failed meanwhile: drop it
    }
    const uint64_t block = host_->options().block_size;
    while (!pending_.empty()) {
      Part* part = pending_.front();
      if (part->t->failed.load(std::memory_order_relaxed)) part->next = part->bytes;
      if (part->next >= part->bytes) {
        pending_.pop_front();
        part->queued = false;
        MaybeFinishPart(part);
        continue;
      }
      Piece* p = NewPiece();
      p->part = part;
      p->pos = part->next;
      p->len = static_cast<uint32_t>(std::min<uint64_t>(block, part->bytes - part->next));
      part->next += p->len;
      ++part->active;
      if (part->next == part->bytes) {
        pending_.pop_front();
        part->queued = false;
      }
      return p;
    }
    return nullptr;
  }

  void Fill() {
    const NvmeOptions& o = host_->options();
    // Without overlap_events a batch is submitted and fully reaped before the
    // next (DeepSpeed aio semantics).
    if (!o.overlap_events && inflight_ > 0) return;
    while (failed_.ok() && inflight_ < o.queue_depth) {
      Piece* p = NextPiece();
      if (p == nullptr) break;
      Issue(p);
    }
  }

  void Issue(Piece* p) {
    IoEnv* env = host_->env();
    const NvmeOptions& o = host_->options();
    Part* part = p->part;
    const SwapFile& f = host_->file(part->file);
    IoOp& op = p->op;
    op = IoOp();
    op.write = part->t->write;
    op.file = part->file;
    op.fd = f.fd;
    op.path = f.path;
    op.offset = part->file_offset + p->pos + p->done;
    op.buf = part->buf + p->pos + p->done;
    op.len = p->len - p->done;
    op.attempt = p->attempts++;
    const int slot = host_->FindSlot(op.buf, op.len);
    op.fixed_buffer = slot >= 0;
    const uint32_t want = op.len;
    int r = env->PrepareIo(op);
    if (r < 0) {  // the environment failed the I/O without submitting it
      HandleCompletion(p, r);
      return;
    }
    if (op.len == 0 || op.len > want || (f.direct && op.len % kAlign != 0)) {
      SetPartError(part,
                   Internal("IoEnv::PrepareIo left an invalid length " + std::to_string(op.len) +
                            " (wanted at most " + std::to_string(want) + ")"));
      FinishPiece(p);
      return;
    }
    io_uring_sqe* sqe = GetSqe();
    if (sqe == nullptr) {
      SetPartError(part, failed_);
      FinishPiece(p);
      return;
    }
    const int fd = fixed_files_ ? static_cast<int>(part->file) : f.fd;
    if (op.write) {
      if (op.fixed_buffer)
        io_uring_prep_write_fixed(sqe, fd, op.buf, op.len, op.offset, slot);
      else
        io_uring_prep_write(sqe, fd, op.buf, op.len, op.offset);
    } else {
      if (op.fixed_buffer)
        io_uring_prep_read_fixed(sqe, fd, op.buf, op.len, op.offset, slot);
      else
        io_uring_prep_read(sqe, fd, op.buf, op.len, op.offset);
    }
    if (fixed_files_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, p);
    p->inflight = true;
    ++inflight_;
    ios_submitted.fetch_add(1, std::memory_order_relaxed);
    if (op.fixed_buffer) fixed_ios.fetch_add(1, std::memory_order_relaxed);
    if (inflight_ > max_inflight.load(std::memory_order_relaxed))
      max_inflight.store(inflight_, std::memory_order_relaxed);
    if (o.single_submit) {
      int s = env->Submit(&ring_);
      // Transient refusals leave the SQE in the ring; the next submit takes it.
      if (s < 0 && s != -EAGAIN && s != -EBUSY && s != -EINTR)
        Fail(IoError("io_uring_submit failed on NVMe ring " + std::to_string(index_), -s));
    }
  }

  void WaitAndReap() {
    int r = host_->env()->SubmitAndWait(&ring_, 1);
    if (r >= 0 || r == -EINTR) {
      busy_rounds_ = 0;
    } else if (r == -EAGAIN || r == -EBUSY) {
      // The kernel cannot take more now (resources, or completions to reap
      // first). Reap what is there; if nothing is, back off briefly.
      if (io_uring_cq_ready(&ring_) == 0) {
        if (++busy_rounds_ > 20000) {  // about 2 s
          Fail(IoError("io_uring keeps refusing submissions on NVMe ring " + std::to_string(index_),
                       -r));
          return;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    } else {
      Fail(IoError("io_uring_submit_and_wait failed on NVMe ring " + std::to_string(index_), -r));
      return;
    }
    Reap();
  }

  void Reap() {
    bool rearm = false;
    io_uring_cqe* cqes[64];
    struct Done {
      uint64_t tag;
      int32_t res;
    } done[64];
    for (;;) {
      unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, 64);
      if (n == 0) break;
      for (unsigned i = 0; i < n; ++i) done[i] = {cqes[i]->user_data, cqes[i]->res};
      io_uring_cq_advance(&ring_, n);  // handling may issue new I/O: free the CQ first
      for (unsigned i = 0; i < n; ++i) {
        if (done[i].tag == kWakeTag) {
          rearm = true;
        } else {
          Piece* p = reinterpret_cast<Piece*>(done[i].tag);
          p->inflight = false;
          --inflight_;
          HandleCompletion(p, done[i].res);
        }
      }
    }
    if (rearm && failed_.ok()) ArmWake();
  }

  // Acts on one block-level result: done, re-queue the rest (short), retry
  // (-EAGAIN/-EINTR, bounded), or an error naming file, offset and errno.
  void HandleCompletion(Piece* p, int32_t res) {
    Part* part = p->part;
    const IoOp& op = p->op;
    res = host_->env()->CompleteIo(op, res);
    // Once the transfer has failed its remaining pieces are drained: nothing
    // is re-queued or retried, but an error at a lower offset still replaces
    // the one to report.
    const bool draining = !part->error.ok() || part->t->failed.load(std::memory_order_relaxed);
    const SwapFile& f = host_->file(part->file);
    const char* what = op.write ? "NVMe write" : "NVMe read";
    auto end_of_file = [&](uint64_t at) {
      return DataLoss(
          "NVMe read found the end of the file inside the extent: the swap file is "
          "shorter than what was written to it (truncated by someone else?)",
          f.path, at);
    };
    Status error;
    if (res < 0) {
      const int err = -res;
      const bool transient = err == EAGAIN || err == EINTR;
      if (transient && draining) {
        FinishPiece(p);
        return;
      }
      if (transient && p->retries < kMaxRetries) {
        ++p->retries;
        retried.fetch_add(1, std::memory_order_relaxed);
        // From the 5th retry of a piece on, back off (0.25 ms doubling to 8 ms,
        // about 64 ms over all retries): the kernel or device is short of
        // something, and a brief stall of this ring beats spinning on it.
        if (p->retries > 4)
          std::this_thread::sleep_for(
              std::chrono::microseconds(250u << std::min(p->retries - 5, 5u)));
        retry_.push_back(p);
        return;
      }
      error = IoError(
          std::string(what) + " of " + std::to_string(op.len) + " bytes failed" +
              (p->retries ? " after " + std::to_string(p->retries) + " retries" : std::string()),
          err, f.path, op.offset);
    } else if (res == 0) {
      error = op.write
                  ? IoError("NVMe write made no progress (0 bytes written)", EIO, f.path, op.offset)
                  : end_of_file(op.offset);
    } else if (static_cast<uint32_t>(res) > op.len) {
      error = Internal(std::string(what) + " returned " + std::to_string(res) +
                       " bytes for a request of " + std::to_string(op.len));
    } else {
      p->done += static_cast<uint32_t>(res);
      if (p->done == p->len && !draining)
        error = host_->PieceDone(
            part->t, part->file_offset - part->t->extent.offset - part->t->offset + p->pos, p->len);
      if (p->done < p->len) {
        const uint64_t at = op.offset + static_cast<uint64_t>(res);
        if (f.direct && at % kAlign != 0) {
          // Direct I/O cannot go on from an unaligned offset. For a read this
          // only happens where a file that was cut short now ends.
          error = op.write ? IoError(
                                 "NVMe write stopped at an unaligned offset; direct I/O "
                                 "cannot continue",
                                 EIO, f.path, at)
                           : end_of_file(at);
        } else if (!draining) {
          short_requeued.fetch_add(1, std::memory_order_relaxed);
          retry_.push_back(p);
          return;
        }
      }
    }
    if (!error.ok()) SetPartError(part, error);
    FinishPiece(p);
  }

  void SetPartError(Part* part, const Status& s) {
    if (ErrorBefore(s, part->error)) part->error = s;
    part->t->failed.store(true, std::memory_order_relaxed);
    part->next = part->bytes;  // cut no more pieces
  }

  void FinishPiece(Piece* p) {
    Part* part = p->part;
    p->live = false;
    free_.push_back(p);
    --part->active;
    MaybeFinishPart(part);
  }

  void MaybeFinishPart(Part* part) {
    if (part->active != 0 || part->queued) return;
    Transfer* t = part->t;
    if (t->parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) host_->CompleteTransfer(t);
  }

  // The ring is unusable (io_uring_enter failed for good): fail every piece it
  // holds and every part that comes later. In-flight pieces are given up: a
  // ring whose io_uring_enter fails with EBADF/EFAULT/... no longer runs I/O.
  void Fail(const Status& s) {
    if (!failed_.ok()) return;
    failed_ = s;
    Note(s.ToString() + "; failing all I/O of this ring");
    for (auto& piece : pool_) {
      Piece* p = piece.get();
      if (!p->live || !p->inflight) continue;
      p->inflight = false;
      --inflight_;
      SetPartError(p->part, s);
      FinishPiece(p);
    }
    while (!retry_.empty()) {
      Piece* p = retry_.front();
      retry_.pop_front();
      SetPartError(p->part, s);
      FinishPiece(p);
    }
    while (!pending_.empty()) {
      Part* part = pending_.front();
      pending_.pop_front();
      part->queued = false;
      SetPartError(part, s);
      MaybeFinishPart(part);
    }
  }

  RingHost* const host_;
  const int index_;
  io_uring ring_{};
  bool ring_ok_ = false;
  bool fixed_files_ = false;
  int efd_ = -1;
  std::thread thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Part*> inbox_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;

  // Ring-thread state.
  uint64_t wake_value_ = 0;  // the eventfd read lands here
  std::vector<Part*> taken_;
  std::deque<Part*> pending_;  // parts with pieces left to cut
  std::deque<Piece*> retry_;   // pieces to submit again (short transfer, EAGAIN)
  std::vector<std::unique_ptr<Piece>> pool_;
  std::vector<Piece*> free_;
  uint32_t inflight_ = 0;  // pieces in the ring (SQ or kernel)
  uint32_t busy_rounds_ = 0;
  Status failed_;  // sticky: the ring is unusable
};

}  // namespace

// ---- NvmeTier::Impl -------------------------------------------------------------------

struct NvmeTier::Impl final : RingHost {
  // Per-extent bookkeeping. `state`/`sums` exist only with checksums on.
  enum BlockState : uint8_t { kUnknown = 0, kValid = 1, kPoisoned = 2 };
  struct ExtentInfo {
    uint64_t bytes = 0;
    std::vector<uint8_t> state;  // per checksum block
    std::vector<uint64_t> sums;
  };
  // A registered range; `slots` empty when the kernel refused it.
  struct Registration {
    uint64_t bytes = 0;
    std::vector<unsigned> slots;
  };
  struct Slot {
    uintptr_t end = 0;
    unsigned index = 0;
  };

  NvmeOptions opt;
  IoEnv* io_env = nullptr;
  std::vector<std::unique_ptr<SwapFile>> files_;  // fixed after Open (fields: see SwapFile)
  std::vector<std::string> paths_;
  std::vector<std::unique_ptr<Ring>> rings_;
  bool direct_ = true;
  bool fixed_buffers_ = true;
  uint64_t capacity_ = 0;  // 0: none

  mutable std::mutex mu_;
  uint64_t used_ GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, ExtentInfo> live_ GUARDED_BY(mu_);

  mutable std::mutex reg_mu_;  // never held while mu_ is wanted, and vice versa
  std::map<uintptr_t, Registration> regs_ GUARDED_BY(reg_mu_);  // by base address
  std::map<uintptr_t, Slot> slots_ GUARDED_BY(reg_mu_);         // by slot start address
  std::vector<bool> slot_used_ GUARDED_BY(reg_mu_);

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
  std::atomic<uint64_t> read_ns_{0}, write_ns_{0}, errors_{0}, checksum_failures_{0};
  std::atomic<uint64_t> registered_bytes_{0};

  ~Impl() override {
    {
      std::unique_lock<std::mutex> l(drain_mu_);
      drain_cv_.wait(l, [&] { return outstanding_.load(std::memory_order_acquire) == 0; });
    }
    for (auto& r : rings_) r->Stop();
    rings_.clear();
    for (auto& f : files_) {
      // Only our own file goes: if the path now names another file (ours
      // was deleted or moved and something took its name), it stays.
      const bool ours = f->fd >= 0 && !f->path.empty() && CheckFile(*f).ok();
      if (f->fd >= 0) io_env->Close(f->fd);
      if (ours) {
        int r = io_env->Unlink(f->path);
        if (r < 0 && r != -ENOENT)
          Note("cannot remove swap file " + f->path + ": " + std::string(strerror(-r)));
      }
    }
  }

  // The swap file is still the one at its path (NvmeTier::CheckFiles).
  Status CheckFile(const SwapFile& f) const {
    struct stat mine{}, named{};
    int r = io_env->Fstat(f.fd, &mine);
    if (r < 0) return IoError("cannot fstat NVMe swap file", -r, f.path);
    if (mine.st_nlink == 0)
      return IoError("NVMe swap file was deleted while in use (the tier still holds it open, so nothing is lost "
                     "yet; its data goes when the process ends)",
                     ENOENT, f.path);
    r = io_env->Stat(f.path, &named);
    if (r < 0)
      return IoError("NVMe swap file is no longer at its path (moved or deleted while in use)", -r, f.path);
    if (named.st_dev != mine.st_dev || named.st_ino != mine.st_ino)
      return IoError("NVMe swap file's path now names another file (ours was moved or deleted while in use)",
                     EEXIST, f.path);
    return Status::OK();
  }

  // RingHost
  const SwapFile& file(uint32_t i) const override { return *files_[i]; }
  IoEnv* env() const override { return io_env; }
  const NvmeOptions& options() const override { return opt; }

  static uint64_t Key(uint32_t file, uint64_t offset) {
    return (static_cast<uint64_t>(file) << 48) | (offset / kAlign);
  }

  // ---- Open -----------------------------------------------------------------------

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

  Status OpenFile(const std::string& dir) {
    static std::atomic<uint64_t> seq{0};
    struct stat st {};
    int r = io_env->Stat(dir, &st);
    if (r == -ENOENT) return NotFound("NVMe directory '" + dir + "' does not exist");
    if (r < 0) return IoError("cannot stat NVMe directory '" + dir + "'", -r, dir);
    if (!S_ISDIR(st.st_mode)) return InvalidArgument("NVMe path '" + dir + "' is not a directory");

    auto f = std::make_unique<SwapFile>(capacity_ ? capacity_ : (UINT64_MAX & ~(kAlign - 1)));
    f->dir = dir;
    const int base_flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    for (int attempt = 0;; ++attempt) {
      std::string path = dir + "/strata-nvme-" + std::to_string(getpid()) + "-" +
                         std::to_string(seq.fetch_add(1)) + ".swap";
      int fd = io_env->Open(path, base_flags | O_DIRECT, 0600);
      if (fd == -EINVAL) {
        // The file system refused O_DIRECT. Some create the file first.
        (void)io_env->Unlink(path);
        if (!opt.buffered_fallback)
          return UnavailableErrno(
              "O_DIRECT was refused on NVMe directory '" + dir +
                  "' (open returned EINVAL: its file system does not support direct I/O, e.g. "
                  "tmpfs). Put the NVMe tier on a disk-backed directory, or set "
                  "buffered_fallback to allow buffered I/O (through the page cache) there",
              EINVAL, dir);
        fd = io_env->Open(path, base_flags, 0600);
        if (fd >= 0) {
          f->direct = false;
          Note("O_DIRECT was refused on " + dir + ": using buffered I/O there (buffered_fallback)");
        }
      }
      if (fd == -EEXIST && attempt < 100) continue;
      if (fd == -EACCES || fd == -EROFS || fd == -EPERM)
        return IoError(
            "NVMe directory '" + dir + "' is not writable: cannot create a swap file in it", -fd,
            dir);
      if (fd < 0) return IoError("cannot create NVMe swap file", -fd, path);
      f->fd = fd;
      f->path = path;
      break;
    }
    if (!f->direct) direct_ = false;
    paths_.push_back(f->path);
    files_.push_back(std::move(f));
    return Status::OK();
  }

  Status Open(const NvmeOptions& o) {
    opt = o;
    io_env = o.env ? o.env : IoEnv::Default();
    capacity_ = o.capacity_bytes & ~(kAlign - 1);
    for (const std::string& dir : o.dirs) RETURN_IF_ERROR(OpenFile(dir));
    std::vector<int> fds;
    for (auto& f : files_) fds.push_back(f->fd);
    slot_used_.assign(kBufferSlots, false);
    for (int i = 0; i < o.rings; ++i) {
      rings_.push_back(std::make_unique<Ring>(this, i));
      RETURN_IF_ERROR(rings_.back()->Init(fds, &fixed_buffers_));
    }
    for (auto& r : rings_) r->Start();
    return Status::OK();
  }

  // ---- Extents ---------------------------------------------------------------------

  // Grows `f` so that it covers [0, end). Requires mu_.
  Status Grow(SwapFile& f, uint64_t end) REQUIRES(mu_) {
    const uint64_t from = f.size;
    int r = f.truncate_to_grow ? io_env->Ftruncate(f.fd, end)
                               : io_env->Fallocate(f.fd, 0, from, end - from);
    if (r == -EOPNOTSUPP && !f.truncate_to_grow) {
      f.truncate_to_grow = true;
      Note("fallocate is not supported in " + f.dir + ": growing " + f.path +
           " with ftruncate (sparse; space is not reserved)");
      r = io_env->Ftruncate(f.fd, end);
    }
    if (r < 0)
      return IoError("cannot grow NVMe swap file to " + std::to_string(end) + " bytes (" +
                         (f.truncate_to_grow ? "ftruncate" : "fallocate") + ")",
                     -r, f.path, from);
    f.size = end;
    return Status::OK();
  }

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
      return files_[a]->alloc.used() < files_[b]->alloc.used();
    });
    Status first_error;
    for (uint32_t fi : order) {
      SwapFile& f = *files_[fi];
      std::optional<uint64_t> off = f.alloc.Allocate(aligned);
      if (!off) continue;
      if (*off + aligned > f.size) {
        Status g = Grow(f, *off + aligned);
        if (!g.ok()) {
          Status undo = f.alloc.Free(*off, aligned);
          if (!undo.ok()) Note("internal: " + undo.ToString());
          if (first_error.ok()) first_error = g;
          continue;  // try the next directory
        }
      }
      used_ += aligned;
      ExtentInfo& info = live_[Key(fi, *off)];
      info.bytes = aligned;
      if (opt.checksum != ChecksumKind::kNone) {
        size_t blocks = (aligned + opt.checksum_block - 1) / opt.checksum_block;
        info.state.assign(blocks, kUnknown);
        info.sums.assign(blocks, 0);
      }
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
    Status s = files_[e.file]->alloc.Free(e.offset, e.bytes);
    if (!s.ok()) Note("internal: " + s.ToString());
    used_ -= e.bytes;
    live_.erase(it);
  }

  // ---- Transfers ----------------------------------------------------------------------

  // Checks a transfer's arguments against the live extents and, with
  // checksums on, prepares its checksum vectors.
  Status Validate(Transfer* t) {
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
      return InvalidArgument(where + "buffer " + Hex(reinterpret_cast<uintptr_t>(buf)) +
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
    if (opt.checksum != ChecksumKind::kNone && bytes > 0) PrepareChecksums(t, it->second);
    return Status::OK();
  }

  void Submit(bool write, const Extent& e, uint64_t offset, void* buf, uint64_t bytes,
              IoCallback done) {
    outstanding_.fetch_add(1, std::memory_order_relaxed);
    auto* t = new Transfer;
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
      Part& p = t->parts[i];
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

  // ---- Checksums -----------------------------------------------------------------------
  //
  // Block b of an extent is [b * checksum_block, min((b + 1) * checksum_block,
  // extent bytes)). A transfer verifies (read) or records (write) the blocks
  // it covers whole; blocks it covers in part become unknown on write.

  uint64_t BlockStart(size_t b) const { return b * opt.checksum_block; }
  uint64_t BlockEnd(const Transfer* t, size_t b) const {
    return std::min<uint64_t>(BlockStart(b) + opt.checksum_block, t->extent.bytes);
  }
  bool FullyCovered(const Transfer* t, size_t b) const {
    return BlockStart(b) >= t->offset && BlockEnd(t, b) <= t->offset + t->bytes;
  }
  uint64_t BlockChecksum(const Transfer* t, size_t b) const {
    return ComputeChecksum(opt.checksum, t->buf + (BlockStart(b) - t->offset),
                           BlockEnd(t, b) - BlockStart(b));
  }
  Status Mismatch(const Transfer* t, size_t b, uint64_t stored, uint64_t read) {
    checksum_failures_.fetch_add(1, std::memory_order_relaxed);
    return DataLoss("NVMe checksum mismatch (" + std::string(ChecksumName(opt.checksum)) +
                        "): the block read back is not what was written (stored " + Hex(stored) +
                        ", read " + Hex(read) + "); the swap file was modified or corrupted",
                    files_[t->extent.file]->path, t->extent.offset + BlockStart(b));
  }

  // Sizes the transfer's checksum vectors; for a read, snapshots the blocks'
  // state and stored checksums. Requires mu_ and a live extent `info`.
  void PrepareChecksums(Transfer* t, const ExtentInfo& info) REQUIRES(mu_) {
    const size_t first = t->offset / opt.checksum_block;
    const size_t last = (t->offset + t->bytes - 1) / opt.checksum_block;
    const size_t n = last - first + 1;
    t->first_block = first;
    t->sums.assign(n, 0);
    t->computed.assign(n, 0);
    if (!t->write) {
      t->expect_state.assign(info.state.begin() + first, info.state.begin() + last + 1);
      t->expect.assign(info.sums.begin() + first, info.sums.begin() + last + 1);
    }
  }

  Status PieceDone(Transfer* t, uint64_t pos, uint64_t len) override {
    if (t->sums.empty()) return Status::OK();
    const uint64_t lo = t->offset + pos, hi = lo + len;  // within the extent
    for (size_t b = (lo + opt.checksum_block - 1) / opt.checksum_block;
         BlockEnd(t, b) <= hi && BlockStart(b) < hi; ++b) {
      const size_t i = b - t->first_block;
      t->sums[i] = BlockChecksum(t, b);
      t->computed[i] = 1;
      if (!t->write && t->expect_state[i] == kValid && t->expect[i] != t->sums[i])
        return Mismatch(t, b, t->expect[i], t->sums[i]);
    }
    return Status::OK();
  }

  // The blocks no piece held whole are done here; then a write publishes its
  // checksums, a read checks what it has not checked yet.
  Status FinishChecksums(Transfer* t, bool ok) {
    const size_t n = t->sums.size();
    if (ok)
      for (size_t i = 0; i < n; ++i)
        if (!t->computed[i] && FullyCovered(t, t->first_block + i)) {
          t->sums[i] = BlockChecksum(t, t->first_block + i);
          t->computed[i] = 1;
          if (!t->write && t->expect_state[i] == kValid && t->expect[i] != t->sums[i])
            return Mismatch(t, t->first_block + i, t->expect[i], t->sums[i]);
        }
    if (!t->write) {
      if (!ok) return Status::OK();
      for (size_t i = 0; i < n; ++i)
        if (t->expect_state[i] == kPoisoned)
          return DataLoss(
              "NVMe block of the extent was not written completely: an earlier write to it "
              "failed",
              files_[t->extent.file]->path, t->extent.offset + BlockStart(t->first_block + i));
      return Status::OK();
    }
    std::lock_guard<std::mutex> l(mu_);
    auto it = live_.find(Key(t->extent.file, t->extent.offset));
    if (it == live_.end()) return Status::OK();  // freed meanwhile
    ExtentInfo& info = it->second;
    for (size_t i = 0; i < n; ++i) {
      const size_t b = t->first_block + i;
      if (!ok) {
        info.state[b] = kPoisoned;  // what reached the disk is unknown
      } else if (t->computed[i]) {
        info.state[b] = kValid;
        info.sums[b] = t->sums[i];
      } else if (info.state[b] != kPoisoned) {
        info.state[b] = kUnknown;  // written in part: no longer known
      }
    }
    return Status::OK();
  }

  void CompleteTransfer(Transfer* t) override {
    Status s = t->early;
    if (s.ok())
      for (const Part& p : t->parts)
        if (ErrorBefore(p.error, s)) s = p.error;
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
    if (tls_io_thread_host == this)
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

  // ---- Registered buffers -------------------------------------------------------------

  int FindSlot(const void* buf, uint64_t len) const override {
    // Fast path without the lock when nothing is registered (a registration
    // racing with this only means one more unregistered I/O).
    if (!fixed_buffers_ || registered_bytes_.load(std::memory_order_relaxed) == 0) return -1;
    const uintptr_t a = reinterpret_cast<uintptr_t>(buf);
    std::lock_guard<std::mutex> l(reg_mu_);
    auto it = slots_.upper_bound(a);
    if (it == slots_.begin()) return -1;
    --it;
    if (a + len <= it->second.end) return static_cast<int>(it->second.index);
    return -1;
  }

  // Empties `slots` in every ring's buffer table. Called without reg_mu_: the
  // registration syscalls may take a while (pinning pages), and ring threads
  // look up slots under reg_mu_ for every piece.
  void ClearSlotsInKernel(const std::vector<unsigned>& slots) {
    iovec empty{nullptr, 0};
    for (unsigned s : slots)
      for (auto& r : rings_) {
        int rc = io_env->UpdateBuffers(r->ring(), s, &empty, 1);
        if (rc < 0) Note("clearing registered buffer slot failed: " + std::string(strerror(-rc)));
      }
  }

  Status RegisterBuffer(void* base, uint64_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(base);
    if (base == nullptr || bytes == 0)
      return InvalidArgument("NvmeTier::RegisterBuffer: empty range");
    if (bytes > UINTPTR_MAX - a)
      return InvalidArgument("NvmeTier::RegisterBuffer: range wraps around the address space");
    std::vector<unsigned> slots;
    std::string refused;
    {
      std::lock_guard<std::mutex> l(reg_mu_);
      auto next = regs_.lower_bound(a);
      auto overlap = [&](uintptr_t other) {
        return InvalidArgument("NvmeTier::RegisterBuffer: [" + Hex(a) + ", " + Hex(a + bytes) +
                               ") overlaps the registered buffer at " + Hex(other));
      };
      if (next != regs_.end() && next->first < a + bytes) return overlap(next->first);
      if (next != regs_.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second.bytes > a) return overlap(prev->first);
      }
      regs_.emplace(a, Registration{bytes, {}});  // claims the range; slots come below
      if (!fixed_buffers_) return Status::OK();   // noted once at Open
      // One slot per GiB (the kernel's limit for one registered buffer).
      const size_t need = (bytes + kMaxSlotBytes - 1) / kMaxSlotBytes;
      for (unsigned s = 0; s < kBufferSlots && slots.size() < need; ++s)
        if (!slot_used_[s]) slots.push_back(s);
      if (slots.size() < need) {
        refused = "all " + std::to_string(kBufferSlots) + " buffer slots are in use";
        slots.clear();
      }
      for (unsigned s : slots) slot_used_[s] = true;
    }
    for (size_t i = 0; i < slots.size() && refused.empty(); ++i) {
      const uint64_t off = i * kMaxSlotBytes;
      iovec iov{reinterpret_cast<void*>(a + off), std::min(kMaxSlotBytes, bytes - off)};
      for (auto& r : rings_) {
        int rc = io_env->UpdateBuffers(r->ring(), slots[i], &iov, 1);
        if (rc < 0) {
          refused = std::string(strerror(-rc)) +
                    (rc == -ENOMEM ? " (is RLIMIT_MEMLOCK too low for io_uring to pin it?)" : "");
          break;
        }
      }
    }
    if (!refused.empty()) {
      ClearSlotsInKernel(slots);
      Note("registering buffer [" + Hex(a) + ", +" + FormatBytes(bytes) +
           ") with io_uring failed: " + refused + "; its transfers use unregistered I/O");
    }
    std::lock_guard<std::mutex> l(reg_mu_);
    if (!refused.empty()) {
      for (unsigned s : slots) slot_used_[s] = false;
      return Status::OK();
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      const uintptr_t start = a + i * kMaxSlotBytes;
      slots_[start] = Slot{start + std::min(kMaxSlotBytes, bytes - i * kMaxSlotBytes), slots[i]};
    }
    auto it = regs_.find(a);
    if (it != regs_.end()) it->second.slots = slots;
    registered_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    return Status::OK();
  }

  void UnregisterBuffer(void* base) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(base);
    std::vector<unsigned> slots;
    {
      std::lock_guard<std::mutex> l(reg_mu_);
      auto it = regs_.find(a);
      if (it == regs_.end()) {
        Note("UnregisterBuffer of " + Hex(a) + ", which is not registered: ignored");
        return;
      }
      slots = it->second.slots;
      for (size_t i = 0; i < slots.size(); ++i) slots_.erase(a + i * kMaxSlotBytes);
      if (!slots.empty()) registered_bytes_.fetch_sub(it->second.bytes, std::memory_order_relaxed);
      regs_.erase(it);
    }
    ClearSlotsInKernel(slots);
    std::lock_guard<std::mutex> l(reg_mu_);
    for (unsigned s : slots) slot_used_[s] = false;
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
    s.checksum_failures = checksum_failures_.load(std::memory_order_relaxed);
    s.registered_bytes = registered_bytes_.load(std::memory_order_relaxed);
    s.fixed_buffers = fixed_buffers_;
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
};

// ---- NvmeTier ---------------------------------------------------------------------------

Result<std::unique_ptr<NvmeTier>> NvmeTier::Open(const NvmeOptions& options) {
  RETURN_IF_ERROR(Impl::ValidateOptions(options));
  std::unique_ptr<NvmeTier> tier(new NvmeTier());
  tier->impl_ = std::make_unique<Impl>();
  RETURN_IF_ERROR(tier->impl_->Open(options));
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
  return impl_->RegisterBuffer(base, bytes);
}
void NvmeTier::UnregisterBuffer(void* base) { impl_->UnregisterBuffer(base); }

const std::vector<std::string>& NvmeTier::files() const { return impl_->paths_; }
Status NvmeTier::CheckFiles() const {
  for (const auto& f : impl_->files_) RETURN_IF_ERROR(impl_->CheckFile(*f));
  return Status::OK();
}
bool NvmeTier::direct_io() const { return impl_->direct_; }
NvmeStats NvmeTier::stats() const { return impl_->Stats(); }

}  // namespace strata
