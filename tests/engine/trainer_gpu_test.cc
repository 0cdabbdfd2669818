// SPDX-License-Identifier: Apache-2.0
// The trainer on the CUDA backend: the same parity checks as the CPU tests —
// loss falls, offloaded placements give the same losses as the all-resident
// run, resume is bit-identical, the GPU budget is never exceeded.
#include <cmath>
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

using ::strata::testing::TempDir;

TrainOptions TinyGpu(int64_t steps, bool bf16) {
  TrainOptions o = testing::TinyTrainer(3, 128, 64);
  Config& c = o.config;
  c.bf16 = bf16;
  o.steps = steps;
  o.backend = "cuda";
  // (The limit covers the CUDA context and libraries too: about 0.6 GiB.)
  o.gpu_memory_limit = 1536 * kMiB;
  o.host_memory_limit = 1 * kGiB;
  return o;
}

std::vector<double> TrainLosses(const TrainOptions& o, int64_t steps) {
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return {};
  std::vector<double> out;
  for (int64_t i = 0; i < steps; ++i) {
    auto r = (*t)->Step();
    EXPECT_OK(r.status());
    if (!r.ok()) break;
    out.push_back(r->loss);
  }
  return out;
}

TEST(TrainerGpu, LossFallsInBf16) {
  STRATA_SKIP_WITHOUT_GPU();
  auto l = TrainLosses(TinyGpu(30, true), 30);
  ASSERT_EQ(l.size(), 30u);
  EXPECT_LT((l[27] + l[28] + l[29]) / 3, (l[0] + l[1] + l[2]) / 3 - 1.0);
}

TEST(TrainerGpu, OffloadedPlacementsGiveTheSameLosses) {
  STRATA_SKIP_WITHOUT_GPU();
  TempDir nvme;
  auto a = TrainLosses(TinyGpu(4, true), 4);
  TrainOptions off = TinyGpu(4, true);
  off.config.zero.offload_optimizer.device = "nvme";
  off.config.zero.offload_optimizer.nvme_path = nvme.path();
  off.config.zero.offload_param.device = "cpu";
  off.config.activation_checkpointing.cpu_checkpointing = true;
  auto b = TrainLosses(off, 4);
  TrainOptions host = TinyGpu(4, true);
  host.config.zero.offload_optimizer.device = "cpu";
  auto c = TrainLosses(host, 4);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  ASSERT_EQ(c.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
    EXPECT_EQ(a[i], c[i]) << "step " << i + 1;
  }
}

TEST(TrainerGpu, ResumeIsBitIdentical) {
  STRATA_SKIP_WITHOUT_GPU();
  TempDir dir;
  auto straight = TrainLosses(TinyGpu(6, true), 6);
  ASSERT_EQ(straight.size(), 6u);
  std::ostringstream log;
  {
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(TinyGpu(3, true), log));
    for (int i = 0; i < 3; ++i) ASSERT_OK(t->Step().status());
    ASSERT_OK(t->Save(dir.path()));
  }
  TrainOptions r = TinyGpu(6, true);
  r.resume_dir = dir.path();
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(r, log));
  for (int i = 3; i < 6; ++i) {
    ASSERT_OK_AND_ASSIGN(StepReport rep, t->Step());
    EXPECT_EQ(rep.loss, straight[static_cast<size_t>(i)]) << "step " << i + 1;
  }
}

