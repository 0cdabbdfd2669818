// SPDX-License-Identifier: Apache-2.0
// The real IoEnv: thin wrappers over the system calls and liburing, each
// returning -errno on failure. Stateless, so safe from any thread; the one
// instance lives until the process exits.
#include "tiers/nvme/io_env.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace strata {

namespace {

// open/close/... return -1 and set errno; io_uring calls return -errno.
inline int Sys(int r) { return r < 0 ? -errno : r; }

class PosixIoEnv final : public IoEnv {
 public:
  int Open(const std::string& path, int flags, mode_t mode) override {
    int fd;
    do {
      fd = ::open(path.c_str(), flags, mode);
    } while (fd < 0 && errno == EINTR);
    return Sys(fd);
  }
  int Close(int fd) override { return Sys(::close(fd)); }
  int Fallocate(int fd, int mode, uint64_t offset, uint64_t len) override {
    int r;
    do {
      r = ::fallocate(fd, mode, static_cast<off_t>(offset), static_cast<off_t>(len));
    } while (r < 0 && errno == EINTR);
    return Sys(r);
  }
  int Ftruncate(int fd, uint64_t len) override {
    int r;
    do {
      r = ::ftruncate(fd, static_cast<off_t>(len));
    } while (r < 0 && errno == EINTR);
    return Sys(r);
  }
  int Fsync(int fd) override { return Sys(::fsync(fd)); }
  int Unlink(const std::string& path) override { return Sys(::unlink(path.c_str())); }
  int Stat(const std::string& path, struct stat* st) override {
    return Sys(::stat(path.c_str(), st));
  }
  int Fstat(int fd, struct stat* st) override { return Sys(::fstat(fd, st)); }
  int EventFd() override { return Sys(::eventfd(0, EFD_CLOEXEC)); }
  int Flock(int fd, int op) override {
    int r;
    do {
      r = ::flock(fd, op);
    } while (r < 0 && errno == EINTR);
    return Sys(r);
  }
  int ListDir(const std::string& dir, std::vector<std::string>* names) override {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return -errno;
    names->clear();
    errno = 0;
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names->push_back(n);
    }
    const int err = errno;
    ::closedir(d);
    return err ? -err : 0;
  }
  int ProbeProcess(pid_t pid) override { return Sys(::kill(pid, 0)); }

  int RingInit(unsigned entries, io_uring* ring, unsigned flags) override {
    return io_uring_queue_init(entries, ring, flags);
  }
  void RingExit(io_uring* ring) override { io_uring_queue_exit(ring); }
  int RegisterFiles(io_uring* ring, const int* fds, unsigned n) override {
    return io_uring_register_files(ring, fds, n);
  }
  int RegisterBuffersSparse(io_uring* ring, unsigned n) override {
    return io_uring_register_buffers_sparse(ring, n);
  }
  int UpdateBuffers(io_uring* ring, unsigned slot, const iovec* iovs, unsigned n) override {
    return io_uring_register_buffers_update_tag(ring, slot, iovs, nullptr, n);
  }
  int SubmitAndWait(io_uring* ring, unsigned wait_nr) override {
    return io_uring_submit_and_wait(ring, wait_nr);
  }
  int Submit(io_uring* ring) override { return io_uring_submit(ring); }
  int PrepareIo(IoOp&) override { return 0; }
  int32_t CompleteIo(const IoOp&, int32_t res) override { return res; }
};

}  // namespace

IoEnv* IoEnv::Default() {
  static PosixIoEnv* env = new PosixIoEnv;  // never deleted: used until process exit
  return env;
}

}  // namespace strata
