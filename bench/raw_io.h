// SPDX-License-Identifier: Apache-2.0
// Shared by the benchmarks: page-aligned buffers and the plain io_uring
// O_DIRECT loop that is the physical baseline for NVMe figures.
#pragma once

#include <fcntl.h>
#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "bench/bench.h"

namespace strata::bench {

// Owns its memory; move-less and copy-less (one owner, freed at scope end).
struct AlignedBuffer {
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  explicit AlignedBuffer(uint64_t n) : p(static_cast<char*>(std::aligned_alloc(4096, n))) {
    if (p == nullptr) Die(OutOfMemory(TierKind::kHost, n, 0, "benchmark buffer"), "aligned_alloc");
  }
  ~AlignedBuffer() { std::free(p); }
  char* p;
};

// The baseline: the smallest correct io_uring O_DIRECT loop. Owns its fd
// and ring; used by one thread. One ring, `qd`
// I/Os of `io` bytes in flight, submitted and reaped in batches; every cqe's
// result must be the full length (the benchmark dies otherwise).
class RawLoop {
 public:
  RawLoop(const std::string& path, uint32_t qd, char* buf, uint64_t bytes, bool fixed) {
    // The destructor does not run when the constructor throws (Die): close here.
    fd_ = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    if (fd_ < 0) Die(ErrnoStatus("open O_DIRECT", path), "raw loop");
    int r = io_uring_queue_init(qd, &ring_, 0);
    if (r < 0) {
      ::close(fd_);
      Die(IoError("io_uring_queue_init", -r), "raw loop");
    }
    if (fixed) {
      iovec iov{buf, bytes};
      fixed_ = io_uring_register_buffers(&ring_, &iov, 1) == 0;
    }
  }
  RawLoop(const RawLoop&) = delete;
  RawLoop& operator=(const RawLoop&) = delete;
  ~RawLoop() {
    io_uring_queue_exit(&ring_);
    ::close(fd_);
  }
  bool fixed() const { return fixed_; }

  // Moves [0, total) of the file from/to buf in `io`-byte I/Os; seconds.
  double Run(bool write, char* buf, uint64_t total, uint32_t io, uint32_t qd) {
    return RunOps([write](uint64_t) { return write; }, buf, total, io, qd);
  }
  // Reads and writes at once: the I/Os of the even `tensor`-sized pieces of
  // [0, total) read, those of the odd ones write (the NVMe optimizer's
  // read-ahead beside its write-behind); seconds.
  double RunMixed(char* buf, uint64_t total, uint32_t io, uint32_t qd, uint64_t tensor) {
    return RunOps([tensor](uint64_t off) { return (off / tensor) % 2 == 1; }, buf, total, io, qd);
  }

 private:
  template <typename IsWrite>
  double RunOps(IsWrite is_write, char* buf, uint64_t total, uint32_t io, uint32_t qd) {
    const double t0 = NowSeconds();
    uint64_t next = 0, done = 0;
    uint32_t inflight = 0;
    while (done < total) {
      while (inflight < qd && next < total) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(io, total - next));
        if (is_write(next))
          fixed_ ? io_uring_prep_write_fixed(sqe, fd_, buf + next, len, next, 0)
                 : io_uring_prep_write(sqe, fd_, buf + next, len, next);
        else
          fixed_ ? io_uring_prep_read_fixed(sqe, fd_, buf + next, len, next, 0)
                 : io_uring_prep_read(sqe, fd_, buf + next, len, next);
        io_uring_sqe_set_data64(sqe, next);
        next += len;
        ++inflight;
      }
      int r = io_uring_submit_and_wait(&ring_, 1);
      if (r < 0 && r != -EINTR) Die(IoError("io_uring_submit_and_wait", -r), "raw loop");
      io_uring_cqe* cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        const uint64_t off = cqe->user_data;
        const int64_t want = static_cast<int64_t>(std::min<uint64_t>(io, total - off));
        if (cqe->res != want)
          Die(cqe->res < 0 ? IoError("raw io_uring transfer", -cqe->res, {}, off)
                           : Internal("raw io_uring transfer was short: " +
                                      std::to_string(cqe->res) + " of " + std::to_string(want)),
              "raw loop");
        done += static_cast<uint64_t>(cqe->res);
        --inflight;
        ++seen;
      }
      io_uring_cq_advance(&ring_, seen);
    }
    return NowSeconds() - t0;
  }

  int fd_ = -1;
  io_uring ring_{};
  bool fixed_ = false;
};

}  // namespace strata::bench
