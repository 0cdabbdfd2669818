#include "engine/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <variant>

namespace strata {

using nlohmann::json;

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

// What to do with a DeepSpeed key strata does not implement.
enum class Policy {
  kWarn,            // accepted, one warning
  kErrorIfEnabled,  // error when true / nonzero / {"enabled": true} / a non-empty object without enabled:false
  kError,           // always an error (present at all changes the result)
};

struct Ignored {
  const char* key;
  Policy policy;
  const char* why;  // for errors: what ignoring it would change
};

bool Enabled(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string()) return !v.get<std::string>().empty() && v.get<std::string>() != "none";
  if (v.is_object()) {
    if (v.contains("enabled")) return Enabled(v["enabled"]);
    return !v.empty();
  }
  if (v.is_array()) return !v.empty();
  return false;
}

std::string Show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct Ctx {
  std::string source;
  std::vector<std::string>* warnings;
};

// One JSON object of the config, with its path; every key read is marked so
// that Finish() can classify the rest.
class Obj {
 public:
  Obj(const json& j, std::string path, Ctx* ctx) : j_(j), path_(std::move(path)), ctx_(ctx) {}

  std::string KeyPath(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  Status Error(const std::string& key, const std::string& what) const {
    return InvalidArgument(ctx_->source + ": " + KeyPath(key) + ": " + what);
  }

  // Marks `key` as known (implemented) and returns its value or nullptr.
  const json* Take(const std::string& key) {
    known_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  bool Has(const std::string& key) const { return j_.contains(key); }
  static bool IsAuto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

  Status AutoError(const std::string& key) const {
    return Error(key, "\"auto\" needs a value here (it is filled in by the Hugging Face Trainer, "
                      "which strata does not use); give a number");
  }

  Status Bool(const std::string& key, bool* out) {
    const json* v = Take(key);
    if (!v) return Status::OK();
    if (!v->is_boolean()) {
      if (IsAuto(*v)) return AutoError(key);
      return Error(key, Show(*v) + " is not allowed (allowed: true, false)");
    }
    *out = v->get<bool>();
    return Status::OK();
  }

  // Integers may be written as 5e8 (DeepSpeed configs do). `auto_ok`:
  // "auto" keeps the default (for performance-only sizes).
  template <typename T>
  Status Int(const std::string& key, T* out, double lo, double hi, bool auto_ok = false) {
    const json* v = Take(key);
    if (!v) return Status::OK();
    if (IsAuto(*v)) return auto_ok ? Status::OK() : AutoError(key);
    if (!v->is_number())
      return Error(key, Show(*v) + " is not a number (allowed: an integer from " + Num(lo) + " to " + Num(hi) + ")");
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d))
      return Error(key, Show(*v) + " is not an integer (allowed: an integer from " + Num(lo) + " to " + Num(hi) + ")");
    if (d < lo || d > hi)
      return Error(key, Show(*v) + " is out of range (allowed: an integer from " + Num(lo) + " to " + Num(hi) + ")");
    *out = static_cast<T>(d);
    return Status::OK();
  }

  Status Double(const std::string& key, double* out, double lo, double hi, bool lo_open = false,
                bool auto_ok = false) {
    const json* v = Take(key);
    if (!v) return Status::OK();
    if (IsAuto(*v)) return auto_ok ? Status::OK() : AutoError(key);
    std::string range = std::string(lo_open ? "(" : "[") + Num(lo) + ", " + Num(hi) + "]";
    if (!v->is_number()) return Error(key, Show(*v) + " is not a number (allowed: " + range + ")");
    double d = v->get<double>();
    if (!std::isfinite(d) || d > hi || d < lo || (lo_open && d == lo))
      return Error(key, Show(*v) + " is out of range (allowed: " + range + ")");
    *out = d;
    return Status::OK();
  }

  // One of `allowed` (compared case-insensitively); stores the canonical spelling.
  Status Choice(const std::string& key, std::string* out, const std::vector<std::string>& allowed) {
    const json* v = Take(key);
    if (!v) return Status::OK();
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    if (!v->is_string()) return Error(key, Show(*v) + " is not allowed (allowed: " + list + ")");
    std::string s = v->get<std::string>();
    for (const auto& a : allowed)
      if (Lower(a) == Lower(s)) {
        *out = a;
        return Status::OK();
      }
    return Error(key, "\"" + s + "\" is not allowed (allowed: " + list + ")");
  }

  Status String(const std::string& key, std::string* out) {
    const json* v = Take(key);
    if (!v) return Status::OK();
    if (!v->is_string()) return Error(key, Show(*v) + " is not a string");
    *out = v->get<std::string>();
    return Status::OK();
  }

  // The sub-object at `key` (empty object when absent).
  Result<Obj> Child(const std::string& key) {
    const json* v = Take(key);
    if (!v) return Obj(Empty(), KeyPath(key), ctx_);
    if (!v->is_object()) return Error(key, Show(*v) + " is not a JSON object");
    return Obj(*v, KeyPath(key), ctx_);
  }

