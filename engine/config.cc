// SPDX-License-Identifier: Apache-2.0
#include "engine/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>
#include <variant>

#include "base/bytes.h"
#include "engine/config_auto.h"
#include "engine/config_fields.h"
#include "engine/config_json.h"
#include "engine/config_reader.h"
#include "models/family.h"

namespace strata {

using nlohmann::json;

namespace {

using config_internal::Ctx;
using config_internal::Ignored;
using config_internal::Obj;
using config_internal::Policy;
using namespace config_internal;

constexpr double kBig = 1e15;


// ---- The sections -------------------------------------------------------------

const Section<Fp16Config>& Fp16Section() {
  using C = Fp16Config;
  static const Section<C> s = {
      {
          Flag("enabled", &C::enabled),
          Real("loss_scale", &C::loss_scale, 0, 1e30),
          Int("initial_scale_power", &C::initial_scale_power, 0, 64),
          Int("loss_scale_window", &C::loss_scale_window, 1, 1e9),
          Int("hysteresis", &C::hysteresis, 1, 1e6),
          Flag("consecutive_hysteresis", &C::consecutive_hysteresis),
          Real("min_loss_scale", &C::min_loss_scale, 0, 1e30, kOpenBelow),
      },
      {
          {"auto_cast", Policy::kErrorIfEnabled, "casting inputs to fp16 changes the computation"},
          {"fp16_master_weights_and_grads", Policy::kErrorIfEnabled,
           "strata keeps fp32 master weights; fp16 masters change the optimizer's arithmetic"},
      }};
  return s;
}

// "bf16": {"enabled": ...}, into Config::bf16.
const Section<Config>& Bf16Section() {
  static const Section<Config> s = {
      {Flag("enabled", &Config::bf16), Flag("bf16_optimizer_states", &Config::bf16_optimizer_states)},
      {
          {"immediate_grad_update", Policy::kWarn, "gradient update timing only"},
          {"check_grad_overflow", Policy::kWarn, "strata always checks gradients"},
          {"bf16_master_weights_and_grads", Policy::kErrorIfEnabled,
           "strata keeps fp32 master weights; bf16 masters change the optimizer's arithmetic"},
      }};
  return s;
}

// bf16 moments belong to bf16 training (DeepSpeed reads its bf16 section
// only when bf16 is enabled): asked for without it is an error, not ignored.
Status CheckBf16OptimizerStates(Obj& o, const Config* c) {
  if (c->bf16_optimizer_states && !c->bf16)
    return o.Fail("bf16.bf16_optimizer_states is true but bf16.enabled is not: the bf16 section, and its bf16 Adam "
                  "moments, apply to bf16 training; enable bf16 or remove bf16_optimizer_states");
  return Status::OK();
}

// After "bf16": the fp16/bf16 conflict, and DeepSpeed's alias "bfloat16".
Status ReadBfloat16(Obj& o, Config* c, Ctx* ctx) {
  if (c->bf16 && c->fp16.enabled) return o.Fail("bf16.enabled and fp16.enabled are both true; choose one");
  if (!o.Has("bfloat16")) return CheckBf16OptimizerStates(o, c);
  if (o.Has("bf16")) {
    (void)o.Take("bfloat16");
    return o.Fail("both \"bf16\" and its alias \"bfloat16\" are given; keep one");
  }
  ASSIGN_OR_RETURN(Obj b, o.Child("bfloat16"));
  RETURN_IF_ERROR(b.Bool("enabled", &c->bf16));
  RETURN_IF_ERROR(b.Bool("bf16_optimizer_states", &c->bf16_optimizer_states));
  RETURN_IF_ERROR(b.Finish({}));
  return CheckBf16OptimizerStates(o, c);
}

Status CheckAdamWMode(Obj& p, OptimizerConfig* c, Ctx*) {
  if (c->type == "AdamW" && !c->adam_w_mode)
    return p.Error("adam_w_mode", "false contradicts optimizer type AdamW (decoupled weight decay); use type Adam");
  return Status::OK();
}

Status ReadBetas(Obj& p, OptimizerConfig* c, Ctx*) {
  const json* b = p.Take("betas");
  if (!b) return Status::OK();
  if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number())
    return p.Error("betas", Show(*b) + " is not allowed (allowed: [beta1, beta2], each in [0, 1))");
  const double b1 = (*b)[0].get<double>(), b2 = (*b)[1].get<double>();
  if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1))  // (NaN fails too)
    return p.Error("betas", Show(*b) + " is out of range (each beta in [0, 1))");
  c->beta1 = b1;
  c->beta2 = b2;
  return Status::OK();
}