TEST(TrainerGpu, Fp16DynamicLossScaleTrains) {
  STRATA_SKIP_WITHOUT_GPU();
  // A scale far too large overflows at first (fp16 gradients of ~1e-2 times
  // 2^24 exceed 65504); the scaler halves it per overflow (hysteresis 1)
  // until steps go through, and then the model trains.
  TrainOptions o = TinyGpu(40, false);
  o.config.fp16.enabled = true;
  o.config.fp16.initial_scale_power = 24;
  o.config.fp16.hysteresis = 1;
  o.config.fp16.loss_scale_window = 100;
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  int skipped = 0;
  std::vector<double> applied;
  double scale_first = 0, scale_last = 0;
  for (int i = 0; i < 40; ++i) {
    ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
    skipped += r.skipped;
    if (i == 0) scale_first = r.loss_scale;
    scale_last = r.loss_scale;
    if (!r.skipped) applied.push_back(r.loss);
  }
  EXPECT_GT(skipped, 0);
  EXPECT_LT(scale_last, scale_first);
  ASSERT_GE(applied.size(), 20u) << skipped << " of 40 steps skipped";
  EXPECT_LT(applied.back(), applied.front() - 0.5);
}

TEST(TrainerGpu, TheDeviceNeverHoldsMoreThanTheLimit) {
  STRATA_SKIP_WITHOUT_GPU();
  // A limit the model needs offloading for; cudaMemGetInfo counts everything
  // the process holds (context, libraries, the tier).
  TrainOptions o = TinyGpu(3, true);
  o.config.model.n_layer = 12;
  o.config.model.n_embd = 1024;  // 151 M parameters: 2.4 GB of training state
  o.config.model.n_head = 8;
  o.config.model.seq_len = 256;
  o.gpu_memory_limit = 1536 * kMiB;
  o.host_memory_limit = 4 * kGiB;
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  for (int i = 0; i < 3; ++i) ASSERT_OK(t->Step().status());
  ASSERT_OK_AND_ASSIGN(GpuInfo info, QueryGpu(0));
  EXPECT_LE(info.total_bytes - info.free_bytes, o.gpu_memory_limit);
}

// The GPU-assisted optimizer (state streamed through the GPU, the fused Adam
// there) gives the CPU Adam's bits: losses and parameters, with it taking
// every shard or sharing them with the CPU worker, chunks small and ragged.
TEST(TrainerGpu, GpuAssistedOptimizerGivesTheCpuAdamsBits) {
  STRATA_SKIP_WITHOUT_GPU();
  for (bool bf16 : {true, false}) {
    TrainOptions cpu = TinyGpu(4, bf16);
    cpu.config.zero.offload_optimizer.device = "cpu";
    cpu.config.trainer.gpu_assisted_optimizer = "off";
    const std::vector<std::string> names = {"transformer.wte.weight", "transformer.h.2.attn.c_attn.weight",
                                            "transformer.ln_f.weight"};
    std::vector<double> a;
    std::vector<std::vector<float>> params;
    {  // one trainer on the device at a time: each counts the other's memory against its limit
      std::ostringstream log0;
      ASSERT_OK_AND_ASSIGN(auto t0, Trainer::Create(cpu, log0));
      for (int i = 0; i < 4; ++i) {
        ASSERT_OK_AND_ASSIGN(StepReport r, t0->Step());
        a.push_back(r.loss);
      }
      for (const std::string& n : names) {
        ASSERT_OK_AND_ASSIGN(std::vector<float> y, t0->Parameter(n));
        params.push_back(y);
      }
    }
    for (bool all : {true, false}) {
      TrainOptions o = cpu;
      o.config.trainer.gpu_assisted_optimizer = "auto";
      o.assist_chunk_params = 100003;
      o.assist_takes_all = all;
      std::ostringstream log;
      ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
      ASSERT_NE(log.str().find("GPU-assisted streaming"), std::string::npos) << log.str();
      double share = 0;
      for (int i = 0; i < 4; ++i) {
        ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
        EXPECT_EQ(r.loss, a[static_cast<size_t>(i)]) << "step " << i + 1 << (bf16 ? " bf16" : " fp32")
                                                      << (all ? " (all on the GPU)" : "");
        share = r.optimizer_gpu_share;
      }
      if (all) {
        EXPECT_EQ(share, 1.0);
      }
      for (size_t k = 0; k < names.size(); ++k) {
        ASSERT_OK_AND_ASSIGN(std::vector<float> x, t->Parameter(names[k]));
        EXPECT_EQ(x, params[k]) << names[k] << (bf16 ? " bf16" : " fp32");
      }
    }
  }
}

