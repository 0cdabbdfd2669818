// SPDX-License-Identifier: Apache-2.0
// The CPU Adam's C API (optim/c_api.h): thin wrappers over CpuAdam and
// optim/grad_clip.h, with the boundary helpers of base/c_api_internal.h.
#include "optim/c_api.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "base/c_api_internal.h"
#include "optim/cpu_adam.h"
#include "optim/grad_clip.h"

static_assert(STRATA_ISA_AUTO == static_cast<int>(strata::optim::Isa::kAuto) &&
              STRATA_ISA_SCALAR == static_cast<int>(strata::optim::Isa::kScalar) &&
              STRATA_ISA_AVX2 == static_cast<int>(strata::optim::Isa::kAvx2) &&
              STRATA_ISA_AVX512 == static_cast<int>(strata::optim::Isa::kAvx512) &&
              STRATA_ISA_AVX512_BF16 == static_cast<int>(strata::optim::Isa::kAvx512Bf16));

struct strata_adam {
  std::unique_ptr<strata::optim::CpuAdam> adam;
};

using strata::InvalidArgument;
using strata::Status;
using strata::capi::Call;
using strata::capi::NullArgument;
using strata::capi::ToDType;

namespace {

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

Status CheckLossScale(const char* fn, double loss_scale) {
  if (!std::isfinite(loss_scale) || !(loss_scale > 0))
    return InvalidArgument(std::string(fn) + ": loss_scale must be finite and > 0, got " + Num(loss_scale));
  return Status::OK();
}

}  // namespace

extern "C" {

size_t strata_optim_struct_size(const char* name) {
  if (name == nullptr) return 0;
  const std::string_view n(name);
#define STRATA_SIZE(T) \
  if (n == #T) return sizeof(T)
  STRATA_SIZE(strata_adam_options);
  STRATA_SIZE(strata_adam_info);
  STRATA_SIZE(strata_adam_hyper);
  STRATA_SIZE(strata_adam_shard);
  STRATA_SIZE(strata_adam_result);
  STRATA_SIZE(strata_grad_stats);
#undef STRATA_SIZE
  return 0;
}

const char* strata_isa_name(int isa) {
  if (isa < STRATA_ISA_AUTO || isa > STRATA_ISA_AVX512_BF16) return "?";
  return strata::optim::IsaName(static_cast<strata::optim::Isa>(isa)).data();  // literals: NUL-terminated
}

void strata_adam_options_init(strata_adam_options* o) {
  if (o == nullptr) return;
  const strata::optim::CpuAdam::Options d;
  *o = strata_adam_options{};
  o->threads = d.threads;
  o->isa = static_cast<strata_isa>(d.isa);
  o->tile_elems = d.tile_elems;
  o->pin_threads = d.pin_threads ? 1 : 0;
  o->numa_node = d.numa_node;
  o->prefetch_bytes = d.prefetch_bytes;
  o->prefetch_hint = d.prefetch_hint == strata::optim::PrefetchHint::kL1 ? STRATA_PREFETCH_L1 : STRATA_PREFETCH_L2;
}

strata_status strata_adam_create(const strata_adam_options* options, strata_adam** adam, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (adam == nullptr) return NullArgument("strata_adam_create", "adam");
    strata_adam_options o;
    strata_adam_options_init(&o);
    if (options != nullptr) o = *options;
    if (o.isa < STRATA_ISA_AUTO || o.isa > STRATA_ISA_AVX512_BF16)
      return InvalidArgument("strata_adam_create: options.isa " + std::to_string(o.isa) +
                             " is not a strata_isa (0 auto, 1 scalar, 2 avx2, 3 avx512, 4 avx512bf16)");
    if (o.prefetch_hint != STRATA_PREFETCH_L1 && o.prefetch_hint != STRATA_PREFETCH_L2)
      return InvalidArgument("strata_adam_create: options.prefetch_hint " + std::to_string(o.prefetch_hint) +
                             " is not a strata_prefetch_hint (0 l1, 1 l2)");
    strata::optim::CpuAdam::Options c;
    c.threads = o.threads;
    c.isa = static_cast<strata::optim::Isa>(o.isa);
    c.tile_elems = o.tile_elems;
    c.pin_threads = o.pin_threads != 0;
    c.numa_node = o.numa_node;
    c.prefetch_bytes = o.prefetch_bytes;
    c.prefetch_hint =
        o.prefetch_hint == STRATA_PREFETCH_L1 ? strata::optim::PrefetchHint::kL1 : strata::optim::PrefetchHint::kL2;
    auto r = strata::optim::CpuAdam::Create(c);
    if (!r.ok()) return r.status();
    *adam = new strata_adam{std::move(r).value()};
    return Status::OK();
  });
}