void WriteBetas(const OptimizerConfig& c, json* j) { (*j)["betas"] = {c.beta1, c.beta2}; }

// "optimizer": {"params": {...}}, into OptimizerConfig.
const Section<OptimizerConfig>& OptimizerParamsSection() {
  using C = OptimizerConfig;
  static const Section<C> s = {
      {
          Real("lr", &C::lr, 0, 10),
          Rule<C>(ReadBetas, WriteBetas),
          Real("eps", &C::eps, 0, 1, kOpenBelow),
          Real("weight_decay", &C::weight_decay, 0, 10),
          Flag("adam_w_mode", &C::adam_w_mode),
          Rule<C>(CheckAdamWMode),
          Flag("bias_correction", &C::bias_correction),
      },
      {
          {"amsgrad", Policy::kErrorIfEnabled, "AMSGrad keeps a running max of v and updates differently"},
          {"torch_adam", Policy::kWarn, "strata's CPU/GPU Adam computes the same update"},
          {"fused", Policy::kWarn, "strata's Adam is always fused"},
          {"foreach", Policy::kWarn, "strata's Adam is always fused"},
          {"capturable", Policy::kWarn, "no effect in strata"},
          {"maximize", Policy::kErrorIfEnabled, "maximizing flips the update's sign"},
      }};
  return s;
}

// A non-empty section names its type; AdamW implies decoupled weight decay.
Status ReadOptimizerType(Obj& o, OptimizerConfig* c, Ctx*) {
  if (!o.Has("type") && !o.raw().empty()) return o.Error("type", "missing (allowed: Adam, AdamW)");
  if (c->type == "AdamW") c->adam_w_mode = true;
  return Status::OK();
}

const Section<OptimizerConfig>& OptimizerSection() {
  using C = OptimizerConfig;
  static const Section<C> s = {
      {
          OneOf("type", &C::type, {"Adam", "AdamW"}),
          Rule<C>(ReadOptimizerType),
          Nested("params", OptimizerParamsSection),
      },
      {}};
  return s;
}

// ---- The scheduler: checked against optim's table of DeepSpeed's types -------

optim::LrParamValue ToLrParam(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})
    return v.get<uint64_t>();  // beyond int64_t
  if (v.is_number_integer()) return v.get<int64_t>();
  return v.get<double>();
}

json FromLrParam(const optim::LrParamValue& v) {
  return std::visit([](const auto& x) { return json(x); }, v);
}

Status ReadScheduler(Obj& top, Config* config, Ctx*) {
  ASSIGN_OR_RETURN(Obj o, top.Child("scheduler"));
  if (o.raw().empty()) return Status::OK();
  SchedulerConfig* c = &config->scheduler;
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
        if (!std::isfinite(v->get<double>())) return p.Error(name, Show(*v) + " is not a finite number");
        break;
    }
    c->params[name] = ToLrParam(*v);
  }
  for (const optim::LrParamSpec& param : spec->params)
    if (param.need == optim::LrParamNeed::kRequired && !c->params.count(param.name))
      return p.Error(std::string(param.name), "required for scheduler " + c->type);
  (void)p.Finish({});
  return o.Finish({});
}

