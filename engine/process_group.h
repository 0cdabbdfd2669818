// SPDX-License-Identifier: Apache-2.0
// The processes of a launch (engine/launcher.h): started together, watched
// together, stopped together.
//
//   start    each child is fork+exec'd in a process group of its own (so a
//            terminal's Ctrl-C reaches the launcher once, and the launcher
//            alone forwards it), with its environment additions, its
//            `prepare` step run in the child before exec (the CPU and
//            memory binding), and its stdout and stderr on pipes.
//   output   every stderr line goes to the launcher's stderr prefixed by
//            the child's label ("[rank 1] ..."); stdout lines go to stdout
//            unprefixed. The last kTailLines stderr lines of each label are
//            kept for the report. A child that is mpirun run with
//            --tag-output has its lines ("[1,R]<stderr>:...") sorted by
//            rank R as if each rank were a child.
//   signals  SIGINT, SIGTERM and SIGHUP received by the launcher are sent
//            on to every child still running (the first asks strata's ranks
//            to stop after the step and save, the second ends them at once:
//            engine/signals.h), and the launcher keeps waiting for them.
//   failure  the first child to end with a non-zero status or a signal,
//            when no stop was asked for, is the failure: every other child
//            gets SIGTERM, and SIGKILL `grace_s` later if still running (a
//            rank waiting in a collective for the failed one does not come
//            back by itself before its communicator's timeout). mpirun names
//            its failed rank itself ("Process name: [[J,1],R] ... Exit
//            code: N", "process rank R ... exited on signal S"); that rank
//            is then the failure.
//   report   Run returns once every child has ended and every pipe is
//            drained; on a failure its first line names the failed child
//            (or mpirun's rank), its exit status or signal, then that one's
//            stderr tail, then the others' ends.
//
// Thread-safety: one ProcessGroup, one thread (the launcher's only one:
// children are forked from a single-threaded process). Signal handlers are
// the launcher's while Run runs and restored after.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace strata {

struct ChildSpec {
  std::string label;                                      // "rank 1", "host worker-2", "mpirun"
  std::vector<std::string> argv;                          // argv[0] is looked up on PATH
  std::vector<std::pair<std::string, std::string>> env;   // set in the child (added to the launcher's)
  // Run in the child after fork, before exec; returns a warning to print or "".
  std::function<std::string()> prepare;
  bool mpirun_tagged = false;                             // mpirun --tag-output: lines sorted by rank
  // The signal a stop (SIGINT, SIGTERM, SIGHUP to the launcher) is passed on
  // as; 0: the one received. mpirun: SIGUSR1, which it forwards to its
  // ranks (its SIGTERM ends the job at once).
  int stop_as = 0;
};

struct GroupResult {
  int exit_code = 0;        // 0, the failed child's (exit status, or 128 + signal), or the stop's
  std::string failed;       // the failed child's label ("rank 1"), "" when none failed
  std::string report;       // what Run printed at the end (also for tests)
};

class ProcessGroup {
 public:
  static constexpr int kTailLines = 20;
  // grace_s: after a failure, how long the others have to end before SIGKILL.
  explicit ProcessGroup(double grace_s) : grace_s_(grace_s) {}
  // Starts every child, waits for all, writes their lines and the report to
  // `out` / `err`. A child that cannot be started (no such program) ends
  // with status 127 and says why on its stderr, like a shell.
  GroupResult Run(const std::vector<ChildSpec>& children, std::ostream& out, std::ostream& err);

 private:
  double grace_s_;
};

// "exit status 3", "signal 9 (Killed)": a waitpid status for messages.
std::string WaitStatusText(int status);

}  // namespace strata
