// SPDX-License-Identifier: Apache-2.0
// Small files written so that a crash never leaves half of one, and the
// checksum that checkpoints record of every file (crc32c with the CPU's
// instruction, tiers/nvme/checksum.h).
//
//   WriteFileAtomic   temp file beside the path, fsync, rename, fsync of the directory
//   WriteFileSynced   the path itself, fsync (inside a directory that is renamed into place later)
//   CopyFileSynced    a copy, fsynced; its crc32c and size on the way
//   SyncDir           fsync of a directory (makes renames in it durable)
//   FileChecksum      crc32c and size of a whole file, read once
//
// Errors name the file and the errno (ErrnoStatus).
//
// Thread-safety: free functions.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace strata {

struct FileSum {
  uint32_t crc32c = 0;
  uint64_t bytes = 0;
};

Status WriteFileAtomic(const std::string& path, const std::string& text);
Result<FileSum> WriteFileSynced(const std::string& path, const std::string& text);
Result<FileSum> CopyFileSynced(const std::string& from, const std::string& to);
Status SyncDir(const std::string& dir);
// NotFound naming the file when it is missing.
Result<FileSum> FileChecksum(const std::string& path);

// "1a2b3c4d": how manifests write a crc32c.
std::string Crc32cHex(uint32_t crc);

}  // namespace strata
