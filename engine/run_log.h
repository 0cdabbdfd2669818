// SPDX-License-Identifier: Apache-2.0
// RunLog: what `strata train` prints while it trains, and its JSON log.
//
// Lines on stdout. Every steps_per_print steps (and at the first and the
// last): the loss, lr, loss scale, gradient norm, tokens/s, TFLOP/s and MFU
// (against the GEMM rate measured at start), the time split with
// wall_clock_breakdown, the speculative update's outcomes, bytes per link
// and memory per tier — the rates, times and bytes over the steps since the
// last line. "step N | val loss X" after each validation. An MFU above 100%
// cannot be: it means the GEMM baseline was measured low (the machine was
// busier then than during the steps), and the line says so ("MFU 123.4%
// (baseline low)"), with one warning line the first time.
//
// The JSON log (--log-json FILE, appended to), one object a line, each with
// "type", the run's "run" id (its start time, PID and count), "time" (UTC wall
// time, ISO 8601 with milliseconds) and "elapsed_s" (since the run began):
//
//   "run"      first, once per run: "version", "start_time", "argv",
//              "config" (as the checkpoint records it), "plan" (its rows,
//              totals, budgets, the tiers' sizes and the table as printed),
//              "first_step", "total_steps", "backend", "gemm_baseline",
//              and "resumed_from" / "init_from" when given
//   "step"     every step, its own figures: "step", "loss", "lr",
//              "loss_scale", "skipped", "grad_norm", "speculation",
//              "tokens", "step_s", "forward_s", "backward_s", "wait_s",
//              "optimizer_s" (the update of the step before, which overlaps
//              this one), "optimizer_gpu_share", "tokens_per_s", "tflops",
//              "mfu", "h2d_bytes", "d2h_bytes", "nvme_read_bytes",
//              "nvme_write_bytes" (moved since the step before)
//   "log"      each printed line's: the printed step's "step", "loss",
//              "lr", "loss_scale", "skipped", "grad_norm", "speculation",
//              then the interval's aggregates, named so: "interval_steps",
//              "interval_s", "interval_tokens", "interval_tokens_per_s",
//              "interval_tflops", "interval_mfu", "interval_forward_s",
//              "interval_backward_s", "interval_optimizer_s",
//              "interval_wait_s", "interval_speculation_committed",
//              "interval_speculation_missed", "interval_h2d_bytes",
//              "interval_d2h_bytes", "interval_nvme_read_bytes",
//              "interval_nvme_write_bytes", and the memory in use now,
//              "gpu_bytes", "host_bytes", "nvme_bytes"
//   "val"      each validation: "step", "val_loss", "batches"
//   "summary"  last, however the run ended: "status" ("ok", "stopped",
//              "error"), "message", "first_step", "last_step", "steps",
//              "tokens", "tokens_per_s", "final_loss", "val_loss",
//              "checkpoint" (the last one saved), "mfu_baseline_low"
//
// The file is locked (flock) while the run writes it: a second run
// appending to it at the same time fails at Open, instead of mixing its
// lines in.
//
// Ownership: a RunLog owns the JSON log's descriptor (and its lock) and its
// progress line; `out` is the caller's. Move-only.
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/progress_line.h"
#include "engine/step_report.h"
#include "tiers/tier_store.h"

namespace strata {

class RunLog {
 public:
  struct Options {
    int64_t first_step = 0;        // the steps a resumed run starts after
    int64_t total_steps = 0;
    int64_t every = 10;            // steps_per_print
    double peak_flops = 0;         // MFU's baseline
    std::string peak_what;         // "512^3 f32 GEMM 210.8 GFLOP/s"
    double flops_per_token = 0;
    bool wall_clock_breakdown = false;
    bool assist = false;           // the GPU-assisted optimizer runs: say its share
    bool speculative = false;      // count the speculative updates' outcomes
    bool progress = false;         // a progress line on stderr
    std::string json_path;         // "" = none; appended to
  };
  // `header`: the "run" record's fields (config, plan, argv, ...); the log
  // adds "type", "run", "time", "elapsed_s", "version", "start_time",
  // "first_step", "total_steps", "gemm_baseline". ErrnoStatus naming the
  // JSON log when it cannot be opened, FailedPrecondition naming the PID of
  // a run writing it now.
  static Result<RunLog> Open(std::ostream* out, const Options& options, nlohmann::json header);
  RunLog(RunLog&&) noexcept;
  RunLog& operator=(RunLog&&) = delete;
  ~RunLog();

  // One step's report: its "step" record; its line when due.
  void Add(const StepReport& r, const TierStoreStats& stats);
  // A validation loss: its line and "val" record.
  void Val(int64_t step, double loss, int batches);
  // A line of the run's own (the final memory line, a saved checkpoint):
  // the progress line is cleared first.
  void Line(const std::string& text);
  // Before something else writes a line to stderr (a checkpoint's "saved ...").
  void ClearProgress() { progress_.Clear(); }
  // The run is over: the progress line goes, the "summary" record is written.
  // `checkpoint`: the last step directory saved ("" = none).
  void Finish(const Status& status, const std::string& checkpoint);

  const std::string& run_id() const { return run_id_; }

 private:
  RunLog(std::ostream* out, const Options& o, double start);
  void Print(const StepReport& r, const TierStoreStats& st);
  void Write(nlohmann::json record);

  std::ostream* out_;
  Options o_;
  double start_;
  std::string run_id_;
  int fd_ = -1;  // the JSON log, locked; -1 without one
  ProgressLine progress_;
  bool warned_mfu_ = false, mfu_low_ = false;
  // This run so far.
  int64_t run_tokens_ = 0, last_step_ = 0;
  double last_loss_ = 0;
  std::optional<double> last_val_;
  // Since the last line.
  double window_s_ = 0;
  int64_t window_tokens_ = 0, window_steps_ = 0, window_committed_ = 0, window_missed_ = 0;
  StepReport agg_;
};

// "%.2e" and "%.<prec>f".
std::string Sci(double v);
std::string Fixed(double v, int prec);

// UTC wall time now, ISO 8601 with milliseconds: "2025-12-01T22:07:00.123Z".
std::string WallTimeNow();

}  // namespace strata
