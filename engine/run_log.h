// RunLog: what `strata train` prints while it trains. Every steps_per_print
// steps (and at the first and the last): a line with the loss, lr, loss
// scale, gradient norm, tokens/s, TFLOP/s and MFU (against the GEMM rate
// measured at start), the time split with wall_clock_breakdown, the
// speculative update's outcomes, bytes per link and memory per tier — all
// over the steps since the last line — and the same as a JSON line when a
// JSON log is open; on a terminal, a progress line on stderr.
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <string>

#include "base/status.h"
#include "engine/step_report.h"
#include "tiers/tier_store.h"

namespace strata {

class RunLog {
 public:
  struct Options {
    int64_t total_steps = 0;
    int64_t every = 10;            // steps_per_print
    double peak_flops = 0;         // MFU's baseline
    double flops_per_token = 0;
    bool wall_clock_breakdown = false;
    bool assist = false;           // the GPU-assisted optimizer runs: say its share
    bool speculative = false;      // count the speculative updates' outcomes
    bool progress = false;         // a progress line on stderr
    std::string json_path;         // "" = none; appended to
  };
  // ErrnoStatus naming the JSON log when it cannot be opened.
  static Result<RunLog> Open(std::ostream* out, const Options& options);
  RunLog(RunLog&&) = default;

  // One step's report; prints when its line is due.
  void Add(const StepReport& r, const TierStoreStats& stats);

 private:
  RunLog(std::ostream* out, const Options& o) : out_(out), o_(o) {}
  void Print(const StepReport& r, const TierStoreStats& st);

  std::ostream* out_;
  Options o_;
  std::ofstream json_;
  // Since the last line.
  double window_s_ = 0;
  int64_t window_tokens_ = 0, window_steps_ = 0, window_committed_ = 0, window_missed_ = 0;
  StepReport agg_;
};

// "%.2e" and "%.<prec>f".
std::string Sci(double v);
std::string Fixed(double v, int prec);

}  // namespace strata
