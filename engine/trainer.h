// SPDX-License-Identifier: Apache-2.0
// The offload trainer: ZeRO-3 with offload on one GPU (or the CPU backend).
//
// What a step does, as data flows (docs/design.md, "The step"):
//
//   forward   embedding -> x_0; for each block l: x_{l+1} = block_l(x_l) for
//             every micro-batch (layer-major: each block's parameters cross
//             PCIe once per step), keeping x_l as the checkpoint (on the GPU
//             or written back to the host as the plan says); the head runs
//             forward and backward at once (loss, d x_L).
//   backward  for each block l from the last: recompute from x_l, backprop
//             every micro-batch, accumulating the block's gradients in fp32 on
//             the GPU; the squared norm and non-finite count are taken on the
//             GPU; the gradients then leave for their home tier.
//   optimizer when backward ends the clip coefficient and the overflow flag
//             are known; Adam updates shard by shard in forward order (CPU
//             Adam for host/NVMe state, the fused GPU Adam for GPU state —
//             all shards' or, with offload_optimizer.ratio < 1, a
//             forward-order prefix's, which then update first) and
//             each shard is marked ready: the next step's forward of block l
//             waits for block l only, so the update overlaps the next
//             forward and no stale weight is ever used.
//             When nothing waits on the global gradient norm (no gradient
//             clipping and no dynamic loss scale: bf16, fp32, or fp16 with a
//             static scale) the same exact update runs *during* the backward
//             instead: the job is posted before the backward's last pass and
//             the host-state shards are updated in the backward's order (ln_f,
//             the last block ... block 0, the embedding last: it is tied to
//             the head) as soon as each one's gradient is final and home.
//             The GPU-state prefix of offload_optimizer.ratio < 1 is still
//             updated right after the backward.
//             With gradient clipping (bf16, fp32 or a static fp16 scale) and
//             the offloaded state on the host, the update runs during the
//             backward on speculation: it assumes the clip coefficient will
//             be 1 (the norm within the threshold, as it usually is once
//             training settles) and writes each shard's new master/m/v into
//             a second set, leaving the current one untouched. When the
//             backward ends and the norm is known, a hit commits (the sets
//             swap, nothing is copied) and a miss redoes the speculated
//             shards from their untouched state with the true multiplier.
//             Either way the result is the post-backward update's, bit for
//             bit. A step speculates when the last one's norm was within the
//             threshold (StepReport::speculation says what became of it).
//             The second set costs 12 B per offloaded parameter of host
//             memory (8 B with bf16 moments); the plan counts it, and without room the update runs
//             after the backward.
//             The plan table and the log say which mode runs and why
//             (TrainerInfo::optimizer_update);
//             TrainOptions::optimizer_after_backward forces the first.
//
// Every tensor of the model (parameters, fp32 gradients, fp32 master, m/v
// in fp32 or bf16 (bf16.bf16_optimizer_states), checkpoints) lives in one TierStore with its home tier from the plan
// (engine/planner.h). The step's GPU accesses follow one access schedule,
// run by swap's Prefetcher: what comes next is prefetched within the GPU
// room left, what is not needed soon is evicted, and a shard's parameters
// are loaded only once its update is done. Scratch (the block's recompute space, the head's
// logits chunk, the residual gradients, tokens) is carved from the store's
// GPU tier, so the GPU budget covers everything the step touches.
//
// Thread-safety: a Trainer is driven by one thread; it runs one optimizer
// thread of its own.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/config.h"
#include "engine/planner.h"
#include "engine/step_report.h"
#include "engine/train_options.h"