  // Classifies every key not read: DeepSpeed keys in `ignored` per their
  // policy, anything else an error naming the nearest known key.
  Status Finish(const std::vector<Ignored>& ignored) {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      const std::string& key = it.key();
      if (known_.count(key)) continue;
      const Ignored* ig = nullptr;
      for (const auto& i : ignored)
        if (key == i.key) ig = &i;
      if (ig) {
        bool err = ig->policy == Policy::kError ||
                   (ig->policy == Policy::kErrorIfEnabled && Enabled(it.value()));
        if (err)
          return Error(key, "strata does not implement this DeepSpeed setting and ignoring " +
                                Show(it.value()) + " would change the training result (" + ig->why +
                                "); remove it or disable it");
        ctx_->warnings->push_back(ctx_->source + ": " + KeyPath(key) +
                                  ": DeepSpeed setting not implemented by strata; ignored (" + ig->why + ")");
        continue;
      }
      std::string best;
      size_t best_d = SIZE_MAX;
      auto consider = [&](const std::string& cand) {
        size_t d = EditDistance(key, cand);
        // A key that is a truncation of a known one ("train_micro_batch_size")
        // most likely means that one.
        if (cand.rfind(key, 0) == 0 || key.rfind(cand, 0) == 0)
          d = std::min(d, 1 + (std::max(cand.size(), key.size()) - std::min(cand.size(), key.size())) / 4);
        if (d < best_d) best_d = d, best = cand;
      };
      for (const auto& k : known_) consider(k);
      for (const auto& i : ignored) consider(i.key);
      std::string msg = "unknown key (neither DeepSpeed nor strata knows it)";
      if (!best.empty() && best_d <= std::max<size_t>(3, key.size() / 3))
        msg += "; did you mean \"" + best + "\"?";
      else if (!best.empty())
        msg += "; the nearest known key here is \"" + best + "\"";
      return Error(key, msg);
    }
    return Status::OK();
  }

  const json& raw() const { return j_; }
  const std::string& path() const { return path_; }

 private:
  static const json& Empty() {
    static const json e = json::object();
    return e;
  }
  static std::string Num(double d) {
    std::ostringstream os;
    if (d >= 1e15) os << "1e15+";
    else os << d;
    return os.str();
  }
  const json& j_;
  std::string path_;
  Ctx* ctx_;
  std::set<std::string> known_;
};

constexpr double kBig = 1e15;

Status ParseFp16(Obj o, Fp16Config* c) {
  RETURN_IF_ERROR(o.Bool("enabled", &c->enabled));
  RETURN_IF_ERROR(o.Double("loss_scale", &c->loss_scale, 0, 1e30));
  RETURN_IF_ERROR(o.Int("initial_scale_power", &c->initial_scale_power, 0, 64));
  RETURN_IF_ERROR(o.Int("loss_scale_window", &c->loss_scale_window, 1, 1e9));
  RETURN_IF_ERROR(o.Int("hysteresis", &c->hysteresis, 1, 1e6));
  RETURN_IF_ERROR(o.Bool("consecutive_hysteresis", &c->consecutive_hysteresis));
  RETURN_IF_ERROR(o.Double("min_loss_scale", &c->min_loss_scale, 0, 1e30, true));
  return o.Finish({
      {"auto_cast", Policy::kErrorIfEnabled, "casting inputs to fp16 changes the computation"},
      {"fp16_master_weights_and_grads", Policy::kErrorIfEnabled,
       "strata keeps fp32 master weights; fp16 masters change the optimizer's arithmetic"},
  });
}

Status ParseOptimizer(Obj o, OptimizerConfig* c) {
  RETURN_IF_ERROR(o.Choice("type", &c->type, {"Adam", "AdamW"}));
  if (!o.Has("type") && !o.raw().empty())
    return o.Error("type", "missing (allowed: Adam, AdamW)");
  if (c->type == "AdamW") c->adam_w_mode = true;
  ASSIGN_OR_RETURN(Obj p, o.Child("params"));
  RETURN_IF_ERROR(p.Double("lr", &c->lr, 0, 10));
  if (const json* b = p.Take("betas")) {
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number())
      return p.Error("betas", Show(*b) + " is not allowed (allowed: [beta1, beta2], each in [0, 1))");
    c->beta1 = (*b)[0].get<double>();
    c->beta2 = (*b)[1].get<double>();
    if (c->beta1 < 0 || c->beta1 >= 1 || c->beta2 < 0 || c->beta2 >= 1)
      return p.Error("betas", Show(*b) + " is out of range (each beta in [0, 1))");
  }
  RETURN_IF_ERROR(p.Double("eps", &c->eps, 0, 1, true));
  RETURN_IF_ERROR(p.Double("weight_decay", &c->weight_decay, 0, 10));
  bool mode = c->adam_w_mode;
  RETURN_IF_ERROR(p.Bool("adam_w_mode", &mode));
  if (c->type == "AdamW" && !mode)
    return p.Error("adam_w_mode", "false contradicts optimizer type AdamW (decoupled weight decay); use type Adam");
  c->adam_w_mode = mode;
  RETURN_IF_ERROR(p.Bool("bias_correction", &c->bias_correction));
  RETURN_IF_ERROR(p.Finish({
      {"amsgrad", Policy::kErrorIfEnabled, "AMSGrad keeps a running max of v and updates differently"},
      {"torch_adam", Policy::kWarn, "strata's CPU/GPU Adam computes the same update"},
      {"fused", Policy::kWarn, "strata's Adam is always fused"},
      {"foreach", Policy::kWarn, "strata's Adam is always fused"},
      {"capturable", Policy::kWarn, "no effect in strata"},
      {"maximize", Policy::kErrorIfEnabled, "maximizing flips the update's sign"},
  }));
  return o.Finish({});
}

