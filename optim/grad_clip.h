// SPDX-License-Identifier: Apache-2.0
// Gradient clipping by global norm, and the one multiplier the Adam pass
// applies to every gradient value (1/loss_scale x clip coefficient).
//
// The flow of a step (the engine's job; this file gives the pieces):
//   1. for each gradient shard, in a fixed order: stats.Merge(
//        cpu_adam.ComputeGradStats(shard))     sum of squares + non-finite count
//   2. overflow = stats.nonfinite > 0          (dynamic loss scaling: skip the
//                                               step, LossScaler::Update(true))
//   3. norm = GlobalGradNorm(stats, loss_scale)
//      coef = ClipCoefficient(norm, gradient_clipping)
//   4. every shard: CpuAdam::Step(..., {.grad_scale = GradMultiplier(loss_scale, coef)})
//
// Clip coefficient, as the two references define it (the same value up to
// one rounding):
//   PyTorch clip_grad_norm_: coef = min(1, max_norm / (total_norm + 1e-6))
//   DeepSpeed (ZeRO unscale_and_clip_grads): clip = (norm/scale + 1e-6) / max_norm,
//     and when clip > 1 the gradients are divided by clip * loss_scale
//     instead of loss_scale.
// Here: coef = max_norm / (norm + 1e-6) when that is < 1, else 1, computed in
// double. gradient_clipping <= 0 means no clipping (DeepSpeed's default 0.0).
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace strata::optim {

// What the gradient scan of a shard (CpuAdam::ComputeGradStats) finds.
struct GradStats {
  double sum_sq = 0.0;     // sum of g*g over the values as stored (not unscaled), in fp64
  uint64_t nonfinite = 0;  // values that are +-Inf or NaN
  uint64_t count = 0;      // values scanned

  // Accumulates another shard. Floating-point addition is not associative:
  // merge shards in a fixed order to get the same norm every run.
  void Merge(const GradStats& o) {
    sum_sq += o.sum_sq;
    nonfinite += o.nonfinite;
    count += o.count;
  }
  bool overflow() const { return nonfinite != 0; }
};

// The L2 norm of the unscaled gradient: sqrt(sum_sq) / loss_scale.
// +Inf when there are non-finite values or the sum overflowed.
double GlobalGradNorm(const GradStats& stats, double loss_scale);

// min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (no clipping) or the
// norm is not finite (the step is skipped then anyway).
double ClipCoefficient(double norm, double max_norm);

// The gradient multiplier for the Adam pass: clip_coef / loss_scale, as a
// double (MakeAdamCoefficients rounds it to fp32 once).
double GradMultiplier(double loss_scale, double clip_coef);

// InvalidArgument naming `gradient_clipping` unless it is finite (any value
// <= 0 disables clipping, as in DeepSpeed).
Status ValidateGradientClipping(double gradient_clipping);

}  // namespace strata::optim
