// SPDX-License-Identifier: Apache-2.0
// Initialization of a unit's fp32 master weights from scratch, by the rules
// the family's spec gives each parameter (models/model_spec.h ParamInit).
//
// Deterministic: each parameter draws from its own stream seeded by (seed,
// its Hugging Face name) — xoshiro256** seeded by splitmix64, Box-Muller
// normals — so the values do not depend on the placement, the backend, the
// order units are initialized in, or the standard library. Padding is zero.
//
// Thread-safety: a free function (units may be initialized concurrently).
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "models/model_spec.h"

namespace strata::models {

// Unit `unit`'s buffer (units[unit].numel fp32 values).
Result<std::vector<float>> InitUnit(const ModelSpec& spec, int unit, uint64_t seed);

}  // namespace strata::models
