// SPDX-License-Identifier: Apache-2.0
// DeepSpeed's learning-rate schedulers as a config names them
// ("scheduler": {"type": ..., "params": {...}}), in one table: for each type
// its parameters with their kind, default and whether required. The config
// parser (engine/config.cc) checks a config against the table; MakeLrSchedule
// builds the schedule from it. The math is optim/lr_schedule.h's; the fixed
// defaults are its parameter structs' initializers (WarmupLRParams, ...),
// which the table shows and MakeLrSchedule uses.
//
// Thread-safety: the table is immutable; every function here may be called
// from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/status.h"
#include "optim/lr_schedule.h"

namespace strata::optim {

// One parameter's value as the config gives it. A number keeps JSON's kind
// (an integer: int64_t, or uint64_t beyond its range; else double) so that
// the config is written back as it was read; MakeLrSchedule reads every
// number as a double, and a step count as that double truncated toward zero.
using LrParamValue = std::variant<bool, int64_t, uint64_t, double, std::string>;
// Parameter values by name.
using LrParamValues = std::map<std::string, LrParamValue, std::less<>>;

enum class LrParamKind : uint8_t {
  kNumber,      // a number: an lr, a ratio, a rate
  kSteps,       // a step count: a number, truncated toward zero
  kBool,        // true or false
  kWarmupType,  // "log" or "linear" (ParseWarmupType)
};

enum class LrParamNeed : uint8_t {
  kOptional,  // the default applies when it is left out
  kRequired,  // a config must give it (DeepSpeed's constructor has no default)
  kUnused,    // accepted, as DeepSpeed accepts it, and without effect in strata
};

// What a parameter left out stands for.
enum class LrParamDefault : uint8_t {
  kValue,        // LrParamSpec::value
  kOptimizerLr,  // the optimizer's lr ("optimizer": {"params": {"lr": ...}})
  kTotalSteps,   // the run's optimizer steps (MakeLrSchedule's total_steps)
  kSameAs,       // the value of parameter LrParamSpec::same_as
};

struct LrParamSpec {
  std::string_view name;
  LrParamKind kind;
  LrParamNeed need;
  // Left out (for kRequired: left out of values not read from a config,
  // which the parser rejects), the parameter is `value`, or what `from` says.
  LrParamDefault from = LrParamDefault::kValue;
  LrParamValue value = {};
  std::string_view same_as = {};
};

struct LrScheduleSpec {
  LrScheduleType type;
  std::string_view name;            // DeepSpeed's type name, LrScheduleTypeName(type)
  std::vector<LrParamSpec> params;  // in the order a config's are checked
  // The spec of `name`, or nullptr.
  const LrParamSpec* Find(std::string_view name) const;
};

// WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, in that order (the
// order error messages list them in). The constant rate has no entry: it is
// the absence of a "scheduler" section.
const std::vector<LrScheduleSpec>& LrScheduleSpecs();
// The entry for DeepSpeed's type name `name` (exact spelling), or nullptr.
const LrScheduleSpec* FindLrScheduleSpec(std::string_view name);

// The schedule a config's "scheduler" section gives: `type` is "" (the
// constant rate `base_lr`) or a name in LrScheduleSpecs(); `params` are that
// type's parameters, those left out taking their default; `base_lr` is the
// optimizer's lr; `total_steps` the run's optimizer steps. InvalidArgument for
// an unknown type, a parameter the type does not have or of the wrong kind,
// or what the schedule's Validate rejects (naming the parameter); `context`
// (e.g. the config file's name) begins every message.
Result<LrSchedule> MakeLrSchedule(std::string_view type, const LrParamValues& params, double base_lr,
                                  int64_t total_steps, std::string_view context = {});

}  // namespace strata::optim