void WriteScheduler(const Config& config, json* j) {
  const SchedulerConfig& c = config.scheduler;
  if (c.type.empty()) return;  // the constant lr
  json params = json::object();
  for (const auto& [name, v] : c.params) params[name] = FromLrParam(v);
  (*j)["scheduler"] = {{"type", c.type}, {"params", params}};
}

// ---- zero_optimization ----------------------------------------------------------

// DeepSpeed's legacy "pipeline": both pipeline_read and pipeline_write.
Status ReadLegacyPipeline(Obj& o, OffloadConfig* c, Ctx*) {
  bool pipeline = false;
  RETURN_IF_ERROR(o.Bool("pipeline", &pipeline));
  if (pipeline) c->pipeline_read = c->pipeline_write = true;
  return Status::OK();
}

Status NvmePathIfNvme(Obj& o, OffloadConfig* c, Ctx*) {
  if (c->device == "nvme" && c->nvme_path.empty())
    return o.Error("nvme_path", "required when device is \"nvme\" (a directory on the NVMe drive)");
  return Status::OK();
}

// offload_param (optimizer false) or offload_optimizer (true).
Section<OffloadConfig> OffloadSection(bool optimizer) {
  using C = OffloadConfig;
  Section<C> s;
  s.rows = {
      OneOf("device", &C::device, {"none", "cpu", "nvme"}),
      Text("nvme_path", &C::nvme_path, kOmitEmpty),
      Flag("pin_memory", &C::pin_memory),
      Int("buffer_count", &C::buffer_count, 1, 1e6),
  };
  if (optimizer) {
    s.rows.push_back(Flag("pipeline_read", &C::pipeline_read));
    s.rows.push_back(Flag("pipeline_write", &C::pipeline_write));
    s.rows.push_back(Rule<C>(ReadLegacyPipeline));
    s.rows.push_back(Real("ratio", &C::ratio, 0, 1));  // 0: all on the GPU (DeepSpeed: ge=0, le=1)
  } else {
    s.rows.push_back(Int("buffer_size", &C::buffer_size, 1, kBig, kAuto));
    s.rows.push_back(Int("max_in_cpu", &C::max_in_cpu, 0, kBig, kAuto));
  }
  s.rows.push_back(Rule<C>(NvmePathIfNvme));
  s.ignored = {{"fast_init", Policy::kWarn, "initialization speed only"}};
  return s;
}

const Section<OffloadConfig>& OffloadParamSection() {
  static const Section<OffloadConfig> s = OffloadSection(false);
  return s;
}

const Section<OffloadConfig>& OffloadOptimizerSection() {
  static const Section<OffloadConfig> s = OffloadSection(true);
  return s;
}

