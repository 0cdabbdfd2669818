// SPDX-License-Identifier: Apache-2.0
// Loss scaling for fp16 training, with DeepSpeed's semantics
// (deepspeed/runtime/fp16/loss_scaler.py: LossScaler, DynamicLossScaler).
//
// DeepSpeed config (the "fp16" section) -> LossScalerConfig:
//   loss_scale           0 = dynamic scaling (default), > 0 = that static scale
//   initial_scale_power  dynamic: the first scale is 2^initial_scale_power (default 16)
//   loss_scale_window    dynamic: grow the scale after this many steps without overflow (1000)
//   hysteresis           dynamic: overflows tolerated before the scale drops (2)
//   consecutive_hysteresis  dynamic: refill the hysteresis on every good step (false)
//   min_loss_scale       dynamic: the scale never drops below this (1)
// DeepSpeed quirk, kept: when the fp16 section names none of
// initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis,
// min_loss_scale, DeepSpeed (runtime/config.py get_dynamic_loss_scale_args)
// passes nothing and DynamicLossScaler's own defaults apply instead: scale
// 2^32, window 1000, hysteresis 1, min 1. LossScalerConfig::DeepSpeedImplicit()
// is that configuration; the engine picks it when the keys are absent.
//
// Dynamic scaling, per step (DynamicLossScaler.update_scale), with `overflow`
// = any non-finite gradient value:
//   overflow:    if hysteresis == 1 or cur_hysteresis == 1:
//                   at min scale -> error (DeepSpeed raises; here Update returns
//                   FailedPrecondition, unless raise_error_at_min_scale is false)
//                   else scale = max(scale / 2, min_loss_scale)
//                else cur_hysteresis -= 1
//                last_overflow_iter = iter
//   no overflow: if consecutive_hysteresis: cur_hysteresis = hysteresis
//                if (iter - last_overflow_iter) % window == 0:
//                   if not consecutive_hysteresis: cur_hysteresis = hysteresis
//                   scale *= 2
//   iter += 1
// The step is skipped on overflow (the caller's job: nothing of the
// optimizer state may change, see optim/cpu_adam.h). With a static scale
// DeepSpeed neither checks for overflow nor skips: Update does nothing.
// bf16 training uses no loss scaling (scale 1, DeepSpeed likewise).
//
// Thread-safety: a LossScaler is a plain value; one thread at a time.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace strata::optim {

struct LossScalerConfig {
  double loss_scale = 0.0;  // 0: dynamic; > 0: static scale
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
  // Not DeepSpeed config keys (constructor arguments there), kept for fidelity.
  double scale_factor = 2.0;
  bool raise_error_at_min_scale = true;

  // DynamicLossScaler() with no arguments: what DeepSpeed runs when the fp16
  // section has none of the dynamic keys (see above).
  static LossScalerConfig DeepSpeedImplicit();

  bool dynamic() const { return loss_scale == 0.0; }
  // InvalidArgument naming the key and the rule: loss_scale finite and >= 0,
  // initial_scale_power in [0, 127] (2^power finite in fp32),
  // loss_scale_window >= 1, hysteresis >= 1, min_loss_scale finite and > 0,
  // scale_factor finite and > 1.
  Status Validate() const;
};

class LossScaler {
 public:
  // The state DeepSpeed keeps (for checkpoints).
  struct State {
    double cur_scale = 1.0;
    int64_t cur_iter = 0;
    int64_t last_overflow_iter = -1;
    int cur_hysteresis = 1;
  };

  static Result<LossScaler> Create(const LossScalerConfig& config);

  double scale() const { return state_.cur_scale; }
  bool dynamic() const { return config_.dynamic(); }
  const LossScalerConfig& config() const { return config_; }
  const State& state() const { return state_; }
  // Restores a checkpointed state: InvalidArgument if the scale is not a
  // finite positive number, the hysteresis is out of [1, hysteresis] (dynamic)
  // or not -1 <= last_overflow_iter < cur_iter.
  Status Restore(const State& s);

  // Records one step's outcome and adjusts the scale (see above). For a
  // dynamic scaler an overflow means the caller skips the step. Returns
  // FailedPrecondition when an overflow happens at min_loss_scale and
  // raise_error_at_min_scale is set (DeepSpeed stops the run there); the state
  // is left unchanged then.
  Status Update(bool overflow);

 private:
  explicit LossScaler(const LossScalerConfig& c) : config_(c) {}
  LossScalerConfig config_;
  State state_;
};

}  // namespace strata::optim
