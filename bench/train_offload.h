// SPDX-License-Identifier: Apache-2.0
// strata-bench train --workload NAME: the offload trainer (engine/trainer.h)
// on a named workload, each figure beside its baseline measured in the same
// run. See bench/train_offload.cc for the workloads and targets.
#pragma once

#include <cstdint>
#include <string>

#include "bench/bench.h"

namespace strata::bench {

struct OffloadBenchOptions {
  CommonOptions common;
  std::string workload;
  std::string backend = "auto";
  int steps = 4, warmup = 1;
  std::string gpu_limit, host_limit;  // override the workload's
  // Shape overrides (0: the workload's), for smoke runs on small machines.
  int64_t layers = 0, d = 0, heads = 0, seq = 0, batch = 0, vocab = 0, accum = 0;
  double optimizer_ratio = 1.0;  // zero_optimization.offload_optimizer.ratio
  int64_t piece_params = 0;      // the CPU worker's pipelining piece (0: the trainer's, 8 Mi parameters)
  double clip = 1.0;             // gradient_clipping (0: none; the optimizer update then runs during the backward)
  std::string nvme_checksum;     // trainer.nvme_checksum (empty: the config's default, crc32c)
  std::string trace;             // --trace FILE: the timed run's timeline (base/trace.h)
  bool peers = false;            // --peers: the PyTorch and DeepSpeed peers on the same shape after (bench/peers.h)
  std::string peer_list;         // --peer-list (empty: the script's default)
};

int RunOffloadWorkload(const OffloadBenchOptions& o);
const char* OffloadWorkloadList();

}  // namespace strata::bench
