// SPDX-License-Identifier: Apache-2.0
// Data parallelism (engine/data_parallel.h) on the CPU backend: this
// program runs as every rank under mpirun (tests/comm/run_mpi_ranks.sh
// starts it with 2 and 3 ranks). Each rank trains the tiny GPT with its
// slice of every micro-batch and compares each step with the run of one
// rank, in the same process, over the same global batch (micro × world
// samples per micro-batch step): the losses and gradient norms agree
// within fp32 reduction-order tolerance (stated below), and the ranks'
// parameters are bitwise the same. A checkpoint saved at W ranks resumes
// at one rank and continues the one-rank run. DataParallelKilledRank runs
// alone (the wrapper's killed mode): a rank dies after a step, and the
// others' next step ends with an error naming it within the timeout.
#include <signal.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "base/clock.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/rank_env.h"
#include "engine/data_parallel.h"
#include "engine/signals.h"
#include "engine/staged_collectives.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// The tolerance between W ranks and one rank: the sums over a unit's
// gradient run in another order (each rank's micro-batch slice, then across
// ranks), so the step's values differ in the last fp32 bits; over a few Adam
// steps that stays within these.
constexpr double kLossRel = 1e-6, kNormRel = 1e-5, kParamAbs = 2e-5;
// bf16: the replicas' fp32 masters differ from one rank's in the last bits,
// and rounding them to bf16 parameters can flip a parameter's last bf16 bit.
constexpr double kBf16LossRel = 1e-4, kBf16NormRel = 1e-4, kBf16ParamAbs = 1e-3;

constexpr int64_t kMicro = 2, kAccum = 2, kSteps = 5;

int World() {
  auto e = comm::RankEnvFromEnvironment();
  return e.ok() ? e->world_size : 1;
}

// `clip` > 0: gradient clipping, which needs the global norm (the update
// runs after the backward, or on speculation); 0: the update runs during
// the backward (engine/update_mode.h).
// `stage`: zero_optimization.stage (>= 1 partitions the state across the
// ranks; one rank runs every stage alike).
TrainOptions Tiny(int world, int64_t micro, const std::string& schedule, double clip = 1.0, int stage = 0) {
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
  c.zero.stage = stage;
  return o;
}

struct Trained {
  std::string plan;
  std::vector<StepReport> steps;
  std::vector<float> wte, c_fc;
};

