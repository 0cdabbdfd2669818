// SPDX-License-Identifier: Apache-2.0
#include "engine/save_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <ostream>

#include "base/bytes.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

// A directory this process may create files in: IoError naming it otherwise.
Status CheckWritable(const std::string& dir, const std::string& what) {
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
    return IoError(what + " is on a read-only file system", EROFS, dir);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return ErrnoStatus(what + " is not writable", dir);
  return Status::OK();
}

}  // namespace

Status CheckSaveDir(const std::string& path, uint64_t checkpoint_bytes, std::vector<std::string>* warnings) {
  if (path.empty()) return Status::OK();
  // The path itself, or the nearest of its parents that exists.
  fs::path p = fs::absolute(fs::path(path));
  std::string missing;
  for (;;) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode))
        return InvalidArgument("--save " + path + ": " + p.string() + " is " +
                               (p == fs::absolute(fs::path(path)) ? "a file, not a directory"
                                                                  : "a file, so the directory cannot be made"));
      break;
    }
    if (errno != ENOENT && errno != ENOTDIR) return ErrnoStatus("--save " + path + ": cannot look at", p.string());
    missing = p.string();
    if (!p.has_parent_path() || p.parent_path() == p) return NotFound("--save " + path + ": no parent exists");
    p = p.parent_path();
  }
  RETURN_IF_ERROR(CheckWritable(
      p.string(), missing.empty() ? "--save " + path : "--save " + path + " would be created in " + p.string() + ", which"));
  struct statvfs vfs {};
  if (checkpoint_bytes && ::statvfs(p.c_str(), &vfs) == 0) {
    const uint64_t free = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (free < checkpoint_bytes && warnings)
      warnings->push_back("--save " + path + ": " + FormatBytes(free) + " free there, and one checkpoint takes " +
                          FormatBytes(checkpoint_bytes) + " (the first save will fail unless space is freed)");
  }
  return Status::OK();
}

namespace {

// The PID a leftover's name ends with ("….tmp.123" -> 123), or 0.
pid_t TrailingPid(const std::string& name, const std::string& marker) {
  const size_t at = name.rfind(marker);
  if (at == std::string::npos) return 0;
  const std::string digits = name.substr(at + marker.size());
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) return 0;
  return static_cast<pid_t>(std::strtol(digits.c_str(), nullptr, 10));
}

bool Gone(pid_t pid) { return pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH; }

// What killed runs left in `dir` (the lock held, so no live run of this
// version writes there).
void ReclaimLeftovers(const std::string& dir, std::ostream* log) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::string path = e.path().string();
    if (name.rfind(".step-", 0) == 0) {
      if (pid_t pid = TrailingPid(name, ".tmp."); Gone(pid)) {
        fs::remove_all(e.path(), ec);
        if (!ec && log) *log << "removed " << path << ", a checkpoint left unfinished by process " << pid << "\n";
      } else if (pid_t old = TrailingPid(name, ".old."); Gone(old)) {
        // ".step-000040.old.PID": step-000040 moved aside while a new one replaced it.
        const std::string step = dir + "/" + name.substr(1, name.rfind(".old.") - 1);
        if (!fs::exists(step, ec)) {
          if (::rename(path.c_str(), step.c_str()) == 0 && log)
            *log << "restored " << step << " from " << path << ", which process " << old
                 << " had moved aside to replace it and did not\n";
        } else {
          fs::remove_all(e.path(), ec);
          if (!ec && log) *log << "removed " << path << ", a replaced checkpoint left by process " << old << "\n";
        }
      }
    } else if (pid_t pid = TrailingPid(name, "latest.tmp."); name.rfind("latest.tmp.", 0) == 0 && Gone(pid)) {
      fs::remove(e.path(), ec);
      if (!ec && log) *log << "removed " << path << ", left by process " << pid << "\n";
    }
  }
}

}  // namespace

Result<SaveDirLock> SaveDirLock::Acquire(const std::string& path, std::ostream* log) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return IoError("cannot create the --save directory", ec.value(), path);
  const std::string lock = path + "/.lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create the --save directory's lock", lock);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK) return IoError("cannot lock the --save directory", err, lock);
    const std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    const long pid = std::strtol(holder.c_str(), nullptr, 10);
    return FailedPrecondition("--save " + path + " is in use by another run (process " +
                              (pid > 0 ? std::to_string(pid) : std::string("unknown")) + ", holding " + lock +
                              "): two runs saving into one directory would interleave their steps; give this "
                              "one another --save directory, or wait for that run to end");
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    Status s = ErrnoStatus("cannot write this run's PID into", lock);
    ::close(fd);
    return s;
  }
  ReclaimLeftovers(path, log);
  return SaveDirLock(path, fd);
}

SaveDirLock::~SaveDirLock() {
  if (fd_ >= 0) ::close(fd_);  // the lock goes with the descriptor
}

}  // namespace strata
