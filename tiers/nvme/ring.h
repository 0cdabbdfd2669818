// SPDX-License-Identifier: Apache-2.0
// Ring: one io_uring and the I/O thread that owns it. The NVMe tier has
// `rings` of them (aio.intra_op_parallelism).
//
// A ring takes parts of transfers (tiers/nvme/transfer.h) through its inbox,
// cuts each into pieces of at most `block_size` bytes, keeps up to
// `queue_depth` pieces in flight and reads every completion's result
// (liburing examples/io_uring-cp.c):
// - a short transfer re-queues the rest of its piece;
// - -EAGAIN and -EINTR retry the piece, 16 times, backing off from the 5th,
//   then end it with a retryable IoError;
// - anything else ends the part with an IoError naming file, offset and
//   errno; a read that meets the end of the file is DataLoss.
// Once a transfer has failed its remaining pieces are drained (nothing is
// re-queued or retried), keeping the error at the lowest offset. When a
// transfer's last part ends, on whichever ring, the ring hands it to
// RingHost::CompleteTransfer. Every block-level I/O passes IoEnv::PrepareIo
// before it enters the ring and IoEnv::CompleteIo with its result.
//
// io_uring_enter failing for good (EBADF, EFAULT, ...) fails the ring:
// sticky, every piece it holds and every part it is given later ends with
// that error.
//
// Ownership: the tier owns its rings and outlives them; a ring owns its
// io_uring, its eventfd, its thread and its pieces; parts belong to their
// transfer. The destructor stops the thread (after the in-flight I/O ends).
//
// Thread-safety: Enqueue and Stop may be called from any thread; Init and
// Start run on the opener's thread before any Enqueue. Everything else runs
// on the ring's own thread, the only thread that touches the io_uring's SQ
// and CQ, so the ring needs no lock: callers reach it through the inbox
// (under a mutex) and wake it through an eventfd whose read is always armed
// in the ring. ring() is handed to the buffer table, whose
// io_uring_register calls may run beside the thread. The stats are atomics.
#pragma once

#include <liburing.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/thread_annotations.h"
#include "tiers/nvme/io_env.h"

namespace strata::nvme {

class SwapFile;
struct Part;
struct Transfer;

// What a ring needs from the tier. Called on the ring's thread.
class RingHost {
 public:
  virtual ~RingHost() = default;
  virtual const SwapFile& file(uint32_t i) const = 0;
  // Registered-buffer slot holding [buf, buf + len), or -1.
  virtual int FindSlot(const void* buf, uint64_t len) const = 0;
  // A piece at [pos, pos + len) of the transfer is complete. Returns an
  // error (a checksum mismatch) to fail the transfer.
  virtual Status PieceDone(Transfer* t, uint64_t pos, uint64_t len) = 0;
  // Runs on the ring thread that finished the transfer's last part.
  virtual void CompleteTransfer(Transfer* t) = 0;
};

struct RingOptions {
  uint32_t block_size = 1u << 20;  // largest piece (aio.block_size)
  uint32_t queue_depth = 32;       // pieces in flight (aio.queue_depth)
  bool single_submit = false;      // one io_uring_submit per piece (aio.single_submit)
  bool overlap_events = true;      // submit new pieces while reaping (aio.overlap_events)
};

class Ring {
 public:
  // `host` and `env` are not owned and outlive the ring.
  Ring(RingHost* host, IoEnv* env, const RingOptions& options, int index);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // Sets up the ring, its eventfd, registered files (`fds`, plain descriptors
  // when refused) and a sparse table of `buffer_slots` (clears
  // *fixed_buffers when refused). Unavailable when io_uring cannot be set up.
  Status Init(const std::vector<int>& fds, unsigned buffer_slots, bool* fixed_buffers);
  void Start();  // starts the I/O thread
  void Enqueue(Part* p);
  void Stop();   // waits for what the ring holds, then joins the thread

  // Whether the calling thread is an I/O thread of one of `host`'s rings
  // (inside a completion callback, where waiting for I/O would deadlock).
  static bool OnIoThreadOf(const RingHost* host);

  io_uring* ring() { return &ring_; }
  bool fixed_files() const { return fixed_files_; }

  // Stats, written by the ring thread, read by anyone (relaxed: counters).
  std::atomic<uint64_t> ios_submitted{0}, short_requeued{0}, retried{0}, fixed_ios{0};
  std::atomic<uint32_t> max_inflight{0};

 private:
  struct Piece;

  void Wake();
  void Run();
  bool TakeInbox();
  void ArmWake();
  io_uring_sqe* GetSqe();
  Piece* NewPiece();
  Piece* NextPiece();
  unsigned Fill();  // returns how many pieces it issued
  // Fill, and submit what it queued (the completions' handling comes after).
  void Refill();
  void Issue(Piece* p);
  void PrepSqe(io_uring_sqe* sqe, const IoOp& op, int slot);
  void WaitAndReap();
  void Reap();
  void HandleCompletion(Piece* p, int32_t res);
  bool Retry(Piece* p);
  bool Progress(Piece* p, uint32_t res, bool draining, Status* error);
  void SetPartError(Part* part, const Status& s);
  void FinishPiece(Piece* p);
  void MaybeFinishPart(Part* part);
  void Fail(const Status& s);

  RingHost* const host_;
  IoEnv* const env_;
  const RingOptions opt_;
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

}  // namespace strata::nvme
