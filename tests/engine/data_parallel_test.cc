// SPDX-License-Identifier: Apache-2.0
// engine/data_parallel.h without mpirun: the batch rule, the plan's note
// and its all-reduce bytes, and the refusal of a config whose world size
// is not the launcher's. Several ranks train in tests/engine/dp_ranks.cc.
#include <algorithm>
#include <memory>
#include <thread>
#include <sstream>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "comm/mpi_communicator.h"
#include "engine/budgets.h"
#include "engine/data_parallel.h"
#include "engine/model_config.h"
#include "engine/trainer.h"
#include "kernels/backend.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

TrainOptions TwoRanks() {
  TrainOptions o = testing::TinyTrainer(2);
  o.backend = "cpu";
  o.config.world_size = 2;
  o.config.train_batch_size = o.config.micro_batch * o.config.grad_accum * 2;
  return o;
}

TEST(DataParallel, BatchRuleNamesTheFourValues) {
  TrainOptions o = TwoRanks();
  EXPECT_OK(CheckBatchRule(o.config));
  o.config.train_batch_size = 8;  // 4 x 2 x 2 is 16
  Status s = CheckBatchRule(o.config);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("train_batch_size 8 is not"));
  EXPECT_THAT(s.message(), HasSubstr("= 4 × 2 × 2 = 16"));
}

TEST(DataParallel, RingAllReduceBytes) {
  EXPECT_EQ(AllReduceBytesPerRank(1, 1000), 0u);
  EXPECT_EQ(AllReduceBytesPerRank(2, 1000), 4000u);  // 2 (W-1)/W x 4 B: half out, half back, twice
  EXPECT_EQ(AllReduceBytesPerRank(3, 300), 1600u);
}

TEST(DataParallel, DryRunSaysWhatEachRankDoes) {
  TrainOptions o = TwoRanks();
  o.config.zero.stage = 2;
  ASSERT_OK_AND_ASSIGN(std::string plan, Trainer::DryRun(o));
  EXPECT_THAT(plan, HasSubstr("data parallel: 2 ranks; each micro-batch step's 8 samples split 4 per rank"));
  EXPECT_THAT(plan, HasSubstr("the plan below is each rank's"));
  EXPECT_THAT(plan, HasSubstr("zero_optimization.stage 2 partitions each unit's flat state in 2 slices"));
  ASSERT_OK_AND_ASSIGN(models::ModelSpec spec, ModelSpecFor(o.config));
  const int64_t P = spec.NumParameters();
  EXPECT_THAT(plan, HasSubstr("per rank per step: " + FormatBytes(ReduceScatterBytesPerRank(2, P)) +
                              " sent and as much received reduce-scattering the fp32 gradients, " +
                              FormatBytes(AllGatherBytesPerRank(2, P, DType::kF32)) +
                              " sent and as much received all-gathering the parameters"));
  // Stage 0 stays the replicated all-reduce.
  o.config.zero.stage = 0;
  ASSERT_OK_AND_ASSIGN(plan, Trainer::DryRun(o));
  EXPECT_THAT(plan, HasSubstr("every rank holds and updates the whole state"));
  EXPECT_THAT(plan, HasSubstr("backward: " + FormatBytes(AllReduceBytesPerRank(2, P)) +
                              " sent and as much received per rank per step"));
  o.config.train_batch_size = 12;
  EXPECT_THAT(Trainer::DryRun(o), StatusIs(StatusCode::kInvalidArgument));
}

