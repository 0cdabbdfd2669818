// SPDX-License-Identifier: Apache-2.0
// `strata train`'s launcher: the ranks of a data-parallel run
// (engine/data_parallel.h) started for the user, on this machine or over
// ssh, as torchrun's and DeepSpeed's launchers start theirs.
//
//   --num-gpus N        N ranks on this machine's first N GPUs (of those
//                       CUDA_VISIBLE_DEVICES leaves), one process each, the
//                       CUDA backend over NCCL. Each rank gets RANK,
//                       WORLD_SIZE, LOCAL_RANK (its GPU), LOCAL_WORLD_SIZE,
//                       MASTER_ADDR, MASTER_PORT, and is bound to its GPU's
//                       NUMA node and a share of its cores
//                       (engine/rank_binding.h). N = 1 is the distributed
//                       path at world size 1 (to measure it against the
//                       plain run). On the CPU backend: refused, naming
//                       --num-ranks.
//   --num-ranks N       (--backend cpu) N CPU-backend ranks, which talk over
//                       MPI: the launcher runs Open MPI's mpirun -n N for
//                       the user (STRATA_MPIRUN names another mpirun;
//                       --launcher-args adds its flags, e.g.
//                       --oversubscribe). mpirun binds and places them.
//   --hostfile FILE     several machines (engine/hostfile.h's format). The
//                       CUDA backend: one ssh per host (`ssh HOST CMD`,
//                       --launcher-args before HOST; STRATA_SSH names
//                       another ssh) runs `cd $PWD && strata
//                       train ... --num-gpus SLOTS` there (the same strata
//                       path and working directory on every host, as
//                       DeepSpeed's launcher assumes), NCCL_*, UCX_* and
//                       STRATA_* variables passed on; that strata is the
//                       host's launcher (STRATA_LAUNCH_RANK0 and
//                       STRATA_LAUNCH_WORLD give its ranks' place). With
//                       --num-gpus, each host runs that many (at most its
//                       slots). The CPU backend: mpirun --hostfile FILE.
//   --master-addr ADDR  rank 0's host for the NCCL rendezvous (default
//                       127.0.0.1; with --hostfile, its first host).
//   --master-port PORT  its port (default 29500, torchrun's).
//
// A process that a launcher started (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*,
// PMI_SIZE set: torchrun, DeepSpeed, mpirun, or this launcher) never
// launches: it joins as the rank it was given.
//
// The launched processes run as an engine/process_group.h group: their
// stderr lines prefixed by rank, SIGINT/SIGTERM/SIGHUP passed on, and when
// one fails the others stopped (SIGTERM, then SIGKILL after kStopGraceS)
// and that rank's error reported first: its exit status and stderr tail.
//
// Thread-safety: Launch runs in `strata train`'s only thread (it forks).
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata {

struct LaunchFlags {
  int num_gpus = 0;           // 0: not given
  int num_ranks = 0;          // 0: not given
  std::string hostfile;       // "" : this machine
  std::string master_addr;    // "" : the default
  int master_port = 0;        // 0: 29500
  std::string launcher_args;  // split at white space, given to mpirun or ssh
  std::string backend = "auto";
};

// After a failure, how long the other ranks have to end before SIGKILL
// (also mpirun's, odls_base_sigkill_timeout): a rank that was asked to stop
// finishes its step and saves within it.
constexpr double kStopGraceS = 10;

// True when a launcher started this process (the variables above).
bool StartedByLauncher(const std::function<const char*(const char*)>& getenv);

// Whether the flags ask to start ranks.
inline bool WantsLaunch(const LaunchFlags& f) { return f.num_gpus > 0 || f.num_ranks > 0 || !f.hostfile.empty(); }

// The flags' rules: ranges, --num-gpus only off the CPU backend and
// --num-ranks only on it (each refusal names the other), --master-* and
// --launcher-args only with a launch. InvalidArgument naming the flag.
Status CheckLaunchFlags(const LaunchFlags& f);

// `strata train`'s arguments (after "train") without the launcher's own
// options (--num-gpus, --num-ranks, --hostfile, --master-addr,
// --master-port, --launcher-args) nor --backend (the launcher gives its
// ranks the one they run), in "--opt V" or "--opt=V" form.
std::vector<std::string> RankTrainArgs(const std::vector<std::string>& args);

// Starts the ranks and waits for them: the exit code for `strata train`
// (0, the failed rank's, or the stop's 128 + signal). Errors before any
// rank starts (no GPU, too few, a bad hostfile) are a Status.
Result<int> Launch(const LaunchFlags& f, const std::vector<std::string>& train_args, std::ostream& out,
                   std::ostream& err);

// `strata train --dry-run` with --num-gpus/--num-ranks/--hostfile: the
// world size and this machine's ranks set in this process's environment
// as its launch would set them for rank 0, so that the plan printed is
// rank 0's. Errors as Launch's.
Status PretendRankZero(const LaunchFlags& f);

}  // namespace strata
