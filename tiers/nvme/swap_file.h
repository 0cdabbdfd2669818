// SPDX-License-Identifier: Apache-2.0
// SwapFile: one scratch file of the NVMe tier, in one directory.
//
// - Create makes a new file "strata-nvme-<pid>-<n>.swap" in the directory
//   (O_EXCL: never someone else's), opened with O_DIRECT, and holds
//   flock(LOCK_EX) on it while it lives, so that a later run tells a live
//   file from one a killed run left (tiers/nvme/leftovers.h). Where the file
//   system refuses O_DIRECT (open returns EINVAL: tmpfs before Linux 6.6) it
//   fails with Unavailable saying so, unless `buffered_fallback` allows a
//   buffered descriptor (noted once); it never falls back silently.
// - Grow extends it to cover [0, end) with fallocate (space reserved), or
//   with ftruncate (sparse) where fallocate is unsupported (noted once).
// - Check says whether the file is still the one at its path (fstat + stat:
//   deleted, moved away, or its name taken by another file).
// - The destructor closes it and removes it, but only while Check passes:
//   a file that now stands at its path is someone else's and stays.
//
// All OS access goes through the IoEnv given to Create (tiers/nvme/io_env.h).
//
// Ownership: a SwapFile owns its descriptor; the IoEnv is not owned and
// outlives it. Held by unique_ptr (rings refer to it by address), so neither
// copied nor moved.
//
// Thread-safety: dir(), path(), fd() and direct() are fixed after Create and
// may be read from any thread (the rings' I/O threads do); Check may run on
// any thread. Grow and size() are not synchronized: the owner serializes them
// (NvmeTier calls them under its extent mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace strata {
class IoEnv;
}

namespace strata::nvme {

class SwapFile {
 public:
  // NotFound for a missing directory, InvalidArgument for a path that is not
  // a directory, IoError (EACCES/EROFS/EPERM) naming a directory that is not
  // writable, Unavailable (EINVAL) when O_DIRECT is refused and
  // `buffered_fallback` is off.
  static Result<std::unique_ptr<SwapFile>> Create(IoEnv* env, const std::string& dir,
                                                  bool buffered_fallback);
  ~SwapFile();  // closes; removes the file if Check passes
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  // Grows the file to cover [0, end) (end > size()). IoError naming the file,
  // the offset it was to grow from and the errno (ENOSPC ...); the size is
  // unchanged then.
  Status Grow(uint64_t end);

  // The file is still the one at its path (NvmeTier::CheckFiles): IoError
  // naming it when it was deleted (ENOENT), moved away, or its path now names
  // another file (EEXIST). Two syscalls, no I/O.
  Status Check() const;

  const std::string& dir() const { return dir_; }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  bool direct() const { return direct_; }  // O_DIRECT (false only with buffered_fallback)
  uint64_t size() const { return size_; }  // bytes reserved (what Grow reached)

 private:
  SwapFile(IoEnv* env, std::string dir) : env_(env), dir_(std::move(dir)) {}
  // Opens a new file in dir_ (a fresh name per attempt while names collide).
  Status OpenNew(bool buffered_fallback);

  IoEnv* const env_;
  const std::string dir_;
  std::string path_;
  int fd_ = -1;
  bool direct_ = true;
  bool truncate_to_grow_ = false;  // fallocate unsupported: grow with ftruncate
  uint64_t size_ = 0;
};

}  // namespace strata::nvme
