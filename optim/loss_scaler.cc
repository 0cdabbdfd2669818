// SPDX-License-Identifier: Apache-2.0
#include "optim/loss_scaler.h"

#include <cmath>
#include <cstdio>
#include <string>

namespace strata::optim {

namespace {
std::string Num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}
}  // namespace

LossScalerConfig LossScalerConfig::DeepSpeedImplicit() {
  LossScalerConfig c;
  c.loss_scale = 0.0;
  c.initial_scale_power = 32;
  c.loss_scale_window = 1000;
  c.hysteresis = 1;
  c.consecutive_hysteresis = false;
  c.min_loss_scale = 1.0;
  return c;
}

Status LossScalerConfig::Validate() const {
  if (!std::isfinite(loss_scale) || loss_scale < 0)
    return InvalidArgument("fp16.loss_scale must be 0 (dynamic) or a finite scale > 0, got " + Num(loss_scale));
  if (!dynamic()) return Status::OK();
  if (initial_scale_power < 0 || initial_scale_power > 127)
    return InvalidArgument("fp16.initial_scale_power must be in [0, 127], got " + std::to_string(initial_scale_power));
  if (loss_scale_window < 1)
    return InvalidArgument("fp16.loss_scale_window must be >= 1, got " + std::to_string(loss_scale_window));
  if (hysteresis < 1) return InvalidArgument("fp16.hysteresis must be >= 1, got " + std::to_string(hysteresis));
  if (!std::isfinite(min_loss_scale) || min_loss_scale <= 0)
    return InvalidArgument("fp16.min_loss_scale must be finite and > 0, got " + Num(min_loss_scale));
  if (!std::isfinite(scale_factor) || scale_factor <= 1)
    return InvalidArgument("loss scaler scale_factor must be finite and > 1, got " + Num(scale_factor));
  return Status::OK();
}

Result<LossScaler> LossScaler::Create(const LossScalerConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  LossScaler s(config);
  if (config.dynamic()) {
    s.state_.cur_scale = std::ldexp(1.0, config.initial_scale_power);
    s.state_.cur_hysteresis = config.hysteresis;
  } else {
    s.state_.cur_scale = config.loss_scale;
    s.state_.cur_hysteresis = 1;
  }
  return s;
}

Status LossScaler::Restore(const State& s) {
  if (!std::isfinite(s.cur_scale) || s.cur_scale <= 0)
    return InvalidArgument("loss scaler state: scale must be finite and > 0, got " + Num(s.cur_scale));
  if (dynamic() && (s.cur_hysteresis < 1 || s.cur_hysteresis > config_.hysteresis))
    return InvalidArgument("loss scaler state: hysteresis " + std::to_string(s.cur_hysteresis) +
                           " outside [1, " + std::to_string(config_.hysteresis) + "]");
  if (s.cur_iter < 0 || s.last_overflow_iter < -1 || s.last_overflow_iter >= s.cur_iter)
    return InvalidArgument("loss scaler state: iterations must satisfy -1 <= last_overflow_iter < cur_iter, got " +
                           std::to_string(s.last_overflow_iter) + " and " + std::to_string(s.cur_iter));
  state_ = s;
  return Status::OK();
}

Status LossScaler::Update(bool overflow) {
  if (!dynamic()) return Status::OK();
  State& s = state_;
  if (overflow) {
    if (config_.hysteresis == 1 || s.cur_hysteresis == 1) {
      if (s.cur_scale == config_.min_loss_scale && config_.raise_error_at_min_scale)
        return FailedPrecondition("gradient overflow with the loss scale already at fp16.min_loss_scale (" +
                                  Num(config_.min_loss_scale) + "): cannot decrease it any more");
      double next = s.cur_scale / config_.scale_factor;
      s.cur_scale = next > config_.min_loss_scale ? next : config_.min_loss_scale;
    } else {
      s.cur_hysteresis -= 1;
    }
    s.last_overflow_iter = s.cur_iter;
  } else {
    if (config_.consecutive_hysteresis) s.cur_hysteresis = config_.hysteresis;
    if ((s.cur_iter - s.last_overflow_iter) % config_.loss_scale_window == 0) {
      if (!config_.consecutive_hysteresis) s.cur_hysteresis = config_.hysteresis;
      s.cur_scale *= config_.scale_factor;
    }
  }
  s.cur_iter += 1;
  return Status::OK();
}

}  // namespace strata::optim