TEST(DataParallel, LocalRanksShareTheHostAndTheCores) {
  comm::RankEnv env;
  env.world_size = env.local_world_size = 2;
  TrainOptions o = TwoRanks();
  o.cpu_threads = 0;
  ShareTheMachine(env, &o);
  EXPECT_EQ(o.local_ranks, 2);
  EXPECT_EQ(o.cpu_threads, std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2));
  TrainOptions given = TwoRanks();
  given.cpu_threads = 3;  // what the user asked for stays
  ShareTheMachine(env, &given);
  EXPECT_EQ(given.cpu_threads, 3);
  // The default host budget halves (the available memory may move a little between the two reads).
  std::unique_ptr<kernels::Backend> backend = kernels::MakeCpuBackend(1);
  TrainOptions alone = TwoRanks();
  ASSERT_OK_AND_ASSIGN(Budgets one, MeasureBudgets(alone, *backend));
  ASSERT_OK_AND_ASSIGN(Budgets half, MeasureBudgets(o, *backend));
  EXPECT_NEAR(static_cast<double>(half.host), static_cast<double>(one.host) / 2, static_cast<double>(one.host) * 0.05);
  o.host_memory_limit = 1 * kGiB;  // a limit given is each rank's own
  ASSERT_OK_AND_ASSIGN(Budgets limited, MeasureBudgets(o, *backend));
  EXPECT_EQ(limited.host, 1 * kGiB);
}

