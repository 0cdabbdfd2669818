// SPDX-License-Identifier: Apache-2.0
#include "engine/run_log.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <sstream>

#include "base/bytes.h"
#include "base/clock.h"
#include "engine/safetensors.h"  // WriteAll

#ifndef STRATA_VERSION
#define STRATA_VERSION "unknown"
#endif

namespace strata {

std::string Sci(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}

std::string Fixed(double v, int prec) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

std::string WallTimeNow() {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const std::time_t t = system_clock::to_time_t(now);
  const auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[64];  // (room for any int the fields could hold: GCC checks the worst case)
  std::snprintf(b, sizeof b, "%04d-%02d-%02dT%02d:%02d:%02d.%03lldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(ms));
  return b;
}

namespace {

// "20251201T220700Z-12345-0": the run's id in every record (its start, the
// process, and the process's runs before it: unique however close two runs are).
std::string RunId() {
  static std::atomic<int> runs{0};
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[64];
  std::snprintf(b, sizeof b, "%04d%02d%02dT%02d%02d%02dZ-%d-%d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(::getpid()), runs.fetch_add(1));
  return b;
}

}  // namespace

RunLog::RunLog(std::ostream* out, const Options& o, double start)
    : out_(out), o_(o), start_(start), run_id_(RunId()), progress_(o.progress, o.first_step, o.total_steps, start),
      last_step_(o.first_step) {}

RunLog::RunLog(RunLog&& o) noexcept
    : out_(o.out_),
      o_(std::move(o.o_)),
      start_(o.start_),
      run_id_(std::move(o.run_id_)),
      fd_(o.fd_),
      progress_(std::move(o.progress_)),
      warned_mfu_(o.warned_mfu_),
      mfu_low_(o.mfu_low_),
      run_tokens_(o.run_tokens_),
      last_step_(o.last_step_),
      last_loss_(o.last_loss_),
      last_val_(o.last_val_),
      window_s_(o.window_s_),
      window_tokens_(o.window_tokens_),
      window_steps_(o.window_steps_),
      window_committed_(o.window_committed_),
      window_missed_(o.window_missed_),
      agg_(o.agg_) {
  o.fd_ = -1;
}

RunLog::~RunLog() {
  if (fd_ >= 0) ::close(fd_);  // (the lock goes with it)
}

Result<RunLog> RunLog::Open(std::ostream* out, const Options& o, nlohmann::json header) {
  RunLog log(out, o, NowSeconds());
  if (!o.json_path.empty()) {
    log.fd_ = ::open(o.json_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (log.fd_ < 0) return ErrnoStatus("cannot open the JSON log", o.json_path);
    if (::flock(log.fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK) return IoError("cannot lock the JSON log", err, o.json_path);
      return FailedPrecondition("--log-json " + o.json_path +
                                " is being written by another run now; their lines would mix: give this run "
                                "another file");
    }
  }
  header["type"] = "run";
  header["version"] = STRATA_VERSION;
  header["start_time"] = WallTimeNow();
  header["first_step"] = o.first_step;
  header["total_steps"] = o.total_steps;
  header["gemm_baseline"] = {{"flops", o.peak_flops}, {"what", o.peak_what}};
  log.Write(std::move(header));
  return log;
}

void RunLog::Write(nlohmann::json j) {
  if (fd_ < 0) return;
  // The fields every record has first, then its own.
  nlohmann::ordered_json o;
  o["type"] = j.value("type", "");
  o["run"] = run_id_;
  o["time"] = WallTimeNow();
  o["elapsed_s"] = NowSeconds() - start_;
  for (auto& [k, v] : j.items())
    if (k != "type") o[k] = nlohmann::ordered_json(v);
  const std::string line = o.dump() + "\n";
  // A failed write of the log does not stop the training it describes.
  (void)WriteAll(fd_, line.data(), line.size(), o_.json_path, 0);
}

void RunLog::Line(const std::string& text) {
  progress_.Clear();
  *out_ << text << "\n";
  out_->flush();
}

void RunLog::Add(const StepReport& r, const TierStoreStats& st) {
  run_tokens_ += r.tokens;
  last_step_ = r.step;
  last_loss_ = r.loss;
  window_s_ += r.seconds;
  window_tokens_ += r.tokens;
  ++window_steps_;
  window_committed_ += r.speculation == Speculation::kCommitted;
  window_missed_ += r.speculation == Speculation::kMissed;
  agg_.forward_s += r.forward_s, agg_.backward_s += r.backward_s, agg_.wait_s += r.wait_s;
  agg_.optimizer_s += r.optimizer_s;
  agg_.h2d += r.h2d, agg_.d2h += r.d2h, agg_.nvme_read += r.nvme_read, agg_.nvme_write += r.nvme_write;
  const double tps = r.seconds > 0 ? r.tokens / r.seconds : 0;
  const double flops = o_.flops_per_token * tps;
  Write({{"type", "step"},
         {"step", r.step},
         {"loss", r.loss},
         {"lr", r.lr},
         {"loss_scale", r.loss_scale},
         {"skipped", r.skipped},
         {"grad_norm", r.grad_norm},
         {"speculation", SpeculationName(r.speculation)},
         {"tokens", r.tokens},
         {"step_s", r.seconds},
         {"forward_s", r.forward_s},
         {"backward_s", r.backward_s},
         {"wait_s", r.wait_s},
         {"optimizer_s", r.optimizer_s},
         {"optimizer_gpu_share", r.optimizer_gpu_share},
         {"tokens_per_s", tps},
         {"tflops", flops / 1e12},
         {"mfu", o_.peak_flops > 0 ? flops / o_.peak_flops : 0},
         {"h2d_bytes", r.h2d},
         {"d2h_bytes", r.d2h},
         {"nvme_read_bytes", r.nvme_read},
         {"nvme_write_bytes", r.nvme_write}});
  const int64_t total = o_.total_steps;
  const bool due = r.step % std::max<int64_t>(1, o_.every) == 0 || r.step == o_.first_step + 1 || r.step == total;
  if (due) Print(r, st);
  if (r.step < total) progress_.Update(r.step, r.loss, run_tokens_, NowSeconds());
  else progress_.Clear();  // the run's last lines stand alone
}

void RunLog::Print(const StepReport& r, const TierStoreStats& st) {
  const double tps = window_s_ > 0 ? window_tokens_ / window_s_ : 0;
  const double flops = o_.flops_per_token * tps;
  const double mfu = o_.peak_flops > 0 ? flops / o_.peak_flops : 0;
  std::ostringstream line;
  line << "step " << r.step << "/" << o_.total_steps << " | loss " << Fixed(r.loss, 4) << " | lr " << Sci(r.lr)
       << " | scale " << r.loss_scale << (r.skipped ? " (overflow: step skipped)" : "") << " | grad norm "
       << Fixed(r.grad_norm, 3) << " | " << Fixed(tps, 0) << " tok/s | " << Fixed(flops / 1e12, 2)
       << " TFLOP/s | MFU " << Fixed(100 * mfu, 1) << "%" << (mfu > 1 ? " (baseline low)" : "");
  if (o_.wall_clock_breakdown)
    line << " | fwd " << Fixed(agg_.forward_s, 2) << "s bwd " << Fixed(agg_.backward_s, 2) << "s opt "
         << Fixed(agg_.optimizer_s, 2) << "s";
  if (o_.assist) line << " (" << Fixed(100 * r.optimizer_gpu_share, 0) << "% on the GPU)";
  if (o_.wall_clock_breakdown) line << " wait " << Fixed(agg_.wait_s, 2) << "s";
  if (o_.speculative) {
    // Of the steps since the last line, how many speculated, and with what outcome.
    line << " | speculative " << window_committed_ + window_missed_ << "/" << window_steps_ << " ("
         << window_committed_ << " committed, " << window_missed_ << " missed)";
  }
  line << " | H2D " << FormatBytes(agg_.h2d) << " D2H " << FormatBytes(agg_.d2h);
  if (agg_.nvme_read || agg_.nvme_write)
    line << " NVMe r " << FormatBytes(agg_.nvme_read) << " w " << FormatBytes(agg_.nvme_write);
  line << " | gpu " << FormatBytes(st.tiers[0].usage.used) << " host " << FormatBytes(st.tiers[1].usage.used);
  Line(line.str());
  if (mfu > 1) {
    mfu_low_ = true;
    if (!warned_mfu_)
      Line("warning: an MFU above 100% means the GEMM baseline measured at the start (" + o_.peak_what +
           ") is below what the steps reach: the machine was busier while it ran than during the steps; this "
           "run's MFU figures are not meaningful");
    warned_mfu_ = true;
  }
  Write({{"type", "log"},
         {"step", r.step},
         {"loss", r.loss},
         {"lr", r.lr},
         {"loss_scale", r.loss_scale},
         {"skipped", r.skipped},
         {"grad_norm", r.grad_norm},
         {"speculation", SpeculationName(r.speculation)},
         {"optimizer_gpu_share", r.optimizer_gpu_share},
         {"interval_steps", window_steps_},
         {"interval_s", window_s_},
         {"interval_tokens", window_tokens_},
         {"interval_tokens_per_s", tps},
         {"interval_tflops", flops / 1e12},
         {"interval_mfu", mfu},
         {"interval_forward_s", agg_.forward_s},
         {"interval_backward_s", agg_.backward_s},
         {"interval_optimizer_s", agg_.optimizer_s},
         {"interval_wait_s", agg_.wait_s},
         {"interval_speculation_committed", window_committed_},
         {"interval_speculation_missed", window_missed_},
         {"interval_h2d_bytes", agg_.h2d},
         {"interval_d2h_bytes", agg_.d2h},
         {"interval_nvme_read_bytes", agg_.nvme_read},
         {"interval_nvme_write_bytes", agg_.nvme_write},
         {"gpu_bytes", st.tiers[0].usage.used},
         {"host_bytes", st.tiers[1].usage.used},
         {"nvme_bytes", st.nvme.used}});
  window_s_ = 0;
  window_tokens_ = window_steps_ = window_committed_ = window_missed_ = 0;
  agg_ = StepReport{};
}

void RunLog::Val(int64_t step, double loss, int batches) {
  last_val_ = loss;
  Line("step " + std::to_string(step) + " | val loss " + Fixed(loss, 4));
  Write({{"type", "val"}, {"step", step}, {"val_loss", loss}, {"batches", batches}});
}

void RunLog::Finish(const Status& status, const std::string& checkpoint) {
  progress_.Clear();
  const double elapsed = NowSeconds() - start_;
  const int64_t steps = last_step_ - o_.first_step;
  nlohmann::json j = {{"type", "summary"},
                      {"status", status.ok() ? "ok" : status.code() == StatusCode::kCancelled ? "stopped" : "error"},
                      {"message", status.ok() ? std::string() : status.ToString()},
                      {"first_step", o_.first_step},
                      {"last_step", last_step_},
                      {"steps", steps},
                      {"tokens", run_tokens_},
                      {"tokens_per_s", elapsed > 0 ? run_tokens_ / elapsed : 0},
                      {"final_loss", steps > 0 ? nlohmann::json(last_loss_) : nlohmann::json(nullptr)},
                      {"val_loss", last_val_ ? nlohmann::json(*last_val_) : nlohmann::json(nullptr)},
                      {"checkpoint", checkpoint.empty() ? nlohmann::json(nullptr) : nlohmann::json(checkpoint)},
                      {"mfu_baseline_low", mfu_low_}};
  Write(std::move(j));
}

}  // namespace strata
