// SPDX-License-Identifier: Apache-2.0
// What bounds offloaded training on this machine: for a model size, the
// plan strata train would make (engine/budgets.h, engine/planner.h) under
// this machine's GPU and host budgets, the bytes
// that plan moves per step over each link, and the time each resource
// needs for its share of the step at the rates measured in this run:
//   compute   model FLOPs per step / the training compute rate (the
//             resident run's tokens/s x FLOPs per token: MFU x GEMM peak)
//   PCIe      the slowest of h2d / h2d rate, d2h / d2h rate and
//             (h2d + d2h) / the both-directions rate
//   NVMe      the slowest of read / read rate, write / write rate and
//             (read + write) / the mixed rate
//   CPU Adam  offloaded parameters / the CPU Adam's parameters per second
//             (0 when the optimizer state is on the GPU: the GPU Adam)
//   host memory  the bytes the step moves through host memory (the CPU
//             Adam pass's, 28 per offloaded parameter, + h2d + d2h + NVMe
//             read + write) / the host roof rate (the Adam byte pattern's,
//             strata-bench adam's roof pass); left out when not measured.
//             The CPU Adam and the copies share that bandwidth.
// strata overlaps them (prefetch, the update during the backward or the
// next forward), so the step takes at least the largest: that resource
// bounds the step, and the tokens per second follow. The figures are a
// lower bound on the step time (perfect overlap; MakePlan's bytes are its
// upper bounds from the sizes, before the trainer's schedule trims them).
//
// Thread-safety: free functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/planner.h"
#include "kernels/backend.h"

namespace strata::bench {

struct OffloadRates {
  double h2d_gbs = 0, d2h_gbs = 0, both_gbs = 0;                 // the copy engine (or its stand-in)
  double nvme_read_gbs = 0, nvme_write_gbs = 0, nvme_mixed_gbs = 0;  // NvmeTier; mixed 0: not measured
  double adam_params_per_s = 0;                                  // CPU Adam, all threads
  double host_roof_gbs = 0;  // host memory at the CPU Adam's byte pattern (its roof pass); 0: not measured
  double compute_flops = 0;                                      // training FLOP/s (model FLOPs)
  uint64_t gpu_budget = 0, host_budget = 0;
  uint64_t nvme_free = 0;  // bytes free where the NVMe tier would live; 0: no NVMe
};

// The NVMe share of a step: its read and write bytes at raw rates measured
// in the same run (GB/s = 1e9 B/s; a rate of 0 with bytes to move: 1e30 s).
// A disk serving reads and writes at once shares its bandwidth between
// them, so the step needs at least the longest of: the reads alone at the
// read rate, the writes alone at the write rate, and all the bytes at the
// rate measured with reads and writes in flight together (mixed; 0: not
// measured, that term left out). The old bound, the reads and the writes one
// after the other, is their sum.
struct NvmeStepBound {
  double read_s = 0, write_s = 0, mixed_s = 0;
  double overlapped_s() const;  // max(read_s, write_s, mixed_s): the bound with reads and writes overlapped
  double sum_s() const;         // read_s + write_s: the bound with them one after the other
};
NvmeStepBound NvmeBoundOf(uint64_t read_bytes, uint64_t write_bytes, double read_gbs, double write_gbs,
                          double mixed_gbs);

struct ModelShape {
  std::string name;  // "gpt-6.7b"
  int layers = 0, d = 0, heads = 0;
  int vocab = 50304, seq = 2048;
};

// The bytes a step moves through host memory: the CPU Adam pass's over the
// `offloaded` parameters' state (optim::AdamBytesPerParam: bf16 gradient
// and parameter copy, fp32 master, m and v in `moments`) plus every byte a
// copy or an NVMe transfer moves, each touching host memory once.
uint64_t HostMemoryBytes(uint64_t offloaded, DType moments, uint64_t h2d, uint64_t d2h, uint64_t nvme_read,
                         uint64_t nvme_write);

// GPT-3's shapes (Brown et al. 2020) from 1.3B to 175B, by name.
const std::vector<ModelShape>& KnownModelShapes();

struct BoundRow {
  ModelShape model;
  uint64_t params = 0;
  bool fits = false;
  std::string why_not;         // when !fits: the planner's message, or the NVMe space short
  int64_t micro_batch = 0, grad_accum = 0;
  int64_t tokens_per_step = 0;
  Plan plan;
  double compute_s = 0, pcie_s = 0, nvme_s = 0, adam_s = 0, host_s = 0;
  std::string bound;           // "compute", "PCIe", "NVMe", "CPU Adam", "host memory"
  double step_s = 0;           // the largest of the five
  double tokens_per_s = 0;
};

// One row per model: the largest micro-batch of {8, 4, 2, 1} whose plan
// fits, `grad_accum` micro-batches per step. `backend` gives the scratch
// sizes (the attention kernel's workspace); nothing is allocated on it.
std::vector<BoundRow> AnalyzeBounds(const OffloadRates& rates, const std::vector<ModelShape>& models,
                                    const kernels::Backend& backend, int64_t grad_accum);

// Where parameters, gradients, optimizer state and checkpoints live, e.g.
// "params gpu, grads host, optimizer nvme, checkpoints gpu".
std::string PlacementText(const Plan& p);

}  // namespace strata::bench
