// SPDX-License-Identifier: Apache-2.0
#include "engine/config_auto.h"

#include <cmath>
#include <initializer_list>
#include <optional>
#include <utility>

namespace strata::config_internal {

namespace {

constexpr double kBig = 1e15;

// The trainer section's TrainingArguments, as given (absent: nullopt).
struct HfArgs {
  std::optional<int64_t> micro, accum, warmup_steps;
  std::optional<double> lr, beta1, beta2, eps, weight_decay, max_grad_norm, warmup_ratio;
  std::optional<bool> bf16, fp16;
};

// Reads them with the reader's checks; errors are recorded in `ctx`.
HfArgs ReadHfArgs(const json& j, Ctx* ctx) {
  HfArgs a;
  auto t = j.find("trainer");
  if (t == j.end() || !t->is_object()) return a;  // the reader reports a trainer that is no object
  Obj o(*t, "trainer", ctx);
  auto integer = [&](const char* key, std::optional<int64_t>* out, double lo) {
    int64_t v = 0;
    if (o.Has(key) && o.Int(key, &v, lo, kBig).ok()) *out = v;
  };
  auto real = [&](const char* key, std::optional<double>* out, double lo, double hi, bool open_below = false) {
    double v = 0;
    if (o.Has(key) && o.Double(key, &v, lo, hi, open_below).ok()) *out = v;
  };
  auto flag = [&](const char* key, std::optional<bool>* out) {
    bool v = false;
    if (o.Has(key) && o.Bool(key, &v).ok()) *out = v;
  };
  integer("per_device_train_batch_size", &a.micro, 1);
  integer("gradient_accumulation_steps", &a.accum, 1);
  real("learning_rate", &a.lr, 0, 10);
  real("adam_beta1", &a.beta1, 0, 0.999999);
  real("adam_beta2", &a.beta2, 0, 0.999999);
  real("adam_epsilon", &a.eps, 0, 1, true);
  real("weight_decay", &a.weight_decay, 0, 10);
  real("max_grad_norm", &a.max_grad_norm, 0, 1e30);
  integer("warmup_steps", &a.warmup_steps, 0);
  real("warmup_ratio", &a.warmup_ratio, 0, 1);
  flag("bf16", &a.bf16);
  flag("fp16", &a.fp16);
  return a;
}

json* Find(json* j, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    if (!j->is_object()) return nullptr;
    auto it = j->find(k);
    if (it == j->end()) return nullptr;
    j = &*it;
  }
  return j;
}

bool IsAuto(const json* v) { return v && v->is_string() && v->get_ref<const std::string&>() == "auto"; }

// Equal as the config means them: numbers by value (5e8 == 500000000).
bool Same(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!Same(a[i], b[i])) return false;
    return true;
  }
  return a == b;
}

// The run's steps: --steps, else trainer.steps when it is a valid count
// (the reader reports one that is not), else the trainer's default.
int64_t RunSteps(const json& j, const ConfigSources& s) {
  if (s.steps >= 1) return s.steps;
  auto t = j.find("trainer");
  if (t != j.end() && t->is_object()) {
    auto st = t->find("steps");
    if (st != t->end() && st->is_number() && st->get<double>() >= 1 && st->get<double>() <= kBig &&
        st->get<double>() == std::floor(st->get<double>()))
      return static_cast<int64_t>(st->get<double>());
  }
  return TrainerConfig{}.steps;
}

// model.n_embd when the config gives a positive integer, else the sources'
// model's; 0 unknown.
int64_t HiddenSize(const json& j, const ConfigSources& s) {
  auto m = j.find("model");
  if (m != j.end() && m->is_object()) {
    auto n = m->find("n_embd");
    if (n != m->end() && n->is_number_integer() && n->get<int64_t>() > 0) return n->get<int64_t>();
  }
  return s.model ? s.model->n_embd : 0;
}

class Resolver {
 public:
  Resolver(json* j, Ctx* ctx) : j_(j), ctx_(ctx) {}

  // HF's fill_match: an "auto" at `keys` becomes `value` when there is one
  // (else it is unresolved, `hint` saying what would resolve it, or, with no
  // hint, left to the caller); a value given there must equal the trainer's
  // (`from` names it).
  void Match(std::initializer_list<const char*> keys, const std::optional<json>& value, const std::string& from,
             const std::string& hint) {
    json* v = Find(j_, keys);
    if (!v) return;
    if (IsAuto(v)) {
      if (value) *v = *value;
      else if (!hint.empty()) Unresolved(keys, hint);
      return;
    }
    if (value && !Same(*v, *value))
      ctx_->errors.push_back(ctx_->source + ": " + Path(keys) + ": " + Show(*v) + " disagrees with " + from + " (" +
                             Show(*value) + "); give one of them, or \"auto\" here");
  }
  // HF's fill_only: an "auto" becomes `value` when there is one, else it is
  // unresolved (`hint` non-empty) or left to the reader (`hint` empty).
  void Fill(std::initializer_list<const char*> keys, const std::optional<json>& value, const std::string& hint = {}) {
    json* v = Find(j_, keys);
    if (!IsAuto(v)) return;
    if (value) *v = *value;
    else if (!hint.empty()) Unresolved(keys, hint);
  }
  void Unresolved(std::initializer_list<const char*> keys, const std::string& hint) {
    const std::string path = Path(keys);
    if (ctx_->unresolved.insert(path).second) unresolved_.push_back({path, hint});
  }
  bool IsAutoAt(std::initializer_list<const char*> keys) { return IsAuto(Find(j_, keys)); }
  // A number given (not "auto") at `keys`.
  bool IsNumberAt(std::initializer_list<const char*> keys) {
    const json* v = Find(j_, keys);
    return v && v->is_number();
  }