Trained Train(const TrainOptions& o) {
  Trained out;
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return out;
  out.plan = (*t)->PlanTable();
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

// The parameters stream from the host, the checkpoints and (bf16) the
// gradients live there, the optimizer state on NVMe (`nvme` the directory).
void Offload(TrainOptions* o, const std::string& nvme, bool bf16) {
  Config& c = o->config;
  c.bf16 = bf16;
  c.zero.offload_optimizer.device = "nvme";
  c.zero.offload_optimizer.nvme_path = nvme;
  c.zero.offload_param.device = "cpu";
  c.activation_checkpointing.cpu_checkpointing = true;
  // bf16: too small to keep the gradients on the GPU: they go to the host.
  o->gpu_memory_limit = bf16 ? 1910 * kKiB : 256 * kMiB;  // (with a second block accumulator: overlap_comm)
  o->host_memory_limit = 256 * kMiB;
}

enum class Placement { kResident, kOffloaded, kOffloadedBf16 };

void CompareWithOneRank(const std::string& schedule, double clip, Placement where = Placement::kResident,
                        int stage = 0) {
  const int w = World();
  ASSERT_GE(w, 2) << "run under mpirun with 2 or more ranks";
  TrainOptions ref = Tiny(1, kMicro * w, schedule, clip), dp = Tiny(w, kMicro, schedule, clip, stage);
  testing::TempDir nvme;
  const bool bf16 = where == Placement::kOffloadedBf16;
  if (bf16) ref.config.bf16 = true;  // the reference all resident
  if (where != Placement::kResident) Offload(&dp, nvme.path(), bf16);
  const double kLossRel = bf16 ? kBf16LossRel : ::strata::kLossRel;
  const double kNormRel = bf16 ? kBf16NormRel : ::strata::kNormRel;
  const double kParamAbs = bf16 ? kBf16ParamAbs : ::strata::kParamAbs;
  const Trained one = Train(ref);  // every rank runs the reference alone
  const Trained many = Train(dp);
  if (where != Placement::kResident) {
    EXPECT_THAT(many.plan, HasSubstr("nvme")) << many.plan;
  }
  if (bf16) {
    EXPECT_THAT(many.plan, HasSubstr("bf16 on the host")) << many.plan;
  }
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
  if (stage >= 1) {
    EXPECT_THAT(many.plan, HasSubstr("the optimizer state of 1/" + std::to_string(w) + " of every unit per rank"))
        << many.plan;
  }
  std::printf("ZeRO stage %d: ", stage);
  std::printf("%d ranks vs 1, %s, clip %g, %s: losses %.4f..%.4f; largest relative difference: loss %.2e, "
              "grad norm %.2e; parameters: largest difference %.2e\n",
              w, schedule.c_str(), clip,
              where == Placement::kResident ? "resident" : bf16 ? "offloaded bf16" : "offloaded", one.steps.front().loss, one.steps.back().loss, loss_rel, norm_rel,
              std::max(MaxAbsDiff(one.wte, many.wte), MaxAbsDiff(one.c_fc, many.c_fc)));
  EXPECT_LT(one.steps.back().loss, one.steps.front().loss) << "the reference does not learn: the check is weak";
  EXPECT_LE(MaxAbsDiff(one.wte, many.wte), kParamAbs);
  EXPECT_LE(MaxAbsDiff(one.c_fc, many.c_fc), kParamAbs);
  ExpectSameOnEveryRank(many.wte, "transformer.wte.weight");
  ExpectSameOnEveryRank(many.c_fc, "transformer.h.1.mlp.c_fc.weight");
}

// The collectives ZeRO's partitions run through (engine/staged_collectives.h),
// with a staging buffer of 64 bytes: every call takes several rounds, the
// last one short, and the unit (23 values) does not divide by the ranks.
// The values are small integers, so every sum is exact.
void ExpectStagedInRoundsAreWhole(const StagedCollectives::Rounds& rounds) {
  ASSERT_OK_AND_ASSIGN(auto c, comm::CreateMpiCommunicator(comm::CommOptions{}));
  const size_t W = static_cast<size_t>(c->world_size()), r = static_cast<size_t>(c->rank());
  ASSERT_GE(W, 2u);
  EXPECT_THAT(StagedCollectives::Create(c.get(), nullptr, 8 * W).status(), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(StagedCollectives sc, StagedCollectives::Create(c.get(), nullptr, rounds));

  // The gradient's reduce-scatter: this rank's range summed, the rest its own.
  const size_t n = 23, pad = (n + W - 1) / W;
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((r + 1) * 1000 + i);
  ASSERT_OK(sc.ReduceScatterFlat(g.data(), static_cast<int64_t>(n), static_cast<int64_t>(pad)));
  for (size_t i = 0; i < n; ++i) {
    const bool mine = i >= r * pad && i < (r + 1) * pad;
    const double want = mine ? 1000.0 * W * (W + 1) / 2 + static_cast<double>(W * i) : (r + 1) * 1000.0 + i;
    EXPECT_EQ(g[i], want) << "element " << i << " of rank " << r << "'s gradient (" << (mine ? "" : "not ") << "its slice)";
  }

  // The gather: every rank's 11, the first W × 11 - 3 of them written, the rest untouched.
  const size_t count = 11, keep = W * count - 3;
  for (DType dt : {DType::kI32, DType::kBF16}) {
    for (bool on_backend : {false, true}) {
      SCOPED_TRACE(std::string(DTypeName(dt)) + (on_backend ? ", into backend memory" : ", into host memory"));
      const size_t es = DTypeSize(dt);
      std::vector<uint8_t> send(count * es), recv(W * count * es, 0xAB);
      for (size_t j = 0; j < count; ++j) {
        const uint32_t x = static_cast<uint32_t>(r * 100 + j);  // (its low bytes for a 2-byte dtype)
        std::memcpy(&send[j * es], &x, es);
      }
      ASSERT_OK(sc.AllGather(send.data(), count, dt, recv.data(), keep, on_backend));
      for (size_t q = 0; q < W; ++q)
        for (size_t j = 0; j < count; ++j) {
          const size_t at = q * count + j;
          uint32_t got = 0, want = at < keep ? static_cast<uint32_t>(q * 100 + j) : 0xABABABABu;
          std::memcpy(&got, &recv[at * es], es);
          if (es == 2) want &= 0xFFFF;
          EXPECT_EQ(got, want) << "element " << j << " of rank " << q << "'s piece";
        }
    }
  }
  EXPECT_THAT(sc.AllGather(nullptr, count, DType::kI32, nullptr, W * count + 1, false),
              StatusIs(StatusCode::kInvalidArgument));

  // The host reductions, over more than a round.
  std::vector<double> d(17);
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<double>(r) + 0.5 * static_cast<double>(i);
  ASSERT_OK(sc.AllReduceHost(d.data(), d.size(), DType::kF64, comm::ReduceOp::kSum));
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i], W * (W - 1) / 2.0 + 0.5 * static_cast<double>(W * i)) << i;
  std::vector<int32_t> m(9);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<int32_t>(r * 10 + i);
  ASSERT_OK(sc.AllReduceHost(m.data(), m.size(), DType::kI32, comm::ReduceOp::kMax));
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i], static_cast<int32_t>((W - 1) * 10 + i)) << i;
}

