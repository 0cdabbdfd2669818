// SPDX-License-Identifier: Apache-2.0
// comm/ on one machine without mpirun: the launcher's environment, the TCP
// rendezvous between threads standing in for ranks (and its errors when a
// rank does not arrive), and the MPI communicator at world size 1. The
// collectives across 2 and 3 ranks run under mpirun: tests/comm/mpi_ranks.cc.
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/rank_env.h"
#include "comm/tcp_rendezvous.h"
#include "tests/test_util.h"

namespace strata::comm {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::FreeLoopbackPort;
using ::testing::HasSubstr;

GetEnv From(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(RankEnv, NoLauncherIsOneRank) {
  ASSERT_OK_AND_ASSIGN(RankEnv e, RankEnvFromEnvironment(From({})));
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(RankEnv, Torchrun) {
  ASSERT_OK_AND_ASSIGN(RankEnv e, RankEnvFromEnvironment(From({{"RANK", "5"},
                                                                {"WORLD_SIZE", "8"},
                                                                {"LOCAL_RANK", "1"},
                                                                {"LOCAL_WORLD_SIZE", "4"},
                                                                {"MASTER_ADDR", "node0"},
                                                                {"MASTER_PORT", "1234"}})));
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_THAT(e.source, HasSubstr("torchrun"));
}

TEST(RankEnv, OpenMpi) {
  ASSERT_OK_AND_ASSIGN(RankEnv e, RankEnvFromEnvironment(From({{"OMPI_COMM_WORLD_RANK", "2"},
                                                                {"OMPI_COMM_WORLD_SIZE", "3"},
                                                                {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}})));
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 3);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.master_addr, "127.0.0.1");  // all ranks on this machine
  EXPECT_THAT(e.source, HasSubstr("Open MPI"));
}

TEST(RankEnv, TorchrunWinsOverOpenMpi) {
  ASSERT_OK_AND_ASSIGN(RankEnv e, RankEnvFromEnvironment(From({{"RANK", "1"},
                                                                {"WORLD_SIZE", "2"},
                                                                {"OMPI_COMM_WORLD_RANK", "0"},
                                                                {"OMPI_COMM_WORLD_SIZE", "4"}})));
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
}

TEST(RankEnv, BadValuesNameTheVariable) {
  auto bad = RankEnvFromEnvironment(From({{"RANK", "x"}, {"WORLD_SIZE", "2"}}));
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(bad.status().message(), HasSubstr("RANK=\"x\""));
  auto high = RankEnvFromEnvironment(From({{"RANK", "2"}, {"WORLD_SIZE", "2"}}));
  EXPECT_THAT(high.status().message(), HasSubstr("is not below WORLD_SIZE=2"));
  auto no_rank = RankEnvFromEnvironment(From({{"WORLD_SIZE", "2"}}));
  EXPECT_THAT(no_rank.status().message(), HasSubstr("RANK is not"));
  auto port = RankEnvFromEnvironment(From({{"MASTER_PORT", "70000"}}));
  EXPECT_THAT(port.status().message(), HasSubstr("MASTER_PORT=\"70000\""));
  // Ranks on several machines need to be told where rank 0 is.
  auto spread = RankEnvFromEnvironment(From({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}}));
  EXPECT_THAT(spread.status().message(), HasSubstr("MASTER_ADDR is not set"));
}

RankEnv Rank(int rank, int world, int port) {
  RankEnv e;
  e.rank = rank;
  e.world_size = world;
  e.local_world_size = world;
  e.master_port = port;
  return e;
}

TEST(TcpRendezvous, RankZeroBlobReachesEveryRank) {
  const int port = FreeLoopbackPort(), world = 3;
  std::string id(128, '\0');  // as NCCL's id: binary, zeros included
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 7);
  std::vector<Result<std::string>> got(world, Status(Internal("not run")));
  std::vector<std::thread> ranks;
  // The others start first: they retry until rank 0 listens.
  for (int r = world - 1; r >= 0; --r)
    ranks.emplace_back([&, r] { got[r] = ShareFromRankZero(Rank(r, world, port), r == 0 ? id : "ignored", 20); });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_OK(got[r].status()) << "rank " << r;
    EXPECT_EQ(*got[r], id) << "rank " << r;
  }
}