  // One error listing every unresolved "auto", each with what would resolve it.
  void Report() {
    if (unresolved_.empty()) return;
    std::string msg = ctx_->source + ": " + std::to_string(unresolved_.size()) +
                      (unresolved_.size() == 1 ? " \"auto\" value has" : " \"auto\" values have") +
                      " nothing to resolve them (strata resolves \"auto\" as the Hugging Face Trainer does, from the "
                      "config's \"trainer\" section: docs/training.md); give what is named, or a value in place of "
                      "\"auto\":";
    for (const auto& [path, hint] : unresolved_) msg += "\n    " + path + ": " + hint;
    ctx_->errors.push_back(std::move(msg));
  }

 private:
  static std::string Path(std::initializer_list<const char*> keys) {
    std::string p;
    for (const char* k : keys) {
      if (!p.empty()) p += '.';
      p += k;
    }
    return p;
  }
  json* j_;
  Ctx* ctx_;
  std::vector<std::pair<std::string, std::string>> unresolved_;
};

template <typename T>
std::optional<json> Opt(const std::optional<T>& v) {
  return v ? std::optional<json>(json(*v)) : std::nullopt;
}

void ResolveBatch(Resolver& r, const HfArgs& a, int world) {
  r.Match({"train_micro_batch_size_per_gpu"}, Opt(a.micro), "trainer.per_device_train_batch_size", "");
  r.Match({"gradient_accumulation_steps"}, Opt(a.accum), "trainer.gradient_accumulation_steps", "");
  std::optional<json> total;
  if (a.micro && a.accum) total = json(*a.micro * *a.accum * world);
  r.Match({"train_batch_size"}, total, "trainer.per_device_train_batch_size × gradient_accumulation_steps × world size",
          "");
  // A micro batch or accumulation "auto" still left is derived by the batch
  // rule when the other two are numbers; train_batch_size's, whenever the
  // micro batch is known.
  const char* keys[] = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"};
  const char* hints[] = {"follows from the two below", "trainer.per_device_train_batch_size",
                         "trainer.gradient_accumulation_steps"};
  bool micro_unknown = false;
  for (int i : {1, 2}) {
    if (!r.IsAutoAt({keys[i]})) continue;
    if (r.IsNumberAt({keys[(i + 1) % 3]}) && r.IsNumberAt({keys[(i + 2) % 3]})) continue;
    r.Unresolved({keys[i]}, hints[i]);
    micro_unknown |= i == 1;
  }
  if (micro_unknown && r.IsAutoAt({keys[0]})) r.Unresolved({keys[0]}, hints[0]);
}

void ResolveOptimizer(Resolver& r, const HfArgs& a) {
  r.Match({"gradient_clipping"}, Opt(a.max_grad_norm), "trainer.max_grad_norm", "trainer.max_grad_norm");
  r.Match({"optimizer", "params", "lr"}, Opt(a.lr), "trainer.learning_rate", "trainer.learning_rate");
  std::optional<json> betas;
  if (a.beta1 && a.beta2) betas = json::array({*a.beta1, *a.beta2});
  r.Match({"optimizer", "params", "betas"}, betas, "[trainer.adam_beta1, trainer.adam_beta2]",
          "trainer.adam_beta1 and trainer.adam_beta2");
  r.Match({"optimizer", "params", "eps"}, Opt(a.eps), "trainer.adam_epsilon", "trainer.adam_epsilon");
  r.Match({"optimizer", "params", "weight_decay"}, Opt(a.weight_decay), "trainer.weight_decay",
          "trainer.weight_decay");
}

void ResolveScheduler(Resolver& r, json* j, const HfArgs& a, int64_t steps) {
  r.Fill({"scheduler", "params", "warmup_min_lr"}, json(0));
  // warmup_max_lr: the learning rate, which is the optimizer's once resolved.
  std::optional<json> lr = Opt(a.lr);
  if (!lr) {
    const json* opt_lr = Find(j, {"optimizer", "params", "lr"});
    if (opt_lr && opt_lr->is_number()) lr = *opt_lr;
  }
  if (a.lr) r.Match({"scheduler", "params", "warmup_max_lr"}, lr, "trainer.learning_rate", "trainer.learning_rate");
  else r.Fill({"scheduler", "params", "warmup_max_lr"}, lr, "trainer.learning_rate");
  std::optional<json> warmup;
  if (a.warmup_steps && *a.warmup_steps > 0) warmup = json(*a.warmup_steps);
  else if (a.warmup_ratio) warmup = json(static_cast<int64_t>(std::ceil(static_cast<double>(steps) * *a.warmup_ratio)));
  else if (a.warmup_steps) warmup = json(int64_t{0});
  r.Match({"scheduler", "params", "warmup_num_steps"}, warmup, "trainer.warmup_steps / warmup_ratio",
          "trainer.warmup_steps or trainer.warmup_ratio");
  r.Fill({"scheduler", "params", "total_num_steps"}, json(steps));
}