TEST(DataParallel, ConfigWorldMustBeTheCommunicators) {
  if (!comm::BuiltWithMpi()) GTEST_SKIP() << "built without MPI";
  ASSERT_OK_AND_ASSIGN(auto one, comm::CreateMpiCommunicator(comm::CommOptions{}));  // no mpirun: one rank
  auto dp = DataParallel::Over(std::move(one), TwoRanks().config);
  EXPECT_THAT(dp, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(dp.status().message(), HasSubstr("mpirun -n 2"));
}

TEST(DataParallel, TrainerWithoutTheRanksSaysHowToStartThem) {
  if (!comm::BuiltWithMpi()) GTEST_SKIP() << "built without MPI";
  std::ostringstream log;
  auto t = Trainer::Create(TwoRanks(), log);
  EXPECT_THAT(t, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(t.status().message(), HasSubstr("mpirun -n 2"));
}

// A process a launcher started at world size 1 (mpirun -n 1, RANK=0
// WORLD_SIZE=1) takes the ranks' path, over MPI on the CPU backend, and
// trains as the plain run does.
TEST(DataParallel, LaunchedAtWorldOneGivesThePlainLosses) {
  if (!comm::BuiltWithMpi()) GTEST_SKIP() << "built without MPI";
  TrainOptions o = testing::TinyTrainer(2);
  o.backend = "cpu";
  o.cpu_threads = 1;
  o.steps = 4;
  o.config.gradient_clipping = 1.0;
  auto losses = [](const TrainOptions& opt, std::string* run_log) {
    std::ostringstream log, out;
    auto t = Trainer::Create(opt, log);
    EXPECT_OK(t.status());
    if (!t.ok()) return std::vector<double>{};
    const std::vector<double> l = testing::StepLosses(**t, 3);
    EXPECT_OK((*t)->Run(out));
    *run_log = out.str();
    return l;
  };
  std::string plain_log, launched_log;
  const std::vector<double> plain = losses(o, &plain_log);
  o.launched = true;
  const std::vector<double> launched = losses(o, &launched_log);
  EXPECT_THAT(launched_log, HasSubstr("this is rank 0 of 1 (mpi)"));
  EXPECT_THAT(plain_log, ::testing::Not(HasSubstr("data parallel")));
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(plain, launched);
}

// TrainOptions::partition_at_world_one: ZeRO stages 1-3 through the
// partitioned path at one rank (over MPI here; the GPU test runs it over
// NCCL): each slice is the whole unit, the collectives move it through
// their staging, and the losses are the plain run's bit for bit — with the
// optimizer state resident and offloaded to the host.
TEST(DataParallel, PartitionedAtWorldOneGivesThePlainLosses) {
  if (!comm::BuiltWithMpi()) GTEST_SKIP() << "built without MPI";
  for (const char* arch : {"gpt2", "llama"}) {
    for (const char* where : {"none", "cpu"}) {
      for (int stage : {1, 2, 3}) {
        SCOPED_TRACE(std::string(arch) + ", stage " + std::to_string(stage) + ", offload_optimizer " + where);
        TrainOptions o = testing::TinyTrainer(2);
        if (std::string(arch) == "llama") {  // (an untied head, grouped-query attention)
          o.config.model.arch = "llama";
          o.config.model.n_kv_head = 2;
          o.config.model.intermediate_size = 176;
        }
        o.backend = "cpu";
        o.cpu_threads = 1;
        o.config.gradient_clipping = 1.0;
        o.config.zero.stage = stage;
        o.config.zero.offload_optimizer.device = where;
        auto losses = [](const TrainOptions& opt, std::string* plan) {
          std::ostringstream log;
          auto t = Trainer::Create(opt, log);
          EXPECT_OK(t.status());
          if (!t.ok()) return std::vector<double>{};
          *plan = (*t)->PlanTable();
          return testing::StepLosses(**t, 3);
        };
        std::string plain_plan, partitioned_plan;
        const std::vector<double> plain = losses(o, &plain_plan);
        o.launched = true;
        o.partition_at_world_one = true;
        const std::vector<double> partitioned = losses(o, &partitioned_plan);
        EXPECT_THAT(plain_plan, ::testing::Not(HasSubstr("zero stage")));
        EXPECT_THAT(partitioned_plan, HasSubstr("zero stage " + std::to_string(stage) + " across 1 ranks"));
        if (stage == 3) {
          EXPECT_THAT(partitioned_plan, HasSubstr("gathered at each use"));
        }
        if (stage >= 2) {
          EXPECT_THAT(partitioned_plan, HasSubstr("this rank's slices"));
        } else {
          EXPECT_THAT(partitioned_plan, ::testing::Not(HasSubstr("this rank's slices")));
        }
        ASSERT_EQ(plain.size(), 3u);
        EXPECT_EQ(plain, partitioned);
      }
    }
  }
}

// DeepSpeed's bucket sizes are elements over all the ranks: a round moves
// bucket / W of them per rank, at least one, and no more than the largest
// unit's slice; the staging holds the larger round and this rank's piece.
TEST(DataParallel, BucketSizesBoundTheRounds) {
  using Rounds = StagedCollectives::Rounds;
  const Rounds a = StagedCollectives::RoundsFor(4, 1000, 400, DType::kBF16, 10000);
  EXPECT_EQ(a.reduce_len, 250u);
  EXPECT_EQ(a.gather_len, 100u);
  EXPECT_EQ(a.stage_bytes, 5u * 250 * 4);
  const Rounds capped = StagedCollectives::RoundsFor(4, 500'000'000, 500'000'000, DType::kBF16, 101);
  EXPECT_EQ(capped.reduce_len, 26u);  // ceil(101 / 4)
  EXPECT_EQ(capped.gather_len, 26u);
  EXPECT_EQ(capped.stage_bytes, 5u * 26 * 4);
  const Rounds tiny = StagedCollectives::RoundsFor(4, 3, 1, DType::kF32, 10000);
  EXPECT_EQ(tiny.reduce_len, 1u);
  EXPECT_EQ(tiny.gather_len, 1u);
  EXPECT_EQ(tiny.stage_bytes, 5u * 8);  // (room for an 8-byte scalar per rank)
  Config c = TwoRanks().config;
  c.zero.stage = 2;
  c.zero.reduce_bucket_size = 64;
  c.zero.allgather_bucket_size = 32;
  EXPECT_EQ(DataParallel::RoundsFor(c, 10000).reduce_len, 32u);
  EXPECT_EQ(DataParallel::RoundsFor(c, 0).stage_bytes, StagedCollectives::kStageBytes);  // (the unit unknown)
  c.zero.stage = 0;
  EXPECT_EQ(DataParallel::RoundsFor(c, 10000).stage_bytes, size_t{1} << 20);
}

// The GPU a rank takes: LOCAL_RANK's among all, or the one a per-rank
// CUDA_VISIBLE_DEVICES leaves.
TEST(DataParallel, RankDeviceIsTheLocalRanks) {
  comm::RankEnv env;
  env.world_size = env.local_world_size = 4;
  env.rank = env.local_rank = 2;
  EXPECT_EQ(*RankDevice(env, 4), 2);
  EXPECT_EQ(*RankDevice(env, 1), 0);
  auto r = RankDevice(env, 2);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().message(), HasSubstr("LOCAL_RANK=2"));
  EXPECT_THAT(r.status().message(), HasSubstr("sees 2 GPUs"));
}

}  // namespace
}  // namespace strata
