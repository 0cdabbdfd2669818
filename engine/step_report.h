// SPDX-License-Identifier: Apache-2.0
// StepReport: what one optimizer step did and measured (Trainer::Step).
#pragma once

#include <cstdint>

namespace strata {

// What became of a step's speculative update (TrainOptions::speculative_update).
enum class Speculation : uint8_t {
  kNone,       // the step did not speculate (the update ran after the backward, or during it without clipping)
  kCommitted,  // it did, and the norm was within the threshold: the speculated update was kept
  kMissed,     // it did, the norm was clipped: the speculated shards were redone with the true multiplier
};
const char* SpeculationName(Speculation s);  // "none", "committed", "missed"

struct StepReport {
  int64_t step = 0;            // optimizer steps taken after this one
  double loss = 0;             // mean training loss of the step's micro-batches
  double lr = 0;
  double loss_scale = 1;
  double grad_norm = 0;        // unscaled global L2 norm, before clipping
  bool skipped = false;        // fp16 overflow: no update
  Speculation speculation = Speculation::kNone;  // this step's update
  int64_t tokens = 0;
  // Wall time of the whole step: the forward's start to the end of what
  // follows the backward (the loss and norm, the verdict, the update of the
  // GPU-state prefix — every shard, all-resident — and the gathers).
  double seconds = 0;
  // optimizer_s: the previous step's update, from its job's posting (after
  // the backward, or before the backward's last pass when the update runs
  // during it) to its last shard.
  double forward_s = 0, backward_s = 0, optimizer_s = 0, wait_s = 0;
  // Of optimizer_s's parameters (the offloaded shards': not the GPU-state
  // prefix of offload_optimizer.ratio < 1, which the step's thread updates),
  // the share the GPU-assisted worker updated.
  double optimizer_gpu_share = 0;
  // Bytes moved since the last step (the previous step's optimizer update,
  // which overlaps this step's forward, included; Evaluate's and Save's not).
  // Whichever the update mode, the optimizer's own PCIe copies count with
  // the update they belong to (the previous step's), wherever they fall in
  // time. The NVMe bytes are the links' counts between the ends of two
  // steps: an update running across a step's end (its write-behind, or
  // during the backward its state reads) splits between two reports.
  uint64_t h2d = 0, d2h = 0, nvme_read = 0, nvme_write = 0;
  double tflops = 0, mfu = 0;  // model FLOPs (6N + 12 L d T per token) / time, / peak
};

}  // namespace strata
