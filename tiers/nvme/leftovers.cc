// SPDX-License-Identifier: Apache-2.0
#include "tiers/nvme/leftovers.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "tiers/nvme/io_env.h"

namespace strata::nvme {

pid_t SwapFileOwner(const std::string& name) {
  static const std::string kPrefix = "strata-nvme-", kSuffix = ".swap";
  if (name.size() <= kPrefix.size() + kSuffix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0 ||
      name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return 0;
  const std::string mid = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  const size_t dash = mid.find('-');
  if (dash == 0 || dash == std::string::npos || mid.find_first_not_of("0123456789-") != std::string::npos) return 0;
  const long pid = std::strtol(mid.substr(0, dash).c_str(), nullptr, 10);
  return pid > 0 && pid < (1L << 30) ? static_cast<pid_t>(pid) : 0;
}

namespace {

// Each leftover in `dir`, locked while `act` sees it (so no run can take it
// over meanwhile); `act` returns whether it goes in the list.
template <class Act>
Result<std::vector<LeftoverSwapFile>> ForEachLeftover(IoEnv* env, const std::string& dir, Act act) {
  std::vector<std::string> names;
  const int r = env->ListDir(dir, &names);
  if (r == -ENOENT) return NotFound("NVMe directory '" + dir + "' does not exist");
  if (r < 0) return IoError("cannot list NVMe directory", -r, dir);
  std::vector<LeftoverSwapFile> out;
  for (const std::string& name : names) {
    const pid_t pid = SwapFileOwner(name);
    if (pid == 0 || pid == ::getpid()) continue;
    LeftoverSwapFile f{dir + "/" + name, 0, pid};
    const int fd = env->Open(f.path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) continue;  // gone already (another run reclaimed it), or not ours to read
    struct stat st {};
    const bool free_lock = env->Flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (free_lock && env->ProbeProcess(pid) == -ESRCH && env->Fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
      f.bytes = static_cast<uint64_t>(st.st_size);
      if (act(f)) out.push_back(std::move(f));
    }
    env->Close(fd);  // (drops the lock)
  }
  return out;
}

}  // namespace

Result<std::vector<LeftoverSwapFile>> FindLeftoverSwapFiles(IoEnv* env, const std::string& dir) {
  return ForEachLeftover(env, dir, [](const LeftoverSwapFile&) { return true; });
}

Result<std::vector<LeftoverSwapFile>> ReclaimLeftoverSwapFiles(IoEnv* env, const std::string& dir) {
  return ForEachLeftover(env, dir, [env](const LeftoverSwapFile& f) { return env->Unlink(f.path) == 0; });
}

}  // namespace strata::nvme