// The legacy offload switches, then the ratio's rule (which a legacy switch
// can satisfy).
Status ReadLegacyOffload(Obj& o, ZeroConfig* c, Ctx* ctx) {
  bool legacy = false, legacy_params = false, pin = true;
  RETURN_IF_ERROR(FirstError({o.Bool("cpu_offload", &legacy), o.Bool("cpu_offload_params", &legacy_params),
                              o.Bool("cpu_offload_use_pin_memory", &pin)}));
  if (legacy) {
    if (c->offload_optimizer.device == "none") c->offload_optimizer.device = "cpu";
    ctx->warnings->push_back(ctx->source + ": " + o.KeyPath("cpu_offload") +
                             " is deprecated in DeepSpeed; read as offload_optimizer.device = \"cpu\"");
  }
  if (legacy_params) {
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
  if (o.Has("cpu_offload_use_pin_memory")) c->offload_optimizer.pin_memory = c->offload_param.pin_memory = pin;
  return Status::OK();
}

// Tuning knobs of DeepSpeed's own fetch heuristics: checked and kept in the
// config, but the planner decides what they decide there, from the memory
// budgets. One warning names those set to other than DeepSpeed's default,
// so a tuned config does not look obeyed when it is not. The bucket sizes
// are obeyed (the rounds of the ranks' collectives, engine/
// staged_collectives.h), as are stage 3's prefetch_bucket_size (engine/
// param_gather.h) and overlap_comm (the gathers' stream at stage 3, and at
// every stage the gradients' sums beside the backward: engine/
// grad_reduce.h).
Status WarnTuningKnobs(Obj& o, ZeroConfig* c, Ctx* ctx) {
  const ZeroConfig def;
  const std::pair<std::string, bool> tuning[] = {
      {"max_live_parameters", c->max_live_parameters != def.max_live_parameters},
      {"max_reuse_distance", c->max_reuse_distance != def.max_reuse_distance},
      {"param_persistence_threshold", c->param_persistence_threshold != def.param_persistence_threshold},
      {"sub_group_size", c->sub_group_size != def.sub_group_size}};
  std::string tuned;
  for (const auto& [key, changed] : tuning)
    for (const std::string& k : {key, "stage3_" + key})
      if (changed && o.Has(k)) tuned += (tuned.empty() ? "" : ", ") + o.KeyPath(k);
  if (!tuned.empty())
    ctx->warnings->push_back(ctx->source + ": " + tuned +
                             ": accepted, no effect in strata (the planner sets the prefetch depth and which "
                             "parameters stay on the GPU from the memory budgets, by each tensor's next use in the "
                             "step, and updates the optimizer state a layer at a time; --dry-run shows them)");
  return Status::OK();
}

const Section<ZeroConfig>& ZeroSection() {
  using C = ZeroConfig;
  static const Section<C> s = {
      {
          Int("stage", &C::stage, 0, 3),
          Child("offload_param", &C::offload_param, OffloadParamSection),
          Child("offload_optimizer", &C::offload_optimizer, OffloadOptimizerSection),
          Rule<C>(ReadLegacyOffload),
          Flag("overlap_comm", &C::overlap_comm),
          Int("reduce_bucket_size", &C::reduce_bucket_size, 1, kBig, kAuto),
          Int("allgather_bucket_size", &C::allgather_bucket_size, 1, kBig, kAuto),
          Int("prefetch_bucket_size", &C::prefetch_bucket_size, 0, kBig, kStage3),
          Int("max_live_parameters", &C::max_live_parameters, 0, kBig, kStage3),
          Int("max_reuse_distance", &C::max_reuse_distance, 0, kBig, kStage3),
          Int("param_persistence_threshold", &C::param_persistence_threshold, 0, kBig, kStage3),
          Int("sub_group_size", &C::sub_group_size, 0, kBig, kAuto),
          Rule<C>(WarnTuningKnobs),
      },
      {
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
      }};
  return s;
}

// ---- The other sections ---------------------------------------------------------

const Section<ActivationCheckpointingConfig>& ActivationCheckpointingSection() {
  using C = ActivationCheckpointingConfig;
  static const Section<C> s = {
      {
          Flag("partition_activations", &C::partition_activations),
          Flag("cpu_checkpointing", &C::cpu_checkpointing),
          Int("number_checkpoints", &C::number_checkpoints, 0, 1e6),
      },
      {
          {"contiguous_memory_optimization", Policy::kWarn, "memory layout only"},
          {"synchronize_checkpoint_boundary", Policy::kWarn, "timing only"},
          {"profile", Policy::kWarn, "profiling only"},
      }};
  return s;
}

Status BlockSizeIsPages(Obj& o, AioConfig* c, Ctx*) {
  if (c->block_size % 4096) return o.Error("block_size", std::to_string(c->block_size) + " is not a multiple of 4096");
  return Status::OK();
}

// "thread_count" is DeepSpeed's older name of intra_op_parallelism.
Status ReadThreadCount(Obj& o, AioConfig* c, Ctx*) {
  int threads = c->intra_op_parallelism;
  RETURN_IF_ERROR(o.Int("thread_count", &threads, 1, 256));
  if (!o.Has("thread_count")) return Status::OK();
  if (o.Has("intra_op_parallelism") && threads != c->intra_op_parallelism)
    return o.Error("thread_count", "differs from intra_op_parallelism (its alias); keep one");
  c->intra_op_parallelism = threads;
  return Status::OK();
}

const Section<AioConfig>& AioSection() {
  using C = AioConfig;
  static const Section<C> s = {
      {
          Int("block_size", &C::block_size, 4096, 1ull << 30),
          Rule<C>(BlockSizeIsPages),
          Int("queue_depth", &C::queue_depth, 1, 4096),
          Int("intra_op_parallelism", &C::intra_op_parallelism, 1, 256),
          Rule<C>(ReadThreadCount),
          Flag("single_submit", &C::single_submit),
          Flag("overlap_events", &C::overlap_events),
      },
      {{"use_gds", Policy::kWarn, "GPUDirect Storage is not used; I/O goes through pinned host memory"}}};
  return s;
}

Status HeadsDivideWidth(Obj& o, ModelConfig* c, Ctx*) {
  if (o.Failed("n_embd") || o.Failed("n_head")) return Status::OK();
  if (c->n_embd % c->n_head)
    return o.Error("n_head", std::to_string(c->n_head) + " does not divide n_embd (" + std::to_string(c->n_embd) + ")");
  return Status::OK();
}

// "num_key_value_heads" is Hugging Face's name of n_kv_head.
Status ReadKvHeads(Obj& o, ModelConfig* c, Ctx*) {
  int kv = c->n_kv_head;
  RETURN_IF_ERROR(o.Int("num_key_value_heads", &kv, 0, 1 << 14));
  if (!o.Has("num_key_value_heads")) return Status::OK();
  if (o.Has("n_kv_head") && kv != c->n_kv_head)
    return o.Error("num_key_value_heads", "differs from n_kv_head (its alias); keep one");
  c->n_kv_head = kv;
  return Status::OK();
}

Status ArchIsKnown(Obj& o, ModelConfig* c, Ctx*) {
  if (o.Failed("arch")) return Status::OK();
  Result<const models::Family*> f = models::FindFamily(c->arch);
  if (!f.ok()) return o.Error("arch", std::string(f.status().message()));
  if (std::string((*f)->name) != "gpt2" && c->intermediate_size < 1)
    return o.Error("intermediate_size", "is required for the " + c->arch + " architecture");
  if (c->n_kv_head > 0 && c->n_head % c->n_kv_head)
    return o.Error("n_kv_head", std::to_string(c->n_kv_head) + " does not divide n_head (" + std::to_string(c->n_head) + ")");
  return Status::OK();
}

Status RopeTypeAlias(Obj& o, RopeScalingConfig* c, Ctx*) {
  std::string t = c->rope_type;
  RETURN_IF_ERROR(o.Choice("type", &t, {"default", "linear", "llama3"}));
  if (!o.Has("type")) return Status::OK();
  if (o.Has("rope_type") && t != c->rope_type) return o.Error("type", "differs from rope_type (its newer name); keep one");
  c->rope_type = t;
  return Status::OK();
}

const Section<RopeScalingConfig>& RopeScalingSection() {
  using C = RopeScalingConfig;
  static const Section<C> s = {
      {
          OneOf("rope_type", &C::rope_type, {"default", "linear", "llama3"}),
          Rule<C>(RopeTypeAlias),
          Real("factor", &C::factor, 0, 1e6, kOpenBelow),
          Real("low_freq_factor", &C::low_freq_factor, 0, 1e6, kOpenBelow),
          Real("high_freq_factor", &C::high_freq_factor, 0, 1e6, kOpenBelow),
          Int("original_max_position_embeddings", &C::original_max_position_embeddings, 1, 1 << 24),
      },
      {}};
  return s;
}

const Section<ModelConfig>& ModelSection() {
  using C = ModelConfig;
  static const Section<C> s = {
      {
          Text("arch", &C::arch),
          Int("n_layer", &C::n_layer, 1, 10000),
          Int("n_embd", &C::n_embd, 1, 1 << 20),
          Int("n_head", &C::n_head, 1, 1 << 14),
          Int("vocab_size", &C::vocab_size, 2, 1 << 24),
          Int("seq_len", &C::seq_len, 1, 1 << 20),
          Int("n_kv_head", &C::n_kv_head, 0, 1 << 14),
          Rule<C>(ReadKvHeads),
          Int("intermediate_size", &C::intermediate_size, 0, 1 << 24),
          Real("rms_norm_eps", &C::rms_norm_eps, 0, 1, kOpenBelow),
          Real("rope_theta", &C::rope_theta, 0, 1e12, kOpenBelow),
          Child("rope_scaling", &C::rope_scaling, RopeScalingSection),
          Flag("tie_word_embeddings", &C::tie_word_embeddings),
          Flag("attention_bias", &C::attention_bias),
          Rule<C>(HeadsDivideWidth),
          Rule<C>(ArchIsKnown),
      },
      {}};
  return s;
}

const Section<DataConfig>& DataSection() {
  using C = DataConfig;
  static const Section<C> s = {
      {
          Text("path", &C::path),
          OneOf("format", &C::format, {"auto", "text", "tokens", "tokens32"}),
          Text("val_path", &C::val_path),
          Real("val_fraction", &C::val_fraction, 0, 0.5),
          OneOf("sampling", &C::sampling, {"random", "sequential"}),
          Int("seed", &C::seed, 0, 1.8e19),
      },
      {}};
  return s;
}

// The Hugging Face TrainingArguments a trainer section may hold: read (and
// checked) where they resolve "auto" values (engine/config_auto.h); here
// they are only known keys.
Status TakeHfTrainerKeys(Obj& o, TrainerConfig*, Ctx*) {
  for (const std::string& k : HfTrainerKeys()) (void)o.Take(k);
  return Status::OK();
}

Status ShardSizeIsBytes(Obj& o, TrainerConfig* c, Ctx*) {
  if (o.Failed("save_max_shard_size")) return Status::OK();
  Result<uint64_t> b = ParseBytes(c->save_max_shard_size);
  if (!b.ok()) return o.Error("save_max_shard_size", std::string(b.status().message()));
  if (*b == 0) return o.Error("save_max_shard_size", "must be more than 0 bytes");
  return Status::OK();
}

const Section<TrainerConfig>& TrainerSection() {
  using C = TrainerConfig;
  static const Section<C> s = {
      {
          Int("steps", &C::steps, 1, kBig),
          Int("seed", &C::seed, 0, 1.8e19),
          Int("eval_interval", &C::eval_interval, 0, kBig),
          Int("eval_batches", &C::eval_batches, 1, 1e6),
          OneOf("gpu_assisted_optimizer", &C::gpu_assisted_optimizer, {"auto", "on", "off"}),
          OneOf("schedule", &C::schedule, {"layer-major", "micro-batch-major"}),
          OneOf("nvme_checksum", &C::nvme_checksum, {"crc32c", "xxh64", "none"}),
          OneOf("save_dtype", &C::save_dtype, {"bf16", "fp32"}),
          Text("save_max_shard_size", &C::save_max_shard_size),
          Rule<C>(ShardSizeIsBytes),
          Rule<C>(TakeHfTrainerKeys),
      },
      {}};
  return s;
}

// ---- The top level ----------------------------------------------------------------

// train_batch_size = micro batch × accumulation steps × world size: any two
// give the third; "auto" or absent counts as not given; none given is an
// error (DeepSpeed's too). A key that failed, or an "auto" reported
// unresolved, stops the rule (its error is the one that matters).
Status ReadBatchSizes(Obj& o, Config* c, Ctx* ctx) {
  int64_t tb = 0, mb = 0, ga = 0;  // 0: not given
  const char* keys[] = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"};
  RETURN_IF_ERROR(FirstError({o.Int(keys[0], &tb, 1, kBig, true), o.Int(keys[1], &mb, 1, kBig, true),
                              o.Int(keys[2], &ga, 1, kBig, true)}));
  for (const char* k : keys)
    if (ctx->unresolved.count(k)) return Status::OK();
  const int64_t w = c->world_size;
  auto rule = [&](const std::string& what) {
    return o.Error("train_batch_size", what +
                                           " (the rule: train_batch_size = train_micro_batch_size_per_gpu × "
                                           "gradient_accumulation_steps × world size; here " +
                                           (tb ? std::to_string(tb) : "?") + " vs " +
                                           (mb ? std::to_string(mb) : "?") + " × " +
                                           (ga ? std::to_string(ga) : "?") + " × " + std::to_string(w) + ")");
  };
  // Products in 128 bits: each factor is at most 1e15.
  auto product = [](__int128 a, __int128 b, __int128 c3) { return a * b * c3; };
  if (!tb && !mb)
    return o.Error("train_batch_size",
                   "no batch size: give train_micro_batch_size_per_gpu (with gradient_accumulation_steps, default 1) "
                   "or train_batch_size (DeepSpeed requires one of them too)");
  if (tb && mb && ga) {
    if (tb != product(mb, ga, w)) return rule("inconsistent batch sizes");
  } else if (tb && mb) {
    if (tb % product(mb, w, 1)) return rule("train_batch_size is not divisible by micro batch × world size");
    ga = static_cast<int64_t>(tb / product(mb, w, 1));
  } else if (tb && ga) {
    if (tb % product(ga, w, 1)) return rule("train_batch_size is not divisible by accumulation steps × world size");
    mb = static_cast<int64_t>(tb / product(ga, w, 1));
  } else if (mb) {
    if (!ga) ga = 1;
    if (product(mb, ga, w) > static_cast<__int128>(kBig)) return rule("the batch is too large");
    tb = static_cast<int64_t>(product(mb, ga, w));
  } else {
    ga = 1;
    if (tb % w) return rule("train_batch_size is not divisible by the world size");
    mb = tb / w;
  }
  c->train_batch_size = tb;
  c->micro_batch = mb;
  c->grad_accum = ga;
  return Status::OK();
}

void WriteBatchSizes(const Config& c, json* j) {
  (*j)["train_batch_size"] = c.train_batch_size;
  (*j)["train_micro_batch_size_per_gpu"] = c.micro_batch;
  (*j)["gradient_accumulation_steps"] = c.grad_accum;
}

const Section<Config>& ConfigSection() {
  using C = Config;
  static const Section<C> s = {
      {
          Rule<C>(ReadBatchSizes, WriteBatchSizes),
          Child("fp16", &C::fp16, Fp16Section),
          Nested("bf16", Bf16Section),
          Rule<C>(ReadBfloat16),
          Child("optimizer", &C::optimizer, OptimizerSection),
          Rule<C>(ReadScheduler, WriteScheduler),
          Real("gradient_clipping", &C::gradient_clipping, 0, 1e30),
          Child("zero_optimization", &C::zero, ZeroSection),
          Child("activation_checkpointing", &C::activation_checkpointing, ActivationCheckpointingSection),
          Child("aio", &C::aio, AioSection),
          Int("steps_per_print", &C::steps_per_print, 1, kBig),
          Flag("wall_clock_breakdown", &C::wall_clock_breakdown),
          Child("model", &C::model, ModelSection),
          Child("data", &C::data, DataSection),
          Child("trainer", &C::trainer, TrainerSection),
      },
      {
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
          {"data_types", Policy::kErrorIfEnabled,
           "strata accumulates gradients in fp32; another dtype changes the result"},
      }};
  return s;
}

}  // namespace

