// SPDX-License-Identifier: Apache-2.0
// SwapFile: creating, growing, checking and removing one swap file
// (tiers/nvme/swap_file.h).
#include "tiers/nvme/swap_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "tiers/nvme/common.h"
#include "tiers/nvme/io_env.h"

namespace strata::nvme {

Result<std::unique_ptr<SwapFile>> SwapFile::Create(IoEnv* env, const std::string& dir,
                                                   bool buffered_fallback) {
  struct stat st {};
  int r = env->Stat(dir, &st);
  if (r == -ENOENT) return NotFound("NVMe directory '" + dir + "' does not exist");
  if (r < 0) return IoError("cannot stat NVMe directory '" + dir + "'", -r, dir);
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("NVMe path '" + dir + "' is not a directory");
  std::unique_ptr<SwapFile> f(new SwapFile(env, dir));
  RETURN_IF_ERROR(f->OpenNew(buffered_fallback));
  return f;
}

Status SwapFile::OpenNew(bool buffered_fallback) {
  static std::atomic<uint64_t> seq{0};  // names are unique within the process
  const int base_flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  for (int attempt = 0;; ++attempt) {
    std::string path = dir_ + "/strata-nvme-" + std::to_string(getpid()) + "-" +
                       std::to_string(seq.fetch_add(1)) + ".swap";
    int fd = env_->Open(path, base_flags | O_DIRECT, 0600);
    if (fd == -EINVAL) {
      // The file system refused O_DIRECT. Some create the file first.
      (void)env_->Unlink(path);
      if (!buffered_fallback)
        return UnavailableErrno(
            "O_DIRECT was refused on NVMe directory '" + dir_ +
                "' (open returned EINVAL: its file system does not support direct I/O, e.g. "
                "tmpfs). Put the NVMe tier on a disk-backed directory, or set "
                "buffered_fallback to allow buffered I/O (through the page cache) there",
            EINVAL, dir_);
      fd = env_->Open(path, base_flags, 0600);
      if (fd >= 0) {
        direct_ = false;
        Note("O_DIRECT was refused on " + dir_ + ": using buffered I/O there (buffered_fallback)");
      }
    }
    if (fd == -EEXIST && attempt < 100) continue;
    if (fd == -EACCES || fd == -EROFS || fd == -EPERM)
      return IoError(
          "NVMe directory '" + dir_ + "' is not writable: cannot create a swap file in it", -fd,
          dir_);
    if (fd < 0) return IoError("cannot create NVMe swap file", -fd, path);
    // Held for the file's life: a later run sees the file is in use
    // (tiers/nvme/leftovers.h). Where locks are unsupported, only the PID tells.
    if (const int lr = env_->Flock(fd, LOCK_EX | LOCK_NB); lr < 0)
      Note("cannot lock " + path + " (" + strerror(-lr) + "): a later run tells it is in use by its PID only");
    fd_ = fd;
    path_ = std::move(path);
    return Status::OK();
  }
}

SwapFile::~SwapFile() {
  if (fd_ < 0) return;
  // Only our own file goes: if the path now names another file (ours was
  // deleted or moved and something took its name), it stays.
  const bool ours = !path_.empty() && Check().ok();
  env_->Close(fd_);
  if (ours) {
    int r = env_->Unlink(path_);
    if (r < 0 && r != -ENOENT) Note("cannot remove swap file " + path_ + ": " + strerror(-r));
  }
}

Status SwapFile::Grow(uint64_t end) {
  const uint64_t from = size_;
  int r = truncate_to_grow_ ? env_->Ftruncate(fd_, end) : env_->Fallocate(fd_, 0, from, end - from);
  if (r == -EOPNOTSUPP && !truncate_to_grow_) {
    truncate_to_grow_ = true;
    Note("fallocate is not supported in " + dir_ + ": growing " + path_ +
         " with ftruncate (sparse; space is not reserved)");
    r = env_->Ftruncate(fd_, end);
  }
  if (r < 0)
    return IoError("cannot grow NVMe swap file to " + std::to_string(end) + " bytes (" +
                       (truncate_to_grow_ ? "ftruncate" : "fallocate") + ")",
                   -r, path_, from);
  size_ = end;
  return Status::OK();
}

Status SwapFile::Check() const {
  struct stat mine{}, named{};
  int r = env_->Fstat(fd_, &mine);
  if (r < 0) return IoError("cannot fstat NVMe swap file", -r, path_);
  if (mine.st_nlink == 0)
    return IoError(
        "NVMe swap file was deleted while in use (the tier still holds it open, so nothing is "
        "lost yet; its data goes when the process ends)",
        ENOENT, path_);
  r = env_->Stat(path_, &named);
  if (r < 0)
    return IoError("NVMe swap file is no longer at its path (moved or deleted while in use)", -r,
                   path_);
  if (named.st_dev != mine.st_dev || named.st_ino != mine.st_ino)
    return IoError(
        "NVMe swap file's path now names another file (ours was moved or deleted while in use)",
        EEXIST, path_);
  return Status::OK();
}

}  // namespace strata::nvme
