// SPDX-License-Identifier: Apache-2.0
#include "optim/lr_schedule_spec.h"

#include <string>

namespace strata::optim {

namespace {

using enum LrParamKind;
using enum LrParamNeed;

// DeepSpeed's last_batch_iteration starts a schedule at a given step (its
// resume position); strata's position is the count of optimizer steps
// applied, which a --resume restores.
LrParamSpec LastBatchIteration() {
  return {.name = "last_batch_iteration", .kind = kSteps, .need = kUnused, .value = int64_t{-1}};
}

std::string TypeNames() {
  std::string s;
  for (const LrScheduleSpec& spec : LrScheduleSpecs()) s += (s.empty() ? "" : ", ") + std::string(spec.name);
  return s;
}

bool IsNumber(const LrParamValue& v) {
  return std::holds_alternative<int64_t>(v) || std::holds_alternative<uint64_t>(v) ||
         std::holds_alternative<double>(v);
}

double ToDouble(const LrParamValue& v) {
  if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  if (const uint64_t* u = std::get_if<uint64_t>(&v)) return static_cast<double>(*u);
  return std::get<double>(v);
}

// InvalidArgument unless every value in `given` is a parameter of `spec` of
// its kind (what the config parser checks; values built in code may not be).
Status CheckKinds(const LrScheduleSpec& spec, const LrParamValues& given) {
  for (const auto& [name, v] : given) {
    const std::string key = "scheduler.params." + name;
    const LrParamSpec* p = spec.Find(name);
    if (!p) return InvalidArgument(key + ": not a parameter of " + std::string(spec.name));
    switch (p->kind) {
      case kNumber:
      case kSteps:
        if (!IsNumber(v)) return InvalidArgument(key + ": must be a number");
        break;
      case kBool:
        if (!std::holds_alternative<bool>(v)) return InvalidArgument(key + ": must be true or false");
        break;
      case kWarmupType: {
        const std::string* s = std::get_if<std::string>(&v);
        if (!s) return InvalidArgument(key + ": must be \"log\" or \"linear\"");
        RETURN_IF_ERROR(ParseWarmupType(*s).status().WithContext(key));
        break;
      }
    }
  }
  return Status::OK();
}

// A type's parameter values as Build reads them: each given one, else its
// default. A name the spec lacks, or a default that is not a value, is a bug
// in Build: the first sticks in status(). Refers to the spec and the values
// (not owned); one thread.
class Args {
 public:
  Args(const LrScheduleSpec& spec, const LrParamValues& given, int64_t total_steps)
      : spec_(spec), given_(given), total_steps_(total_steps) {}

  bool Given(std::string_view name) const { return given_.find(name) != given_.end(); }
  double Number(std::string_view name) {
    const LrParamValue* v = Get(name);
    return v ? ToDouble(*v) : 0.0;
  }
  int64_t Steps(std::string_view name) {
    const LrParamSpec* p = spec_.Find(name);
    if (p && p->from == LrParamDefault::kTotalSteps && !Given(name)) return total_steps_;
    return static_cast<int64_t>(Number(name));
  }
  bool Flag(std::string_view name) {
    const LrParamValue* v = Get(name);
    return v && std::get<bool>(*v);
  }
  WarmupType Warmup(std::string_view name) {
    const LrParamValue* v = Get(name);
    if (!v) return WarmupType::kLog;
    Result<WarmupType> t = ParseWarmupType(std::get<std::string>(*v));
    if (!t.ok()) Stick(t.status());
    return t.value_or(WarmupType::kLog);
  }
  const Status& status() const { return status_; }

 private:
  const LrParamValue* Get(std::string_view name) {
    if (auto it = given_.find(name); it != given_.end()) return &it->second;
    const LrParamSpec* p = spec_.Find(name);
    if (p && p->from == LrParamDefault::kValue) return &p->value;
    Stick(Internal("MakeLrSchedule reads " + std::string(spec_.name) + "." + std::string(name) +
                   ", which has no default value in the table"));
    return nullptr;
  }
  void Stick(Status s) {
    if (status_.ok()) status_ = std::move(s);
  }

