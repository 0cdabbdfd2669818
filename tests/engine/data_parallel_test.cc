// engine/data_parallel.h without mpirun: the batch rule, the plan's note
// and its all-reduce bytes, and the refusal of a config whose world size
// is not the launcher's. Several ranks train in tests/engine/dp_ranks.cc.
#include <memory>
#include <string>

#include "base/bytes.h"
#include "comm/mpi_communicator.h"
#include "engine/data_parallel.h"
#include "engine/model_config.h"
#include "engine/trainer.h"
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
  EXPECT_THAT(plan, HasSubstr("zero_optimization.stage 2's partitioning across ranks is not implemented yet"));
  ASSERT_OK_AND_ASSIGN(models::ModelSpec spec, ModelSpecFor(o.config));
  EXPECT_THAT(plan, HasSubstr("backward: " + FormatBytes(AllReduceBytesPerRank(2, spec.NumParameters())) +
                              " sent and as much received per rank per step"));
  o.config.train_batch_size = 12;
  EXPECT_THAT(Trainer::DryRun(o), StatusIs(StatusCode::kInvalidArgument));
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

}  // namespace
}  // namespace strata