TEST(TcpRendezvous, MissingRankIsNamedToRankZeroAndTheOthers) {
  const int port = FreeLoopbackPort(), world = 3;
  Result<std::string> zero = Status(Internal("not run")), one = zero;
  const double t0 = NowSeconds();
  std::thread a([&] { zero = ShareFromRankZero(Rank(0, world, port), "id", 1.0); });
  std::thread b([&] { one = ShareFromRankZero(Rank(1, world, port), "", 1.0); });  // rank 2 never comes
  a.join();
  b.join();
  EXPECT_LT(NowSeconds() - t0, 8.0);
  EXPECT_THAT(zero, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(zero.status().message(), HasSubstr("rank(s) 2 of 3 did not arrive"));
  EXPECT_THAT(one, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(one.status().message(), HasSubstr("rank 1: "));
  EXPECT_THAT(one.status().message(), HasSubstr("rank(s) 2 of 3 did not arrive"));
}

TEST(TcpRendezvous, NoRankZeroIsNamed) {
  const double t0 = NowSeconds();
  auto r = ShareFromRankZero(Rank(1, 2, FreeLoopbackPort()), "", 0.5);
  EXPECT_LT(NowSeconds() - t0, 5.0);
  EXPECT_THAT(r, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(r.status().message(), HasSubstr("could not reach rank 0 at 127.0.0.1:"));
}

TEST(TcpRendezvous, RankOfAnotherJobIsTurnedAway) {
  const int port = FreeLoopbackPort();
  Result<std::string> zero = Status(Internal("not run")), stray = zero;
  std::thread a([&] { zero = ShareFromRankZero(Rank(0, 2, port), "id", 1.5); });
  std::thread b([&] { stray = ShareFromRankZero(Rank(1, 4, port), "", 1.5); });  // thinks the job has 4 ranks
  a.join();
  b.join();
  EXPECT_THAT(stray.status().message(), HasSubstr("does not fit rank 0's job of 2 ranks"));
  EXPECT_THAT(zero.status().message(), HasSubstr("rank(s) 1 of 2 did not arrive"));
}

// MPI without mpirun is one rank (a singleton): every collective is the
// identity, and the errors that need no peer.
TEST(MpiCommunicator, WorldOfOne) {
  if (!BuiltWithMpi()) GTEST_SKIP() << "built without MPI (scripts/install-deps.sh installs libopenmpi-dev)";
  ASSERT_OK_AND_ASSIGN(auto c, CreateMpiCommunicator(CommOptions{}));
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world_size(), 1);
  EXPECT_EQ(c->backend(), "mpi");
  std::vector<float> x = {1.5f, -2, 3}, y(3);
  ASSERT_OK(c->AllReduce(x.data(), y.data(), 3, DType::kF32, ReduceOp::kSum, nullptr));
  EXPECT_EQ(y, x);
  std::vector<float> g(3);
  ASSERT_OK(c->AllGather(x.data(), g.data(), 3, DType::kF32, nullptr));
  EXPECT_EQ(g, x);
  std::vector<float> s(3);
  ASSERT_OK(c->ReduceScatter(x.data(), s.data(), 3, DType::kF32, ReduceOp::kMax, nullptr));
  EXPECT_EQ(s, x);
  ASSERT_OK(c->Broadcast(x.data(), 3, DType::kF32, 0, nullptr));
  ASSERT_OK(c->Barrier(nullptr));
  ASSERT_OK(c->Synchronize());
  Status bf16 = c->AllReduce(x.data(), y.data(), 1, DType::kBF16, ReduceOp::kSum, nullptr);
  EXPECT_THAT(bf16, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(bf16.message(), HasSubstr("all_reduce 1 x bf16 (sum) on rank 0 of 1"));
  Status root = c->Broadcast(x.data(), 3, DType::kF32, 1, nullptr);
  EXPECT_THAT(root.message(), HasSubstr("broadcast 3 x f32 from rank 1 on rank 0 of 1: no such root rank"));
  // Refusals of bad arguments do not break the communicator.
  ASSERT_OK(c->AllReduce(x.data(), y.data(), 3, DType::kF32, ReduceOp::kSum, nullptr));
}

TEST(CollectiveError, NamesCollectiveRankAndPeer) {
  Status s = CollectiveError(StatusCode::kUnavailable, "all_gather 4 x bf16", 1, 3, 2, "gone");
  EXPECT_EQ(s.message(), "all_gather 4 x bf16 on rank 1 of 3 (peer rank 2): gone");
  EXPECT_EQ(CollectiveError(StatusCode::kInternal, "barrier", 0, 2, -1, "x").message(), "barrier on rank 0 of 2: x");
}

}  // namespace
}  // namespace strata::comm
