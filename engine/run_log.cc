#include "engine/run_log.h"

#include <cstdio>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/bytes.h"

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

Result<RunLog> RunLog::Open(std::ostream* out, const Options& o) {
  RunLog log(out, o);
  if (!o.json_path.empty()) {
    log.json_.open(o.json_path, std::ios::app);
    if (!log.json_) return ErrnoStatus("cannot open the JSON log", o.json_path);
  }
  return log;
}

void RunLog::Add(const StepReport& r, const TierStoreStats& st) {
  window_s_ += r.seconds;
  window_tokens_ += r.tokens;
  ++window_steps_;
  window_committed_ += r.speculation == Speculation::kCommitted;
  window_missed_ += r.speculation == Speculation::kMissed;
  agg_.forward_s += r.forward_s, agg_.backward_s += r.backward_s, agg_.wait_s += r.wait_s;
  agg_.optimizer_s += r.optimizer_s;
  agg_.h2d += r.h2d, agg_.d2h += r.d2h, agg_.nvme_read += r.nvme_read, agg_.nvme_write += r.nvme_write;
  const int64_t total = o_.total_steps;
  if (o_.progress) {
    const int width = 30, done = static_cast<int>(width * r.step / std::max<int64_t>(total, 1));
    std::cerr << "\r[" << std::string(static_cast<size_t>(done), '#')
              << std::string(static_cast<size_t>(width - done), '.') << "] " << r.step << "/" << total << " loss "
              << Fixed(r.loss, 4) << std::flush;
    if (r.step == total) std::cerr << "\n";
  }
  if (r.step % std::max<int64_t>(1, o_.every) == 0 || r.step == 1 || r.step == total) Print(r, st);
}

void RunLog::Print(const StepReport& r, const TierStoreStats& st) {
  const double tps = window_s_ > 0 ? window_tokens_ / window_s_ : 0;
  const double flops = o_.flops_per_token * tps;
  const double mfu = o_.peak_flops > 0 ? flops / o_.peak_flops : 0;
  std::ostringstream line;
  line << "step " << r.step << "/" << o_.total_steps << " | loss " << Fixed(r.loss, 4) << " | lr " << Sci(r.lr)
       << " | scale " << r.loss_scale << (r.skipped ? " (overflow: step skipped)" : "") << " | grad norm "
       << Fixed(r.grad_norm, 3) << " | " << Fixed(tps, 0) << " tok/s | " << Fixed(flops / 1e12, 2)
       << " TFLOP/s | MFU " << Fixed(100 * mfu, 1) << "%";
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
  if (o_.progress) std::cerr << "\r" << std::string(60, ' ') << "\r";
  *out_ << line.str() << "\n";
  out_->flush();
  if (json_.is_open()) {
    nlohmann::json j = {{"step", r.step},
                        {"loss", r.loss},
                        {"lr", r.lr},
                        {"loss_scale", r.loss_scale},
                        {"skipped", r.skipped},
                        {"grad_norm", r.grad_norm},
                        {"speculation", SpeculationName(r.speculation)},
                        {"speculation_committed", window_committed_},
                        {"speculation_missed", window_missed_},
                        {"tokens_per_s", tps},
                        {"tflops", flops / 1e12},
                        {"mfu", mfu},
                        {"forward_s", agg_.forward_s},
                        {"backward_s", agg_.backward_s},
                        {"optimizer_s", agg_.optimizer_s},
                        {"wait_s", agg_.wait_s},
                        {"optimizer_gpu_share", r.optimizer_gpu_share},
                        {"h2d_bytes", agg_.h2d},
                        {"d2h_bytes", agg_.d2h},
                        {"nvme_read_bytes", agg_.nvme_read},
                        {"nvme_write_bytes", agg_.nvme_write},
                        {"gpu_bytes", st.tiers[0].usage.used},
                        {"host_bytes", st.tiers[1].usage.used},
                        {"nvme_bytes", st.nvme.used}};
    json_ << j.dump() << "\n";
    json_.flush();
  }
  window_s_ = 0;
  window_tokens_ = window_steps_ = window_committed_ = window_missed_ = 0;
  agg_ = StepReport{};
}

}  // namespace strata
