// SPDX-License-Identifier: Apache-2.0
/* The C API of the CPU Adam (libstrata.so): optim/cpu_adam.h and the
 * gradient-clipping helpers of optim/grad_clip.h for C and ctypes.
 *
 * The update is exactly the C++ CpuAdam::Step (DeepSpeed's fma sequence,
 * bitwise the same on every code path and thread count); optim/cpu_adam.h is
 * the reference for the arithmetic, the non-finite guarantee and the memory
 * traffic. The error convention, ownership rules and enums (strata_status,
 * strata_error, strata_dtype) are those of tiers/c_api.h: every function that
 * can fail returns a strata_status and takes `strata_error** error` last.
 *
 * OWNERSHIP: a strata_adam (from strata_adam_create) belongs to the caller,
 * who frees it with strata_adam_destroy; it holds no optimizer state. All
 * arrays (shards, gradients) belong to the caller and are used only during
 * the call.
 *
 * THREAD-SAFETY: strata_adam_step and strata_adam_grad_stats may run
 * concurrently from several threads on one strata_adam (on different
 * shards: the calls share its thread pool); strata_adam_destroy must be the
 * last call on it. The helpers on strata_grad_stats and doubles are pure.
 *
 * The typical step over state kept in a strata_store (examples/c/):
 *   1. per shard, in a fixed order: strata_adam_grad_stats, then
 *      strata_grad_stats_merge into one total
 *   2. total.nonfinite > 0: skip the step (dynamic loss scaling)
 *   3. strata_global_grad_norm -> strata_clip_coefficient ->
 *      strata_grad_multiplier
 *   4. per shard: acquire master/m/v on the host tier READ_WRITE,
 *      strata_adam_step with that multiplier, release them dirty.
 */
#ifndef STRATA_OPTIM_C_API_H_
#define STRATA_OPTIM_C_API_H_

#include <stddef.h>
#include <stdint.h>

#include "base/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct strata_adam strata_adam;

/* sizeof the named struct of this header ("strata_adam_options",
 * "strata_adam_info", "strata_adam_hyper", "strata_adam_shard",
 * "strata_adam_result", "strata_grad_stats"); 0 for another name. */
STRATA_C_API size_t strata_optim_struct_size(const char* name);

typedef enum strata_isa {
  STRATA_ISA_AUTO = 0,        /* the best path this CPU supports */
  STRATA_ISA_SCALAR = 1,
  STRATA_ISA_AVX2 = 2,        /* AVX2 + FMA + F16C */
  STRATA_ISA_AVX512 = 3,      /* AVX-512 F/BW/DQ/VL */
  STRATA_ISA_AVX512_BF16 = 4  /* plus AVX512_BF16 */
} strata_isa;

/* "auto", "scalar", "avx2", "avx512", "avx512bf16"; "?" otherwise. */
STRATA_C_API const char* strata_isa_name(int isa);

typedef enum strata_prefetch_hint {
  STRATA_PREFETCH_L1 = 0, /* prefetcht0 */
  STRATA_PREFETCH_L2 = 1  /* prefetcht2 */
} strata_prefetch_hint;

/* CpuAdam::Options. Start from strata_adam_options_init. */
typedef struct strata_adam_options {
  int threads;                        /* 0: all hardware threads */
  strata_isa isa;                     /* a path the CPU lacks is UNAVAILABLE naming the features */
  size_t tile_elems;                  /* elements per task: a multiple of 64 in [64, 2^24] */
  int pin_threads;                    /* 1: bind worker threads to cores (hwloc) */
  int numa_node;                      /* with pin_threads: only this node's cores (-1: any) */
  size_t prefetch_bytes;              /* software prefetch distance: multiple of 64, <= 65536; 0 none */
  strata_prefetch_hint prefetch_hint; /* a hint: results are the same for every setting */
} strata_adam_options;

/* The C++ defaults. NULL is ignored. */
STRATA_C_API void strata_adam_options_init(strata_adam_options* options);

/* Creates the engine (a thread pool; it holds no optimizer state).
 * `options` NULL: the defaults. INVALID_ARGUMENT naming a bad option;
 * UNAVAILABLE for an ISA this CPU lacks or pinning hwloc cannot do.
 * *adam is owned by the caller. */
STRATA_C_API strata_status strata_adam_create(const strata_adam_options* options, strata_adam** adam,
                                              strata_error** error);
/* Waits for nothing (no call may be running on it). NULL is ignored. */
STRATA_C_API void strata_adam_destroy(strata_adam* adam);

typedef struct strata_adam_info {
  strata_isa isa;        /* the path chosen (never AUTO) */
  int threads;
  size_t tile_elems;
  size_t prefetch_bytes;
  int pinned;            /* 0/1 */
} strata_adam_info;

STRATA_C_API strata_status strata_adam_info_get(const strata_adam* adam, strata_adam_info* info,
                                                strata_error** error);