void strata_adam_destroy(strata_adam* adam) { delete adam; }

strata_status strata_adam_info_get(const strata_adam* adam, strata_adam_info* info, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (adam == nullptr) return NullArgument("strata_adam_info_get", "adam");
    if (info == nullptr) return NullArgument("strata_adam_info_get", "info");
    const strata::optim::CpuAdam& a = *adam->adam;
    strata_adam_info out{};
    out.isa = static_cast<strata_isa>(a.isa());
    out.threads = a.threads();
    out.tile_elems = a.tile_elems();
    out.prefetch_bytes = a.prefetch_bytes();
    out.pinned = a.pinned() ? 1 : 0;
    *info = out;
    return Status::OK();
  });
}

void strata_adam_hyper_init(strata_adam_hyper* h) {
  if (h == nullptr) return;
  const strata::optim::AdamHyper d;
  *h = strata_adam_hyper{};
  h->lr = d.lr;
  h->beta1 = d.beta1;
  h->beta2 = d.beta2;
  h->eps = d.eps;
  h->weight_decay = d.weight_decay;
  h->decay_mode = d.decay_mode == strata::optim::WeightDecayMode::kDecoupled ? STRATA_DECAY_DECOUPLED : STRATA_DECAY_L2;
  h->bias_correction = d.bias_correction ? 1 : 0;
  h->step = d.step;
}

strata_status strata_adam_step(const strata_adam* adam, const strata_adam_shard* shard,
                               const strata_adam_hyper* hyper, double grad_scale, int skip_on_nonfinite,
                               strata_adam_result* result, strata_error** error) {
  return Call(error, [&]() -> Status {
    const char* fn = "strata_adam_step";
    if (adam == nullptr) return NullArgument(fn, "adam");
    if (shard == nullptr) return NullArgument(fn, "shard");
    if (hyper == nullptr) return NullArgument(fn, "hyper");
    strata::optim::AdamShard s;
    s.n = shard->n;
    s.master = shard->master;
    s.exp_avg = shard->exp_avg;
    s.exp_avg_sq = shard->exp_avg_sq;
    ASSIGN_OR_RETURN(s.state_dtype, ToDType(shard->state_dtype, "shard.state_dtype"));
    s.grad = shard->grad;
    ASSIGN_OR_RETURN(s.grad_dtype, ToDType(shard->grad_dtype, "shard.grad_dtype"));
    s.param_out = shard->param_out;
    if (shard->param_out != nullptr) {
      ASSIGN_OR_RETURN(s.param_out_dtype, ToDType(shard->param_out_dtype, "shard.param_out_dtype"));
    }
    if (hyper->decay_mode != STRATA_DECAY_DECOUPLED && hyper->decay_mode != STRATA_DECAY_L2)
      return InvalidArgument(std::string(fn) + ": hyper.decay_mode " + std::to_string(hyper->decay_mode) +
                             " is not a strata_weight_decay (0 decoupled, 1 l2)");
    strata::optim::AdamHyper h;
    h.lr = hyper->lr;
    h.beta1 = hyper->beta1;
    h.beta2 = hyper->beta2;
    h.eps = hyper->eps;
    h.weight_decay = hyper->weight_decay;
    h.decay_mode = hyper->decay_mode == STRATA_DECAY_DECOUPLED ? strata::optim::WeightDecayMode::kDecoupled
                                                               : strata::optim::WeightDecayMode::kL2;
    h.bias_correction = hyper->bias_correction != 0;
    h.step = hyper->step;
    strata::optim::AdamStepOptions opt;
    opt.grad_scale = grad_scale;
    opt.skip_on_nonfinite = skip_on_nonfinite != 0;
    ASSIGN_OR_RETURN(const strata::optim::AdamStepResult r, adam->adam->Step(s, h, opt));
    if (result != nullptr) *result = strata_adam_result{r.nonfinite_grads, r.skipped ? 1 : 0};
    return Status::OK();
  });
}

