// SPDX-License-Identifier: Apache-2.0
// The MPI communicator across ranks: this program runs as every rank under
// mpirun (tests/comm/run_mpi_ranks.sh starts it with 2 and 3 ranks on
// loopback). Each collective is checked against the values it must give,
// which depend on the rank and the world size only. MpiKilledRank runs
// alone (the wrapper's "killed" mode): the last rank dies and the others
// must end with an error naming it within the timeout.
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/rank_env.h"
#include "tests/test_util.h"

namespace strata::comm {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

// One communicator for the process (MPI starts once); every test uses it.
Communicator* Shared() {
  static std::unique_ptr<Communicator> c = [] {
    CommOptions o;
    o.timeout_s = 60;
    auto r = CreateMpiCommunicator(o);
    EXPECT_OK(r.status());
    return r.ok() ? std::move(*r) : nullptr;
  }();
  return c.get();
}
#define SHARED_COMM(c)             \
  Communicator* c##_ = Shared();   \
  ASSERT_NE(c##_, nullptr);        \
  Communicator& c = *c##_

TEST(MpiRanks, SeesTheLauncher) {
  SHARED_COMM(c);
  ASSERT_OK_AND_ASSIGN(RankEnv env, RankEnvFromEnvironment());
  EXPECT_EQ(c.world_size(), env.world_size);
  EXPECT_EQ(c.rank(), env.rank);
  EXPECT_GE(c.world_size(), 2) << "run under mpirun with 2 or more ranks";
}

TEST(MpiRanks, AllReduceSumMaxMin) {
  SHARED_COMM(c);
  const int r = c.rank(), w = c.world_size();
  // Large enough that MPI pipelines it.
  const size_t n = (1 << 20) + 3;
  std::vector<float> x(n), y(n, -1);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((r + 1) * (i % 1000));
  ASSERT_OK(c.AllReduce(x.data(), y.data(), n, DType::kF32, ReduceOp::kSum, nullptr));
  const float tri = static_cast<float>(w * (w + 1) / 2);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], tri * static_cast<float>(i % 1000)) << i;
  std::vector<int32_t> k = {r, -r, 7 * r + 1};
  ASSERT_OK(c.AllReduce(k.data(), k.data(), 3, DType::kI32, ReduceOp::kMax, nullptr));  // in place
  EXPECT_EQ(k, (std::vector<int32_t>{w - 1, 0, 7 * (w - 1) + 1}));
  std::vector<double> d = {r + 0.5, 1.0 / (r + 1)};
  ASSERT_OK(c.AllReduce(d.data(), d.data(), 2, DType::kF64, ReduceOp::kMin, nullptr));
  EXPECT_EQ(d, (std::vector<double>{0.5, 1.0 / w}));
}

TEST(MpiRanks, AllGatherPlacesRankBlocksInOrder) {
  SHARED_COMM(c);
  const int r = c.rank(), w = c.world_size();
  const size_t n = 1001;
  std::vector<int32_t> mine(n), all(n * w, -1);
  for (size_t i = 0; i < n; ++i) mine[i] = r * 100000 + static_cast<int32_t>(i);
  ASSERT_OK(c.AllGather(mine.data(), all.data(), n, DType::kI32, nullptr));
  for (int b = 0; b < w; ++b)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(all[b * n + i], b * 100000 + static_cast<int32_t>(i));
  // In place: this rank's block already sits in the output.
  std::vector<uint16_t> half(3 * w, 0);
  for (int i = 0; i < 3; ++i) half[r * 3 + i] = static_cast<uint16_t>(0x3f80 + r * 3 + i);  // bf16 bit patterns
  ASSERT_OK(c.AllGather(half.data() + r * 3, half.data(), 3, DType::kBF16, nullptr));
  for (int i = 0; i < 3 * w; ++i) EXPECT_EQ(half[i], 0x3f80 + i);
}

TEST(MpiRanks, ReduceScatterSumsEachRanksBlock) {
  SHARED_COMM(c);
  const int r = c.rank(), w = c.world_size();
  const size_t n = 4097;
  std::vector<float> send(n * w), mine(n, -1);
  for (int b = 0; b < w; ++b)
    for (size_t i = 0; i < n; ++i)
      send[b * n + i] = static_cast<float>(r + 10 * b) + static_cast<float>(i % 64) * 0.25f;
  ASSERT_OK(c.ReduceScatter(send.data(), mine.data(), n, DType::kF32, ReduceOp::kSum, nullptr));
  // Block r summed over the ranks q: sum_q (q + 10 r + (i % 64) / 4).
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(mine[i], static_cast<float>(w * (w - 1) / 2 + w * 10 * r) + w * static_cast<float>(i % 64) * 0.25f) << i;
}

