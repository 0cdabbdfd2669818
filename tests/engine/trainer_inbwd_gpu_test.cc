// SPDX-License-Identifier: Apache-2.0
// The optimizer update during the backward on the CUDA backend, where its
// ordering is real: each shard's update waits (on the host) for the copy of
// its non-finite count, queued on the D2H stream after the compute stream's
// work on the shard, before it reads the gradient, uploads parameters or runs
// the GPU-assisted worker's Adam beside the backward. Same bits as the
// post-backward update (losses, grad norms, parameters, moments).
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/device.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::Parameters;
using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

// No gradient clipping: DeepSpeed's default (DefaultConfig has the CLI's 1.0).
TrainOptions TinyGpu(bool bf16) { return testing::TinyGpuTrainer(bf16, 0); }

std::string FileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

struct Outcome {
  std::vector<double> losses, norms;
  std::string model, optimizer;  // the checkpoint after the last step
  bool during = false;
  std::string plan;
};

Outcome TrainRun(const TrainOptions& o, int steps) {
  Outcome out;
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return out;
  out.during = (*t)->Info().optimizer_during_backward;
  out.plan = (*t)->PlanTable();
  for (int i = 0; i < steps; ++i) {
    auto r = (*t)->Step();
    EXPECT_OK(r.status());
    if (!r.ok()) return out;
    out.losses.push_back(r->loss);
    out.norms.push_back(r->grad_norm);
  }
  TempDir ck;
  EXPECT_OK((*t)->Save(ck.path()));
  const std::string dir = ck.path() + "/step-00000" + std::to_string(steps);
  out.model = FileBytes(dir + "/master.safetensors");
  out.optimizer = FileBytes(dir + "/optimizer.safetensors");
  return out;
}

TEST(TrainerInBackwardGpu, SameBitsAsAfterBackward) {
  STRATA_SKIP_WITHOUT_GPU();
  struct Case {
    const char* what;
    bool bf16;
    int64_t accum;
    const char* schedule;
    double ratio;
    const char* assist;
    bool nvme;
  };
  const Case cases[] = {
      {"bf16, assist auto", true, 1, "layer-major", 1.0, "auto", false},
      {"bf16, assist off", true, 1, "layer-major", 1.0, "off", false},
      {"fp32, assist auto", false, 1, "layer-major", 1.0, "auto", false},
      {"bf16, accumulation 3, micro-batch-major, assist auto", true, 3, "micro-batch-major", 1.0, "auto", false},
      {"bf16, ratio 0.5, assist auto", true, 1, "layer-major", 0.5, "auto", false},
      {"bf16, nvme, parameters and checkpoints offloaded", true, 2, "layer-major", 1.0, "auto", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir nvme_a, nvme_b;
    auto opts = [&](bool after, const std::string& dir) {
      TrainOptions o = TinyGpu(c.bf16);
      Config& cf = o.config;
      cf.grad_accum = c.accum;
      cf.train_batch_size = cf.micro_batch * c.accum;
      cf.trainer.schedule = c.schedule;
      cf.trainer.gpu_assisted_optimizer = c.assist;
      cf.zero.offload_optimizer.ratio = c.ratio;
      if (c.nvme) {
        cf.zero.offload_optimizer.device = "nvme";
        cf.zero.offload_optimizer.nvme_path = dir;
        cf.zero.offload_optimizer.pipeline_read = cf.zero.offload_optimizer.pipeline_write = true;
        cf.zero.offload_param.device = "cpu";
        cf.activation_checkpointing.cpu_checkpointing = true;
      }
      o.optimizer_after_backward = after;
      return o;
    };
    // One trainer on the device at a time (each counts the other's memory).
    const Outcome s = TrainRun(opts(false, nvme_a.path()), 4);
    const Outcome p = TrainRun(opts(true, nvme_b.path()), 4);
    EXPECT_TRUE(s.during) << s.plan;
    EXPECT_FALSE(p.during);
    ASSERT_EQ(s.losses.size(), 4u);
    ASSERT_EQ(p.losses.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(s.losses[i], p.losses[i]) << "step " << i + 1;
      EXPECT_EQ(s.norms[i], p.norms[i]) << "step " << i + 1;
    }
    EXPECT_LT(s.losses.back(), s.losses.front());
    EXPECT_FALSE(s.model.empty());
    EXPECT_TRUE(s.model == p.model) << "master weights differ";
    EXPECT_TRUE(s.optimizer == p.optimizer) << "moments differ";
  }
}

// The non-finite count of the shard comes down from the device before its
// update: block 1's NaN is never applied; ln_f and block 2 (before it in the
// backward's order) are updated, block 0 and the embedding (after) are not.
TEST(TrainerInBackwardGpu, NonFiniteGradientIsNeverApplied) {
  STRATA_SKIP_WITHOUT_GPU();
  const std::vector<std::string> names = {"transformer.ln_f.weight", "transformer.h.2.mlp.c_fc.weight",
                                          "transformer.h.1.mlp.c_fc.weight", "transformer.h.0.attn.c_attn.weight",
                                          "transformer.wte.weight"};
  TrainOptions o = TinyGpu(true);
  o.config.trainer.gpu_assisted_optimizer = "off";  // one worker: the order is exact
  o.inject_nonfinite_shard = "blk1";
  o.inject_nonfinite_step = 2;
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_TRUE(t->Info().optimizer_during_backward);
  ASSERT_OK(t->Step().status());
  const std::vector<std::vector<float>> before = Parameters(*t, names);
  auto r = t->Step();
  EXPECT_THAT(r, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(r.status().ToString(), HasSubstr("non-finite gradients at step 2"));
  const std::vector<std::vector<float>> now = Parameters(*t, names);
  EXPECT_NE(now[0], before[0]);
  EXPECT_NE(now[1], before[1]);
  EXPECT_EQ(now[2], before[2]) << "block 1 (the NaN) was updated";
  EXPECT_EQ(now[3], before[3]);
  EXPECT_EQ(now[4], before[4]);
  TempDir ck;
  EXPECT_THAT(t->Save(ck.path()), StatusIs(StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace strata
