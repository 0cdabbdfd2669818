// SPDX-License-Identifier: Apache-2.0
#include "engine/path_probe.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

namespace strata {

namespace {

std::string ErrnoText(const char* what, int err) { return std::string(what) + ": " + std::strerror(err); }

// The last component of the /sys/dev/block/MAJ:MIN link: the device's name.
void FindDevice(dev_t dev, PathProbe* p) {
  if (major(dev) == 0) return;  // an anonymous device (overlayfs, btrfs subvolumes, tmpfs)
  const std::string sys = "/sys/dev/block/" + std::to_string(major(dev)) + ":" + std::to_string(minor(dev));
  char target[4096];
  const ssize_t n = ::readlink(sys.c_str(), target, sizeof target - 1);
  if (n <= 0) return;
  target[n] = '\0';
  std::string t = target;
  p->device = t.substr(t.rfind('/') + 1);
  // A partition's queue/ is its disk's, one level up.
  for (const char* q : {"/queue/rotational", "/../queue/rotational"}) {
    std::ifstream f(sys + q);
    int r;
    if (f >> r) {
      p->rotational = r ? 1 : 0;
      break;
    }
  }
}

// Writes 4 KiB through O_DIRECT into a scratch file and reads it back.
void TryDirectIo(const std::string& dir, PathProbe* p) {
  std::string tmpl = dir + "/.strata-probe.XXXXXX";
  const int made = ::mkstemp(tmpl.data());
  if (made < 0) {
    p->o_direct_error = ErrnoText("cannot create a file in it", errno);
    return;
  }
  p->writable = true;
  ::close(made);
  const int fd = ::open(tmpl.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    p->o_direct_error = ErrnoText("open with O_DIRECT was refused", errno);
    ::unlink(tmpl.c_str());
    return;
  }
  constexpr size_t kBytes = 4096;
  std::unique_ptr<void, decltype(&std::free)> buf(std::aligned_alloc(kBytes, kBytes), &std::free);
  std::memset(buf.get(), 0x5a, kBytes);
  ssize_t w = ::pwrite(fd, buf.get(), kBytes, 0);
  const int werr = errno;
  ssize_t r = w == static_cast<ssize_t>(kBytes) ? ::pread(fd, buf.get(), kBytes, 0) : -1;
  const int rerr = errno;
  ::close(fd);
  ::unlink(tmpl.c_str());
  if (w != static_cast<ssize_t>(kBytes))
    p->o_direct_error = w < 0 ? ErrnoText("an O_DIRECT write failed", werr) : "an O_DIRECT write was short";
  else if (r != static_cast<ssize_t>(kBytes))
    p->o_direct_error = r < 0 ? ErrnoText("an O_DIRECT read failed", rerr) : "an O_DIRECT read was short";
  else
    p->o_direct = true;
}

}  // namespace

std::string FilesystemName(const std::string& path) {
  struct statfs s {};
  if (statfs(path.c_str(), &s) != 0) return "?";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x6969: return "nfs";
    case 0x794c7630: return "overlayfs";
    case 0x2FC12FC1: return "zfs";
    case 0xF2F52010: return "f2fs";
    case 0x65735546: return "fuse";
    case 0x4d44: return "vfat";
    default: {
      std::ostringstream os;
      os << "0x" << std::hex << s.f_type;
      return os.str();
    }
  }
}

PathProbe ProbePath(const std::string& path) {
  PathProbe p;
  p.path = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    p.error = ErrnoText("cannot stat it", errno);
    return p;
  }
  if (!S_ISDIR(st.st_mode)) {
    p.error = "not a directory";
    return p;
  }
  p.filesystem = FilesystemName(path);
  struct statvfs vs {};
  if (statvfs(path.c_str(), &vs) == 0) {
    p.free_bytes = static_cast<uint64_t>(vs.f_bavail) * vs.f_frsize;
    p.total_bytes = static_cast<uint64_t>(vs.f_blocks) * vs.f_frsize;
  }
  FindDevice(st.st_dev, &p);
  TryDirectIo(path, &p);
  return p;
}

}  // namespace strata