Result<Config> ParseConfig(const json& j, const std::string& source, const ConfigSources& sources,
                           std::vector<std::string>* warnings) {
  std::vector<std::string> local;
  if (!warnings) warnings = &local;
  if (!j.is_object()) return InvalidArgument(source + ": the config is not a JSON object (it is " + Show(j) + ")");
  if (sources.world_size < 1)
    return InvalidArgument("world size " + std::to_string(sources.world_size) + " is not positive");
  if (JsonDeeperThan(j, kMaxConfigDepth))
    return InvalidArgument(source + ": nested deeper than " + std::to_string(kMaxConfigDepth) + " levels");
  Ctx ctx{source, warnings, {}, {}};
  json resolved = j;
  try {
    ResolveAuto(&resolved, sources, &ctx);
  } catch (const std::exception& e) {  // a library exception at the boundary is a config error
    ctx.errors.push_back(source + ": cannot resolve \"auto\" values: " + PrintableText(e.what(), 120));
  }
  Config c;  // every key left out keeps its default
  c.source = source;
  c.world_size = sources.world_size;
  Obj o(resolved, "", &ctx);
  (void)ReadSection(o, &c, ConfigSection(), &ctx);
  if (!j.contains("model")) {
    if (sources.model) {
      c.model = *sources.model;
    } else if (sources.require_model) {
      ctx.errors.push_back(source +
                           ": no \"model\" section: give the model's shape (\"model\": {\"n_layer\": ..., \"n_embd\": "
                           "..., \"n_head\": ..., \"vocab_size\": ..., \"seq_len\": ...}), or start from Hugging Face "
                           "GPT-2 weights with --init-from FILE (their shape is the model); `strata train` without "
                           "--config trains the built-in demo");
    }
  }
  if (!ctx.errors.empty()) return InvalidArgument(JoinConfigErrors(ctx.errors));
  return c;
}

