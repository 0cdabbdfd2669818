// SPDX-License-Identifier: Apache-2.0
// Rank 0 hands one small blob (NCCL's unique id) to every other rank over
// TCP, before any collective exists: the rendezvous torchrun's and
// DeepSpeed's launchers expect (MASTER_ADDR:MASTER_PORT, comm/rank_env.h).
//
// Rank 0 listens on MASTER_PORT and waits until every rank has connected
// and said who it is, then sends each the blob. When the timeout passes
// first, every rank that did arrive is told which ranks did not, and rank 0
// returns that error too; a rank that cannot reach rank 0 in time says so.
// Only this exchange runs over the socket: the collectives run on NCCL.
#pragma once

#include <cstddef>
#include <string>

#include "base/status.h"
#include "comm/rank_env.h"

namespace strata::comm {

// Rank 0 passes the blob in `blob` (the others' is ignored); every rank
// gets it back. kUnavailable naming the ranks missing, or the address,
// when the rendezvous does not complete within `timeout_s`; IoError for a
// socket call that fails (errno, address).
Result<std::string> ShareFromRankZero(const RankEnv& env, const std::string& blob, double timeout_s);

}  // namespace strata::comm
