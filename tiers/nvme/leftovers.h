// SPDX-License-Identifier: Apache-2.0
// Swap files that a run killed part-way left behind: "strata-nvme-<pid>-<n>.swap"
// in an NVMe directory, whose owner is gone.
//
// A live swap file's owner holds flock(LOCK_EX) on it for the file's whole
// life (swap_file.h), and the kernel drops the lock when the owner dies
// however it dies; so a file whose lock can be taken has no owner. It is a
// leftover only if its PID is gone as well: a file whose lock is free but
// whose PID lives (a strata from before the lock, a PID reused, a run that
// has just created its file and not locked it yet) stays. NvmeTier::Open
// reclaims the leftovers of each directory before it makes its own files,
// and says what it removed (one line each on stderr).
//
// All OS access goes through the IoEnv (tiers/nvme/io_env.h).
//
// Thread-safety: free functions; two processes reclaiming one directory at
// once each remove what they lock (the other's open or unlink then finds
// the file gone, which is no error).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata {
class IoEnv;
}

namespace strata::nvme {

struct LeftoverSwapFile {
  std::string path;
  uint64_t bytes = 0;  // its size (the space removing it frees)
  pid_t pid = 0;       // the run that made it (gone)
};

// The leftovers in `dir`; nothing is removed. IoError naming `dir` when it
// cannot be listed (NotFound when it does not exist).
Result<std::vector<LeftoverSwapFile>> FindLeftoverSwapFiles(IoEnv* env, const std::string& dir);

// Removes the leftovers in `dir` and returns those removed.
Result<std::vector<LeftoverSwapFile>> ReclaimLeftoverSwapFiles(IoEnv* env, const std::string& dir);

// The PID in a swap file's name ("strata-nvme-123-0.swap" -> 123), or 0 for
// a name that is not a swap file's.
pid_t SwapFileOwner(const std::string& name);

}  // namespace strata::nvme
