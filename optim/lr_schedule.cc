// SPDX-License-Identifier: Apache-2.0
#include "optim/lr_schedule.h"

#include <cmath>
#include <cstdio>
#include <numbers>
#include <string>

namespace strata::optim {

namespace {

std::string Num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

Status NonNegative(const char* schedule, const char* key, double v) {
  if (!std::isfinite(v) || v < 0)
    return InvalidArgument(std::string(schedule) + "." + key + " must be finite and >= 0, got " + Num(v));
  return Status::OK();
}

Status AtLeast(const char* schedule, const char* key, int64_t v, int64_t min) {
  if (v < min)
    return InvalidArgument(std::string(schedule) + "." + key + " must be >= " + std::to_string(min) + ", got " +
                           std::to_string(v));
  return Status::OK();
}

Status Momentum(const char* key, double v) {
  if (!std::isfinite(v) || v < 0 || v >= 1)
    return InvalidArgument(std::string("OneCycle.") + key + " must be in [0, 1), got " + Num(v));
  return Status::OK();
}

// DeepSpeed: warmup_num_steps = max(2, warmup_num_steps).
int64_t EffectiveWarmup(int64_t n) { return n < 2 ? 2 : n; }

// The warmup fraction w(it) for 0 <= it < N.
double WarmupFraction(int64_t it, int64_t n, WarmupType t) {
  if (t == WarmupType::kLog) return (1.0 / std::log(static_cast<double>(n))) * std::log(static_cast<double>(it + 1));
  return static_cast<double>(it) / static_cast<double>(n);
}

}  // namespace

Result<LrScheduleType> ParseLrScheduleType(std::string_view name) {
  for (LrScheduleType t : {LrScheduleType::kConstant, LrScheduleType::kWarmupLR, LrScheduleType::kWarmupDecayLR,
                           LrScheduleType::kWarmupCosineLR, LrScheduleType::kOneCycle})
    if (name == LrScheduleTypeName(t)) return t;
  return InvalidArgument("unknown scheduler type '" + std::string(name) +
                         "' (allowed: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, Constant)");
}

std::string_view LrScheduleTypeName(LrScheduleType t) {
  switch (t) {
    case LrScheduleType::kConstant: return "Constant";
    case LrScheduleType::kWarmupLR: return "WarmupLR";
    case LrScheduleType::kWarmupDecayLR: return "WarmupDecayLR";
    case LrScheduleType::kWarmupCosineLR: return "WarmupCosineLR";
    case LrScheduleType::kOneCycle: return "OneCycle";
  }
  return "?";
}

Result<WarmupType> ParseWarmupType(std::string_view name) {
  for (WarmupType t : {WarmupType::kLog, WarmupType::kLinear})
    if (name == WarmupTypeName(t)) return t;
  return InvalidArgument("unknown warmup_type '" + std::string(name) + "' (allowed: log, linear)");
}

std::string_view WarmupTypeName(WarmupType t) {
  switch (t) {
    case WarmupType::kLog: return "log";
    case WarmupType::kLinear: return "linear";
  }
  return "?";
}

Status WarmupLRParams::Validate() const {
  RETURN_IF_ERROR(NonNegative("WarmupLR", "warmup_min_lr", warmup_min_lr));
  if (warmup_max_lr) RETURN_IF_ERROR(NonNegative("WarmupLR", "warmup_max_lr", *warmup_max_lr));
  RETURN_IF_ERROR(AtLeast("WarmupLR", "warmup_num_steps", warmup_num_steps, 0));
  return Status::OK();
}

Status WarmupDecayLRParams::Validate() const {
  RETURN_IF_ERROR(AtLeast("WarmupDecayLR", "total_num_steps", total_num_steps, 1));
  RETURN_IF_ERROR(NonNegative("WarmupDecayLR", "warmup_min_lr", warmup_min_lr));
  RETURN_IF_ERROR(NonNegative("WarmupDecayLR", "warmup_max_lr", warmup_max_lr));
  RETURN_IF_ERROR(AtLeast("WarmupDecayLR", "warmup_num_steps", warmup_num_steps, 0));
  return Status::OK();
}

Status WarmupCosineLRParams::Validate() const {
  RETURN_IF_ERROR(NonNegative("WarmupCosineLR", "warmup_min_ratio", warmup_min_ratio));
  RETURN_IF_ERROR(NonNegative("WarmupCosineLR", "cos_min_ratio", cos_min_ratio));
  RETURN_IF_ERROR(AtLeast("WarmupCosineLR", "warmup_num_steps", warmup_num_steps, 0));
  int64_t n = EffectiveWarmup(warmup_num_steps);
  if (total_num_steps <= n)
    return InvalidArgument("WarmupCosineLR.total_num_steps must be > warmup_num_steps (at least 2), got " +
                           std::to_string(total_num_steps) + " <= " + std::to_string(n) +
                           " (the cosine phase divides by their difference)");
  return Status::OK();
}

Status OneCycleParams::Validate() const {
  RETURN_IF_ERROR(NonNegative("OneCycle", "cycle_min_lr", cycle_min_lr));
  RETURN_IF_ERROR(NonNegative("OneCycle", "cycle_max_lr", cycle_max_lr));
  RETURN_IF_ERROR(NonNegative("OneCycle", "decay_lr_rate", decay_lr_rate));
  RETURN_IF_ERROR(AtLeast("OneCycle", "cycle_first_step_size", cycle_first_step_size, 1));
  if (cycle_second_step_size) RETURN_IF_ERROR(AtLeast("OneCycle", "cycle_second_step_size", *cycle_second_step_size, 0));
  RETURN_IF_ERROR(AtLeast("OneCycle", "cycle_first_stair_count", cycle_first_stair_count, 0));
  if (cycle_second_stair_count)
    RETURN_IF_ERROR(AtLeast("OneCycle", "cycle_second_stair_count", *cycle_second_stair_count, 0));
  RETURN_IF_ERROR(AtLeast("OneCycle", "decay_step_size", decay_step_size, 0));
  RETURN_IF_ERROR(NonNegative("OneCycle", "decay_mom_rate", decay_mom_rate));
  if (cycle_momentum) {
    RETURN_IF_ERROR(Momentum("cycle_min_mom", cycle_min_mom));
    RETURN_IF_ERROR(Momentum("cycle_max_mom", cycle_max_mom));
  }
  return Status::OK();
}

Result<LrSchedule> LrSchedule::Constant(double base_lr) {
  RETURN_IF_ERROR(NonNegative("Constant", "lr", base_lr));
  return LrSchedule(ConstantP{base_lr});
}

Result<LrSchedule> LrSchedule::WarmupLR(const WarmupLRParams& p, double base_lr) {
  RETURN_IF_ERROR(p.Validate());
  if (!p.warmup_max_lr) RETURN_IF_ERROR(NonNegative("WarmupLR", "optimizer lr (warmup_max_lr unset)", base_lr));
  return LrSchedule(WarmupP{p.warmup_min_lr, p.warmup_max_lr.value_or(base_lr), EffectiveWarmup(p.warmup_num_steps),
                            p.warmup_type, false, 0});
}

Result<LrSchedule> LrSchedule::WarmupDecayLR(const WarmupDecayLRParams& p) {
  RETURN_IF_ERROR(p.Validate());
  return LrSchedule(WarmupP{p.warmup_min_lr, p.warmup_max_lr, EffectiveWarmup(p.warmup_num_steps), p.warmup_type,
                            true, p.total_num_steps});
}

Result<LrSchedule> LrSchedule::WarmupCosineLR(const WarmupCosineLRParams& p, double base_lr) {
  RETURN_IF_ERROR(p.Validate());
  RETURN_IF_ERROR(NonNegative("WarmupCosineLR", "optimizer lr", base_lr));
  return LrSchedule(CosineP{base_lr, p.warmup_min_ratio, p.cos_min_ratio, EffectiveWarmup(p.warmup_num_steps),
                            p.total_num_steps, p.warmup_type});
}

Result<LrSchedule> LrSchedule::OneCycle(const OneCycleParams& p) {
  RETURN_IF_ERROR(p.Validate());
  return LrSchedule(p);
}

LrScheduleType LrSchedule::type() const {
  if (std::holds_alternative<ConstantP>(p_)) return LrScheduleType::kConstant;
  if (auto* w = std::get_if<WarmupP>(&p_)) return w->decay ? LrScheduleType::kWarmupDecayLR : LrScheduleType::kWarmupLR;
  if (std::holds_alternative<CosineP>(p_)) return LrScheduleType::kWarmupCosineLR;
  return LrScheduleType::kOneCycle;
}

LrValue LrSchedule::At(int64_t it) const {
  LrValue out;
  if (auto* c = std::get_if<ConstantP>(&p_)) {
    out.lr = c->lr;
    return out;
  }
  if (auto* w = std::get_if<WarmupP>(&p_)) {
    if (it < 0) {
      out.lr = w->min_lr;
      return out;
    }
    double gamma;
    if (it < w->warmup) {
      gamma = WarmupFraction(it, w->warmup, w->type);
    } else if (!w->decay) {
      gamma = 1.0;
    } else {
      double den = static_cast<double>(w->total - w->warmup);
      gamma = static_cast<double>(w->total - it) / (den > 1.0 ? den : 1.0);
      if (gamma < 0.0) gamma = 0.0;
    }
    out.lr = w->min_lr + (w->max_lr - w->min_lr) * gamma;
    return out;
  }
  if (auto* c = std::get_if<CosineP>(&p_)) {
    if (it < 0) return out;  // lr 0
    double ratio;
    if (it < c->warmup) {
      ratio = WarmupFraction(it, c->warmup, c->type);
      ratio = c->warmup_min_ratio + ratio * (1.0 - c->warmup_min_ratio);
    } else {
      double s = static_cast<double>(it - c->warmup + 1);
      double t = static_cast<double>(c->total - c->warmup);
      ratio = (1.0 + std::cos(std::numbers::pi * s / t)) / 2.0;
      ratio = c->cos_min_ratio + (1.0 - c->cos_min_ratio) * ratio;
      if (ratio < 0.0) ratio = 0.0;
    }
    out.lr = c->base_lr * ratio;
    return out;
  }
  const OneCycleParams& o = std::get<OneCycleParams>(p_);
  const double first = static_cast<double>(o.cycle_first_step_size);
  const double second = o.cycle_second_step_size ? static_cast<double>(*o.cycle_second_step_size) : first;
  const double total = first + second;
  const double ratio = first / total;
  if (it < 0) {  // _initialize_lr / _initialize_momentum
    out.lr = o.cycle_min_lr;
    if (o.cycle_momentum) {
      out.beta1 = o.cycle_min_mom;
      out.beta2 = 0.99;
    }
    return out;
  }
  if (static_cast<double>(it) < total) {
    double b = static_cast<double>(it + 1);
    double cycle = std::floor(1.0 + b / total);
    double x = 1.0 + b / total - cycle;
    double f = x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
    out.lr = o.cycle_min_lr + (o.cycle_max_lr - o.cycle_min_lr) * f;
    if (o.cycle_momentum) {
      out.beta1 = o.cycle_max_mom - (o.cycle_max_mom - o.cycle_min_mom) * f;
      out.beta2 = 0.99;
    }
    return out;
  }
  const double d = static_cast<double>(it) - total + 1.0;  // decay_batch_iteration
  const bool no_step = o.decay_step_size == 0;
  if (no_step || o.decay_lr_rate == 0.0) {
    out.lr = o.cycle_min_lr;
  } else {
    out.lr = o.cycle_min_lr / (1.0 + o.decay_lr_rate * (d / static_cast<double>(o.decay_step_size)));
  }
  if (o.cycle_momentum) {
    if (no_step || o.decay_mom_rate == 0.0) {
      out.beta1 = o.cycle_max_mom;
    } else {
      out.beta1 = o.cycle_max_mom * (1.0 + o.decay_mom_rate * (d / static_cast<double>(o.decay_step_size)));
    }
    out.beta2 = 0.99;
  }
  return out;
}

}  // namespace strata::optim