// The scheduler, checked against optim's table of DeepSpeed's types.

optim::LrParamValue ToLrParam(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return v.get<uint64_t>();
  if (v.is_number_integer()) return v.get<int64_t>();
  return v.get<double>();
}

json FromLrParam(const optim::LrParamValue& v) {
  return std::visit([](const auto& x) { return json(x); }, v);
}

Status ParseScheduler(Obj o, SchedulerConfig* c) {
  if (o.raw().empty()) return Status::OK();
  std::vector<std::string> types;
  std::string list;
  for (const optim::LrScheduleSpec& s : optim::LrScheduleSpecs()) {
    types.emplace_back(s.name);
    list += (list.empty() ? "" : ", ") + types.back();
  }
  if (!o.Has("type")) return o.Error("type", "missing (allowed: " + list + ")");
  if (const json& t = o.raw()["type"]; t.is_string() && t.get<std::string>() == "LRRangeTest") {
    (void)o.Take("type");
    return o.Error("type", "\"LRRangeTest\" is not implemented by strata (allowed: " + list + ")");
  }
  RETURN_IF_ERROR(o.Choice("type", &c->type, types));
  const optim::LrScheduleSpec* spec = optim::FindLrScheduleSpec(c->type);
  ASSIGN_OR_RETURN(Obj p, o.Child("params"));
  for (const optim::LrParamSpec& param : spec->params) {
    const std::string name(param.name);
    const json* v = p.Take(name);
    if (!v) continue;
    if (Obj::IsAuto(*v)) return p.AutoError(name);
    switch (param.kind) {
      case optim::LrParamKind::kWarmupType:
        if (!v->is_string() || !optim::ParseWarmupType(v->get<std::string>()).ok())
          return p.Error(name, Show(*v) + " is not allowed (allowed: \"log\", \"linear\")");
        break;
      case optim::LrParamKind::kBool:
        if (!v->is_boolean()) return p.Error(name, Show(*v) + " is not allowed (allowed: true, false)");
        break;
      case optim::LrParamKind::kNumber:
      case optim::LrParamKind::kSteps:
        if (!v->is_number()) return p.Error(name, Show(*v) + " is not a number");
        break;
    }
    c->params[name] = ToLrParam(*v);
  }
  for (const optim::LrParamSpec& param : spec->params)
    if (param.need == optim::LrParamNeed::kRequired && !c->params.count(param.name))
      return p.Error(std::string(param.name), "required for scheduler " + c->type);
  RETURN_IF_ERROR(p.Finish({}));
  return o.Finish({});
}

Status ParseOffload(Obj o, OffloadConfig* c, bool optimizer) {
  RETURN_IF_ERROR(o.Choice("device", &c->device, {"none", "cpu", "nvme"}));
  RETURN_IF_ERROR(o.String("nvme_path", &c->nvme_path));
  RETURN_IF_ERROR(o.Bool("pin_memory", &c->pin_memory));
  RETURN_IF_ERROR(o.Int("buffer_count", &c->buffer_count, 1, 1e6));
  std::vector<Ignored> ignored = {{"fast_init", Policy::kWarn, "initialization speed only"}};
  if (optimizer) {
    RETURN_IF_ERROR(o.Bool("pipeline_read", &c->pipeline_read));
    RETURN_IF_ERROR(o.Bool("pipeline_write", &c->pipeline_write));
    bool pipeline = false;
    RETURN_IF_ERROR(o.Bool("pipeline", &pipeline));  // legacy: both
    if (pipeline) c->pipeline_read = c->pipeline_write = true;
    RETURN_IF_ERROR(o.Double("ratio", &c->ratio, 0, 1));  // 0: all on the GPU (DeepSpeed: ge=0, le=1)
  } else {
    RETURN_IF_ERROR(o.Int("buffer_size", &c->buffer_size, 1, kBig, true));
    RETURN_IF_ERROR(o.Int("max_in_cpu", &c->max_in_cpu, 0, kBig, true));
  }
  if (c->device == "nvme" && c->nvme_path.empty())
    return o.Error("nvme_path", "required when device is \"nvme\" (a directory on the NVMe drive)");
  return o.Finish(ignored);
}

// Reads `name` and its `stage3_` spelling; both present and different is an error.
template <typename T>
Status Stage3Int(Obj& o, const std::string& name, T* out, double lo, double hi) {
  T a = *out, b = *out;
  RETURN_IF_ERROR(o.Int(name, &a, lo, hi, true));
  RETURN_IF_ERROR(o.Int("stage3_" + name, &b, lo, hi, true));
  if (o.Has(name) && o.Has("stage3_" + name) && a != b)
    return o.Error(name, "given as both \"" + name + "\" (" + std::to_string(a) + ") and \"stage3_" + name +
                             "\" (" + std::to_string(b) + "); keep one");
  *out = o.Has(name) ? a : b;
  return Status::OK();
}