namespace strata {


// What a run used and measured, for reports (strata-bench train).
struct TrainerInfo {
  std::string backend;              // "cuda:0 NVIDIA H200"
  double peak_flops = 0;            // the GEMM rate measured at Create (MFU's baseline)
  std::string peak_what;            // "8192^3 bf16 GEMM 779.0 TFLOP/s"
  double flops_per_token = 0;       // 6 N + 12 L d T
  int64_t tokens_per_step = 0;
  uint64_t gpu_budget = 0, host_budget = 0;  // of the tiers
  uint64_t gpu_overhead = 0;        // device memory outside the GPU tier, inside the limit
  uint64_t gpu_tier_peak = 0, host_tier_peak = 0;
  uint64_t device_in_use = 0;       // cudaMemGetInfo now: the whole process (0 without CUDA)
  // The prefetcher (swap/prefetcher.h) so far: its window on the GPU, the
  // moves it made, acquires it had to admit beyond the window or that found
  // no free block big enough (the store then made room itself), and the
  // GPU copies the store dropped in all (the prefetcher's evictions included).
  uint64_t swap_window = 0;
  uint64_t swap_prefetches = 0, swap_evictions = 0, swap_forced = 0, swap_fragmented = 0;
  uint64_t gpu_evictions = 0;
  // The shards whose optimizer state (with their gradients and parameters)
  // lives on the GPU, updated by the GPU Adam: all when the plan keeps the
  // optimizer there, the forward-order prefix of offload_optimizer.ratio < 1,
  // or none; and their parameters.
  int64_t optimizer_gpu_shards = 0;
  uint64_t optimizer_gpu_params = 0;
  // When the offloaded optimizer state is updated, and why: "during backward
  // (no clipping, bf16)", "after backward (gradient_clipping 1.0 needs the
  // global norm)", ... (trainer.h's header comment, "optimizer").
  // during_backward: every step's update runs during the backward (no
  // clipping); speculative: with clipping, the steps after one whose norm
  // was within the threshold speculate (trainer.h's header comment), and a
  // second master/m/v of `speculative_bytes` is held on the host.
  bool optimizer_during_backward = false;
  bool optimizer_speculative = false;
  uint64_t speculative_bytes = 0;
  std::string optimizer_update;
};

class Trainer {
 public:
  // Builds the backend, plans the placement (fails before allocating when no
  // plan fits), checks the places the run will write and the memory it will
  // pin (engine/preflight.h), locks the --save directory (engine/save_dir.h),
  // opens the store with tiers sized to the plan (engine/tier_sizes.h),
  // creates and initializes (or resumes, after verifying the checkpoint)
  // the model. Messages go to `log`.
  static Result<std::unique_ptr<Trainer>> Create(const TrainOptions& options, std::ostream& log);
  // Only the plan (for --dry-run), and the same checks as Create: no
  // allocation, nothing created.
  static Result<std::string> DryRun(const TrainOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // The plan (a value, as MakePlan made it) and what the step's schedule
  // moves per step in the GPU room the run has; the table prints both.
  const Plan& plan() const;
  const ScheduledTraffic& traffic() const;
  std::string PlanTable() const;

  // One optimizer step on the next batches of the data loader.
  Result<StepReport> Step();
  // One optimizer step on the caller's batches: tokens and targets of all
  // micro-batches, [grad_accum, micro_batch, seq_len] int32 each; a negative
  // target is ignored. Tokens outside the vocabulary are InvalidArgument.
  Result<StepReport> StepWith(const int32_t* tokens, const int32_t* targets);
  // Mean validation loss over `batches` validation batches.
  // With several ranks, Evaluate (ZeRO stage 3), Save and Parameter (ZeRO
  // stages >= 1) run collectives: every rank calls them alike, in the same
  // order (engine/data_parallel.h).
  Result<double> Evaluate(int batches);
  // Writes a checkpoint of the current state into `dir` (atomically; with
  // every file's checksum and the Hugging Face files: engine/checkpoint.h).
  // Rank 0 writes it; with the state partitioned each rank writes its own
  // slices and joins rank 0's gathers of the masters for the HF weights.
  Status Save(const std::string& dir);
  // The whole run: steps, logging every steps_per_print (and the JSON log,
  // engine/run_log.h), evaluation, checkpoints. Returns the first error.
  // When a signal asked to stop (engine/signals.h: the handlers are the
  // program's to install) the step under way ends, a checkpoint is saved
  // with --save, and Run returns Cancelled saying where.
  Status Run(std::ostream& out);
  // Writes the --trace file now, once the last step's update is done (Run
  // does at its end; a caller of Step calls it, or the destructor writes
  // it and prints its error).
  Status FinishTrace();

  int64_t step() const;
  TrainerInfo Info() const;
  // A parameter (fp32 master weights) by its Hugging Face name, for tests.
  // Once the optimizer has failed (a sticky error) it returns the in-memory
  // state as the workers left it, which may be partly updated.
  Result<std::vector<float>> Parameter(const std::string& hf_name);

 private:
  Trainer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
