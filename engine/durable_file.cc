// SPDX-License-Identifier: Apache-2.0
#include "engine/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "engine/safetensors.h"  // WriteAll, SyncParentDir
#include "tiers/nvme/checksum.h"

namespace strata {

namespace {

// Writes `text` into a new file at `path` and fsyncs it.
Status WriteAndSync(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", path);
  Status s = WriteAll(fd, text.data(), text.size(), path, 0);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoStatus("fsync failed", path);
  if (::close(fd) != 0 && s.ok()) s = ErrnoStatus("close failed", path);
  return s;
}

}  // namespace

Status WriteFileAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  Status s = WriteAndSync(tmp, text);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoStatus("rename into place failed", path);
  if (!s.ok()) ::unlink(tmp.c_str());
  RETURN_IF_ERROR(s);
  return SyncParentDir(path);
}

Result<FileSum> WriteFileSynced(const std::string& path, const std::string& text) {
  RETURN_IF_ERROR(WriteAndSync(path, text));
  return FileSum{Crc32c(text.data(), text.size()), text.size()};
}

Result<FileSum> CopyFileSynced(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return ErrnoStatus("cannot open", from);
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    Status s = ErrnoStatus("cannot create", to);
    ::close(in);
    return s;
  }
  FileSum sum;
  std::vector<char> buf(1 << 20);
  Status s;
  for (;;) {
    const ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      s = ErrnoStatus("read failed", from, sum.bytes);
      break;
    }
    if (n == 0) break;
    s = WriteAll(out, buf.data(), static_cast<size_t>(n), to, sum.bytes);
    if (!s.ok()) break;
    sum.crc32c = Crc32cExtend(sum.crc32c, buf.data(), static_cast<size_t>(n));
    sum.bytes += static_cast<uint64_t>(n);
  }
  if (s.ok() && ::fsync(out) != 0) s = ErrnoStatus("fsync failed", to);
  if (::close(out) != 0 && s.ok()) s = ErrnoStatus("close failed", to);
  ::close(in);
  RETURN_IF_ERROR(s);
  return sum;
}

Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open directory to fsync", dir);
  Status s = ::fsync(fd) == 0 ? Status::OK() : ErrnoStatus("fsync of directory failed", dir);
  ::close(fd);
  return s;
}

Result<FileSum> FileChecksum(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound(path + " is missing");
    return ErrnoStatus("cannot open", path);
  }
  FileSum sum;
  std::vector<char> buf(1 << 20);
  Status s;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      s = ErrnoStatus("read failed", path, sum.bytes);
      break;
    }
    if (n == 0) break;
    sum.crc32c = Crc32cExtend(sum.crc32c, buf.data(), static_cast<size_t>(n));
    sum.bytes += static_cast<uint64_t>(n);
  }
  ::close(fd);
  RETURN_IF_ERROR(s);
  return sum;
}

std::string Crc32cHex(uint32_t crc) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", crc);
  return b;
}

}  // namespace strata