Status ParseZero(Obj o, ZeroConfig* c, Ctx* ctx) {
  RETURN_IF_ERROR(o.Int("stage", &c->stage, 0, 3));
  ASSIGN_OR_RETURN(Obj op, o.Child("offload_param"));
  RETURN_IF_ERROR(ParseOffload(op, &c->offload_param, false));
  ASSIGN_OR_RETURN(Obj oo, o.Child("offload_optimizer"));
  RETURN_IF_ERROR(ParseOffload(oo, &c->offload_optimizer, true));
  // Legacy spellings of the offload switches.
  bool legacy = false;
  RETURN_IF_ERROR(o.Bool("cpu_offload", &legacy));
  if (legacy) {
    if (c->offload_optimizer.device == "none") c->offload_optimizer.device = "cpu";
    ctx->warnings->push_back(ctx->source + ": " + o.KeyPath("cpu_offload") +
                             " is deprecated in DeepSpeed; read as offload_optimizer.device = \"cpu\"");
  }
  legacy = false;
  RETURN_IF_ERROR(o.Bool("cpu_offload_params", &legacy));
  if (legacy) {
    if (c->offload_param.device == "none") c->offload_param.device = "cpu";
    ctx->warnings->push_back(ctx->source + ": " + o.KeyPath("cpu_offload_params") +
                             " is deprecated in DeepSpeed; read as offload_param.device = \"cpu\"");
  }
  // offload_optimizer.ratio is the fraction of the optimizer state offloaded
  // to offload_optimizer.device; with "none" (the planner places it) it has
  // no meaning, and ignoring it would silently keep state where the user did
  // not ask for it.
  if (c->offload_optimizer.ratio < 1 && c->offload_optimizer.device == "none") {
    std::ostringstream r;
    r << c->offload_optimizer.ratio;
    return o.Error("offload_optimizer.ratio",
                   r.str() +
                       " needs offload_optimizer.device \"cpu\" or \"nvme\" (the ratio is the fraction of the "
                       "optimizer state offloaded there, the rest staying on the GPU)");
  }
  bool pin = true;
  RETURN_IF_ERROR(o.Bool("cpu_offload_use_pin_memory", &pin));
  if (o.Has("cpu_offload_use_pin_memory")) c->offload_optimizer.pin_memory = c->offload_param.pin_memory = pin;
  RETURN_IF_ERROR(o.Bool("overlap_comm", &c->overlap_comm));
  RETURN_IF_ERROR(o.Int("reduce_bucket_size", &c->reduce_bucket_size, 1, kBig, true));
  RETURN_IF_ERROR(o.Int("allgather_bucket_size", &c->allgather_bucket_size, 1, kBig, true));
  RETURN_IF_ERROR(Stage3Int(o, "prefetch_bucket_size", &c->prefetch_bucket_size, 0, kBig));
  RETURN_IF_ERROR(Stage3Int(o, "max_live_parameters", &c->max_live_parameters, 0, kBig));
  RETURN_IF_ERROR(Stage3Int(o, "max_reuse_distance", &c->max_reuse_distance, 0, kBig));
  RETURN_IF_ERROR(Stage3Int(o, "param_persistence_threshold", &c->param_persistence_threshold, 0, kBig));
  RETURN_IF_ERROR(o.Int("sub_group_size", &c->sub_group_size, 0, kBig, true));
  // Tuning knobs of DeepSpeed's own fetch heuristics and of communication:
  // checked and kept in the config, but the planner decides what they decide
  // there, from the memory budgets (and one GPU has no communication). One
  // warning names those set to other than DeepSpeed's default, so a tuned
  // config does not look obeyed when it is not.
  const ZeroConfig def;
  const std::pair<std::string, bool> tuning[] = {
      {"prefetch_bucket_size", c->prefetch_bucket_size != def.prefetch_bucket_size},
      {"max_live_parameters", c->max_live_parameters != def.max_live_parameters},
      {"max_reuse_distance", c->max_reuse_distance != def.max_reuse_distance},
      {"param_persistence_threshold", c->param_persistence_threshold != def.param_persistence_threshold},
      {"reduce_bucket_size", c->reduce_bucket_size != def.reduce_bucket_size},
      {"allgather_bucket_size", c->allgather_bucket_size != def.allgather_bucket_size},
      {"overlap_comm", c->overlap_comm != def.overlap_comm},
      {"sub_group_size", c->sub_group_size != def.sub_group_size}};
  std::string tuned;
  for (const auto& [key, changed] : tuning)
    for (const std::string& k : {key, "stage3_" + key})
      if (changed && o.Has(k)) tuned += (tuned.empty() ? "" : ", ") + o.KeyPath(k);
  if (!tuned.empty())
    ctx->warnings->push_back(ctx->source + ": " + tuned +
                             ": accepted, no effect in strata (the planner sets the prefetch depth and which "
                             "parameters stay on the GPU from the memory budgets, by each tensor's next use in the "
                             "step, and updates the optimizer state a layer at a time; --dry-run shows them. One GPU: no "
                             "communication to bucket or overlap)");
  return o.Finish({
      {"contiguous_gradients", Policy::kWarn, "strata's gradient buffers are always contiguous per layer"},
      {"reduce_scatter", Policy::kWarn, "communication pattern only"},
      {"allgather_partitions", Policy::kWarn, "communication pattern only"},
      {"round_robin_gradients", Policy::kWarn, "communication pattern only"},
      {"stage3_gather_16bit_weights_on_model_save", Policy::kWarn, "strata always saves whole weights"},
      {"gather_16bit_weights_on_model_save", Policy::kWarn, "strata always saves whole weights"},
      {"stage3_gather_fp16_weights_on_model_save", Policy::kWarn, "strata always saves whole weights"},
      {"ignore_unused_parameters", Policy::kWarn, "every GPT parameter is used"},
      {"legacy_stage1", Policy::kWarn, "no effect in strata"},
      {"elastic_checkpoint", Policy::kWarn, "checkpoint layout only"},
      {"load_from_fp32_weights", Policy::kWarn, "strata always resumes from fp32 master weights"},
      {"memory_efficient_linear", Policy::kWarn, "memory layout only"},
      {"pipeline_loading_checkpoint", Policy::kWarn, "loading speed only"},
      {"override_module_apply", Policy::kWarn, "no effect in strata"},
      {"use_multi_rank_bucket_allreduce", Policy::kWarn, "communication pattern only"},
      {"log_trace_cache_warnings", Policy::kWarn, "logging only"},
      {"zero_hpz_partition_size", Policy::kWarn, "communication pattern only"},
      {"mics_hierarchical_params_gather", Policy::kWarn, "communication pattern only"},
      {"stage3_module_granularity_threshold", Policy::kWarn, "prefetch granularity only"},
      {"module_granularity_threshold", Policy::kWarn, "prefetch granularity only"},
      {"stage3_use_all_reduce_for_fetch_params", Policy::kWarn, "communication pattern only"},
      {"use_all_reduce_for_fetch_params", Policy::kWarn, "communication pattern only"},
      {"zero_quantized_weights", Policy::kErrorIfEnabled, "quantized weight communication changes the numerics"},
      {"zero_quantized_nontrainable_weights", Policy::kErrorIfEnabled, "quantized weights change the numerics"},
      {"zero_quantized_gradients", Policy::kErrorIfEnabled, "quantized gradients change the numerics"},
      {"zeropp_loco_param", Policy::kErrorIfEnabled, "quantized gradients change the numerics"},
      {"mics_shard_size", Policy::kErrorIfEnabled, "MiCS sharding is not implemented"},
  });
}

