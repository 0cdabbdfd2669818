// SPDX-License-Identifier: Apache-2.0
// When the offloaded optimizer state is updated, and why: after the
// backward, during it, or during it on speculation (engine/trainer.h's
// header comment has the three modes). Decided once per run, from the config
// and the plan, before anything is allocated; the reason text is what the
// plan table, --dry-run and the log print.
//
// The exact update of a shard needs its final gradient and the step's
// gradient multiplier; that multiplier is GradMultiplier(scale, 1) before the
// backward ends unless gradient clipping needs the global norm or a dynamic
// loss scale may skip the step on overflow (which must leave every shard
// untouched). Then the shards are updated during the backward, each as its
// gradient is final; else after it. With gradient clipping alone the update
// may still run during the backward on speculation that the clip coefficient
// will be 1, into a second master/m/v on the host, if the plan has room for
// it (PlanInputs::speculative_state). With every shard's state on the GPU
// (the GPU Adam, at device speed) there is nothing worth moving into the
// backward.
//
// Thread-safety: free functions.
#pragma once

#include <cstdint>
#include <string>

#include "engine/config.h"
#include "engine/planner.h"
#include "engine/train_options.h"

namespace strata {

struct UpdateMode {
  bool during_backward = false;  // every step's update runs during the backward (no clipping)
  bool speculative = false;      // with clipping: steps after one within the threshold speculate
  std::string why;               // "during backward (no clipping, bf16)", ...
};

// fp16 with a dynamic loss scale (loss_scale 0).
bool DynamicLossScale(const Config& c);

// Whether the plan should count the speculative update's second set: the
// update would run after the backward only because of gradient clipping.
bool WantsSpeculativeState(const Config& c, const TrainOptions& o);

// The mode for `plan` (of `n_shards` shards) within `host_budget`.
UpdateMode UpdateModeFor(const Config& c, const Plan& plan, int64_t n_shards, const TrainOptions& o,
                         uint64_t host_budget);

// A config value as the reasons quote it: 1.0, 0.5, 128.0.
std::string ConfigNumber(double v);

}  // namespace strata
