// SPDX-License-Identifier: Apache-2.0
// Learning-rate schedules by DeepSpeed's names and parameters
// (deepspeed/runtime/lr_schedules.py): WarmupLR, WarmupDecayLR,
// WarmupCosineLR, OneCycle, plus a constant rate. Each takes its parameters
// from a small struct whose initializers are DeepSpeed's defaults, with a
// Validate() that names the parameter and the rule. The config's
// "scheduler": {"type": ..., "params": {...}} reaches them through
// optim/lr_schedule_spec.h (the table of types and parameters).
//
// Time is DeepSpeed's `last_batch_iteration` (it): the scheduler's
// constructor runs with it = -1 and sets the optimizer's lr (and, for
// OneCycle, betas); DeepSpeed's engine then calls scheduler.step() (it += 1)
// after every optimizer step that was not skipped for overflow. So the k-th
// applied step (k = 1, 2, ...) runs with At(k - 2): ForStep(k).
//
// The values, with N = max(2, warmup_num_steps) and the warmup fraction
//   w(it) = log(it + 1) / log(N)   (warmup_type "log", the default)
//   w(it) = it / N                 (warmup_type "linear"):
//
// WarmupLR:        it < 0: warmup_min_lr;  it < N: min + (max - min) * w(it);  else max.
//                  warmup_max_lr unset: the optimizer's lr (base_lr).
// WarmupDecayLR:   as WarmupLR until N, then
//                  min + (max - min) * max(0, (total - it) / max(1, total - N)).
// WarmupCosineLR:  lr = base_lr * ratio; it < 0: ratio 0 (so the first step
//                  runs with lr 0, as in DeepSpeed);
//                  it < N: ratio = warmup_min_ratio + (1 - warmup_min_ratio) * w(it);
//                  else with s = it - N + 1, T = total - N:
//                  ratio = max(0, cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * s / T)) / 2)
//                  (past total_num_steps the cosine rises again, as in DeepSpeed).
// OneCycle:        total = first + second step size (second defaults to first),
//                  r = first / total; it < 0: cycle_min_lr (and beta1 = cycle_min_mom);
//                  it < total: with b = it + 1, x = 1 + b/total - floor(1 + b/total),
//                    f = x <= r ? x / r : (x - 1) / (r - 1),
//                    lr = min_lr + (max_lr - min_lr) * f,
//                    beta1 = max_mom - (max_mom - min_mom) * f;
//                  after: d = (it - total + 1) / decay_step_size,
//                    lr = min_lr / (1 + decay_lr_rate * d)      (min_lr if no decay),
//                    beta1 = max_mom * (1 + decay_mom_rate * d)  (max_mom if no decay),
//                  "no decay" when decay_step_size == 0 or the rate is 0.
//                  With cycle_momentum DeepSpeed also sets beta2 = 0.99; so
//                  does LrValue. The stair counts are accepted and unused, as
//                  in DeepSpeed. decay_mom_rate > 0 grows beta1 without bound
//                  (DeepSpeed does not cap it); once it reaches 1 the Adam
//                  step rejects it (AdamHyper::Validate).
// Constant:        lr at every step (no "scheduler" section).
//
// Thread-safety: an LrSchedule is an immutable value.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>

#include "base/status.h"

namespace strata::optim {

enum class LrScheduleType : uint8_t { kConstant, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR, kOneCycle };
enum class WarmupType : uint8_t { kLog, kLinear };

// "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "Constant";
// InvalidArgument naming the allowed names otherwise.
Result<LrScheduleType> ParseLrScheduleType(std::string_view name);
std::string_view LrScheduleTypeName(LrScheduleType t);
// "log", "linear" (DeepSpeed falls back to log on anything else with a
// warning; a typo is an error here).
Result<WarmupType> ParseWarmupType(std::string_view name);
std::string_view WarmupTypeName(WarmupType t);

struct WarmupLRParams {
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr;  // unset: the optimizer's lr
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  // warmup_min_lr/max finite and >= 0, warmup_num_steps >= 0.
  Status Validate() const;
};

struct WarmupDecayLRParams {
  int64_t total_num_steps = 0;  // required
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  // as WarmupLR, and total_num_steps >= 1.
  Status Validate() const;
};

struct WarmupCosineLRParams {
  int64_t total_num_steps = 0;  // required
  double warmup_min_ratio = 0.0;
  int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 0.0001;
  WarmupType warmup_type = WarmupType::kLog;
  // ratios finite and >= 0, warmup_num_steps >= 0, and
  // total_num_steps > max(2, warmup_num_steps) (DeepSpeed divides by
  // total - warmup).
  Status Validate() const;
};

struct OneCycleParams {
  double cycle_min_lr = 0.0;  // required
  double cycle_max_lr = 0.0;  // required
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  std::optional<int64_t> cycle_second_step_size;  // unset: cycle_first_step_size
  int64_t cycle_first_stair_count = 0;            // unused (as in DeepSpeed)
  std::optional<int64_t> cycle_second_stair_count;  // unused
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
  // lrs finite and >= 0, cycle_first_step_size >= 1, cycle_second_step_size
  // >= 0, stair counts >= 0, decay_step_size >= 0, decay rates finite and
  // >= 0, momenta in [0, 1).
  Status Validate() const;
};

// What a schedule sets for one step. beta1/beta2 only when the schedule
// drives them (OneCycle with cycle_momentum).
struct LrValue {
  double lr = 0.0;
  std::optional<double> beta1;
  std::optional<double> beta2;
};

class LrSchedule {
 public:
  // `base_lr` is the optimizer's lr ("optimizer": {"params": {"lr": ...}}),
  // used by Constant, WarmupLR without warmup_max_lr and WarmupCosineLR.
  // InvalidArgument from the params' Validate or for a bad base_lr.
  static Result<LrSchedule> Constant(double base_lr);
  static Result<LrSchedule> WarmupLR(const WarmupLRParams& p, double base_lr);
  static Result<LrSchedule> WarmupDecayLR(const WarmupDecayLRParams& p);
  static Result<LrSchedule> WarmupCosineLR(const WarmupCosineLRParams& p, double base_lr);
  static Result<LrSchedule> OneCycle(const OneCycleParams& p);

  LrScheduleType type() const;

  // DeepSpeed's get_lr() (and OneCycle's get_mom()) with the scheduler at
  // last_batch_iteration = it; any it < 0 gives what the constructor sets.
  LrValue At(int64_t last_batch_iteration) const;
  // The values of the k-th applied optimizer step, k >= 1: At(k - 2).
  LrValue ForStep(int64_t k) const { return At(k - 2); }

 private:
  struct ConstantP {
    double lr;
  };
  struct WarmupP {
    double min_lr, max_lr;
    int64_t warmup;  // max(2, warmup_num_steps)
    WarmupType type;
    bool decay;
    int64_t total;
  };
  struct CosineP {
    double base_lr, warmup_min_ratio, cos_min_ratio;
    int64_t warmup, total;
    WarmupType type;
  };
  using Params = std::variant<ConstantP, WarmupP, CosineP, OneCycleParams>;
  explicit LrSchedule(Params p) : p_(std::move(p)) {}
  Params p_;
};

}  // namespace strata::optim