  const LrScheduleSpec& spec_;
  const LrParamValues& given_;
  const int64_t total_steps_;
  Status status_;
};

// The schedule of `spec`'s type from values CheckKinds accepts.
Result<LrSchedule> Build(const LrScheduleSpec& spec, const LrParamValues& given, double base_lr,
                         int64_t total_steps) {
  Args a(spec, given, total_steps);
  switch (spec.type) {
    case LrScheduleType::kWarmupLR: {
      WarmupLRParams p;
      p.warmup_min_lr = a.Number("warmup_min_lr");
      if (a.Given("warmup_max_lr")) p.warmup_max_lr = a.Number("warmup_max_lr");  // else the optimizer's lr
      p.warmup_num_steps = a.Steps("warmup_num_steps");
      p.warmup_type = a.Warmup("warmup_type");
      RETURN_IF_ERROR(a.status());
      return LrSchedule::WarmupLR(p, base_lr);
    }
    case LrScheduleType::kWarmupDecayLR: {
      WarmupDecayLRParams p;
      p.total_num_steps = a.Steps("total_num_steps");
      p.warmup_min_lr = a.Number("warmup_min_lr");
      p.warmup_max_lr = a.Number("warmup_max_lr");
      p.warmup_num_steps = a.Steps("warmup_num_steps");
      p.warmup_type = a.Warmup("warmup_type");
      RETURN_IF_ERROR(a.status());
      return LrSchedule::WarmupDecayLR(p);
    }
    case LrScheduleType::kWarmupCosineLR: {
      WarmupCosineLRParams p;
      p.total_num_steps = a.Steps("total_num_steps");
      p.warmup_min_ratio = a.Number("warmup_min_ratio");
      p.warmup_num_steps = a.Steps("warmup_num_steps");
      p.cos_min_ratio = a.Number("cos_min_ratio");
      p.warmup_type = a.Warmup("warmup_type");
      RETURN_IF_ERROR(a.status());
      return LrSchedule::WarmupCosineLR(p, base_lr);
    }
    case LrScheduleType::kOneCycle: {
      OneCycleParams p;
      p.cycle_min_lr = a.Number("cycle_min_lr");
      p.cycle_max_lr = a.Number("cycle_max_lr");
      p.decay_lr_rate = a.Number("decay_lr_rate");
      p.cycle_first_step_size = a.Steps("cycle_first_step_size");
      // else as long as the first half
      if (a.Given("cycle_second_step_size")) p.cycle_second_step_size = a.Steps("cycle_second_step_size");
      p.decay_step_size = a.Steps("decay_step_size");
      p.cycle_momentum = a.Flag("cycle_momentum");
      p.cycle_min_mom = a.Number("cycle_min_mom");
      p.cycle_max_mom = a.Number("cycle_max_mom");
      p.decay_mom_rate = a.Number("decay_mom_rate");
      RETURN_IF_ERROR(a.status());
      return LrSchedule::OneCycle(p);
    }
    case LrScheduleType::kConstant:
      break;
  }
  return Internal("the scheduler table lists " + std::string(spec.name) + ", which MakeLrSchedule does not build");
}

}  // namespace

const LrParamSpec* LrScheduleSpec::Find(std::string_view name) const {
  for (const LrParamSpec& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

const std::vector<LrScheduleSpec>& LrScheduleSpecs() {
  // The fixed defaults are the parameter structs' (DeepSpeed's).
  static const std::vector<LrScheduleSpec> specs = [] {
    const WarmupLRParams wl;
    const WarmupDecayLRParams wd;
    const WarmupCosineLRParams wc;
    const OneCycleParams oc;
    auto warmup_type = [](WarmupType t) { return LrParamValue(std::string(WarmupTypeName(t))); };
    return std::vector<LrScheduleSpec>{
        {LrScheduleType::kWarmupLR,
         "WarmupLR",
         {
             {.name = "warmup_min_lr", .kind = kNumber, .need = kOptional, .value = wl.warmup_min_lr},
             {.name = "warmup_max_lr", .kind = kNumber, .need = kOptional, .from = LrParamDefault::kOptimizerLr},
             {.name = "warmup_num_steps", .kind = kSteps, .need = kOptional, .value = wl.warmup_num_steps},
             {.name = "warmup_type", .kind = kWarmupType, .need = kOptional, .value = warmup_type(wl.warmup_type)},
             LastBatchIteration(),
         }},
        {LrScheduleType::kWarmupDecayLR,
         "WarmupDecayLR",
         {
             {.name = "warmup_min_lr", .kind = kNumber, .need = kOptional, .value = wd.warmup_min_lr},
             {.name = "warmup_max_lr", .kind = kNumber, .need = kOptional, .value = wd.warmup_max_lr},
             {.name = "warmup_num_steps", .kind = kSteps, .need = kOptional, .value = wd.warmup_num_steps},
             {.name = "warmup_type", .kind = kWarmupType, .need = kOptional, .value = warmup_type(wd.warmup_type)},
             {.name = "total_num_steps", .kind = kSteps, .need = kRequired, .from = LrParamDefault::kTotalSteps},
             LastBatchIteration(),
         }},
        {LrScheduleType::kWarmupCosineLR,
         "WarmupCosineLR",
         {
             {.name = "total_num_steps", .kind = kSteps, .need = kRequired, .from = LrParamDefault::kTotalSteps},
             {.name = "warmup_min_ratio", .kind = kNumber, .need = kOptional, .value = wc.warmup_min_ratio},
             {.name = "warmup_num_steps", .kind = kSteps, .need = kOptional, .value = wc.warmup_num_steps},
             {.name = "cos_min_ratio", .kind = kNumber, .need = kOptional, .value = wc.cos_min_ratio},
             {.name = "warmup_type", .kind = kWarmupType, .need = kOptional, .value = warmup_type(wc.warmup_type)},
             LastBatchIteration(),
         }},
        {LrScheduleType::kOneCycle,
         "OneCycle",
         {
             {.name = "cycle_min_lr", .kind = kNumber, .need = kRequired, .value = oc.cycle_min_lr},
             {.name = "cycle_max_lr", .kind = kNumber, .need = kRequired, .value = oc.cycle_max_lr},
             {.name = "decay_lr_rate", .kind = kNumber, .need = kOptional, .value = oc.decay_lr_rate},
             {.name = "cycle_first_step_size", .kind = kSteps, .need = kOptional, .value = oc.cycle_first_step_size},
             {.name = "cycle_second_step_size",
              .kind = kSteps,
              .need = kOptional,
              .from = LrParamDefault::kSameAs,
              .same_as = "cycle_first_step_size"},
             // The stair counts are accepted and unused, as in DeepSpeed.
             {.name = "cycle_first_stair_count", .kind = kSteps, .need = kUnused, .value = oc.cycle_first_stair_count},
             {.name = "cycle_second_stair_count",
              .kind = kSteps,
              .need = kUnused,
              .from = LrParamDefault::kSameAs,
              .same_as = "cycle_first_stair_count"},
             {.name = "decay_step_size", .kind = kSteps, .need = kOptional, .value = oc.decay_step_size},
             {.name = "cycle_momentum", .kind = kBool, .need = kOptional, .value = oc.cycle_momentum},
             {.name = "cycle_min_mom", .kind = kNumber, .need = kOptional, .value = oc.cycle_min_mom},
             {.name = "cycle_max_mom", .kind = kNumber, .need = kOptional, .value = oc.cycle_max_mom},
             {.name = "decay_mom_rate", .kind = kNumber, .need = kOptional, .value = oc.decay_mom_rate},
             LastBatchIteration(),
         }},
    };
  }();
  return specs;
}

const LrScheduleSpec* FindLrScheduleSpec(std::string_view name) {
  for (const LrScheduleSpec& s : LrScheduleSpecs())
    if (s.name == name) return &s;
  return nullptr;
}

Result<LrSchedule> MakeLrSchedule(std::string_view type, const LrParamValues& params, double base_lr,
                                  int64_t total_steps, std::string_view context) {
  const LrScheduleSpec* spec = FindLrScheduleSpec(type);
  if (!type.empty() && !spec)
    return InvalidArgument("scheduler.type \"" + std::string(type) + "\" is not implemented (allowed: " + TypeNames() +
                           ")")
        .WithContext(context);
  if (spec) RETURN_IF_ERROR(CheckKinds(*spec, params).WithContext(context));
  Result<LrSchedule> r = spec ? Build(*spec, params, base_lr, total_steps) : LrSchedule::Constant(base_lr);
  if (!r.ok()) return r.status().WithContext("scheduler (" + std::string(type) + ")").WithContext(context);
  return r;
}

}  // namespace strata::optim
