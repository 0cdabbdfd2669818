// SPDX-License-Identifier: Apache-2.0
// What a directory offers as an NVMe path (zero_optimization.*.nvme_path,
// strata-bench --dir): the filesystem, the free space, the block device
// under it and whether O_DIRECT works there — what `strata report` and
// `strata-bench all` print, and what a failed NvmeTier::Open would have
// complained about, found before training.
//
// Thread-safety: free functions.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

struct PathProbe {
  std::string path;
  std::string error;          // why nothing more could be learned ("" when the path is a directory)
  bool writable = false;      // a file could be made in it
  std::string filesystem;     // "ext4", "xfs", "tmpfs", ... or the statfs magic in hex
  uint64_t free_bytes = 0;    // for an unprivileged user (statvfs f_bavail)
  uint64_t total_bytes = 0;
  std::string device;         // the block device under it ("nvme0n1", "vda"); "" when unknown
  int rotational = -1;        // the device's queue/rotational: 1, 0, or -1 unknown
  bool o_direct = false;      // a 4 KiB O_DIRECT write and read-back of a scratch file worked
  std::string o_direct_error; // else why (the open or the transfer, with errno)
};

// Probes `path`; makes (and removes) one scratch file in it to try O_DIRECT.
PathProbe ProbePath(const std::string& path);

// The filesystem `path` is on, as PathProbe::filesystem says it ("?" when statfs fails).
std::string FilesystemName(const std::string& path);

}  // namespace strata
