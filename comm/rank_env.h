// SPDX-License-Identifier: Apache-2.0
// Who this process is among the ranks of a job, read from the environment
// its launcher set: torchrun's and DeepSpeed's launcher's RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT, or Open MPI's mpirun's
// OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
// (with MASTER_ADDR/MASTER_PORT where set). With neither, one rank.
#pragma once

#include <functional>
#include <string>

#include "base/status.h"

namespace strata::comm {

struct RankEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;       // the rank among this machine's: which GPU it takes
  int local_world_size = 1;
  // Where rank 0 publishes what every rank needs to join (comm/
  // tcp_rendezvous.h: NCCL's unique id). Without MASTER_ADDR, 127.0.0.1
  // when every rank is on this machine.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // torchrun's default
  std::string source;       // "torchrun/DeepSpeed (RANK, WORLD_SIZE)", "Open MPI (OMPI_COMM_WORLD_*)", "none"

  // "rank 1 of 4 (local 1 of 4; master 127.0.0.1:29500, from ...)"
  std::string ToString() const;
};

using GetEnv = std::function<const char*(const char*)>;

// InvalidArgument naming the variable and its value when one is not a
// number in range, when a rank is not below the world size, or when ranks
// span machines and MASTER_ADDR is not set.
Result<RankEnv> RankEnvFromEnvironment(const GetEnv& getenv);
Result<RankEnv> RankEnvFromEnvironment();  // the process's own environment

}  // namespace strata::comm
