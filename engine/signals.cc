// SPDX-License-Identifier: Apache-2.0
#include "engine/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <initializer_list>

namespace strata {

namespace {

// Lock-free, so that the handler may touch it.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

void Write(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  ssize_t w = ::write(STDERR_FILENO, s, n);
  (void)w;
}

void OnSignal(int sig) {
  // Relaxed: the flag carries no data; the run loop only needs to see it
  // (its next check is on the same thread or after a join).
  const int before = g_signal.exchange(sig, std::memory_order_relaxed);
  if (before != 0) {
    Write("\nstrata: second signal: exiting now, nothing more is saved\n");
    ::_exit(128 + sig);
  }
  Write("\nstrata: stopping after the step under way (a second Ctrl-C exits at once)\n");
}

}  // namespace

void InstallStopSignalHandlers() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls go on; the run sees the flag at its next check
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaction(s, &sa, nullptr);
}

int StopSignal() { return g_signal.load(std::memory_order_relaxed); }

void RequestStop(int signal) { g_signal.store(signal, std::memory_order_relaxed); }

void ClearStopRequest() { g_signal.store(0, std::memory_order_relaxed); }

const char* StopSignalName(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
  }
  static thread_local char buf[24];
  std::snprintf(buf, sizeof buf, "signal %d", signal);
  return buf;
}

}  // namespace strata
