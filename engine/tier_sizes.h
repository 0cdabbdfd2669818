// SPDX-License-Identifier: Apache-2.0
// How big each tier of a run is: what its plan needs there, plus a stated
// margin, within the run's budget (engine/budgets.h) — not the whole
// budget for a plan that needs less of it, except the host tier of an NVMe
// plan (below). The tiers map memory as they fill (tiers/slab_tier.h);
// these sizes cap what they may map and pin.
//
//   GPU    the plan's GPU total, plus the swap window the prefetcher can use
//          at most (every tensor the step streams through the GPU: the
//          parameters, gradients and activation checkpoints the plan puts
//          off it, and one more of the largest for the allocator's slack),
//          the GPU-assisted optimizer's chunks (and the activation it keeps
//          free beside them) when it may run, and 64 MiB.
//          With that room the prefetcher keeps every streamed tensor
//          resident, as it would in a larger tier, so the step moves the
//          same bytes; one slab, mapped at the first allocation.
//   host   the plan's host total (everything the host tier holds: state,
//          checkpoints, staging, page rounding) plus 64 MiB and 1/16 of it
//          for the allocator; with NVMe, in slabs of at most 1 GiB (the
//          largest buffer io_uring registers) and one largest host tensor
//          more per slab for their unusable ends, else one slab. A plan that
//          puts nothing in host memory gets 64 MiB, unpinned: nothing there
//          to pin. With NVMe the host tier may grow to the whole budget,
//          as it did before the tiers were sized to their plans: what the
//          plan leaves is room for the write-behind, whose copies can then
//          trail into the next step's forward instead of holding back the
//          backward's read-ahead for host memory. (Measured on the H200's
//          virtio disk, docs/measurements.md: gpt-1.3b-nvme took 16.3 s
//          steps with the plan's 4.4 GiB, 12.7-14.5 s with the budget, a
//          difference the disk's own drift between runs also reaches.)
//
// Thread-safety: free functions.
#pragma once

#include <cstdint>
#include <string>

#include "engine/budgets.h"
#include "engine/train_options.h"
#include "models/model_spec.h"

namespace strata {

struct TierSizes {
  uint64_t gpu = 0;          // the GPU tier's budget
  uint64_t host = 0;         // the host tier's budget
  uint64_t host_slab = 0;    // its growth step (0: one slab of `host`)
  bool host_pin = true;      // pin the host tier (pin_memory, and something planned there)
  std::string what;          // one line for the plan table: sizes and margins
};

inline constexpr uint64_t kTierMargin = 64ull << 20;

// `cuda`: the run trains on a GPU (the GPU-assisted optimizer's "auto" runs there only).
TierSizes TierSizesFor(const TrainOptions& options, const RunPlan& run, const models::ModelSpec& spec, bool cuda);

// The NVMe directory of a config (offload_optimizer's nvme_path, else
// offload_param's); "" when there is none.
std::string NvmeDirOf(const Config& cfg);

}  // namespace strata
