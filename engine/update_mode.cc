// SPDX-License-Identifier: Apache-2.0
#include "engine/update_mode.h"

#include <cstdio>

#include "base/bytes.h"

namespace strata {

bool DynamicLossScale(const Config& c) { return c.fp16.enabled && c.fp16.loss_scale == 0; }

bool WantsSpeculativeState(const Config& c, const TrainOptions& o) {
  return o.speculative_update && !o.optimizer_after_backward && c.gradient_clipping > 0 && !DynamicLossScale(c);
}

std::string ConfigNumber(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  std::string t = b;
  if (t.find_first_of(".e") == std::string::npos) t += ".0";
  return t;
}

UpdateMode UpdateModeFor(const Config& c, const Plan& p, int64_t n_shards, const TrainOptions& o,
                         uint64_t host_budget) {
  const auto num = ConfigNumber;
  if (p.optimizer == TierKind::kGpu || p.optimizer_gpu_shards >= n_shards)
    return {false, false, "after backward (the optimizer state is on the GPU)"};
  if (o.optimizer_after_backward) return {false, false, "after backward (asked for: --optimizer-after-backward)"};
  if (c.gradient_clipping > 0) {
    const std::string clip = "gradient_clipping " + num(c.gradient_clipping);
    if (DynamicLossScale(c))
      return {false, false,
              "after backward (" + clip + " needs the global norm, and fp16's dynamic loss scale skips the step on "
              "overflow)"};
    if (p.speculative_fits)
      return {false, true,
              "during backward, speculative (" + clip +
                  ": updates assume the norm is within it and are redone when it is not)"};
    std::string why = "after backward (" + clip + " needs the global norm; ";
    if (!o.speculative_update) {
      why += "speculation is off";
    } else if (p.optimizer != TierKind::kHost) {
      why += "no speculation with the optimizer state on NVMe: its second copy would be written there too";
    } else {
      const uint64_t left = host_budget > p.host_total ? host_budget - p.host_total : 0;
      why += "speculating would need " + FormatBytes(p.speculative_bytes) +
             " more host memory for a second master/m/v, and the plan leaves " + FormatBytes(left) + " of the " +
             FormatBytes(host_budget) + " host budget";
    }
    return {false, false, why + ")"};
  }
  if (DynamicLossScale(c)) return {false, false, "after backward (fp16's dynamic loss scale skips the step on overflow)"};
  const std::string what = c.fp16.enabled ? "fp16, static loss scale " + num(c.fp16.loss_scale) : c.precision();
  return {true, false, "during backward (no clipping, " + what + ")"};
}

}  // namespace strata
