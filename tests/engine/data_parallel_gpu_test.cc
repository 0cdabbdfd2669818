// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's data parallelism (engine/data_parallel.h) at world size
// 1, as `strata train --num-gpus 1` or a launcher's RANK=0 WORLD_SIZE=1 runs
// it: the NCCL communicator joined through the TCP rendezvous, every
// gradient all-reduced on the step's stream, the scalars through device
// memory — and the losses are the plain single-rank run's, bit for bit (a
// sum over one rank is the value). ZeRO stages 1-3 through the partitioned
// path at world size 1, and the staged collectives over NCCL, likewise.
// Skips without a GPU or NCCL.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "comm/nccl_communicator.h"
#include "engine/data_parallel.h"
#include "engine/model_config.h"
#include "engine/param_gather.h"
#include "engine/staged_collectives.h"
#include "engine/trainer.h"
#include "kernels/backend.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::FreeLoopbackPort;
using ::testing::HasSubstr;

// The launcher's variables for the test's lifetime.
class LauncherEnv {
 public:
  explicit LauncherEnv(int port) {
    for (auto [k, v] : {std::pair{"RANK", "0"}, std::pair{"WORLD_SIZE", "1"}, std::pair{"LOCAL_RANK", "0"},
                        std::pair{"LOCAL_WORLD_SIZE", "1"}, std::pair{"MASTER_ADDR", "127.0.0.1"}})
      ::setenv(k, v, 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  }
  ~LauncherEnv() {
    for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
      ::unsetenv(k);
  }
};

TrainOptions TinyGpu(bool bf16) {
  TrainOptions o = testing::TinyTrainer(3, 128, 64);
  o.config.bf16 = bf16;
  o.config.gradient_clipping = 1.0;  // the norm: the all-reduced gradients' statistics
  o.backend = "cuda";
  o.gpu_memory_limit = 1536 * kMiB;
  o.host_memory_limit = 1 * kGiB;
  o.steps = 5;
  return o;
}

// Four steps' losses, then Run's fifth step and its log (the ranks' line).
std::vector<double> Losses(const TrainOptions& o, std::string* run_log) {
  std::ostringstream log, out;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return {};
  std::vector<double> l;
  for (int i = 0; i < 4; ++i) {
    auto r = (*t)->Step();
    EXPECT_OK(r.status());
    if (!r.ok()) return l;
    l.push_back(r->loss);
  }
  EXPECT_OK((*t)->Run(out));
  *run_log = out.str();
  return l;
}

class DataParallelGpu : public ::testing::TestWithParam<bool> {};

TEST_P(DataParallelGpu, NcclAtWorldOneGivesThePlainLosses) {
  STRATA_SKIP_WITHOUT_GPU();
  if (!comm::BuiltWithNccl()) GTEST_SKIP() << "built without NCCL";
  std::string plain_log, nccl_log;
  const std::vector<double> plain = Losses(TinyGpu(GetParam()), &plain_log);
  std::vector<double> nccl;
  {
    LauncherEnv env(FreeLoopbackPort());
    TrainOptions o = TinyGpu(GetParam());
    o.launched = true;
    nccl = Losses(o, &nccl_log);
  }
  EXPECT_THAT(nccl_log, HasSubstr("this is rank 0 of 1 (nccl)"));
  EXPECT_THAT(plain_log, ::testing::Not(HasSubstr("data parallel")));
  ASSERT_EQ(plain.size(), 4u);
  ASSERT_EQ(nccl.size(), 4u);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i], nccl[i]) << "step " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(Fp32AndBf16, DataParallelGpu, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "bf16" : "fp32"; });