Status ParseActivationCheckpointing(Obj o, ActivationCheckpointingConfig* c) {
  RETURN_IF_ERROR(o.Bool("partition_activations", &c->partition_activations));
  RETURN_IF_ERROR(o.Bool("cpu_checkpointing", &c->cpu_checkpointing));
  RETURN_IF_ERROR(o.Int("number_checkpoints", &c->number_checkpoints, 0, 1e6));
  return o.Finish({
      {"contiguous_memory_optimization", Policy::kWarn, "memory layout only"},
      {"synchronize_checkpoint_boundary", Policy::kWarn, "timing only"},
      {"profile", Policy::kWarn, "profiling only"},
  });
}

Status ParseAio(Obj o, AioConfig* c) {
  RETURN_IF_ERROR(o.Int("block_size", &c->block_size, 4096, 1ull << 30));
  if (c->block_size % 4096) return o.Error("block_size", std::to_string(c->block_size) + " is not a multiple of 4096");
  RETURN_IF_ERROR(o.Int("queue_depth", &c->queue_depth, 1, 4096));
  int threads = c->intra_op_parallelism;
  RETURN_IF_ERROR(o.Int("intra_op_parallelism", &c->intra_op_parallelism, 1, 256));
  RETURN_IF_ERROR(o.Int("thread_count", &threads, 1, 256));
  if (o.Has("thread_count")) {
    if (o.Has("intra_op_parallelism") && threads != c->intra_op_parallelism)
      return o.Error("thread_count", "differs from intra_op_parallelism (its alias); keep one");
    c->intra_op_parallelism = threads;
  }
  RETURN_IF_ERROR(o.Bool("single_submit", &c->single_submit));
  RETURN_IF_ERROR(o.Bool("overlap_events", &c->overlap_events));
  return o.Finish({{"use_gds", Policy::kWarn, "GPUDirect Storage is not used; I/O goes through pinned host memory"}});
}

Status ParseModel(Obj o, ModelConfig* c) {
  RETURN_IF_ERROR(o.Int("n_layer", &c->n_layer, 1, 10000));
  RETURN_IF_ERROR(o.Int("n_embd", &c->n_embd, 1, 1 << 20));
  RETURN_IF_ERROR(o.Int("n_head", &c->n_head, 1, 1 << 14));
  RETURN_IF_ERROR(o.Int("vocab_size", &c->vocab_size, 2, 1 << 24));
  RETURN_IF_ERROR(o.Int("seq_len", &c->seq_len, 1, 1 << 20));
  if (c->n_embd % c->n_head)
    return o.Error("n_head", std::to_string(c->n_head) + " does not divide n_embd (" + std::to_string(c->n_embd) + ")");
  return o.Finish({});
}

Status ParseData(Obj o, DataConfig* c) {
  RETURN_IF_ERROR(o.String("path", &c->path));
  RETURN_IF_ERROR(o.Choice("format", &c->format, {"auto", "text", "tokens"}));
  RETURN_IF_ERROR(o.String("val_path", &c->val_path));
  RETURN_IF_ERROR(o.Double("val_fraction", &c->val_fraction, 0, 0.5));
  RETURN_IF_ERROR(o.Choice("sampling", &c->sampling, {"random", "sequential"}));
  RETURN_IF_ERROR(o.Int("seed", &c->seed, 0, 1.8e19));
  return o.Finish({});
}