TEST(DataParallelRanks, StagedCollectivesInRoundsAreTheWholeCollectives) {
  ExpectStagedInRoundsAreWhole(StagedCollectives::Rounds{64});
}
// The bucket sizes bound the rounds below what the staging holds: 2
// elements per rank a round of the reduce-scatter, 3 of the gathers.
TEST(DataParallelRanks, StagedCollectivesInBucketedRoundsAreTheWholeCollectives) {
  ExpectStagedInRoundsAreWhole(StagedCollectives::Rounds{1 << 20, 2, 3});
}

TEST(DataParallelRanks, ClippedLayerMajorGivesTheLossesOfOneRank) { CompareWithOneRank("layer-major", 1.0); }
TEST(DataParallelRanks, UnclippedLayerMajorGivesTheLossesOfOneRank) { CompareWithOneRank("layer-major", 0); }
TEST(DataParallelRanks, MicroBatchMajorGivesTheLossesOfOneRank) { CompareWithOneRank("micro-batch-major", 1.0); }
TEST(DataParallelRanks, OffloadedGivesTheLossesOfOneRank) {
  CompareWithOneRank("layer-major", 1.0, Placement::kOffloaded);
}
TEST(DataParallelRanks, OffloadedBf16GivesTheLossesOfOneRank) {
  CompareWithOneRank("layer-major", 0, Placement::kOffloadedBf16);
}

// ZeRO stages 1-3 across the ranks (engine/data_parallel.h): each rank
// updates its slice of every unit from the reduce-scattered gradient and
// the parameters are all-gathered; the tolerances are stage 0's (the
// reduce-scatter sums in another order than the all-reduce, the norm is a
// sum of slice norms: both within the last fp32 bits).
TEST(DataParallelRanks, ZeroStage1GivesTheLossesOfOneRank) {
  CompareWithOneRank("layer-major", 1.0, Placement::kResident, 1);
}
TEST(DataParallelRanks, ZeroStage2GivesTheLossesOfOneRank) {
  CompareWithOneRank("layer-major", 1.0, Placement::kResident, 2);
}
TEST(DataParallelRanks, ZeroStage3GivesTheLossesOfOneRank) {
  CompareWithOneRank("layer-major", 1.0, Placement::kResident, 3);
}
// Unclipped: each slice is updated during the backward, once its reduced
// gradient is final (the exact overlapped update).
TEST(DataParallelRanks, ZeroStage2UnclippedGivesTheLossesOfOneRank) {
  CompareWithOneRank("layer-major", 0, Placement::kResident, 2);
}
TEST(DataParallelRanks, ZeroStage2MicroBatchMajorGivesTheLossesOfOneRank) {
  CompareWithOneRank("micro-batch-major", 1.0, Placement::kResident, 2);
}
// The slices' optimizer state on NVMe (in a temp dir), parameters streamed from the host.
TEST(DataParallelRanks, ZeroStage2OffloadedGivesTheLossesOfOneRank) {
  CompareWithOneRank("layer-major", 1.0, Placement::kOffloaded, 2);
}
TEST(DataParallelRanks, ZeroStage1OffloadedBf16GivesTheLossesOfOneRank) {
  CompareWithOneRank("layer-major", 0, Placement::kOffloadedBf16, 1);
}