// ZeRO stages 1-3 on the CUDA backend through the partitioned path at world
// size 1 (TrainOptions::partition_at_world_one): the gradient reduce-scattered
// on the device through NCCL, the slices' statistics summed, each slice's
// update writing its parameters' slice, and at stages 1-2 the gather into the
// whole parameters, at stage 3 the gather at each use into device buffers —
// with the optimizer state on the GPU and on the host, with the sums on the
// compute stream and beside the backward on their own (overlap_comm). A sum
// over one rank is the value, so the losses are the plain run's bit for bit.
TEST_P(DataParallelGpu, ZeroStagesPartitionedAtWorldOneGiveThePlainLosses) {
  STRATA_SKIP_WITHOUT_GPU();
  if (!comm::BuiltWithNccl()) GTEST_SKIP() << "built without NCCL";
  for (const char* where : {"none", "cpu"}) {
    TrainOptions base = TinyGpu(GetParam());
    base.config.zero.offload_optimizer.device = where;
    std::string plain_log;
    const std::vector<double> plain = Losses(base, &plain_log);
    ASSERT_EQ(plain.size(), 4u);
    for (int stage : {1, 2, 3})
    for (bool overlap : {true, false}) {
      SCOPED_TRACE(std::string("stage ") + std::to_string(stage) + ", offload_optimizer " + where +
                   ", overlap_comm " + (overlap ? "on" : "off"));
      TrainOptions o = base;
      o.config.zero.stage = stage;
      o.config.zero.overlap_comm = overlap;
      o.launched = true;
      o.partition_at_world_one = true;
      // overlap_comm: the sums beside the backward (engine/grad_reduce.h)
      // wherever the fp32 sums are the step's scratch.
      EXPECT_EQ(ReducesBesideBackward(o), overlap && (GetParam() || stage >= 2));
      LauncherEnv env(FreeLoopbackPort());
      std::ostringstream log;
      auto t = Trainer::Create(o, log);
      ASSERT_OK(t.status());
      EXPECT_THAT((*t)->PlanTable(), HasSubstr("zero stage " + std::to_string(stage) + " across 1 ranks"));
      // The plan took the collectives' device memory off the GPU tier: the
      // staging, and at stage 3 the gather buffers (two held and those
      // fetched ahead, each the largest unit's parameters).
      ASSERT_OK_AND_ASSIGN(const std::string dry, Trainer::DryRun(o));
      ASSERT_OK_AND_ASSIGN(const models::ModelSpec spec, ModelSpecFor(o.config));
      int64_t largest = 0;
      for (const auto& u : spec.units) largest = std::max(largest, u.numel);
      const size_t buffers = ParamGather::kMaxHeld + ParamGather::AheadUnits(spec, o.config.zero.prefetch_bucket_size);
      EXPECT_GE(buffers, 3u);  // (the default bucket fetches ahead)
      const uint64_t gathered =
          stage == 3 ? buffers * static_cast<uint64_t>(largest) * DTypeSize(ComputeDType(o.config)) : 0;
      const uint64_t staging = DataParallel::RoundsFor(o.config, largest).stage_bytes;
      EXPECT_THAT(dry, HasSubstr("gpu: " + FormatBytes(staging + gathered) +
                                 " beside the tiers for the ranks' collectives (staging" +
                                 (stage == 3 ? " and the gathered parameters" : ")")));
      for (size_t i = 0; i < plain.size(); ++i) {
        ASSERT_OK_AND_ASSIGN(StepReport r, (*t)->Step());
        EXPECT_EQ(r.loss, plain[i]) << "step " << i + 1;
      }
    }
  }
}

// The staged collectives (engine/staged_collectives.h) over NCCL on device
// memory, with a 64-byte staging buffer so that every call takes rounds: at
// one rank the reduce-scatter leaves the gradient as it was, the gather
// writes exactly the elements asked for (host or device), the host
// reductions keep their values.
TEST(StagedCollectivesGpu, RoundsOverNcclAtWorldOne) {
  STRATA_SKIP_WITHOUT_GPU();
  if (!comm::BuiltWithNccl()) GTEST_SKIP() << "built without NCCL";
  comm::RankEnv env;
  env.master_port = FreeLoopbackPort();
  ASSERT_OK_AND_ASSIGN(auto c, comm::CreateNcclCommunicator(env, 0, comm::CommOptions{}));
  ASSERT_OK_AND_ASSIGN(auto be, kernels::MakeCudaBackend(0));
  ASSERT_OK_AND_ASSIGN(StagedCollectives sc, StagedCollectives::Create(c.get(), be.get(), 64));
  const size_t n = 37;
  std::vector<float> g(n), back(n);
  for (size_t i = 0; i < n; ++i) g[i] = 0.25f * static_cast<float>(i) - 3.f;
  ASSERT_OK_AND_ASSIGN(kernels::DeviceBuffer dg, be->Allocate(n * 4));
  ASSERT_OK(be->CopyToDevice(dg.data(), g.data(), n * 4));
  ASSERT_OK(sc.ReduceScatterFlat(dg.as<float>(), static_cast<int64_t>(n), static_cast<int64_t>(n)));
  ASSERT_OK(be->CopyToHost(back.data(), dg.data(), n * 4));
  EXPECT_EQ(back, g);

  const size_t count = 29, keep = 26;
  std::vector<uint16_t> send(count);
  for (size_t j = 0; j < count; ++j) send[j] = static_cast<uint16_t>(0x3f80 + j);
  std::vector<uint16_t> host(count, 0xABAB), want(count, 0xABAB);
  std::copy(send.begin(), send.begin() + keep, want.begin());
  ASSERT_OK(sc.AllGather(send.data(), count, DType::kBF16, host.data(), keep, false));
  EXPECT_EQ(host, want);
  ASSERT_OK_AND_ASSIGN(kernels::DeviceBuffer dr, be->Allocate(count * 2));
  ASSERT_OK(be->Memset(dr.data(), 0xAB, count * 2));
  ASSERT_OK(sc.AllGather(send.data(), count, DType::kBF16, dr.data(), keep, true));
  std::vector<uint16_t> dev(count);
  ASSERT_OK(be->CopyToHost(dev.data(), dr.data(), count * 2));
  EXPECT_EQ(dev, want);

  std::vector<double> d(19);
  for (size_t i = 0; i < d.size(); ++i) d[i] = 1.5 * static_cast<double>(i);
  const std::vector<double> d0 = d;
  ASSERT_OK(sc.AllReduceHost(d.data(), d.size(), DType::kF64, comm::ReduceOp::kSum));
  EXPECT_EQ(d, d0);
}

}  // namespace
}  // namespace strata