Status ParseTrainer(Obj o, TrainerConfig* c) {
  RETURN_IF_ERROR(o.Int("steps", &c->steps, 1, kBig));
  RETURN_IF_ERROR(o.Int("seed", &c->seed, 0, 1.8e19));
  RETURN_IF_ERROR(o.Int("eval_interval", &c->eval_interval, 0, kBig));
  RETURN_IF_ERROR(o.Int("eval_batches", &c->eval_batches, 1, 1e6));
  RETURN_IF_ERROR(o.Choice("gpu_assisted_optimizer", &c->gpu_assisted_optimizer, {"auto", "on", "off"}));
  RETURN_IF_ERROR(o.Choice("schedule", &c->schedule, {"layer-major", "micro-batch-major"}));
  return o.Finish({});
}

}  // namespace

Result<Config> ParseConfig(const json& j, const std::string& source, int world_size,
                           std::vector<std::string>* warnings) {
  std::vector<std::string> local;
  if (!warnings) warnings = &local;
  Ctx ctx{source, warnings};
  if (!j.is_object()) return InvalidArgument(source + ": the config is not a JSON object");
  if (world_size < 1) return InvalidArgument("world size " + std::to_string(world_size) + " is not positive");
  Config c;  // every key left out keeps its default
  c.source = source;
  c.world_size = world_size;
  c.train_batch_size = c.micro_batch = c.grad_accum = 0;  // 0: not given (the batch rule below)
  Obj o(j, "", &ctx);

  RETURN_IF_ERROR(o.Int("train_batch_size", &c.train_batch_size, 1, kBig, true));
  RETURN_IF_ERROR(o.Int("train_micro_batch_size_per_gpu", &c.micro_batch, 1, kBig, true));
  RETURN_IF_ERROR(o.Int("gradient_accumulation_steps", &c.grad_accum, 1, kBig, true));
  {
    int64_t& tb = c.train_batch_size;
    int64_t& mb = c.micro_batch;
    int64_t& ga = c.grad_accum;
    const int64_t w = world_size;
    auto rule = [&](const std::string& what) {
      return InvalidArgument(source + ": train_batch_size: " + what +
                             " (the rule: train_batch_size = train_micro_batch_size_per_gpu × "
                             "gradient_accumulation_steps × world size; here " +
                             (tb ? std::to_string(tb) : "?") + " vs " + (mb ? std::to_string(mb) : "?") + " × " +
                             (ga ? std::to_string(ga) : "?") + " × " + std::to_string(w) + ")");
    };
    if (tb && mb && ga) {
      if (tb != mb * ga * w) return rule("inconsistent batch sizes");
    } else if (tb && mb) {
      if (tb % (mb * w)) return rule("train_batch_size is not divisible by micro batch × world size");
      ga = tb / (mb * w);
    } else if (tb && ga) {
      if (tb % (ga * w)) return rule("train_batch_size is not divisible by accumulation steps × world size");
      mb = tb / (ga * w);
    } else if (mb) {
      if (!ga) ga = 1;
      tb = mb * ga * w;
    } else if (tb) {
      ga = 1;
      if (tb % w) return rule("train_batch_size is not divisible by the world size");
      mb = tb / w;
    } else {
      const Config defaults;
      mb = defaults.micro_batch;
      if (!ga) ga = defaults.grad_accum;
      tb = mb * ga * w;
    }
  }

  ASSIGN_OR_RETURN(Obj fp16, o.Child("fp16"));
  RETURN_IF_ERROR(ParseFp16(fp16, &c.fp16));
  ASSIGN_OR_RETURN(Obj bf16, o.Child("bf16"));
  RETURN_IF_ERROR(bf16.Bool("enabled", &c.bf16));
  RETURN_IF_ERROR(bf16.Finish({{"immediate_grad_update", Policy::kWarn, "gradient update timing only"},
                               {"check_grad_overflow", Policy::kWarn, "strata always checks gradients"}}));
  if (c.bf16 && c.fp16.enabled)
    return InvalidArgument(source + ": bf16.enabled and fp16.enabled are both true; choose one");
  // bfloat16 is DeepSpeed's alias of bf16.
  if (o.Has("bfloat16")) {
    if (o.Has("bf16")) return InvalidArgument(source + ": both \"bf16\" and its alias \"bfloat16\" are given; keep one");
    ASSIGN_OR_RETURN(Obj b2, o.Child("bfloat16"));
    RETURN_IF_ERROR(b2.Bool("enabled", &c.bf16));
    RETURN_IF_ERROR(b2.Finish({}));
  }
  ASSIGN_OR_RETURN(Obj opt, o.Child("optimizer"));
  RETURN_IF_ERROR(ParseOptimizer(opt, &c.optimizer));
  ASSIGN_OR_RETURN(Obj sched, o.Child("scheduler"));
  RETURN_IF_ERROR(ParseScheduler(sched, &c.scheduler));
  RETURN_IF_ERROR(o.Double("gradient_clipping", &c.gradient_clipping, 0, 1e30));
  ASSIGN_OR_RETURN(Obj zero, o.Child("zero_optimization"));
  RETURN_IF_ERROR(ParseZero(zero, &c.zero, &ctx));
  ASSIGN_OR_RETURN(Obj ac, o.Child("activation_checkpointing"));
  RETURN_IF_ERROR(ParseActivationCheckpointing(ac, &c.activation_checkpointing));
  ASSIGN_OR_RETURN(Obj aio, o.Child("aio"));
  RETURN_IF_ERROR(ParseAio(aio, &c.aio));
  RETURN_IF_ERROR(o.Int("steps_per_print", &c.steps_per_print, 1, kBig));
  RETURN_IF_ERROR(o.Bool("wall_clock_breakdown", &c.wall_clock_breakdown));
  ASSIGN_OR_RETURN(Obj model, o.Child("model"));
  RETURN_IF_ERROR(ParseModel(model, &c.model));
  ASSIGN_OR_RETURN(Obj data, o.Child("data"));
  RETURN_IF_ERROR(ParseData(data, &c.data));
  ASSIGN_OR_RETURN(Obj trainer, o.Child("trainer"));
  RETURN_IF_ERROR(ParseTrainer(trainer, &c.trainer));
  RETURN_IF_ERROR(o.Finish({
      {"flops_profiler", Policy::kWarn, "profiling only; strata prints TFLOP/s and MFU itself"},
      {"tensorboard", Policy::kWarn, "logging only; use --log-json"},
      {"wandb", Policy::kWarn, "logging only; use --log-json"},
      {"csv_monitor", Policy::kWarn, "logging only; use --log-json"},
      {"comet", Policy::kWarn, "logging only; use --log-json"},
      {"monitor_config", Policy::kWarn, "logging only"},
      {"comms_logger", Policy::kWarn, "logging only"},
      {"autotuning", Policy::kWarn, "use strata-bench and the planner instead"},
      {"dump_state", Policy::kWarn, "debugging output only"},
      {"memory_breakdown", Policy::kWarn, "strata prints memory per tier itself"},
      {"checkpoint", Policy::kWarn, "checkpoint options are given with --save/--resume"},
      {"zero_allow_untested_optimizer", Policy::kWarn, "no effect in strata"},
      {"zero_force_ds_cpu_optimizer", Policy::kWarn, "strata always uses its own CPU Adam"},
      {"nebula", Policy::kWarn, "checkpoint service not used"},
      {"timers", Policy::kWarn, "timing output only"},
      {"compile", Policy::kWarn, "torch.compile does not apply"},
      {"pipeline", Policy::kWarn, "pipeline parallelism is not used on one GPU"},
      {"prescale_gradients", Policy::kWarn, "only the rounding of the reduction differs"},
      {"gradient_predivide_factor", Policy::kWarn, "only the rounding of the reduction differs"},
      {"fp32_allreduce", Policy::kWarn, "strata reduces gradients in fp32"},
      {"communication_data_type", Policy::kWarn, "strata reduces gradients in fp32"},
      {"seq_parallel_communication_data_type", Policy::kWarn, "sequence parallelism is not used"},
      {"disable_allgather", Policy::kWarn, "communication pattern only"},
      {"vocabulary_size", Policy::kWarn, "strata reads the vocabulary from model.vocab_size"},
      {"use_node_local_storage", Policy::kWarn, "checkpoint layout only"},
      {"load_universal_checkpoint", Policy::kWarn, "use --resume"},
      {"graph_harvesting", Policy::kWarn, "no effect in strata"},
      {"eigenvalue", Policy::kWarn, "diagnostics only"},
      {"elasticity", Policy::kErrorIfEnabled, "elastic training changes the batch size"},
      {"data_efficiency", Policy::kErrorIfEnabled, "data sampling and routing change what is trained on"},
      {"curriculum_learning", Policy::kErrorIfEnabled, "the curriculum changes what is trained on"},
      {"progressive_layer_drop", Policy::kErrorIfEnabled, "dropping layers changes the model's computation"},
      {"sparse_attention", Policy::kError, "sparse attention changes the model"},
      {"sparse_gradients", Policy::kErrorIfEnabled, "sparse gradients are not implemented"},
      {"amp", Policy::kErrorIfEnabled, "Apex AMP changes the precision of the computation"},
      {"torch_autocast", Policy::kErrorIfEnabled, "autocast changes the precision of the computation"},
      {"quantize_training", Policy::kErrorIfEnabled, "quantized training changes the numerics"},
      {"compression_training", Policy::kErrorIfEnabled, "compression changes the model"},
      {"weight_quantization", Policy::kErrorIfEnabled, "quantized weights change the numerics"},
      {"hybrid_engine", Policy::kErrorIfEnabled, "the RLHF hybrid engine is not implemented"},
      {"tensor_parallel", Policy::kErrorIfEnabled, "tensor parallelism is not implemented"},
      {"data_types", Policy::kErrorIfEnabled, "strata accumulates gradients in fp32; another dtype changes the result"},
  }));
  if (c.model.seq_len < 1) return InvalidArgument(source + ": model.seq_len must be positive");
  return c;
}

