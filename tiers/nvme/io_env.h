// SPDX-License-Identifier: Apache-2.0
// IoEnv: the only way the NVMe tier touches the operating system.
//
// Every system call and io_uring operation of the NVMe tier (tiers/nvme/)
// goes through an IoEnv: opening (with O_DIRECT), growing, syncing, locking and removing the swap
// files, finding those a dead run left (listing a directory, probing a PID), setting up rings and registering files and buffers, submitting and
// waiting, and two per-I/O hooks around each block-level transfer. IoEnv::
// Default() is the real OS. Tests derive from IoEnvWrapper, which forwards
// every call to another IoEnv, and override one method to inject a fault
// (leveldb's Env / EnvWrapper): EIO or ENOSPC from a completion, a short
// transfer, -EAGAIN, O_DIRECT refused with EINVAL, ENOSPC from fallocate.
// The tests of every layer use one such wrapper, configured by rules:
// FaultIoEnv (tests/fault_io_env.h).
//
// Conventions, kernel style: calls return >= 0 on success and -errno on
// failure (never set errno for the caller to read). The NVMe tier converts
// each result into a Status right at its call (swap_file.cc, ring.cc,
// buffer_table.cc), naming the file and offset.
//
// Ownership: Default() is never deleted; an IoEnvWrapper does not own its
// target, and whoever passes an IoEnv to the tier keeps it alive longer.
//
// Thread-safety: Default() is safe from any thread. The NVMe tier calls the
// file methods from the thread calling Open/Allocate, the ring methods from
// each ring's I/O thread (one thread per ring) and the buffer-table methods
// from the thread calling RegisterBuffer. A wrapper whose hooks keep state
// must protect it (the per-I/O hooks of different rings run concurrently).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

struct io_uring;
struct io_uring_cqe;
struct iovec;
struct stat;

namespace strata {

// One block-level I/O of the NVMe tier: a piece of at most `block_size` bytes
// of a caller's transfer. PrepareIo sees it before it goes into the ring;
// CompleteIo sees it (as submitted) with the completion's result.
struct IoOp {
  bool write = false;
  uint32_t file = 0;      // index into NvmeTier::files()
  int fd = -1;            // that file's descriptor
  std::string_view path;  // that file's path
  uint64_t offset = 0;    // absolute byte offset in the file
  void* buf = nullptr;
  uint32_t len = 0;           // bytes to transfer
  uint32_t attempt = 0;       // 0 the first time; +1 per re-queue (short transfer) or retry
  bool fixed_buffer = false;  // uses a registered buffer (IORING_OP_*_FIXED)
};

class IoEnv {
 public:
  virtual ~IoEnv() = default;

  // The real operating system. Never deleted.
  static IoEnv* Default();

  // ---- Files ------------------------------------------------------------------
  // open(2): the descriptor, or -errno. EINVAL with O_DIRECT in `flags` means
  // the file system refused direct I/O.
  virtual int Open(const std::string& path, int flags, mode_t mode) = 0;
  virtual int Close(int fd) = 0;
  // fallocate(2) / ftruncate(2) / fsync(2) / unlink(2) / stat(2) / fstat(2): 0 or -errno.
  virtual int Fallocate(int fd, int mode, uint64_t offset, uint64_t len) = 0;
  virtual int Ftruncate(int fd, uint64_t len) = 0;
  virtual int Fsync(int fd) = 0;
  virtual int Unlink(const std::string& path) = 0;
  virtual int Stat(const std::string& path, struct stat* st) = 0;
  virtual int Fstat(int fd, struct stat* st) = 0;
  // eventfd(2) (blocking, close-on-exec): the descriptor or -errno. Each
  // ring's I/O thread waits on one so that new work can wake it.
  virtual int EventFd() = 0;
  // flock(2) (LOCK_EX | LOCK_NB, ...): 0 or -errno (-EWOULDBLOCK: held by
  // another open file description). A swap file's owner holds LOCK_EX on it.
  virtual int Flock(int fd, int op) = 0;
  // The names in directory `dir` ("." and ".." left out) into *names: 0 or -errno.
  virtual int ListDir(const std::string& dir, std::vector<std::string>* names) = 0;
  // kill(pid, 0): 0 when process `pid` exists, -ESRCH when it does not
  // (-EPERM: it exists, another user's).
  virtual int ProbeProcess(pid_t pid) = 0;

