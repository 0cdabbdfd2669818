// SPDX-License-Identifier: Apache-2.0
// `strata train`'s progress line on a terminal's stderr, rewritten in place:
//
//   [#########...........] 12/40  loss 3.1234  19.8k tok/s  0:12 elapsed, ~0:28 left
//
// The rate is the tokens of this run's steps over their wall time, the time
// left the steps to go at this run's mean time per step so far. Clear()
// erases the line; the run log calls it before printing any line of its own
// and before the run's last line, so the line never stays under the output.
// Off (every call a no-op) unless stdout and stderr are both a terminal
// (TrainOptions::progress).
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

class ProgressLine {
 public:
  // `first_step`: the step count the run starts from (a resume's); `start`: NowSeconds() then.
  ProgressLine(bool on, int64_t first_step, int64_t total_steps, double start);
  ~ProgressLine() { Clear(); }
  ProgressLine(ProgressLine&& o) noexcept;
  ProgressLine& operator=(ProgressLine&&) = delete;
  ProgressLine(const ProgressLine&) = delete;

  // After step `step` (of this run's `tokens` so far) at time `now`.
  void Update(int64_t step, double loss, int64_t tokens, double now);
  void Clear();

  // The line Update draws (tests; no terminal needed).
  std::string Text(int64_t step, double loss, int64_t tokens, double now) const;

 private:
  bool on_;
  bool showing_ = false;
  int64_t first_, total_;
  double start_;
};

// "0:07", "12:34", "1:02:03".
std::string ClockText(double seconds);

}  // namespace strata