typedef enum strata_weight_decay {
  STRATA_DECAY_DECOUPLED = 0, /* AdamW: p -= lr * wd * p  (torch AdamW; DeepSpeed adam_w_mode=true) */
  STRATA_DECAY_L2 = 1         /* Adam:  g += wd * p       (torch Adam;  DeepSpeed adam_w_mode=false) */
} strata_weight_decay;

/* AdamHyper: one parameter group's hyperparameters for one step. Rules
 * (INVALID_ARGUMENT naming the field otherwise): lr >= 0, 0 <= beta1 < 1,
 * 0 <= beta2 < 1, eps >= 0, weight_decay >= 0, all finite; step >= 1. */
typedef struct strata_adam_hyper {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  strata_weight_decay decay_mode;
  int bias_correction; /* 1: DeepSpeed's default and torch's only behaviour */
  int64_t step;        /* the step being taken, counted from 1 */
} strata_adam_hyper;

/* lr 1e-3, betas 0.9/0.999, eps 1e-8, no decay (decoupled), bias correction,
 * step 1. NULL is ignored. */
STRATA_C_API void strata_adam_hyper_init(strata_adam_hyper* hyper);

/* One shard in host memory (AdamShard). All arrays hold n elements, are
 * naturally aligned for their dtype and do not overlap; the caller owns them
 * and keeps them valid for the call. */
typedef struct strata_adam_shard {
  size_t n;
  float* master;               /* (n) fp32 master weights, updated in place */
  void* exp_avg;               /* (n) state_dtype: m, in place */
  void* exp_avg_sq;            /* (n) state_dtype: v, in place */
  strata_dtype state_dtype;    /* STRATA_F32 or STRATA_BF16 */
  const void* grad;            /* (n) grad_dtype, read only */
  strata_dtype grad_dtype;     /* STRATA_F32, STRATA_F16 or STRATA_BF16 */
  void* param_out;             /* (n) param_out_dtype: the new parameters; NULL: none */
  strata_dtype param_out_dtype; /* STRATA_F16, STRATA_BF16 or STRATA_F32 */
} strata_adam_shard;

typedef struct strata_adam_result {
  uint64_t nonfinite_grads; /* non-finite gradient values found (before the multiplier) */
  int skipped;              /* 1: nothing was written (skip_on_nonfinite found some) */
} strata_adam_result;

/* One Adam/AdamW step over the shard (CpuAdam::Step). `grad_scale` multiplies
 * every gradient value (1/loss_scale x clip coefficient: strata_grad_multiplier);
 * finite, >= 0. `skip_on_nonfinite` 1: scan the gradient first and write
 * nothing if any value is non-finite (result.skipped = 1); 0: update all and
 * count them. Errors (INVALID_ARGUMENT naming the field of the shard or the
 * hyperparameters) are found before anything is written. `result` may be
 * NULL. Thread-safe: concurrent steps on different shards share the pool. */
STRATA_C_API strata_status strata_adam_step(const strata_adam* adam, const strata_adam_shard* shard,
                                            const strata_adam_hyper* hyper, double grad_scale,
                                            int skip_on_nonfinite, strata_adam_result* result,
                                            strata_error** error);

/* What a gradient scan finds (GradStats). */
typedef struct strata_grad_stats {
  double sum_sq;      /* sum of g*g over the values as stored, in fp64 */
  uint64_t nonfinite; /* +-Inf or NaN values */
  uint64_t count;     /* values scanned */
} strata_grad_stats;

/* Sum of squares and non-finite count of n values of `dtype` (F32, F16,
 * BF16). Writes nothing; deterministic for any thread count. Thread-safe. */
STRATA_C_API strata_status strata_adam_grad_stats(const strata_adam* adam, const void* grad, int dtype, size_t n,
                                                  strata_grad_stats* stats, strata_error** error);

/* total += shard (merge shards in a fixed order for a reproducible norm). */
STRATA_C_API strata_status strata_grad_stats_merge(strata_grad_stats* total, const strata_grad_stats* shard,
                                                   strata_error** error);

/* sqrt(sum_sq) / loss_scale; +Inf when there are non-finite values.
 * INVALID_ARGUMENT unless loss_scale is finite and > 0. */
STRATA_C_API strata_status strata_global_grad_norm(const strata_grad_stats* stats, double loss_scale, double* norm,
                                                   strata_error** error);

/* min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (no clipping) or the
 * norm is not finite. INVALID_ARGUMENT unless max_norm is finite. */
STRATA_C_API strata_status strata_clip_coefficient(double norm, double max_norm, double* coef,
                                                   strata_error** error);

/* clip_coef / loss_scale: the grad_scale of strata_adam_step. INVALID_ARGUMENT
 * unless loss_scale is finite and > 0 and clip_coef finite and >= 0. */
STRATA_C_API strata_status strata_grad_multiplier(double loss_scale, double clip_coef, double* multiplier,
                                                  strata_error** error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPTIM_C_API_H_ */