  // ---- io_uring (liburing) --------------------------------------------------------
  virtual int RingInit(unsigned entries, io_uring* ring, unsigned flags) = 0;
  virtual void RingExit(io_uring* ring) = 0;
  virtual int RegisterFiles(io_uring* ring, const int* fds, unsigned n) = 0;
  // A sparse table of `n` empty buffer slots (kernel 5.19+).
  virtual int RegisterBuffersSparse(io_uring* ring, unsigned n) = 0;
  // Sets slots [slot, slot + n) to `iovs` ({nullptr, 0} empties a slot).
  // Returns the number of slots updated or -errno.
  virtual int UpdateBuffers(io_uring* ring, unsigned slot, const iovec* iovs, unsigned n) = 0;
  // io_uring_submit_and_wait: submits what is in the SQ and waits for at least
  // `wait_nr` completions. The number submitted, or -errno.
  virtual int SubmitAndWait(io_uring* ring, unsigned wait_nr) = 0;
  // io_uring_submit. The number submitted, or -errno.
  virtual int Submit(io_uring* ring) = 0;

  // ---- Per I/O -------------------------------------------------------------------------
  // Called for every block-level I/O just before it goes into the ring. May
  // shorten `op.len` (to a non-zero multiple of 4096 for direct I/O) to make
  // the transfer short; returning -errno completes the I/O with that result
  // without submitting it. The default returns 0.
  virtual int PrepareIo(IoOp& op) = 0;
  // Called with each block-level I/O's `cqe->res`; returns the result the
  // tier acts on. The default returns `res`.
  virtual int32_t CompleteIo(const IoOp& op, int32_t res) = 0;
};

// Forwards every call to `target` (not owned). Derive and override one method
// to inject a fault.
class IoEnvWrapper : public IoEnv {
 public:
  explicit IoEnvWrapper(IoEnv* target = IoEnv::Default()) : target_(target) {}
  IoEnv* target() const { return target_; }

  int Open(const std::string& path, int flags, mode_t mode) override {
    return target_->Open(path, flags, mode);
  }
  int Close(int fd) override { return target_->Close(fd); }
  int Fallocate(int fd, int mode, uint64_t offset, uint64_t len) override {
    return target_->Fallocate(fd, mode, offset, len);
  }
  int Ftruncate(int fd, uint64_t len) override { return target_->Ftruncate(fd, len); }
  int Fsync(int fd) override { return target_->Fsync(fd); }
  int Unlink(const std::string& path) override { return target_->Unlink(path); }
  int Stat(const std::string& path, struct stat* st) override { return target_->Stat(path, st); }
  int Fstat(int fd, struct stat* st) override { return target_->Fstat(fd, st); }
  int EventFd() override { return target_->EventFd(); }
  int Flock(int fd, int op) override { return target_->Flock(fd, op); }
  int ListDir(const std::string& dir, std::vector<std::string>* names) override {
    return target_->ListDir(dir, names);
  }
  int ProbeProcess(pid_t pid) override { return target_->ProbeProcess(pid); }
  int RingInit(unsigned entries, io_uring* ring, unsigned flags) override {
    return target_->RingInit(entries, ring, flags);
  }
  void RingExit(io_uring* ring) override { target_->RingExit(ring); }
  int RegisterFiles(io_uring* ring, const int* fds, unsigned n) override {
    return target_->RegisterFiles(ring, fds, n);
  }
  int RegisterBuffersSparse(io_uring* ring, unsigned n) override {
    return target_->RegisterBuffersSparse(ring, n);
  }
  int UpdateBuffers(io_uring* ring, unsigned slot, const iovec* iovs, unsigned n) override {
    return target_->UpdateBuffers(ring, slot, iovs, n);
  }
  int SubmitAndWait(io_uring* ring, unsigned wait_nr) override {
    return target_->SubmitAndWait(ring, wait_nr);
  }
  int Submit(io_uring* ring) override { return target_->Submit(ring); }
  int PrepareIo(IoOp& op) override { return target_->PrepareIo(op); }
  int32_t CompleteIo(const IoOp& op, int32_t res) override { return target_->CompleteIo(op, res); }

 private:
  IoEnv* target_;
};

}  // namespace strata