strata_status strata_adam_grad_stats(const strata_adam* adam, const void* grad, int dtype, size_t n,
                                     strata_grad_stats* stats, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (adam == nullptr) return NullArgument("strata_adam_grad_stats", "adam");
    if (stats == nullptr) return NullArgument("strata_adam_grad_stats", "stats");
    if (grad == nullptr && n > 0) return NullArgument("strata_adam_grad_stats", "grad");
    ASSIGN_OR_RETURN(const strata::DType dt, ToDType(dtype, "dtype"));
    ASSIGN_OR_RETURN(const strata::optim::GradStats g, adam->adam->ComputeGradStats(grad, dt, n));
    *stats = strata_grad_stats{g.sum_sq, g.nonfinite, g.count};
    return Status::OK();
  });
}

strata_status strata_grad_stats_merge(strata_grad_stats* total, const strata_grad_stats* shard,
                                      strata_error** error) {
  return Call(error, [&]() -> Status {
    if (total == nullptr) return NullArgument("strata_grad_stats_merge", "total");
    if (shard == nullptr) return NullArgument("strata_grad_stats_merge", "shard");
    strata::optim::GradStats t{total->sum_sq, total->nonfinite, total->count};
    t.Merge(strata::optim::GradStats{shard->sum_sq, shard->nonfinite, shard->count});
    *total = strata_grad_stats{t.sum_sq, t.nonfinite, t.count};
    return Status::OK();
  });
}

strata_status strata_global_grad_norm(const strata_grad_stats* stats, double loss_scale, double* norm,
                                      strata_error** error) {
  return Call(error, [&]() -> Status {
    if (stats == nullptr) return NullArgument("strata_global_grad_norm", "stats");
    if (norm == nullptr) return NullArgument("strata_global_grad_norm", "norm");
    RETURN_IF_ERROR(CheckLossScale("strata_global_grad_norm", loss_scale));
    *norm = strata::optim::GlobalGradNorm(strata::optim::GradStats{stats->sum_sq, stats->nonfinite, stats->count},
                                          loss_scale);
    return Status::OK();
  });
}

strata_status strata_clip_coefficient(double norm, double max_norm, double* coef, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (coef == nullptr) return NullArgument("strata_clip_coefficient", "coef");
    RETURN_IF_ERROR(strata::optim::ValidateGradientClipping(max_norm));
    *coef = strata::optim::ClipCoefficient(norm, max_norm);
    return Status::OK();
  });
}

strata_status strata_grad_multiplier(double loss_scale, double clip_coef, double* multiplier, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (multiplier == nullptr) return NullArgument("strata_grad_multiplier", "multiplier");
    RETURN_IF_ERROR(CheckLossScale("strata_grad_multiplier", loss_scale));
    if (!std::isfinite(clip_coef) || clip_coef < 0)
      return InvalidArgument("strata_grad_multiplier: clip_coef must be finite and >= 0, got " + Num(clip_coef));
    *multiplier = strata::optim::GradMultiplier(loss_scale, clip_coef);
    return Status::OK();
  });
}

}  // extern "C"
