// SPDX-License-Identifier: Apache-2.0
// What a run checks before its first step, and --dry-run checks too, so that
// a run does not fail after hours for what could be seen at the start:
//
//   --resume, --init-from   what the run starts from exists (a checkpoint
//                 that `latest` names; the weights' file or directory), and
//                 model.seq_len is within the --init-from model's
//                 max_position_embeddings (engine/model_config.h)
//   --log-json    a file it may append to, or create
//   --save DIR    a directory it may write, or one it may create
//                 (engine/save_dir.h CheckSaveDir); free space below one
//                 checkpoint (12 bytes per parameter, 8 with bf16 moments,
//                 the HF weights and the small files) is a warning
//   NVMe paths    each exists and is writable, and has the free space the
//                 plan puts there (counting the swap files killed runs left,
//                 which the NVMe tier removes: tiers/nvme/leftovers.h):
//                 OutOfMemory (tier nvme) naming the path, what is free and
//                 what the plan needs
//   memlock       the bytes the host tier pins with mlock (no GPU: the CPU
//                 backend) within RLIMIT_MEMLOCK, unless CAP_IPC_LOCK
//                 (tiers/host_tier.h CheckMlockLimit)
//
// Thread-safety: free functions.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "engine/budgets.h"
#include "engine/tier_sizes.h"
#include "engine/train_options.h"
#include "models/model_spec.h"

namespace strata {

// `cuda`: the run trains on a GPU (its host tier pins with cudaHostRegister,
// which RLIMIT_MEMLOCK does not cap). Warnings are appended to `warnings`.
Status PreflightChecks(const TrainOptions& options, const RunPlan& run, const TierSizes& tiers,
                       const models::ModelSpec& spec, bool cuda, std::vector<std::string>* warnings);

}  // namespace strata
