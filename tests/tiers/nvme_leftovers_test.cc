// SPDX-License-Identifier: Apache-2.0
// Swap files a killed run left (tiers/nvme/leftovers.h): NvmeTier::Open
// removes those whose lock is free and whose process is gone, says so, and
// leaves every other file: a live run's (its lock held), one whose PID lives,
// and anything not named as a swap file.
#include "tiers/nvme/leftovers.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tiers/nvme/io_env.h"
#include "tiers/nvme/nvme_tier.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::TempDir;
using ::testing::HasSubstr;

// The PID of a process that has exited (and been reaped).
pid_t DeadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return pid;
}

std::string SwapName(pid_t pid, int n) {
  return "strata-nvme-" + std::to_string(pid) + "-" + std::to_string(n) + ".swap";
}

void WriteFile(const std::string& path, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f << std::string(bytes, 'x');
}

bool Exists(const std::string& p) { return std::filesystem::exists(p); }

TEST(NvmeLeftovers, OwnerOfAName) {
  EXPECT_EQ(nvme::SwapFileOwner("strata-nvme-123-0.swap"), 123);
  EXPECT_EQ(nvme::SwapFileOwner("strata-nvme-123-45.swap"), 123);
  EXPECT_EQ(nvme::SwapFileOwner("strata-nvme--0.swap"), 0);
  EXPECT_EQ(nvme::SwapFileOwner("strata-nvme-12a-0.swap"), 0);
  EXPECT_EQ(nvme::SwapFileOwner("strata-nvme-123-0.swap.bak"), 0);
  EXPECT_EQ(nvme::SwapFileOwner("model.safetensors"), 0);
}

// A killed run's file goes, with a line saying what and whose; the others stay.
TEST(NvmeLeftovers, OpenRemovesADeadRunsFilesOnly) {
  TempDir dir;
  const pid_t dead = DeadPid();
  const std::string left = dir.File(SwapName(dead, 0)), left2 = dir.File(SwapName(dead, 3));
  const std::string alive = dir.File(SwapName(1, 0));  // PID 1 lives (and holds no lock)
  const std::string other = dir.File("notes.txt");
  WriteFile(left, 8192);
  WriteFile(left2, 4096);
  WriteFile(alive, 4096);
  WriteFile(other, 10);
  ASSERT_OK_AND_ASSIGN(auto found, nvme::FindLeftoverSwapFiles(IoEnv::Default(), dir.path()));
  EXPECT_EQ(found.size(), 2u);
  EXPECT_TRUE(Exists(left)) << "Find removes nothing";
  ::testing::internal::CaptureStderr();
  NvmeOptions o;
  o.dirs = {dir.path()};
  o.buffered_fallback = true;
  auto tier = NvmeTier::Open(o);
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_OK(tier.status());
  EXPECT_FALSE(Exists(left));
  EXPECT_FALSE(Exists(left2));
  EXPECT_THAT(said, HasSubstr("removed " + left + " (8.00 KiB), a swap file left by process " +
                              std::to_string(dead) + ", which has exited"));
  EXPECT_TRUE(Exists(alive));
  EXPECT_TRUE(Exists(other));
}

// A live run's swap file (another process holding its lock) stays; once
// that process is killed, the same file is a leftover.
TEST(NvmeLeftovers, ALockedFileStays) {
  TempDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const char* d = dir.path().c_str();
  const pid_t child = ::fork();
  if (child == 0) {
    // A stand-in for a live run: its own swap file, locked, until killed
    // (only async-signal-safe calls after fork).
    char path[4096];
    std::snprintf(path, sizeof path, "%s/strata-nvme-%d-0.swap", d, static_cast<int>(::getpid()));
    const int fd = ::open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
    const char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const std::string live = dir.File(SwapName(child, 0));
  ASSERT_TRUE(Exists(live));
  ASSERT_OK_AND_ASSIGN(auto gone, nvme::ReclaimLeftoverSwapFiles(IoEnv::Default(), dir.path()));
  EXPECT_TRUE(gone.empty());
  EXPECT_TRUE(Exists(live));
  ::kill(child, SIGKILL);
  int st = 0;
  ::waitpid(child, &st, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  // Its owner gone, the same file is a leftover.
  ASSERT_OK_AND_ASSIGN(gone, nvme::ReclaimLeftoverSwapFiles(IoEnv::Default(), dir.path()));
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].pid, child);
  EXPECT_FALSE(Exists(live));
}

// The tier's own files are locked while it lives: another process sees them in use.
TEST(NvmeLeftovers, TheTiersOwnFilesAreLocked) {
  TempDir dir;
  NvmeOptions o;
  o.dirs = {dir.path()};
  o.buffered_fallback = true;
  ASSERT_OK_AND_ASSIGN(auto tier, NvmeTier::Open(o));
  ASSERT_EQ(tier->files().size(), 1u);
  const int fd = ::open(tier->files()[0].c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_NE(::flock(fd, LOCK_EX | LOCK_NB), 0) << "the tier holds no lock on its swap file";
  EXPECT_EQ(errno, EWOULDBLOCK);
  ::close(fd);
}

}  // namespace
}  // namespace strata
