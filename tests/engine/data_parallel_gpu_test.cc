// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's data parallelism (engine/data_parallel.h) at world size
// 1, as `strata train --num-gpus 1` or a launcher's RANK=0 WORLD_SIZE=1 runs
// it: the NCCL communicator joined through the TCP rendezvous, every
// gradient all-reduced on the step's stream, the scalars through device
// memory — and the losses are the plain single-rank run's, bit for bit (a
// sum over one rank is the value). Skips without a GPU or NCCL.
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "comm/nccl_communicator.h"
#include "engine/trainer.h"
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

}  // namespace
}  // namespace strata
