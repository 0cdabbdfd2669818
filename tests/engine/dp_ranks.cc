// Data parallelism (engine/data_parallel.h) on the CPU backend: this
// program runs as every rank under mpirun (tests/comm/run_mpi_ranks.sh
// starts it with 2 and 3 ranks). Each rank trains the tiny GPT with its
// slice of every micro-batch and compares each step with the run of one
// rank, in the same process, over the same global batch (micro × world
// samples per micro-batch step): the losses and gradient norms agree
// within fp32 reduction-order tolerance (stated below), and the ranks'
// parameters are bitwise the same.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/rank_env.h"
#include "engine/data_parallel.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

// The tolerance between W ranks and one rank: the sums over a unit's
// gradient run in another order (each rank's micro-batch slice, then across
// ranks), so the step's values differ in the last fp32 bits; over a few Adam
// steps that stays within these.
constexpr double kLossRel = 1e-6, kNormRel = 1e-5, kParamAbs = 2e-5;

constexpr int64_t kMicro = 2, kAccum = 2, kSteps = 5;

int World() {
  auto e = comm::RankEnvFromEnvironment();
  return e.ok() ? e->world_size : 1;
}

// `clip` > 0: gradient clipping, which needs the global norm (the update
// runs after the backward, or on speculation); 0: the update runs during
// the backward (engine/update_mode.h).
TrainOptions Tiny(int world, int64_t micro, const std::string& schedule, double clip = 1.0) {
  TrainOptions o = testing::TinyTrainer(2, 64, 32);
  Config& c = o.config;
  o.backend = "cpu";
  o.cpu_threads = 1;  // ranks share the machine's cores
  o.comm_timeout_s = 120;
  c.world_size = world;
  c.micro_batch = micro;
  c.grad_accum = kAccum;
  c.train_batch_size = micro * kAccum * world;
  c.gradient_clipping = clip;
  c.optimizer.weight_decay = 0.1;
  c.trainer.schedule = schedule;
  return o;
}

struct Run {
  std::vector<StepReport> steps;
  std::vector<float> wte, c_fc;
};

Run Train(const TrainOptions& o) {
  Run out;
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return out;
  for (int64_t i = 0; i < kSteps; ++i) {
    auto r = (*t)->Step();
    EXPECT_OK(r.status()) << "step " << i + 1;
    if (!r.ok()) return out;
    out.steps.push_back(*r);
  }
  auto wte = (*t)->Parameter("transformer.wte.weight");
  auto fc = (*t)->Parameter("transformer.h.1.mlp.c_fc.weight");
  EXPECT_OK(wte.status());
  EXPECT_OK(fc.status());
  if (wte.ok()) out.wte = *wte;
  if (fc.ok()) out.c_fc = *fc;
  return out;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return a.size() == b.size() ? m : INFINITY;
}

// The same bits on every rank: the min and the max over the ranks of a hash agree.
void ExpectSameOnEveryRank(const std::vector<float>& v, const char* what) {
  uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    h = (h ^ b) * 1099511628211ull;
  }
  auto c = comm::CreateMpiCommunicator(comm::CommOptions{});
  ASSERT_OK(c.status());
  int64_t lo = static_cast<int64_t>(h >> 1), hi = lo;
  ASSERT_OK((*c)->AllReduce(&lo, &lo, 1, DType::kI64, comm::ReduceOp::kMin, nullptr));
  ASSERT_OK((*c)->AllReduce(&hi, &hi, 1, DType::kI64, comm::ReduceOp::kMax, nullptr));
  EXPECT_EQ(lo, hi) << what << " differs between the ranks";
}

void CompareWithOneRank(const std::string& schedule, double clip) {
  const int w = World();
  ASSERT_GE(w, 2) << "run under mpirun with 2 or more ranks";
  const Run one = Train(Tiny(1, kMicro * w, schedule, clip));  // every rank runs the reference alone
  const Run many = Train(Tiny(w, kMicro, schedule, clip));
  ASSERT_EQ(one.steps.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(many.steps.size(), static_cast<size_t>(kSteps));
  double loss_rel = 0, norm_rel = 0;
  for (int64_t i = 0; i < kSteps; ++i) {
    const StepReport &a = one.steps[i], &b = many.steps[i];
    EXPECT_NEAR(b.loss, a.loss, kLossRel * a.loss) << "step " << i + 1;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, kNormRel * a.grad_norm) << "step " << i + 1;
    loss_rel = std::max(loss_rel, std::fabs(b.loss - a.loss) / a.loss);
    norm_rel = std::max(norm_rel, std::fabs(b.grad_norm - a.grad_norm) / a.grad_norm);
  }
  std::printf("%d ranks vs 1, %s, clip %g: losses %.4f..%.4f; largest relative difference: loss %.2e, grad norm %.2e; "
              "parameters: largest difference %.2e\n",
              w, schedule.c_str(), clip, one.steps.front().loss, one.steps.back().loss, loss_rel, norm_rel,
              std::max(MaxAbsDiff(one.wte, many.wte), MaxAbsDiff(one.c_fc, many.c_fc)));
  EXPECT_LT(one.steps.back().loss, one.steps.front().loss) << "the reference does not learn: the check is weak";
  EXPECT_LE(MaxAbsDiff(one.wte, many.wte), kParamAbs);
  EXPECT_LE(MaxAbsDiff(one.c_fc, many.c_fc), kParamAbs);
  ExpectSameOnEveryRank(many.wte, "transformer.wte.weight");
  ExpectSameOnEveryRank(many.c_fc, "transformer.h.1.mlp.c_fc.weight");
}

TEST(DataParallelRanks, ClippedLayerMajorGivesTheLossesOfOneRank) { CompareWithOneRank("layer-major", 1.0); }
TEST(DataParallelRanks, UnclippedLayerMajorGivesTheLossesOfOneRank) { CompareWithOneRank("layer-major", 0); }
TEST(DataParallelRanks, MicroBatchMajorGivesTheLossesOfOneRank) { CompareWithOneRank("micro-batch-major", 1.0); }

TEST(DataParallelRanks, BatchRuleIsChecked) {
  TrainOptions o = Tiny(World(), kMicro, "layer-major");
  o.config.train_batch_size += 1;
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_THAT(t, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(t.status().message(), HasSubstr("gradient_accumulation_steps × world size"));
}

TEST(DataParallelRanks, RankZeroAloneLogs) {
  const int w = World();
  TrainOptions o = Tiny(w, kMicro, "layer-major");
  o.steps = 2;
  o.config.steps_per_print = 1;
  o.config.data.val_fraction = 0;
  std::ostringstream log, out;
  auto t = Trainer::Create(o, log);
  ASSERT_OK(t.status());
  ASSERT_OK((*t)->Run(out));
  ASSERT_OK_AND_ASSIGN(comm::RankEnv e, comm::RankEnvFromEnvironment());
  if (e.rank == 0) {
    EXPECT_THAT(out.str(), HasSubstr("data parallel: rank 0 of " + std::to_string(w)));
    EXPECT_THAT(out.str(), HasSubstr("step 2"));
  } else {
    EXPECT_EQ(out.str(), "");
    EXPECT_EQ(log.str(), "");
  }
}

}  // namespace
}  // namespace strata
