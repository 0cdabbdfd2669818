// SPDX-License-Identifier: Apache-2.0
// Running strata-bench and strata as a user does, for the CLI tests:
// the built binaries (build/bin), run to their end or signalled part-way,
// with stdout and stderr captured together.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace strata::testing {

struct CommandResult {
  int rc = -1;         // the exit code; 128 + N when killed by signal N
  std::string output;  // stdout and stderr together
};

inline std::string ReadFile(const std::string& path);

inline std::string BenchBinary() { return std::string(STRATA_BINARY_DIR) + "/bin/strata-bench"; }
inline std::string StrataBinary() { return std::string(STRATA_BINARY_DIR) + "/bin/strata"; }

namespace cli_detail {

// Spawns argv with stdout and stderr into a temporary file; returns the pid.
inline pid_t Spawn(const std::vector<std::string>& argv, std::string* out_path) {
  char tmpl[] = "/tmp/strata-cli-test.XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd < 0) return -1;
  *out_path = tmpl;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, fd, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  std::vector<std::string> copy = argv;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  ::close(fd);
  return pid;
}

inline CommandResult Finish(pid_t pid, const std::string& out_path) {
  CommandResult r;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.output = ReadFile(out_path);
  ::unlink(out_path.c_str());
  return r;
}

}  // namespace cli_detail

inline CommandResult RunCommand(const std::vector<std::string>& argv) {
  std::string out;
  const pid_t pid = cli_detail::Spawn(argv, &out);
  if (pid < 0) return {-1, "cannot start " + argv[0]};
  return cli_detail::Finish(pid, out);
}

inline CommandResult RunAndSignal(const std::vector<std::string>& argv, double delay_s, int signal) {
  std::string out;
  const pid_t pid = cli_detail::Spawn(argv, &out);
  if (pid < 0) return {-1, "cannot start " + argv[0]};
  std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
  ::kill(pid, signal);
  return cli_detail::Finish(pid, out);
}

namespace cli_detail {
// Polls `out` every 10 ms until it shows `marker` or `until` passes.
template <typename TimePoint>
bool AwaitOutput(const std::string& out, const std::string& marker, TimePoint until) {
  while (std::chrono::steady_clock::now() < until) {
    if (ReadFile(out).find(marker) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}
}  // namespace cli_detail

// Runs argv; once its output shows `marker` (polled every 10 ms, for at
// most `timeout_s`) sends each of `signals`, `gap_s` apart. Deterministic
// where a delay is not: the signal lands after the step the marker names.
inline CommandResult RunAndSignalWhen(const std::vector<std::string>& argv, const std::string& marker,
                                      const std::vector<int>& signals, double gap_s = 0, double timeout_s = 120) {
  std::string out;
  const pid_t pid = cli_detail::Spawn(argv, &out);
  if (pid < 0) return {-1, "cannot start " + argv[0]};
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  const bool seen = cli_detail::AwaitOutput(out, marker, until);
  for (size_t i = 0; i < signals.size(); ++i) {
    if (i) std::this_thread::sleep_for(std::chrono::duration<double>(gap_s));
    ::kill(pid, signals[i]);
  }
  CommandResult r = cli_detail::Finish(pid, out);
  if (!seen) r.output = "(never showed '" + marker + "')\n" + r.output;
  return r;
}

// Runs argv and sends each signal once the output shows its marker, in
// order. Two signals of one kind sent back to back may reach the process as
// one (a pending signal is not queued twice); waiting for the output that
// says the first was handled keeps them apart however loaded the machine.
inline CommandResult RunAndSignalAt(const std::vector<std::string>& argv,
                                    const std::vector<std::pair<std::string, int>>& marker_signals,
                                    double timeout_s = 120) {
  std::string out;
  const pid_t pid = cli_detail::Spawn(argv, &out);
  if (pid < 0) return {-1, "cannot start " + argv[0]};
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string missed;
  for (const auto& [marker, signal] : marker_signals) {
    if (!cli_detail::AwaitOutput(out, marker, until)) {
      missed = marker;
      break;
    }
    ::kill(pid, signal);
  }
  if (!missed.empty()) ::kill(pid, SIGKILL);
  CommandResult r = cli_detail::Finish(pid, out);
  if (!missed.empty()) r.output = "(never showed '" + missed + "')\n" + r.output;
  return r;
}

inline std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.push_back(e->d_name);
    ::closedir(d);
  }
  return names;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace strata::testing