Result<Config> ParseConfig(const json& j, const std::string& source, int world_size,
                           std::vector<std::string>* warnings) {
  ConfigSources s;
  s.world_size = world_size;
  return ParseConfig(j, source, s, warnings);
}

namespace {

// `p` under `dir` (which ends in '/', or is "") when it is relative; "" stays "".
std::string RelativeTo(const std::string& dir, const std::string& p) {
  if (p.empty() || p.front() == '/') return p;
  return dir + p;
}

}  // namespace

Result<Config> LoadConfig(const std::string& path, const ConfigSources& sources, std::vector<std::string>* warnings) {
  ASSIGN_OR_RETURN(std::string text, ReadConfigText(path));
  ASSIGN_OR_RETURN(json j, ParseConfigJson(text, path));
  ASSIGN_OR_RETURN(Config c, ParseConfig(j, path, sources, warnings));
  // Paths in the file are relative to its folder (as the file's author sees them).
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  for (std::string* p : {&c.data.path, &c.data.val_path, &c.zero.offload_param.nvme_path,
                         &c.zero.offload_optimizer.nvme_path})
    *p = RelativeTo(dir, *p);
  return c;
}

Result<Config> LoadConfig(const std::string& path, int world_size, std::vector<std::string>* warnings) {
  ConfigSources s;
  s.world_size = world_size;
  return LoadConfig(path, s, warnings);
}

nlohmann::json ConfigToJson(const Config& c) { return WriteSection(c, ConfigSection()); }

Config DefaultConfig() {
  // DeepSpeed's defaults but where GPT training's usual values differ
  // (configs/default.json writes the same).
  Config c;
  c.source = "(built-in default)";
  c.train_batch_size = c.micro_batch = 8;
  c.grad_accum = 1;
  c.optimizer.beta2 = 0.95;
  c.optimizer.weight_decay = 0.1;
  c.gradient_clipping = 1.0;
  c.steps_per_print = 5;
  return c;
}

}  // namespace strata