Result<int> LauncherWorldSize(const std::function<const char*(const char*)>& getenv) {
  for (const char* var : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* v = getenv(var);
    if (!v || !*v) continue;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || n < 1 || n > (1 << 20))
      return InvalidArgument(std::string("environment variable ") + var + "=\"" + v +
                             "\" (set by a launcher) is not a positive integer world size");
    return static_cast<int>(n);
  }
  return 1;
}

Result<Config> LoadConfig(const std::string& path, int world_size, std::vector<std::string>* warnings) {
  std::ifstream in(path);
  if (!in) return ErrnoStatus("cannot open config file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return ErrnoStatus("cannot read config file", path);
  json j;
  try {
    j = json::parse(ss.str(), nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    // Translate the byte offset into line:column.
    std::string text = ss.str();
    size_t line = 1, col = 1;
    for (size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') ++line, col = 1;
      else ++col;
    }
    return InvalidArgument(path + ":" + std::to_string(line) + ":" + std::to_string(col) +
                           ": not valid JSON: " + e.what());
  }
  return ParseConfig(j, path, world_size, warnings);
}

nlohmann::json ConfigToJson(const Config& c) {
  auto offload = [](const OffloadConfig& o, bool optimizer) {
    json j = {{"device", o.device}, {"pin_memory", o.pin_memory}, {"buffer_count", o.buffer_count}};
    if (!o.nvme_path.empty()) j["nvme_path"] = o.nvme_path;
    if (optimizer) {
      j["pipeline_read"] = o.pipeline_read;
      j["pipeline_write"] = o.pipeline_write;
      j["ratio"] = o.ratio;
    } else {
      j["buffer_size"] = o.buffer_size;
      j["max_in_cpu"] = o.max_in_cpu;
    }
    return j;
  };
  json sched = json::object();
  if (!c.scheduler.type.empty()) {
    json params = json::object();
    for (const auto& [k, v] : c.scheduler.params) params[k] = FromLrParam(v);
    sched = {{"type", c.scheduler.type}, {"params", params}};
  }
  json j = {
      {"train_batch_size", c.train_batch_size},
      {"train_micro_batch_size_per_gpu", c.micro_batch},
      {"gradient_accumulation_steps", c.grad_accum},
      {"fp16",
       {{"enabled", c.fp16.enabled},
        {"loss_scale", c.fp16.loss_scale},
        {"initial_scale_power", c.fp16.initial_scale_power},
        {"loss_scale_window", c.fp16.loss_scale_window},
        {"hysteresis", c.fp16.hysteresis},
        {"consecutive_hysteresis", c.fp16.consecutive_hysteresis},
        {"min_loss_scale", c.fp16.min_loss_scale}}},
      {"bf16", {{"enabled", c.bf16}}},
      {"optimizer",
       {{"type", c.optimizer.type},
        {"params",
         {{"lr", c.optimizer.lr},
          {"betas", {c.optimizer.beta1, c.optimizer.beta2}},
          {"eps", c.optimizer.eps},
          {"weight_decay", c.optimizer.weight_decay},
          {"adam_w_mode", c.optimizer.adam_w_mode},
          {"bias_correction", c.optimizer.bias_correction}}}}},
      {"gradient_clipping", c.gradient_clipping},
      {"zero_optimization",
       {{"stage", c.zero.stage},
        {"offload_param", offload(c.zero.offload_param, false)},
        {"offload_optimizer", offload(c.zero.offload_optimizer, true)},
        {"overlap_comm", c.zero.overlap_comm},
        {"reduce_bucket_size", c.zero.reduce_bucket_size},
        {"allgather_bucket_size", c.zero.allgather_bucket_size},
        {"stage3_prefetch_bucket_size", c.zero.prefetch_bucket_size},
        {"stage3_max_live_parameters", c.zero.max_live_parameters},
        {"stage3_max_reuse_distance", c.zero.max_reuse_distance},
        {"stage3_param_persistence_threshold", c.zero.param_persistence_threshold},
        {"sub_group_size", c.zero.sub_group_size}}},
      {"activation_checkpointing",
       {{"partition_activations", c.activation_checkpointing.partition_activations},
        {"cpu_checkpointing", c.activation_checkpointing.cpu_checkpointing},
        {"number_checkpoints", c.activation_checkpointing.number_checkpoints}}},
      {"aio",
       {{"block_size", c.aio.block_size},
        {"queue_depth", c.aio.queue_depth},
        {"intra_op_parallelism", c.aio.intra_op_parallelism},
        {"single_submit", c.aio.single_submit},
        {"overlap_events", c.aio.overlap_events}}},
      {"steps_per_print", c.steps_per_print},
      {"wall_clock_breakdown", c.wall_clock_breakdown},
      {"model",
       {{"n_layer", c.model.n_layer},
        {"n_embd", c.model.n_embd},
        {"n_head", c.model.n_head},
        {"vocab_size", c.model.vocab_size},
        {"seq_len", c.model.seq_len}}},
      {"data",
       {{"path", c.data.path},
        {"format", c.data.format},
        {"val_path", c.data.val_path},
        {"val_fraction", c.data.val_fraction},
        {"sampling", c.data.sampling},
        {"seed", c.data.seed}}},
      {"trainer",
       {{"steps", c.trainer.steps},
        {"seed", c.trainer.seed},
        {"eval_interval", c.trainer.eval_interval},
        {"eval_batches", c.trainer.eval_batches},
        {"gpu_assisted_optimizer", c.trainer.gpu_assisted_optimizer},
        {"schedule", c.trainer.schedule}}},
  };
  if (!sched.empty()) j["scheduler"] = sched;
  return j;
}

Config DefaultConfig() {
  // The demo is the defaults; only its name in messages differs.
  Config c;
  c.source = "(built-in default)";
  return c;
}

}  // namespace strata