// fp16/bf16 from the trainer's precision, else from the weights' dtype.
void ResolvePrecision(Resolver& r, json* j, const HfArgs& a, const ConfigSources& s, Ctx* ctx) {
  std::string prec;  // bf16 | fp16 | fp32 | "" unknown
  const bool from_trainer = a.bf16 || a.fp16;
  if (a.bf16.value_or(false) && a.fp16.value_or(false)) {
    ctx->errors.push_back(ctx->source + ": trainer.bf16 and trainer.fp16 are both true; choose one");
    return;
  }
  if (from_trainer) prec = a.bf16.value_or(false) ? "bf16" : a.fp16.value_or(false) ? "fp16" : "fp32";
  else prec = s.model_dtype;
  std::optional<json> fp16, bf16;
  if (!prec.empty()) fp16 = json(prec == "fp16"), bf16 = json(prec == "bf16");
  const std::string hint = "trainer.bf16 / trainer.fp16 (or --init-from weights, whose dtype says)";
  const size_t errors = ctx->errors.size();
  if (from_trainer) {
    r.Match({"fp16", "enabled"}, fp16, "the trainer's precision (" + prec + ")", hint);
    r.Match({"bf16", "enabled"}, bf16, "the trainer's precision (" + prec + ")", hint);
    r.Match({"bfloat16", "enabled"}, bf16, "the trainer's precision (" + prec + ")", hint);
  } else {
    r.Fill({"fp16", "enabled"}, fp16, hint);
    r.Fill({"bf16", "enabled"}, bf16, hint);
    r.Fill({"bfloat16", "enabled"}, bf16, hint);
  }
  r.Fill({"amp", "enabled"}, json(false));
  if (!from_trainer || ctx->errors.size() != errors) return;
  // The config's precision once resolved must be the trainer's (a section
  // left out is not enabled).
  auto enabled = [&](const char* section) {
    const json* v = Find(j, {section, "enabled"});
    return v && v->is_boolean() && v->get<bool>();
  };
  const std::string have = enabled("bf16") || enabled("bfloat16") ? "bf16" : enabled("fp16") ? "fp16" : "fp32";
  if (have != prec && !r.IsAutoAt({"fp16", "enabled"}) && !r.IsAutoAt({"bf16", "enabled"}))
    ctx->errors.push_back(ctx->source + ": the trainer section asks for " + prec + " (trainer." +
                          (a.bf16 ? "bf16" : "fp16") + ") but the config trains " + have +
                          "; enable the same precision in both (\"" + (prec == "fp32" ? "fp16" : prec) +
                          "\": {\"enabled\": ...})");
}

// ZeRO's bucket sizes from the model's width (HF: hidden_size).
void ResolveZero(Resolver& r, json* j, int64_t hidden) {
  if (hidden <= 0) return;  // left "auto": the reader keeps the default
  const json* stage = Find(j, {"zero_optimization", "stage"});
  const bool zero3 = stage && stage->is_number() && stage->get<double>() == 3;
  r.Fill({"zero_optimization", "reduce_bucket_size"}, json(hidden * hidden));
  if (!zero3) return;
  const auto prefetch = static_cast<int64_t>(std::floor(0.9 * static_cast<double>(hidden) * static_cast<double>(hidden)));
  for (const char* k : {"stage3_prefetch_bucket_size", "prefetch_bucket_size"})
    r.Fill({"zero_optimization", k}, json(prefetch));
  for (const char* k : {"stage3_param_persistence_threshold", "param_persistence_threshold"})
    r.Fill({"zero_optimization", k}, json(10 * hidden));
}

}  // namespace

const std::vector<std::string>& HfTrainerKeys() {
  static const std::vector<std::string> keys = {
      "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "adam_beta1", "adam_beta2",
      "adam_epsilon", "weight_decay", "max_grad_norm", "warmup_steps", "warmup_ratio", "bf16", "fp16"};
  return keys;
}

void ResolveAuto(json* j, const ConfigSources& sources, Ctx* ctx) {
  const HfArgs a = ReadHfArgs(*j, ctx);
  Resolver r(j, ctx);
  ResolveBatch(r, a, sources.world_size);
  ResolveOptimizer(r, a);
  ResolveScheduler(r, j, a, RunSteps(*j, sources));
  ResolvePrecision(r, j, a, sources, ctx);
  ResolveZero(r, j, HiddenSize(*j, sources));
  r.Report();
}

}  // namespace strata::config_internal
