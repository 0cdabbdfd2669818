// SPDX-License-Identifier: Apache-2.0
// Where each of a machine's local ranks runs: the NUMA node of its GPU and
// a share of that node's cores, found with hwloc (as tiers/numa.h finds a
// GPU's node) — what `strata train --num-gpus N` (engine/launcher.h) binds
// each rank's process to before it starts.
//
// The ranks whose GPUs share a node split its cores into equal contiguous
// runs (whole cores, every hardware thread of each); a rank whose GPU's
// node is unknown (one NUMA node, or hwloc cannot see the device) gets its
// share of all the machine's cores. Memory is bound to the node without
// hwloc's STRICT flag: preferred, so that a node that runs out lends from
// the others rather than failing the allocation. Placement is an
// optimization: a machine or container that refuses binding gets a warning
// line and the rank runs unbound.
//
// Ownership: owns the topology and the sets. Thread-safety: Bind is called
// in a freshly forked child (one thread); the rest from one thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace strata {

class RankBindings {
 public:
  // One binding per local rank; `gpu_bus_ids[i]` is rank i's GPU ("" when
  // unknown: the machine-wide share).
  static RankBindings ForGpus(const std::vector<std::string>& gpu_bus_ids);
  ~RankBindings();
  RankBindings(RankBindings&&) noexcept;
  RankBindings& operator=(RankBindings&&) noexcept;

  size_t size() const;
  // "NUMA node 1, cores 8-15 (PUs 8-15,72-79)" or "unbound (hwloc: ...)".
  std::string Describe(size_t rank) const;
  // Binds the calling process (its CPUs and its memory policy, both kept
  // across exec). "" or the warning to print.
  std::string Bind(size_t rank) const;

 private:
  struct Impl;
  explicit RankBindings(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