// Stage 3: the parameters too are partitioned and gathered at each use.
TEST(DataParallelRanks, ZeroStage3OffloadedGivesTheLossesOfOneRank) {
  CompareWithOneRank("layer-major", 1.0, Placement::kOffloaded, 3);
}
TEST(DataParallelRanks, ZeroStage3UnclippedMicroBatchMajorGivesTheLossesOfOneRank) {
  CompareWithOneRank("micro-batch-major", 0, Placement::kResident, 3);
}
// zero_optimization.overlap_comm (engine/grad_reduce.h): each unit's sum
// runs beside the next unit's backward, reduce-scattered (stage 0:
// all-reduced) in place in the padded accumulator, against the same run
// with each sum on the compute stream as the gradient is final (through the
// staging at stages >= 1). At two ranks each element's sum is one fp32
// addition either way, so the runs agree to the bit; at three the sums may
// associate differently: within the tolerances above.
void CompareOverlapWithout(int stage, Placement where) {
  const int w = World();
  ASSERT_GE(w, 2) << "run under mpirun with 2 or more ranks";
  const bool bf16 = where == Placement::kOffloadedBf16;
  testing::TempDir nvme_on, nvme_off;
  TrainOptions on = Tiny(w, kMicro, "layer-major", 1.0, stage), off = on;
  off.config.zero.overlap_comm = false;
  if (where != Placement::kResident) {
    Offload(&on, nvme_on.path(), bf16);
    Offload(&off, nvme_off.path(), bf16);
  }
  ASSERT_TRUE(ReducesBesideBackward(on));
  ASSERT_FALSE(ReducesBesideBackward(off));
  EXPECT_THAT(DataParallelNote(on, 1000), HasSubstr("beside the backward"));
  EXPECT_THAT(DataParallelNote(off, 1000), Not(HasSubstr("beside the backward")));
  const Trained a = Train(on), b = Train(off);
  ASSERT_EQ(a.steps.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(b.steps.size(), static_cast<size_t>(kSteps));
  const double kLossRel = bf16 ? kBf16LossRel : ::strata::kLossRel;
  const double kParamAbs = bf16 ? kBf16ParamAbs : ::strata::kParamAbs;
  for (int64_t i = 0; i < kSteps; ++i) {
    if (w == 2) {
      EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i + 1;
      EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << "step " << i + 1;
    } else {
      EXPECT_NEAR(a.steps[i].loss, b.steps[i].loss, kLossRel * b.steps[i].loss) << "step " << i + 1;
    }
  }
  if (w == 2) {
    EXPECT_EQ(a.wte, b.wte);
    EXPECT_EQ(a.c_fc, b.c_fc);
  } else {
    EXPECT_LE(MaxAbsDiff(a.wte, b.wte), kParamAbs);
    EXPECT_LE(MaxAbsDiff(a.c_fc, b.c_fc), kParamAbs);
  }
  EXPECT_LT(a.steps.back().loss, a.steps.front().loss) << "the run does not learn: the check is weak";
  ExpectSameOnEveryRank(a.wte, "transformer.wte.weight");
  std::printf("overlap_comm on vs off, %d ranks, ZeRO stage %d, %s: losses %.6f..%.6f vs %.6f..%.6f\n", w, stage,
              where == Placement::kResident ? "resident" : bf16 ? "offloaded bf16" : "offloaded",
              a.steps.front().loss, a.steps.back().loss, b.steps.front().loss, b.steps.back().loss);
}

TEST(DataParallelRanks, ZeroStage2OverlappedReduceGivesTheLossesWithout) {
  CompareOverlapWithout(2, Placement::kResident);
}
TEST(DataParallelRanks, ZeroStage3OffloadedOverlappedReduceGivesTheLossesWithout) {
  CompareOverlapWithout(3, Placement::kOffloaded);
}
TEST(DataParallelRanks, ZeroStage1Bf16OverlappedReduceGivesTheLossesWithout) {
  CompareOverlapWithout(1, Placement::kOffloadedBf16);
}
// Stage 0 (bf16 gradients: the fp32 sums in scratch): the all-reduce beside.
TEST(DataParallelRanks, Bf16OverlappedAllReduceGivesTheLossesWithout) {
  CompareOverlapWithout(0, Placement::kOffloadedBf16);
}

// An evaluation between steps gathers the parameters as the step does: it
// gives the loss of the replicated ranks (stage 0, the same batches).
TEST(DataParallelRanks, ZeroStage3EvaluatesAsStage0) {
  const int w = World();
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto one, Trainer::Create(Tiny(w, kMicro, "layer-major", 1.0, 0), log));
  ASSERT_OK_AND_ASSIGN(auto many, Trainer::Create(Tiny(w, kMicro, "layer-major", 1.0, 3), log));
  EXPECT_THAT(many->PlanTable(), HasSubstr("its parameters too are gathered at each use"));
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(one->Step().status());
    ASSERT_OK(many->Step().status());
  }
  ASSERT_OK_AND_ASSIGN(double a, one->Evaluate(2));
  ASSERT_OK_AND_ASSIGN(double b, many->Evaluate(2));
  EXPECT_NEAR(b, a, kLossRel * a);
}

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
    EXPECT_THAT(out.str(), HasSubstr("data parallel: " + std::to_string(w) + " ranks"));
    EXPECT_THAT(out.str(), HasSubstr("this is rank 0 of " + std::to_string(w) + " (mpi)"));
    EXPECT_THAT(out.str(), HasSubstr("step 2"));
  } else {
    EXPECT_EQ(out.str(), "");
    EXPECT_EQ(log.str(), "");
  }
}

