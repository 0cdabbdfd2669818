// SPDX-License-Identifier: Apache-2.0
// The communicator over NCCL, for ranks on the CUDA backend: device
// buffers, each collective enqueued on the caller's stream.
//
// Creation: rank 0 makes the unique id and publishes it over TCP (comm/
// tcp_rendezvous.h, MASTER_ADDR:MASTER_PORT, bounded by the timeout); every
// rank then joins a non-blocking NCCL communicator on `device`, polling
// ncclCommGetAsyncError until the join completes or the timeout passes.
//
// Every collective: the enqueue itself is polled the same way (a
// non-blocking communicator may answer ncclInProgress), then an event
// recorded behind it on the stream is handed to the communicator's
// watchdog thread, which polls that event and ncclCommGetAsyncError. When
// NCCL reports an error (a peer that died: "remote process exited") or a
// collective has not completed within CommOptions::timeout_s, the watchdog
// aborts the NCCL communicator (ncclCommAbort: the kernels waiting on the
// dead peer return, so the stream moves on) and the error sticks: the
// next call, and Synchronize(), return it. The call itself does not wait,
// so communication overlaps whatever the stream and the host do next.
//
// NCCL does not say which peer failed: its errors name the collective and
// this rank, and give NCCL's own last error text.
#pragma once

#include <memory>

#include "base/status.h"
#include "comm/communicator.h"
#include "comm/rank_env.h"

namespace strata::comm {

// Unavailable when strata was built without CUDA or NCCL, or `device`
// is not usable.
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(const RankEnv& env, int device,
                                                              const CommOptions& options);

bool BuiltWithNccl();

}  // namespace strata::comm
