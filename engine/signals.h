// SPDX-License-Identifier: Apache-2.0
// SIGINT, SIGTERM, SIGHUP and SIGUSR1 during `strata train`: the first asks
// the run to stop, the second ends the process at once. (SIGUSR1 is the
// one Open MPI's mpirun passes on to its ranks without ending the job —
// its SIGTERM kills them within seconds —, so the launcher,
// engine/launcher.h, sends it to mpirun for a stop.)
//
// The handler does two async-signal-safe things: it sets an atomic flag
// (the signal's number) and writes one line to stderr. Trainer::Run checks
// the flag between steps (engine/trainer_run.cc): the step under way ends —
// its optimizer update included, so that the state is a step boundary a
// resume continues from bit for bit — and then, with --save, a checkpoint
// is written through the normal, atomic save and the run says where;
// without --save it says that nothing was saved. Run returns Cancelled and
// `strata train` exits 128 + the signal's number (130 for SIGINT).
//
// A second signal (of any of the four) calls _exit(128 + its number) from
// the handler: nothing more is written; a save in progress leaves the
// previous checkpoint intact and its temporary directory for the next run
// to remove (engine/save_dir.h), as the NVMe swap files are
// (tiers/nvme/leftovers.h).
//
// Only programs install the handlers (main.cc): a library embedding the
// trainer keeps its own; Run then stops on RequestStop() alone.
//
// Thread-safety: StopSignal and RequestStop from any thread (an atomic).
#pragma once

namespace strata {

// Installs the handlers for SIGINT, SIGTERM, SIGHUP and SIGUSR1 (once; later calls
// do nothing).
void InstallStopSignalHandlers();

// The signal that asked to stop (SIGINT, ...), or 0.
int StopSignal();

// Asks to stop as `signal` would (tests; an embedder's own handler).
void RequestStop(int signal);
// Forgets a request (tests).
void ClearStopRequest();

// "SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", or "signal N".
const char* StopSignalName(int signal);

}  // namespace strata
