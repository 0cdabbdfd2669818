// SPDX-License-Identifier: Apache-2.0
// A sweep's two courtesies to the person running it: a progress line with
// the time left, and a clean stop on Ctrl-C.
//
// Stop: main() calls InstallStopHandler() once; SIGINT, SIGTERM and SIGHUP then only
// set a flag (the handler writes one line and nothing else), which the
// sweeps poll with StopRequested() between measurements. A stopped command
// prints and writes what it measured, removes its files like any other exit
// (destructors run: nothing is killed half-way), and exits kStoppedExit
// (130, the shell's code for SIGINT). A second Ctrl-C does not kill either:
// the measurement in flight ends first (kill -9 would leave the benchmark's
// files in --dir).
//
// Progress: a Progress of `total` points prints, once the sweep has run for
// kProgressAfterSeconds, "\r<what> 7/24 (bs 1 MiB qd 32), ~41 s left" to
// stderr, rewritten in place, and only when stdout and stderr are both a
// terminal (a log or a pipe gets no carriage returns). The estimate is the
// mean time per finished point times the points left. Anything that prints
// a line while a progress line may be showing calls ClearProgressLine()
// first (Report::Add does).
//
// Thread-safety: StopRequested() from any thread (an atomic read). Progress
// and ClearProgressLine() from the thread that runs the sweep.
#pragma once

#include <cstddef>
#include <string>

namespace strata::bench {

inline constexpr int kStoppedExit = 130;
inline constexpr double kProgressAfterSeconds = 3.0;

// SIGINT, SIGTERM and SIGHUP set the stop flag (installed once; later calls no-ops).
void InstallStopHandler();
// True once Ctrl-C (or SIGTERM, SIGHUP) arrived, or RequestStop() was called.
bool StopRequested();
// Sets the flag as the signal would (tests, and commands that give up early).
void RequestStop();

// Erases a progress line if one is showing.
void ClearProgressLine();

class Progress {
 public:
  // `what` names the sweep ("nvme", "adam"); `total` points (>= 1).
  Progress(std::string what, size_t total);
  ~Progress();  // clears the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Marks the start of point `label` (the previous one finished): redraws
  // the line with the points done so far and the time left.
  void Next(const std::string& label);

 private:
  std::string what_;
  size_t total_, done_ = 0;
  double start_;
  bool started_ = false;
  bool tty_;
};

}  // namespace strata::bench
