// SPDX-License-Identifier: Apache-2.0
#include "bench/sweep.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>

#include "base/clock.h"

namespace strata::bench {

namespace {

// Lock-free, so the handler may set it (a std::atomic<bool> is on every
// platform strata builds for; static_assert below).
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);
bool g_line_showing = false;  // a progress line is on stderr (sweep thread only)

void OnSignal(int) {
  // Relaxed is enough: the flag carries no data; pollers only need to see it eventually.
  const bool again = g_stop.exchange(true, std::memory_order_relaxed);
  const char* msg = again ? "\nstrata-bench: still stopping: the measurement in flight ends first\n"
                          : "\nstrata-bench: stopping after the measurement in flight; what was measured is "
                            "written\n";
  ssize_t n = ::write(STDERR_FILENO, msg, __builtin_strlen(msg));
  (void)n;
}

}  // namespace

void InstallStopHandler() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking waits continue; the sweep sees the flag at its next point
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);  // the terminal closed: stop as cleanly, files removed
}

bool StopRequested() { return g_stop.load(std::memory_order_relaxed); }

void RequestStop() { g_stop.store(true, std::memory_order_relaxed); }

void ClearProgressLine() {
  if (!g_line_showing) return;
  std::cerr << "\r\033[K" << std::flush;
  g_line_showing = false;
}

Progress::Progress(std::string what, size_t total)
    : what_(std::move(what)),
      total_(total ? total : 1),
      start_(NowSeconds()),
      tty_(isatty(STDOUT_FILENO) && isatty(STDERR_FILENO)) {}

Progress::~Progress() { ClearProgressLine(); }

void Progress::Next(const std::string& label) {
  if (started_) ++done_;
  started_ = true;
  if (!tty_) return;
  const double elapsed = NowSeconds() - start_;
  if (elapsed < kProgressAfterSeconds || done_ == 0) return;
  const double left = elapsed / static_cast<double>(done_) * static_cast<double>(total_ - done_);
  char eta[32];
  if (left >= 90)
    std::snprintf(eta, sizeof eta, "~%.0f min left", left / 60);
  else
    std::snprintf(eta, sizeof eta, "~%.0f s left", left);
  std::cerr << "\r\033[K" << what_ << " " << done_ + 1 << "/" << total_ << " (" << label << "), " << eta
            << (StopRequested() ? ", stopping" : "") << std::flush;
  g_line_showing = true;
}

}  // namespace strata::bench
