// SPDX-License-Identifier: Apache-2.0
// The communicator over MPI (Open MPI from Debian), for ranks on the CPU
// backend: host buffers, collectives complete when the call returns.
//
// The process's MPI is initialized by the first communicator (thread level
// serialized) and finalized at exit unless a collective failed (a finalize
// with a dead peer would hang). Each communicator duplicates
// MPI_COMM_WORLD, so its collectives never match another's, and errors
// return (MPI_ERRORS_RETURN) rather than abort.
//
// Every collective is started non-blocking and polled until it completes,
// an error comes back, or CommOptions::timeout_s passes. On the timeout the
// rank pings every peer on a second duplicated communicator and waits half
// the timeout (1 to 5 s) for the answers; the ranks that do not answer
// (every rank waiting in a collective answers pings) are named in the
// error: a killed rank is named, and with every peer answering the error
// says the ranks called different collectives.
//
// Under mpirun a dead rank normally makes mpirun kill the job itself;
// `mpirun --enable-recovery` leaves the others running to report it, as the
// tests do (tests/comm/run_mpi_test.sh).
#pragma once

#include <memory>

#include "base/status.h"
#include "comm/communicator.h"

namespace strata::comm {

// Unavailable when strata was built without MPI (scripts/install-deps.sh
// installs libopenmpi-dev) or MPI cannot start.
Result<std::unique_ptr<Communicator>> CreateMpiCommunicator(const CommOptions& options);

// True when this build has the MPI communicator.
bool BuiltWithMpi();

}  // namespace strata::comm
