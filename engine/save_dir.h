// SPDX-License-Identifier: Apache-2.0
// The --save directory of a run (engine/checkpoint.h writes into it):
// checked before the first step, held for the run, cleared of what killed
// runs left.
//
// - CheckSaveDir, before anything is allocated and in --dry-run (it changes
//   nothing): the directory exists and this process may write in it, or it
//   does not exist and would be created in a place it may write. A path
//   that is a file (or has a file among its parents) is InvalidArgument; a
//   place not writable (EACCES, a read-only file system: EROFS) is IoError
//   naming it. Free space below one checkpoint's size is a warning.
// - SaveDirLock::Acquire creates the directory and takes flock(LOCK_EX) on
//   DIR/.lock for the life of the lock, with this process's PID written in
//   the file; a second run saving into the same directory fails at once
//   (FailedPrecondition) naming the holder's PID. With the lock held it
//   reclaims what killed runs left, each named on `log`: ".step-N.tmp.PID"
//   (a save cut short: removed), ".step-N.old.PID" (a step being replaced,
//   moved aside: put back when its step directory is missing, else removed)
//   and "latest.tmp.PID", of a PID that is not this process's and is gone.
//
// Ownership: a SaveDirLock owns its descriptor (the lock goes with it);
// move-only. The lock file stays (removing it would race with the next
// holder's open).
//
// Thread-safety: free functions; a SaveDirLock is used by one thread.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata {

// `checkpoint_bytes`: what one checkpoint takes (0: no free-space check);
// warnings are appended to `warnings`.
Status CheckSaveDir(const std::string& path, uint64_t checkpoint_bytes, std::vector<std::string>* warnings);

class SaveDirLock {
 public:
  static Result<SaveDirLock> Acquire(const std::string& path, std::ostream* log);
  SaveDirLock(SaveDirLock&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }
  SaveDirLock& operator=(SaveDirLock&&) = delete;
  SaveDirLock(const SaveDirLock&) = delete;
  ~SaveDirLock();
  const std::string& path() const { return path_; }

 private:
  SaveDirLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

}  // namespace strata