TEST(MpiRanks, ReduceScatterInPlaceLeavesEachRanksSumInItsOwnBlock) {
  SHARED_COMM(c);
  const int r = c.rank(), w = c.world_size();
  const size_t n = 1031;
  std::vector<float> buf(n * w);
  for (int b = 0; b < w; ++b)
    for (size_t i = 0; i < n; ++i) buf[b * n + i] = static_cast<float>(r + 10 * b) + static_cast<float>(i % 32);
  float* mine = buf.data() + static_cast<size_t>(r) * n;
  ASSERT_OK(c.ReduceScatter(buf.data(), mine, n, DType::kF32, ReduceOp::kSum, nullptr));
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(mine[i], static_cast<float>(w * (w - 1) / 2 + w * 10 * r) + w * static_cast<float>(i % 32)) << i;
}

TEST(MpiRanks, BroadcastFromEveryRoot) {
  SHARED_COMM(c);
  const int r = c.rank(), w = c.world_size();
  for (int root = 0; root < w; ++root) {
    std::vector<int64_t> v(5, r == root ? 0 : -1);
    if (r == root) {
      for (int i = 0; i < 5; ++i) v[i] = (int64_t{1} << 40) * root + i;
    }
    ASSERT_OK(c.Broadcast(v.data(), 5, DType::kI64, root, nullptr));
    for (int i = 0; i < 5; ++i) EXPECT_EQ(v[i], (int64_t{1} << 40) * root + i) << "root " << root;
  }
}

TEST(MpiRanks, BarrierWaitsForTheSlowestRank) {
  SHARED_COMM(c);
  ASSERT_OK(c.Barrier(nullptr));  // all start together
  if (c.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const double t0 = NowSeconds();
  ASSERT_OK(c.Barrier(nullptr));
  if (c.rank() != 0) {
    EXPECT_GT(NowSeconds() - t0, 0.3) << "the barrier let rank " << c.rank() << " past rank 0";
  }
  ASSERT_OK(c.Synchronize());
}

TEST(MpiRanks, RefusedArgumentsNameTheCollectiveAndKeepItUsable) {
  SHARED_COMM(c);
  std::vector<uint16_t> h(4, 0);
  Status s = c.AllReduce(h.data(), h.data(), 4, DType::kF16, ReduceOp::kSum, nullptr);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("all_reduce 4 x f16 (sum) on rank " + std::to_string(c.rank()) + " of " +
                                     std::to_string(c.world_size())));
  int32_t one = 1;
  ASSERT_OK(c.AllReduce(&one, &one, 1, DType::kI32, ReduceOp::kSum, nullptr));
  EXPECT_EQ(one, c.world_size());
}

// Run alone, under `mpirun --enable-recovery` (else mpirun kills the job
// itself when a rank dies).
TEST(MpiKilledRank, OthersEndWithAnErrorNamingItWithinTheTimeout) {
  CommOptions o;
  o.timeout_s = 3;
  ASSERT_OK_AND_ASSIGN(auto c, CreateMpiCommunicator(o));
  const int r = c->rank(), w = c->world_size();
  float x = 1, y = 0;
  ASSERT_OK(c->AllReduce(&x, &y, 1, DType::kF32, ReduceOp::kSum, nullptr));
  ASSERT_EQ(y, static_cast<float>(w));
  if (r == w - 1) raise(SIGKILL);
  const double t0 = NowSeconds();
  Status s = c->AllReduce(&x, &y, 1, DType::kF32, ReduceOp::kSum, nullptr);
  const double took = NowSeconds() - t0;
  EXPECT_THAT(s, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(s.message(), HasSubstr("all_reduce 1 x f32 (sum) on rank " + std::to_string(r) + " of " +
                                     std::to_string(w) + " (peer rank " + std::to_string(w - 1) + ")"));
  EXPECT_THAT(s.message(), HasSubstr("rank(s) " + std::to_string(w - 1) + " do not answer"));
  EXPECT_LT(took, o.timeout_s + 4) << s;
  // The error sticks.
  EXPECT_EQ(c->Barrier(nullptr).message(), s.message());
  std::printf("rank %d: expected error: %s\n", r, s.ToString().c_str());
}

}  // namespace
}  // namespace strata::comm
