// SPDX-License-Identifier: Apache-2.0
#include "optim/grad_clip.h"

#include <cmath>
#include <limits>
#include <string>

namespace strata::optim {

double GlobalGradNorm(const GradStats& stats, double loss_scale) {
  if (stats.nonfinite != 0 || !std::isfinite(stats.sum_sq))
    return std::numeric_limits<double>::infinity();
  return std::sqrt(stats.sum_sq) / loss_scale;
}

double ClipCoefficient(double norm, double max_norm) {
  if (!(max_norm > 0.0) || !std::isfinite(norm)) return 1.0;
  double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

double GradMultiplier(double loss_scale, double clip_coef) { return clip_coef / loss_scale; }

Status ValidateGradientClipping(double gradient_clipping) {
  if (!std::isfinite(gradient_clipping))
    return InvalidArgument("gradient_clipping must be a finite number (<= 0 disables clipping), got " +
                           std::to_string(gradient_clipping));
  return Status::OK();
}

}  // namespace strata::optim
