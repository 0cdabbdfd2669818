// SPDX-License-Identifier: Apache-2.0
// strata-bench train --peers: what a user would run instead of strata, on
// the same shape in the same run, beside strata's own tokens/s.
//
// After strata's figure, RunPeers runs bench/peers/train_peers.py (PyTorch
// eager and torch.compile all on the GPU, FSDP2 with CPUOffloadPolicy,
// DeepSpeed ZeRO-3 and ZeRO-2 with CPU offload; docs/benchmarks.md) as a
// child process under a Python that imports torch: $STRATA_TORCH_PYTHON when
// set (only it: the user named it), else python3, else /usr/bin/python3.
// The script is found in the source tree compiled in (STRATA_PEERS_DIR),
// else in peers/ next to the strata-bench binary. Its own table goes to the
// terminal as it runs; then a table of strata beside each peer: the peer's
// tokens/s as the baseline, ratio = strata / peer, the peer's GPU peak; a
// peer that could not run has its reason in its row. Without a Python that
// imports torch, or without the script, one line says the peers were
// skipped and why. Everything goes into the report's JSON under "peers".
//
// Thread-safety: call from the thread that runs the benchmark.
#pragma once

#include <cstdint>
#include <string>

#include "bench/bench.h"

namespace strata::bench {

// The peers' names, as --peer-list takes them.
const char* PeerNames();
// BadArgument naming --peer-list and the name when `list` holds a name that is not a peer.
void CheckPeerList(const std::string& list);

// The shape and the step strata ran, for the peers to run the same.
struct PeerRun {
  int64_t layers = 0, d = 0, heads = 0, seq = 0, vocab = 0, batch = 0, accum = 1;
  bool train = false;       // the optimizer step too (--workload), not only forward + backward (--resident)
  double clip = 0;          // gradient clipping in a train step (0: none)
  std::string checkpoint = "all-but-last";  // strata's recompute (train_peers.py --checkpoint)
  std::string dtype = "bf16";
  int steps = 10, warmup = 3;
  bool cpu = false;         // strata ran on its CPU backend: the peers run eager on the CPU
  std::string peers;        // --peer-list; empty: the script's default (all; eager on the CPU)
};

// Runs the peers, prints strata beside them and sets report.meta()["peers"].
void RunPeers(const PeerRun& run, double strata_tokens_per_s, Report& report);

}  // namespace strata::bench
