// SPDX-License-Identifier: Apache-2.0
// The placement planner: given the model, the batch and the budgets, decide
// where each kind of training state lives and how deep to prefetch, before
// anything is allocated.
//
// State kinds and their sizes (P = parameters, per layer and for the
// embedding; B×T tokens per micro-batch; A micro-batches per step):
//   params       P × 2 B (bf16/fp16) or 4 B (fp32)        GPU | host | NVMe
//   grads        P × 4 B on the GPU (fp32 accumulation), or P × grad_host_bytes
//                on the host (bf16 in bf16 training)        GPU | host
//   optimizer    P × 12 B (fp32 master, m, v), or P × 8 B   GPU | host | NVMe
//                with bf16 moments (bf16.bf16_optimizer_states)
//                (ZeRO stage >= 1 across W ranks: P / W of that per rank,
//                PlanInputs::zero_partitions; the plan is then the rank's)
//                (+ as much again on the host for the speculative update's
//                second set, when asked for and the host budget has room)
//   checkpoints  (L+1) × A × B×T×C × dtype (each layer's input and the
//                head's)                                     GPU | host, or split:
//                the last layers' on the GPU, the first layers' on the host
// plus the GPU working set: one layer's recompute scratch, the gradient
// accumulator of one layer (fp32), the parameter buffers of the layers in
// flight (prefetch depth + 1), the residual-stream gradients of the A
// micro-batches, and the head's logits chunk; and on the host, what the
// host tier holds beside the state: a host optimizer's staging (GPU-homed
// gradients of the largest offloaded shard come down through one buffer,
// GPU-homed parameters go up through two), the non-finite counts, the
// store's NVMe staging, and each allocation's rounding to the tier's pages.
// So the host total is what the host tier will hold, and a plan that fits
// (the speculative update's second set included) can be allocated.
//
// Policy: of the placements that fit both budgets, the one with the least
// expected transfer time per step (PCIe bytes at PCIe speed, NVMe bytes at
// NVMe speed); ties go to the one using less host memory. Checkpoints that do
// not all fit on the GPU are split: the GPU keeps the last layers' (used
// first in backward), the host the first layers' (written early in forward,
// needed last). A device forced by the config (offload_*.device "cpu"/"nvme",
// cpu_checkpointing) is honoured. An impossible plan fails before anything is
// allocated, naming the budget that is short and by how much.
//
// Partial optimizer offload (DeepSpeed's offload_optimizer.ratio, the
// "Twin-Flow" of ZeRO-Offload++): with ratio r < 1 the optimizer state of a
// forward-order prefix of the shards (embedding, block 0, 1, ..., ln_f) stays
// on the GPU and is updated there by the fused GPU Adam, with those shards'
// gradients and parameters on the GPU too; the rest is offloaded as the
// config asks (host or NVMe) and updated by the CPU Adam. The prefix is the
// longest whose parameter count is <= (1 - r) x all parameters (whole shards
// only, so at least the fraction r is offloaded). Forward order, because
// after the backward the GPU shards update at once and the next forward
// starts on them while the CPU Adam works through the rest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/tier_kind.h"