// A signal reaches the ranks at different moments (here: rank 1 alone has
// seen it): every rank stops at the same step boundary, none waits in a
// collective for one that stopped.
TEST(DataParallelRanks, AStopSeenByOneRankStopsEveryRank) {
  const int w = World();
  TrainOptions o = Tiny(w, kMicro, "layer-major");
  o.steps = 3;
  o.comm_timeout_s = 10;
  std::ostringstream log, out;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_OK(t->Step().status());
  ASSERT_OK_AND_ASSIGN(comm::RankEnv e, comm::RankEnvFromEnvironment());
  if (e.rank == 1) RequestStop(SIGINT);
  Status s = t->Run(out);
  ClearStopRequest();
  EXPECT_THAT(s, StatusIs(StatusCode::kCancelled)) << "rank " << e.rank;
  EXPECT_THAT(s.message(), HasSubstr("stopped by SIGINT after step 1 of 3"));
  EXPECT_EQ(t->step(), 1);
}

// Rank 0's temporary directory, its name broadcast to every rank; `comm`
// keeps the ranks in step around it.
std::string SharedDir(comm::Communicator& c, testing::TempDir* mine) {
  std::vector<char> name(4096, '\0');
  if (c.rank() == 0) std::snprintf(name.data(), name.size(), "%s", mine->path().c_str());
  EXPECT_OK(c.Broadcast(name.data(), name.size(), DType::kU8, 0, nullptr));
  return name.data();
}

void SaveAtSeveralRanksResumeAtOne(int stage) {
  const int w = World();
  ASSERT_OK_AND_ASSIGN(auto c, comm::CreateMpiCommunicator(comm::CommOptions{}));
  testing::TempDir tmp;
  const std::string dir = SharedDir(*c, &tmp);
  const Trained one = Train(Tiny(1, kMicro * w, "layer-major"));  // kSteps uninterrupted
  {
    TrainOptions o = Tiny(w, kMicro, "layer-major", 1.0, stage);
    o.save_dir = dir;
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    for (int i = 0; i < 3; ++i) ASSERT_OK(t->Step().status());
    ASSERT_OK(t->Save(dir));  // rank 0 writes it
  }
  ASSERT_OK(c->Barrier(nullptr));  // the checkpoint is there for every rank
  TrainOptions o = Tiny(1, kMicro * w, "layer-major");
  o.resume_dir = dir;
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  EXPECT_EQ(t->step(), 3);
  for (int64_t i = 3; i < kSteps; ++i) {
    ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
    EXPECT_NEAR(r.loss, one.steps[i].loss, kLossRel * one.steps[i].loss) << "step " << i + 1;
  }
  ASSERT_OK(c->Barrier(nullptr));  // rank 0's directory stays until every rank is done with it
}

TEST(DataParallelRanks, SavedAtSeveralRanksResumesAtOne) { SaveAtSeveralRanksResumeAtOne(0); }
// Partitioned: rank 0 writes the whole state, gathered unit by unit from the slices.
TEST(DataParallelRanks, ZeroStage2SavedAtSeveralRanksResumesAtOne) { SaveAtSeveralRanksResumeAtOne(2); }
TEST(DataParallelRanks, ZeroStage3SavedAtSeveralRanksResumesAtOne) { SaveAtSeveralRanksResumeAtOne(3); }

// Run alone under `mpirun --enable-recovery` (tests/comm/run_mpi_ranks.sh killed).
TEST(DataParallelKilledRank, OthersStepEndsWithAnErrorNamingIt) {
  const int w = World();
  TrainOptions o = Tiny(w, kMicro, "layer-major");
  o.comm_timeout_s = 3;
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_OK(t->Step().status());
  ASSERT_OK_AND_ASSIGN(comm::RankEnv e, comm::RankEnvFromEnvironment());
  if (e.rank == w - 1) raise(SIGKILL);  // mid-run, before the next step's first collective
  const double t0 = NowSeconds();
  auto r = t->Step();
  const double took = NowSeconds() - t0;
  EXPECT_THAT(r, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(r.status().message(), HasSubstr("on rank " + std::to_string(e.rank) + " of " + std::to_string(w) +
                                              " (peer rank " + std::to_string(w - 1) + ")"));
  EXPECT_LT(took, o.comm_timeout_s + 5);
  std::printf("rank %d: expected error: %s\n", e.rank, r.status().ToString().c_str());
}

}  // namespace
}  // namespace strata
