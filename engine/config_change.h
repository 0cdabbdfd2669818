// SPDX-License-Identifier: Apache-2.0
// What a resume changes: the config a checkpoint recorded (its manifest's
// `config`, ConfigToJson's) against the run's, key by key, each change
// classified by whether the resumed run still computes the uninterrupted
// run's bits.
//
// Changes that keep the bits: placement and tuning (zero_optimization, aio,
// activation_checkpointing), logging (steps_per_print, wall_clock_breakdown),
// evaluation (trainer.eval_interval, trainer.eval_batches), the trainer's
// schedule and GPU-assisted optimizer (same bits by design), the run's
// length (trainer.steps) and the initialization seed (a resume restores the
// weights). Every other change (batch sizes, optimizer, scheduler, clipping,
// precision, loss scaling, data, model) breaks them.
//
// Thread-safety: free functions.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

struct ConfigChange {
  std::string key;             // "optimizer.params.lr"
  std::string before, after;   // JSON text, bounded; "(absent)" for a key one side lacks
  bool breaks_identity = false;
};

// Every leaf (or array) of `recorded` and `now` that differs, in key order.
std::vector<ConfigChange> ConfigChanges(const nlohmann::json& recorded, const nlohmann::json& now);

// "optimizer.params.lr: 0.001 -> 0.002" (with " (keeps the bits)" where it does).
std::string DescribeChange(const ConfigChange& c);

}  // namespace strata