// offload_optimizer.ratio on the CUDA backend: the GPU-state prefix
// (embedding and block 0 at ratio 0.5; everything at 0) is updated by the
// fused GPU Adam, the rest by the CPU Adam (with and without the
// GPU-assisted worker), and the losses and parameters are the all-CPU-Adam
// run's bits (optim/gpu_adam.h: the GPU Adam computes the CPU Adam's bits).
TEST(TrainerGpu, OffloadRatioGivesTheCpuAdamsBits) {
  STRATA_SKIP_WITHOUT_GPU();
  const std::vector<std::string> names = {"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
                                          "transformer.h.2.mlp.c_fc.weight", "transformer.ln_f.weight"};
  for (bool bf16 : {true, false}) {
    auto run = [&](double ratio, const std::string& assist, std::vector<double>* losses,
                   std::vector<std::vector<float>>* params, int64_t* gpu_shards) {
      TrainOptions o = TinyGpu(4, bf16);
      o.config.zero.offload_optimizer.device = "cpu";
      o.config.zero.offload_optimizer.ratio = ratio;
      o.config.trainer.gpu_assisted_optimizer = assist;
      o.config.gradient_clipping = 0.5;
      std::ostringstream log;
      ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
      for (int i = 0; i < 4; ++i) {
        ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
        losses->push_back(r.loss);
      }
      for (const std::string& n : names) {
        ASSERT_OK_AND_ASSIGN(std::vector<float> y, t->Parameter(n));
        params->push_back(y);
      }
      *gpu_shards = t->Info().optimizer_gpu_shards;
      ASSERT_OK_AND_ASSIGN(GpuInfo info, QueryGpu(0));
      EXPECT_LE(info.total_bytes - info.free_bytes, o.gpu_memory_limit);
    };
    // One trainer on the device at a time (each counts the other's memory).
    std::vector<double> a;
    std::vector<std::vector<float>> pa;
    int64_t shards = -1;
    run(1.0, "off", &a, &pa, &shards);
    ASSERT_EQ(a.size(), 4u);
    EXPECT_EQ(shards, 0);
    struct Case {
      double ratio;
      const char* assist;
      int64_t gpu_shards;
    };
    for (const Case& c : {Case{0.5, "off", 2}, Case{0.5, "auto", 2}, Case{0.0, "auto", 5}}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + ", ratio " + std::to_string(c.ratio) + ", assist " +
                   c.assist);
      std::vector<double> b;
      std::vector<std::vector<float>> pb;
      run(c.ratio, c.assist, &b, &pb, &shards);
      EXPECT_EQ(shards, c.gpu_shards);
      ASSERT_EQ(b.size(), a.size());
      for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
      ASSERT_EQ(pb.size(), pa.size());
      for (size_t k = 0; k < pa.size(); ++k) EXPECT_EQ(pa[k], pb[k]) << names[k];
    }
  }
}

// Micro-batch-major gives layer-major's losses on the CUDA backend too: the
// first step's bits exactly, later ones within the embedding gradient's
// summation order (bf16 here, where that disappears in the rounding).
TEST(TrainerGpu, MicroBatchMajorGivesTheLayerMajorLosses) {
  STRATA_SKIP_WITHOUT_GPU();
  TrainOptions lm = TinyGpu(3, true);
  lm.config.zero.offload_optimizer.device = "cpu";
  auto a = TrainLosses(lm, 3);
  TrainOptions mb = lm;
  mb.config.trainer.schedule = "micro-batch-major";
  auto b = TrainLosses(mb, 3);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(a[0], b[0]);
  for (size_t i = 1; i < 3; ++i) EXPECT_NEAR(a[i], b[i], 1e-3 * std::abs(a[i])) << "step " << i + 1;
}

}  // namespace
}  // namespace strata
