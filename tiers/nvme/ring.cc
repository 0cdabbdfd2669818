// SPDX-License-Identifier: Apache-2.0
// Ring: submission, completion, short-transfer re-queue and retries of one
// io_uring, on its own thread (tiers/nvme/ring.h).
//
// Contents
//   Piece                   one block-level I/O
//   set-up and thread       Init, Start, Enqueue, Stop, Run, TakeInbox
//   submission              NextPiece, Fill, Refill, Issue, PrepSqe
//   completion              WaitAndReap, Reap, HandleCompletion, Retry, Progress
//   ending                  SetPartError, FinishPiece, MaybeFinishPart, Fail
#include "tiers/nvme/ring.h"

#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "tiers/nvme/common.h"
#include "tiers/nvme/swap_file.h"
#include "tiers/nvme/transfer.h"

namespace strata::nvme {

namespace {

constexpr uint32_t kMaxRetries = 16;  // -EAGAIN/-EINTR retries of one piece
constexpr uint64_t kWakeTag = ~0ull;  // user_data of the eventfd read

// Tells ReadSync/WriteSync that they are running on an I/O thread (inside a
// callback), where waiting for I/O would deadlock.
thread_local const RingHost* tls_io_thread_host = nullptr;

Status EndOfFile(const SwapFile& f, uint64_t at) {
  return DataLoss(
      "NVMe read found the end of the file inside the extent: the swap file is "
      "shorter than what was written to it (truncated by someone else?)",
      f.path(), at);
}

}  // namespace

// One block-level I/O.
struct Ring::Piece {
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

// ---- Set-up and thread -------------------------------------------------------------

Ring::Ring(RingHost* host, IoEnv* env, const RingOptions& options, int index)
    : host_(host), env_(env), opt_(options), index_(index) {}

Ring::~Ring() {
  Stop();
  if (ring_ok_) env_->RingExit(&ring_);
  if (efd_ >= 0) env_->Close(efd_);
}

bool Ring::OnIoThreadOf(const RingHost* host) { return tls_io_thread_host == host; }

Status Ring::Init(const std::vector<int>& fds, unsigned buffer_slots, bool* fixed_buffers) {
  std::memset(&ring_, 0, sizeof ring_);
  int r = env_->RingInit(opt_.queue_depth + 1, &ring_, 0);
  if (r < 0)
    return UnavailableErrno(
        "io_uring is not available: io_uring_queue_init failed (a kernel without io_uring, "
        "io_uring disabled by sysctl kernel.io_uring_disabled, or blocked by seccomp)",
        -r);
  ring_ok_ = true;
  efd_ = env_->EventFd();
  if (efd_ < 0) {
    int err = -efd_;
    efd_ = -1;
    return IoError("cannot create the eventfd of NVMe ring " + std::to_string(index_), err);
  }
  r = env_->RegisterFiles(&ring_, fds.data(), static_cast<unsigned>(fds.size()));
  fixed_files_ = r >= 0;
  if (r < 0 && index_ == 0)
    Note("registering the swap files with io_uring failed (" + std::string(strerror(-r)) +
         "): using plain descriptors");
  r = env_->RegisterBuffersSparse(&ring_, buffer_slots);
  if (r < 0) {
    *fixed_buffers = false;
    if (index_ == 0)
      Note("the kernel refused a sparse registered-buffer table (" + std::string(strerror(-r)) +
           "; needs Linux 5.19+): transfers use unregistered buffers");
  }
  return Status::OK();
}

void Ring::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Ring::Enqueue(Part* p) {
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

void Ring::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  Wake();
  thread_.join();
}

void Ring::Wake() {
  // Not through IoEnv: waking the thread is not I/O of the tier.
  if (efd_ >= 0) (void)eventfd_write(efd_, 1);
  cv_.notify_one();  // only a failed ring waits on the condition variable
}

void Ring::Run() {
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
bool Ring::TakeInbox() {
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

void Ring::ArmWake() {
  io_uring_sqe* sqe = GetSqe();
  if (sqe == nullptr) return;
  io_uring_prep_read(sqe, efd_, &wake_value_, sizeof wake_value_, 0);
  io_uring_sqe_set_data64(sqe, kWakeTag);
}

// ---- Submission ----------------------------------------------------------------------

io_uring_sqe* Ring::GetSqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) {  // SQ full (cannot happen with entries > depth, but be safe)
    int r = env_->Submit(&ring_);
    if (r < 0 && r != -EAGAIN && r != -EBUSY && r != -EINTR)
      Fail(IoError("io_uring_submit failed on NVMe ring " + std::to_string(index_), -r));
    sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr && failed_.ok())
      Fail(Internal("NVMe ring " + std::to_string(index_) + ": submission queue stays full"));
  }
  return sqe;
}

Ring::Piece* Ring::NewPiece() {
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
Ring::Piece* Ring::NextPiece() {
  while (!retry_.empty()) {
    Piece* p = retry_.front();
    retry_.pop_front();
    if (p->part->error.ok() && !p->part->t->failed.load(std::memory_order_relaxed)) return p;
    FinishPiece(p);  // its transfer failed meanwhile: drop it
  }
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
    p->len = static_cast<uint32_t>(std::min<uint64_t>(opt_.block_size, part->bytes - part->next));
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

unsigned Ring::Fill() {
  // Without overlap_events a batch is submitted and fully reaped before the
  // next (DeepSpeed aio semantics).
  if (!opt_.overlap_events && inflight_ > 0) return 0;
  unsigned issued = 0;
  while (failed_.ok() && inflight_ < opt_.queue_depth) {
    Piece* p = NextPiece();
    if (p == nullptr) break;
    Issue(p);
    ++issued;
  }
  return issued;
}

void Ring::Refill() {
  if (Fill() == 0 || opt_.single_submit || !failed_.ok()) return;
  int s = env_->Submit(&ring_);
  // Transient refusals leave the SQEs in the ring; the next submit takes them.
  if (s < 0 && s != -EAGAIN && s != -EBUSY && s != -EINTR)
    Fail(IoError("io_uring_submit failed on NVMe ring " + std::to_string(index_), -s));
}

void Ring::Issue(Piece* p) {
  Part* part = p->part;
  const SwapFile& f = host_->file(part->file);
  IoOp& op = p->op;
  op = IoOp();
  op.write = part->t->write;
  op.file = part->file;
  op.fd = f.fd();
  op.path = f.path();
  op.offset = part->file_offset + p->pos + p->done;
  op.buf = part->buf + p->pos + p->done;
  op.len = p->len - p->done;
  op.attempt = p->attempts++;
  const int slot = host_->FindSlot(op.buf, op.len);
  op.fixed_buffer = slot >= 0;
  const uint32_t want = op.len;
  int r = env_->PrepareIo(op);
  if (r < 0) {  // the environment failed the I/O without submitting it
    HandleCompletion(p, r);
    return;
  }
  if (op.len == 0 || op.len > want || (f.direct() && op.len % kAlign != 0)) {
    SetPartError(part, Internal("IoEnv::PrepareIo left an invalid length " +
                                std::to_string(op.len) + " (wanted at most " +
                                std::to_string(want) + ")"));
    FinishPiece(p);
    return;
  }
  io_uring_sqe* sqe = GetSqe();
  if (sqe == nullptr) {
    SetPartError(part, failed_);
    FinishPiece(p);
    return;
  }
  PrepSqe(sqe, op, slot);
  io_uring_sqe_set_data(sqe, p);
  p->inflight = true;
  ++inflight_;
  ios_submitted.fetch_add(1, std::memory_order_relaxed);
  if (op.fixed_buffer) fixed_ios.fetch_add(1, std::memory_order_relaxed);
  if (inflight_ > max_inflight.load(std::memory_order_relaxed))
    max_inflight.store(inflight_, std::memory_order_relaxed);
  if (opt_.single_submit) {
    int s = env_->Submit(&ring_);
    // Transient refusals leave the SQE in the ring; the next submit takes it.
    if (s < 0 && s != -EAGAIN && s != -EBUSY && s != -EINTR)
      Fail(IoError("io_uring_submit failed on NVMe ring " + std::to_string(index_), -s));
  }
}

// The read or write of `op`, on the registered file and buffer where there are.
void Ring::PrepSqe(io_uring_sqe* sqe, const IoOp& op, int slot) {
  const int fd = fixed_files_ ? static_cast<int>(op.file) : op.fd;
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
}

// ---- Completion -------------------------------------------------------------------------

void Ring::WaitAndReap() {
  int r = env_->SubmitAndWait(&ring_, 1);
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

void Ring::Reap() {
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
    unsigned pieces = 0;
    for (unsigned i = 0; i < n; ++i) {
      if (done[i].tag == kWakeTag) {
        rearm = true;
      } else {
        reinterpret_cast<Piece*>(done[i].tag)->inflight = false;
        --inflight_;
        ++pieces;
      }
    }
    // The queue is topped up before the completions are handled: handling
    // verifies or records their blocks' checksums on this thread, and the
    // device keeps `queue_depth` pieces meanwhile instead of draining.
    if (pieces) Refill();
    for (unsigned i = 0; i < n; ++i)
      if (done[i].tag != kWakeTag) HandleCompletion(reinterpret_cast<Piece*>(done[i].tag), done[i].res);
  }
  if (rearm && failed_.ok()) ArmWake();
}

// Acts on one block-level result: done, re-queue the rest (short), retry
// (-EAGAIN/-EINTR, bounded), or an error naming file, offset and errno.
void Ring::HandleCompletion(Piece* p, int32_t res) {
  Part* part = p->part;
  const IoOp& op = p->op;
  res = env_->CompleteIo(op, res);
  // Once the transfer has failed its remaining pieces are drained: nothing
  // is re-queued or retried, but an error at a lower offset still replaces
  // the one to report.
  const bool draining = !part->error.ok() || part->t->failed.load(std::memory_order_relaxed);
  const SwapFile& f = host_->file(part->file);
  const char* what = op.write ? "NVMe write" : "NVMe read";
  Status error;
  if (res < 0) {
    const int err = -res;
    const bool transient = err == EAGAIN || err == EINTR;
    if (transient && draining) {  // the transfer failed already: drop the piece
      FinishPiece(p);
      return;
    }
    if (transient && Retry(p)) return;
    error = IoError(
        std::string(what) + " of " + std::to_string(op.len) + " bytes failed" +
            (p->retries ? " after " + std::to_string(p->retries) + " retries" : std::string()),
        err, f.path(), op.offset);
  } else if (res == 0) {
    error = op.write
                ? IoError("NVMe write made no progress (0 bytes written)", EIO, f.path(), op.offset)
                : EndOfFile(f, op.offset);
  } else if (static_cast<uint32_t>(res) > op.len) {
    error = Internal(std::string(what) + " returned " + std::to_string(res) +
                     " bytes for a request of " + std::to_string(op.len));
  } else if (Progress(p, static_cast<uint32_t>(res), draining, &error)) {
    return;
  }
  if (!error.ok()) SetPartError(part, error);
  FinishPiece(p);
}

// A transient error (-EAGAIN/-EINTR): queues the piece again and returns
// true, or false when it has used its retries.
bool Ring::Retry(Piece* p) {
  if (p->retries >= kMaxRetries) return false;
  ++p->retries;
  retried.fetch_add(1, std::memory_order_relaxed);
  // From the 5th retry of a piece on, back off (0.25 ms doubling to 8 ms,
  // about 64 ms over all retries): the kernel or device is short of
  // something, and a brief stall of this ring beats spinning on it.
  if (p->retries > 4)
    std::this_thread::sleep_for(std::chrono::microseconds(250u << std::min(p->retries - 5, 5u)));
  retry_.push_back(p);
  return true;
}

// `res` bytes of the piece moved. Returns true when the rest was re-queued
// (a short transfer); sets *error when the piece cannot go on, or when its
// checksum blocks do not match.
bool Ring::Progress(Piece* p, uint32_t res, bool draining, Status* error) {
  Part* part = p->part;
  const IoOp& op = p->op;
  const SwapFile& f = host_->file(part->file);
  p->done += res;
  if (p->done == p->len && !draining)
    *error = host_->PieceDone(
        part->t, part->file_offset - part->t->extent.offset - part->t->offset + p->pos, p->len);
  if (p->done == p->len) return false;
  const uint64_t at = op.offset + res;
  if (f.direct() && at % kAlign != 0) {
    // Direct I/O cannot go on from an unaligned offset. For a read this only
    // happens where a file that was cut short now ends.
    *error = op.write
                 ? IoError("NVMe write stopped at an unaligned offset; direct I/O cannot continue",
                           EIO, f.path(), at)
                 : EndOfFile(f, at);
    return false;
  }
  if (draining) return false;
  short_requeued.fetch_add(1, std::memory_order_relaxed);
  retry_.push_back(p);
  return true;
}

// ---- Ending -----------------------------------------------------------------------------

void Ring::SetPartError(Part* part, const Status& s) {
  if (ErrorBefore(s, part->error)) part->error = s;
  part->t->failed.store(true, std::memory_order_relaxed);
  part->next = part->bytes;  // cut no more pieces
}

void Ring::FinishPiece(Piece* p) {
  Part* part = p->part;
  p->live = false;
  free_.push_back(p);
  --part->active;
  MaybeFinishPart(part);
}

void Ring::MaybeFinishPart(Part* part) {
  if (part->active != 0 || part->queued) return;
  Transfer* t = part->t;
  if (t->parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) host_->CompleteTransfer(t);
}

// The ring is unusable (io_uring_enter failed for good): fail every piece it
// holds and every part that comes later. In-flight pieces are given up: a
// ring whose io_uring_enter fails with EBADF/EFAULT/... no longer runs I/O.
void Ring::Fail(const Status& s) {
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

}  // namespace strata::nvme
