// SPDX-License-Identifier: Apache-2.0
// Running the `strata` binary as a user does, with a time limit, for the
// command-line tests: stdout and stderr captured together, stdin /dev/null.
// A run past its limit is killed (SIGKILL) and says so.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace strata::testing {

struct StrataRun {
  int rc = -1;             // the exit code; 128 + N when killed by signal N
  bool signalled = false;  // ended by a signal (a crash, or the time limit)
  bool timed_out = false;
  std::string output;
};

inline std::string StrataPath() { return std::string(STRATA_BINARY_DIR) + "/bin/strata"; }

inline StrataRun RunStrata(const std::vector<std::string>& args, double limit_s = 60) {
  StrataRun r;
  char out_path[] = "/tmp/strata-cli.XXXXXX";
  const int fd = ::mkstemp(out_path);
  if (fd < 0) return r;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, fd, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> argv = {StrataPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargs;
  for (auto& a : argv) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, cargs[0], &fa, nullptr, cargs.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fd);
  if (err != 0) {
    r.output = "cannot start " + argv[0];
    ::unlink(out_path);
    return r;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  int status = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      r.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.signalled = WIFSIGNALED(status);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(out_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  ::unlink(out_path);
  return r;
}

}  // namespace strata::testing
