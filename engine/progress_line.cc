// SPDX-License-Identifier: Apache-2.0
#include "engine/progress_line.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

namespace strata {

std::string ClockText(double seconds) {
  const int64_t s = std::max<int64_t>(0, static_cast<int64_t>(std::llround(seconds)));
  char b[32];
  if (s >= 3600)
    std::snprintf(b, sizeof b, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(b, sizeof b, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return b;
}

namespace {

std::string Rate(double tokens_per_s) {
  char b[32];
  if (tokens_per_s >= 1e6) std::snprintf(b, sizeof b, "%.2fM", tokens_per_s / 1e6);
  else if (tokens_per_s >= 1e4) std::snprintf(b, sizeof b, "%.1fk", tokens_per_s / 1e3);
  else std::snprintf(b, sizeof b, "%.0f", tokens_per_s);
  return b;
}

}  // namespace

ProgressLine::ProgressLine(bool on, int64_t first_step, int64_t total_steps, double start)
    : on_(on), first_(first_step), total_(std::max<int64_t>(total_steps, 1)), start_(start) {}

ProgressLine::ProgressLine(ProgressLine&& o) noexcept
    : on_(o.on_), showing_(o.showing_), first_(o.first_), total_(o.total_), start_(o.start_) {
  o.on_ = o.showing_ = false;
}

std::string ProgressLine::Text(int64_t step, double loss, int64_t tokens, double now) const {
  const int width = 20;
  const int done = static_cast<int>(width * std::clamp<int64_t>(step, 0, total_) / total_);
  const double elapsed = now - start_;
  const int64_t ran = step - first_;
  char lossb[32];
  std::snprintf(lossb, sizeof lossb, "%.4f", loss);
  std::string s = "[" + std::string(static_cast<size_t>(done), '#') + std::string(static_cast<size_t>(width - done), '.') +
                  "] " + std::to_string(step) + "/" + std::to_string(total_) + "  loss " + lossb;
  if (elapsed > 0) s += "  " + Rate(tokens / elapsed) + " tok/s";
  s += "  " + ClockText(elapsed) + " elapsed";
  if (ran > 0 && step < total_) s += ", ~" + ClockText(elapsed / ran * (total_ - step)) + " left";
  return s;
}

void ProgressLine::Update(int64_t step, double loss, int64_t tokens, double now) {
  if (!on_) return;
  std::cerr << "\r\033[K" << Text(step, loss, tokens, now) << std::flush;
  showing_ = true;
}

void ProgressLine::Clear() {
  if (!showing_) return;
  std::cerr << "\r\033[K" << std::flush;
  showing_ = false;
}

}  // namespace strata
