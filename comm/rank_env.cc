// SPDX-License-Identifier: Apache-2.0
#include "comm/rank_env.h"

#include <cerrno>
#include <cstdlib>
#include <optional>

namespace strata::comm {

namespace {

// The integer in `var`, nullopt when unset or empty.
Result<std::optional<int>> IntVar(const GetEnv& getenv, const char* var, long lo, long hi) {
  const char* v = getenv(var);
  if (!v || !*v) return std::optional<int>();
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || n < lo || n > hi)
    return InvalidArgument(std::string("environment variable ") + var + "=\"" + v + "\" (set by a launcher) is not " +
                           "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return std::optional<int>(static_cast<int>(n));
}

struct Names {
  const char *rank, *size, *local_rank, *local_size;
  const char* source;
};
constexpr Names kTorch{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun/DeepSpeed (RANK, WORLD_SIZE)"};
constexpr Names kOmpi{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                      "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI (OMPI_COMM_WORLD_*)"};
constexpr long kMaxRanks = 1 << 20;

// The ranks as `n` names them; nullopt when its world size is not set.
Result<std::optional<RankEnv>> FromNames(const GetEnv& getenv, const Names& n) {
  ASSIGN_OR_RETURN(std::optional<int> size, IntVar(getenv, n.size, 1, kMaxRanks));
  if (!size) return std::optional<RankEnv>();
  ASSIGN_OR_RETURN(std::optional<int> rank, IntVar(getenv, n.rank, 0, kMaxRanks - 1));
  ASSIGN_OR_RETURN(std::optional<int> local, IntVar(getenv, n.local_rank, 0, kMaxRanks - 1));
  ASSIGN_OR_RETURN(std::optional<int> local_size, IntVar(getenv, n.local_size, 1, kMaxRanks));
  if (!rank && *size > 1)
    return InvalidArgument(std::string(n.size) + "=" + std::to_string(*size) + " is set but " + n.rank +
                           " is not: the launcher must give every process its rank");
  RankEnv e;
  e.world_size = *size;
  e.rank = rank.value_or(0);
  if (e.rank >= e.world_size)
    return InvalidArgument(std::string(n.rank) + "=" + std::to_string(e.rank) + " is not below " + n.size + "=" +
                           std::to_string(e.world_size));
  e.local_rank = local.value_or(e.rank);
  e.local_world_size = local_size.value_or(local ? e.world_size : e.world_size);
  e.source = n.source;
  return std::optional<RankEnv>(e);
}

}  // namespace

std::string RankEnv::ToString() const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local " +
         std::to_string(local_rank) + " of " + std::to_string(local_world_size) + "; master " + master_addr + ":" +
         std::to_string(master_port) + ", from " + source + ")";
}

Result<RankEnv> RankEnvFromEnvironment(const GetEnv& getenv) {
  ASSIGN_OR_RETURN(std::optional<RankEnv> e, FromNames(getenv, kTorch));
  if (!e) {
    ASSIGN_OR_RETURN(e, FromNames(getenv, kOmpi));
  }
  if (!e) {
    e = RankEnv{};
    e->source = "none (one rank)";
  }
  ASSIGN_OR_RETURN(std::optional<int> port, IntVar(getenv, "MASTER_PORT", 1, 65535));
  if (port) e->master_port = *port;
  const char* addr = getenv("MASTER_ADDR");
  if (addr && *addr) {
    e->master_addr = addr;
  } else if (e->local_world_size < e->world_size) {
    return InvalidArgument("the " + std::to_string(e->world_size) + " ranks span machines (" +
                           std::to_string(e->local_world_size) +
                           " on this one) and MASTER_ADDR is not set: set it to rank 0's host");
  }
  return *e;
}

Result<RankEnv> RankEnvFromEnvironment() {
  return RankEnvFromEnvironment([](const char* v) { return std::getenv(v); });
}

}  // namespace strata::comm