namespace strata {

struct PlanInputs {
  // Model.
  int64_t n_layer = 0;
  uint64_t layer_params = 0;       // parameters of one transformer block
  uint64_t embedding_params = 0;   // wte (padded vocab) + wpe
  uint64_t final_params = 0;       // ln_f
  uint64_t param_bytes = 2;        // bytes per parameter in the compute dtype
  uint64_t checkpoint_bytes = 0;   // one layer input for one micro-batch (B×T×C×dtype)
  uint64_t grad_host_bytes = 4;    // bytes per gradient value sent to the host
  uint64_t moment_bytes = 4;       // bytes per Adam moment value: 4 (fp32) or 2 (bf16 moments)
  int64_t grad_accum = 1;          // micro-batches per step
  // GPU working set pieces that do not depend on the plan.
  uint64_t layer_workspace = 0;    // recompute + backward scratch of one block
  uint64_t head_workspace = 0;     // final LN + logits chunk + loss scratch
  uint64_t fixed_gpu = 0;          // tokens, targets, norms, misc
  // Budgets.
  uint64_t gpu_budget = 0;
  uint64_t host_budget = 0;
  bool have_nvme = false;
  // Requests from the config: "none" (planner decides), "cpu", "nvme".
  std::string offload_param = "none";
  std::string offload_optimizer = "none";
  bool cpu_checkpointing = false;  // activation_checkpointing.cpu_checkpointing
  int prefetch_depth = 0;          // 0 = as deep as the GPU budget allows, up to 4
  bool layer_major = true;         // all micro-batches through a layer before the next
  // zero_optimization.offload_optimizer.ratio: the fraction of the optimizer
  // state offloaded (to `offload_optimizer`, which must then be "cpu" or
  // "nvme" when it is < 1); the rest stays on the GPU (see above).
  double optimizer_offload_ratio = 1.0;
  // The trainer would update speculatively during the backward (gradient
  // clipping, engine/trainer.cc): it then keeps a second master/m/v of
  // every offloaded shard whose state is on the host, 12 B per parameter of
  // pinned host memory (8 B with bf16 moments), if the chosen placement leaves that much of the host
  // budget. The placement is chosen without it (it is a speed-up, not a need).
  bool speculative_state = false;
  // ZeRO stage >= 1 across this many ranks (engine/data_parallel.h): each
  // rank keeps the optimizer state (and its speculative set, and its NVMe
  // traffic) of 1/zero_partitions of every unit, so the plan is per rank,
  // and the slice of every unit's compute-dtype parameters its update
  // writes (host memory: a row of its own).
  // 1: the whole state (one rank, or stage 0's replicas).
  int zero_partitions = 1;
  // The rank's state is partitioned (ZeRO stage >= 1 over the ranks, or at
  // world size 1 with TrainOptions::partition_at_world_one): its slice of
  // every unit's compute-dtype parameters lives on the host (a row of its
  // own). `gathers_params` (stage 3): no rank holds a unit's whole
  // parameters between uses; each use gathers them into buffers outside the
  // tiers (engine/param_gather.h, engine/budgets.h), so the parameters row
  // is empty and no placement streams them.
  bool partitioned = false;
  bool gathers_params = false;
  // Stage >= 2 (with `partitioned`): the rank keeps the gradient of its
  // slice of every unit alone, 1/zero_partitions of them, in the gradients'
  // tier (the whole unit's still accumulates in fp32 in the working set,
  // and micro-batch-major with accumulation in per-block fp32 accumulators
  // beside them, which stay whole).
  bool partitions_grads = false;
  // The ranks' gradient sums run beside the backward (engine/
  // data_parallel.h ReducesBesideBackward): a second fp32 block accumulator
  // in the working set (layer_params × 4 B), the two alternating.
  bool second_block_accumulator = false;
  // The host tier's own allocations beside the state (a row of their own):
  // each is rounded up to `host_alignment`, and with state on NVMe the
  // store's staging buffers take `nvme_staging_bytes`.
  uint64_t host_alignment = 4096;
  uint64_t nvme_staging_bytes = 0;
};

struct Plan {
  TierKind params = TierKind::kGpu;
  TierKind grads = TierKind::kGpu;
  TierKind optimizer = TierKind::kGpu;
  TierKind checkpoints = TierKind::kGpu;
  bool params_resident = true;     // all layers' params stay on the GPU
  bool gathers_params = false;     // ZeRO stage 3: gathered at each use instead (PlanInputs)
  int64_t checkpoint_gpu_layers = 0;  // with checkpoints on the host: how many of the
                                      // L+1 checkpoint sets (the last ones) stay on the GPU
  uint64_t grad_host_bytes = 4;
  int prefetch_depth = 1;
  bool layer_major = true;
  // Partial optimizer offload: the first `optimizer_gpu_shards` of the
  // `shards` (forward order: embedding, blocks 0..L-1, ln_f) keep their
  // optimizer state, gradients and parameters on the GPU (the GPU Adam
  // updates them); `optimizer`, `grads` and `params` say where the other
  // shards' live. 0 without a ratio < 1. When every shard is on the GPU,
  // `optimizer` and `grads` are kGpu.
  double optimizer_offload_ratio = 1.0;
  int64_t shards = 0;                  // L + 2
  int64_t optimizer_gpu_shards = 0;
  uint64_t optimizer_gpu_params = 0;   // parameters of those shards
  uint64_t total_params = 0;
  // Parameters whose optimizer state lives off the GPU (0 when it all stays there).
  uint64_t offloaded_optimizer_params() const {
    return optimizer == TierKind::kGpu ? 0 : total_params - optimizer_gpu_params;
  }

  // Bytes per tier per kind of state.
  struct Row {
    std::string kind;
    uint64_t gpu = 0, host = 0, nvme = 0;
  };
  std::vector<Row> rows;
  uint64_t gpu_total = 0, host_total = 0, nvme_total = 0;
  // PlanInputs::speculative_state: the second set's bytes (12 B, or 8 B
  // with bf16 moments, per offloaded parameter; 0 when the state is not on the host), and whether
  // they fit: then they are in `rows` (a row of their own) and host_total.
  uint64_t speculative_bytes = 0;
  bool speculative_fits = false;

  // Bytes per optimizer step over each link: upper bounds from the sizes
  // (what the step's schedule really moves is the trainer's ScheduledTraffic).
  uint64_t h2d = 0, d2h = 0, nvme_read = 0, nvme_write = 0;

  // The plan as a table (what `strata train --dry-run` prints).
  std::string Table(uint64_t gpu_budget, uint64_t host_budget) const;
};

Result<Plan> MakePlan(const PlanInputs& in);

// What the step's access schedule moves per step in the GPU room the run
// really has (engine/step_schedule.h), beside the plan's bounds from the
// sizes: blocks kept from the forward for the backward are not loaded twice.
// The optimizer's own copies included (gradients with a GPU home come down
// to a host optimizer, parameters with a GPU home go back up).
struct ScheduledTraffic {
  uint64_t h2d = 0, d2h = 0;
  uint64_t swap_window = 0;  // GPU bytes the prefetcher keeps streamed tensors in
};

}  // namespace strata
