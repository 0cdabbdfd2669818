// SPDX-License-Identifier: Apache-2.0
// zero_optimization.offload_optimizer.ratio on the CPU backend (the GPU tier
// is a host stand-in, so "GPU-state" shards run here: the GPU Adam's place is
// taken by the CPU Adam on the stand-in's memory). A forward-order prefix of
// the shards keeps optimizer state, gradients and parameters on the GPU; the
// rest is offloaded. Whatever the ratio, the losses and the parameters are
// the all-offloaded run's, bit for bit: the same CPU Adam computes every
// shard here (on CUDA the fused GPU Adam gives the CPU Adam's bits by
// contract, optim/gpu_adam.h; tests/engine/trainer_gpu_test.cc checks it).
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "engine/config.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

// 4 blocks of d 64: embedding (256 + 32) x 64 = 18432 parameters, blocks
// 49984 each, ln_f 128; 218496 in all. Ratio 0.5 keeps the embedding and
// block 0 (68416 <= 109248; with block 1, 118400, it would not fit).
constexpr uint64_t kEmb = 18432, kBlock = 49984, kLnF = 128, kAll = kEmb + 4 * kBlock + kLnF;

TrainOptions Small(int64_t steps, double ratio) {
  TrainOptions o = testing::TinyTrainer(4);
  Config& c = o.config;
  c.optimizer.weight_decay = 0.1;
  c.gradient_clipping = 0.5;  // active: the clip coefficient comes from both kinds of shards' gradients
  c.zero.offload_optimizer.device = "cpu";
  c.zero.offload_optimizer.ratio = ratio;
  o.steps = steps;
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.gpu_memory_limit = 64 * kMiB;
  o.host_memory_limit = 64 * kMiB;
  return o;
}

const std::vector<std::string>& Names() {
  static const std::vector<std::string> n = {"transformer.wte.weight", "transformer.wpe.weight",
                                             "transformer.h.0.attn.c_attn.weight", "transformer.h.0.ln_2.bias",
                                             "transformer.h.1.mlp.c_fc.weight", "transformer.h.3.mlp.c_proj.bias",
                                             "transformer.ln_f.weight"};
  return n;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<bool> skipped;
  std::vector<double> norms;
  std::vector<std::vector<float>> params;  // Names(), after the last step
  std::string plan, log;
  TrainerInfo info;
  std::vector<StepReport> reports;
};

Outcome Train(const TrainOptions& o, int64_t steps) {
  Outcome out;
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return out;
  out.plan = (*t)->PlanTable();
  for (int64_t i = 0; i < steps; ++i) {
    auto r = (*t)->Step();
    EXPECT_OK(r.status());
    if (!r.ok()) return out;
    out.losses.push_back(r->loss);
    out.skipped.push_back(r->skipped);
    out.norms.push_back(r->grad_norm);
    out.reports.push_back(*r);
  }
  for (const std::string& n : Names()) {
    auto p = (*t)->Parameter(n);
    EXPECT_OK(p.status());
    out.params.push_back(p.ok() ? *p : std::vector<float>{});
  }
  out.info = (*t)->Info();
  out.log = log.str();
  return out;
}

void ExpectSameBits(const Outcome& a, const Outcome& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
    EXPECT_EQ(a.norms[i], b.norms[i]) << "step " << i + 1;
    EXPECT_EQ(a.skipped[i], b.skipped[i]) << "step " << i + 1;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t k = 0; k < a.params.size(); ++k) EXPECT_EQ(a.params[k], b.params[k]) << Names()[k];
}

// fp32 and bf16, layer-major and micro-batch-major: ratio 0.5 and 0 give the
// ratio-1 (all on the host) run's bits.
TEST(TrainerRatio, AnyRatioGivesTheAllCpuBits) {
  for (const char* precision : {"fp32", "bf16"})
    for (const char* schedule : {"layer-major", "micro-batch-major"}) {
      const std::string what = std::string(precision) + ", " + schedule;
      SCOPED_TRACE(what);
      auto opts = [&](double ratio) {
        TrainOptions o = Small(3, ratio);
        o.config.bf16 = std::string(precision) == "bf16";
        o.config.trainer.schedule = schedule;
        return o;
      };
      const Outcome whole = Train(opts(1.0), 3);
      ASSERT_EQ(whole.losses.size(), 3u);
      EXPECT_EQ(whole.info.optimizer_gpu_shards, 0);
      EXPECT_LT(whole.losses.back(), whole.losses.front());
      const Outcome half = Train(opts(0.5), 3);
      EXPECT_EQ(half.info.optimizer_gpu_shards, 2);
      EXPECT_EQ(half.info.optimizer_gpu_params, kEmb + kBlock);
      EXPECT_THAT(half.plan, HasSubstr("optimizer: first 2 of 6 shards (68416 params, 31.3%) on the GPU"));
      ExpectSameBits(whole, half, what + ", ratio 0.5");
      const Outcome all = Train(opts(0.0), 3);
      EXPECT_EQ(all.info.optimizer_gpu_shards, 6);
      EXPECT_THAT(all.plan, HasSubstr("all 6 shards (218496 params) on the GPU"));
      ExpectSameBits(whole, all, what + ", ratio 0");
    }
}

// The per-step PCIe bytes (exact on the stand-in) lose what the GPU-state
// shards no longer move: their gradients down, their parameters up.
TEST(TrainerRatio, GpuStateShardsCrossNoLinkForTheOptimizer) {
  const Outcome whole = Train(Small(3, 1.0), 3);
  const Outcome half = Train(Small(3, 0.5), 3);
  ASSERT_EQ(whole.reports.size(), 3u);
  ASSERT_EQ(half.reports.size(), 3u);
  const uint64_t gpuN = kEmb + kBlock;
  // Step 1 has no update to upload yet; steps 2 and 3 carry the previous update.
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(whole.reports[i].d2h, kAll * 4) << "step " << i + 1 << "\n" << whole.plan;
    EXPECT_EQ(whole.reports[i].h2d, kAll * 4) << "step " << i + 1;
    EXPECT_EQ(half.reports[i].d2h, (kAll - gpuN) * 4) << "step " << i + 1 << "\n" << half.plan;
    EXPECT_EQ(half.reports[i].h2d, (kAll - gpuN) * 4) << "step " << i + 1;
  }
  EXPECT_THAT(half.plan, HasSubstr("per step (scheduled): H2D 586 KiB, D2H 586 KiB"));
}

// The GPU-assisted optimizer streams only the host-state shards; the
// GPU-state ones are updated in place by whichever worker claims them.
TEST(TrainerRatio, WithTheGpuAssistedOptimizer) {
  const Outcome whole = Train(Small(3, 1.0), 3);
  for (bool takes_all : {true, false}) {
    SCOPED_TRACE(takes_all ? "the assist takes every shard" : "shared");
    TrainOptions o = Small(3, 0.5);
    o.config.trainer.gpu_assisted_optimizer = "on";
    o.assist_chunk_params = 1000;  // many chunks, a ragged last one
    o.assist_takes_all = takes_all;
    const Outcome r = Train(o, 3);
    EXPECT_THAT(r.log, HasSubstr("GPU-assisted streaming"));
    ExpectSameBits(whole, r, "assisted, ratio 0.5");
    ASSERT_EQ(r.reports.size(), 3u);
    if (takes_all) {
      EXPECT_EQ(r.reports.back().optimizer_gpu_share, 1.0);
    }
  }
  // Ratio 0: nothing left to stream.
  TrainOptions o = Small(1, 0.0);
  o.config.trainer.gpu_assisted_optimizer = "on";
  const Outcome r = Train(o, 1);
  EXPECT_THAT(r.log, HasSubstr("gpu-assisted optimizer: off (every shard's optimizer state is on the GPU)"));
}

// Offloaded to NVMe: the prefix stays on the GPU, the rest goes to the
// disk (pipelined reads and writes), with the same bits.
TEST(TrainerRatio, RestOnNvme) {
  TempDir nvme_a, nvme_b;
  auto opts = [&](double ratio, const std::string& dir) {
    TrainOptions o = Small(3, ratio);
    auto& oo = o.config.zero.offload_optimizer;
    oo.device = "nvme";
    oo.nvme_path = dir;
    oo.pipeline_read = oo.pipeline_write = true;
    o.host_memory_limit = 256 * kMiB;  // the NVMe tier's buffers come from it
    return o;
  };
  const Outcome whole = Train(Small(3, 1.0), 3);
  const Outcome disk = Train(opts(1.0, nvme_a.path()), 3);
  const Outcome half = Train(opts(0.5, nvme_b.path()), 3);
  ExpectSameBits(whole, disk, "nvme, ratio 1");
  ExpectSameBits(whole, half, "nvme, ratio 0.5");
  EXPECT_THAT(half.plan, HasSubstr("the rest on the nvme (CPU Adam)"));
  ASSERT_EQ(half.reports.size(), 3u);
  ASSERT_EQ(disk.reports.size(), 3u);
  // Steps 2 and 3 read the offloaded state of the previous update: less of
  // it with the prefix on the GPU.
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_GT(half.reports[i].nvme_read, 0u);
    EXPECT_LT(half.reports[i].nvme_read, disk.reports[i].nvme_read);
  }
}

// A tight GPU budget: the blocks' parameters stream from the host, the
// bf16 gradients and the checkpoints live there, but the prefix (embedding
// and block 0 at ratio 0.8) keeps parameters, gradients (and, micro-batch-
// major, its fp32 accumulator) and state on the GPU. Same bits; each step
// moves exactly the schedule's bytes, with no reload the prefetcher did not plan.
TEST(TrainerRatio, StreamedParametersAndHostGradients) {
  for (const char* schedule : {"layer-major", "micro-batch-major"}) {
    SCOPED_TRACE(schedule);
    auto opts = [&](double ratio) {
      TrainOptions o = Small(3, ratio);
      o.config.model.n_layer = 8;
      o.config.bf16 = true;
      o.config.trainer.schedule = schedule;
      o.config.zero.offload_param.device = "cpu";
      o.config.activation_checkpointing.cpu_checkpointing = true;
      // (Micro-batch-major keeps the prefix block's fp32 accumulator too.)
      o.gpu_memory_limit = (std::string(schedule) == "layer-major" ? 3000 : 3200) * kKiB;
      return o;
    };
    const Outcome whole = Train(opts(1.0), 3);
    const Outcome part = Train(opts(0.8), 3);
    ExpectSameBits(whole, part, std::string("streamed, ratio 0.8, ") + schedule);
    EXPECT_THAT(part.plan, AllOf(HasSubstr("gradients (bf16 on the host)"), HasSubstr("prefetch depth: 1"),
                                 HasSubstr("first 2 of 10 shards (68416 params, 16.4%) on the GPU")));
    EXPECT_EQ(part.info.optimizer_gpu_shards, 2);
    ASSERT_EQ(part.reports.size(), 3u);
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(opts(0.8), log));
    const Plan plan = t->plan();
    const ScheduledTraffic traffic = t->traffic();
    EXPECT_FALSE(plan.params_resident);
    EXPECT_EQ(plan.grads, TierKind::kHost);
    for (size_t i = 1; i < 3; ++i) {
      EXPECT_EQ(part.reports[i].h2d, traffic.h2d) << "step " << i + 1 << "\n" << part.plan;
      EXPECT_EQ(part.reports[i].d2h, traffic.d2h) << "step " << i + 1;
    }
    EXPECT_EQ(part.info.swap_forced, 0u);
    EXPECT_EQ(part.info.gpu_evictions, part.info.swap_evictions);
  }
}

// fp16 with a loss scale that overflows at first: the overflow check spans
// both kinds of shards, and a skipped step touches neither.
TEST(TrainerRatio, Fp16OverflowSkipsEveryShard) {
  auto opts = [](double ratio) {
    TrainOptions o = Small(4, ratio);
    o.config.fp16.enabled = true;
    o.config.fp16.initial_scale_power = 30;
    o.config.fp16.hysteresis = 1;
    return o;
  };
  const Outcome whole = Train(opts(1.0), 4);
  const Outcome half = Train(opts(0.5), 4);
  ASSERT_EQ(whole.skipped.size(), 4u);
  EXPECT_TRUE(whole.skipped.front());
  ExpectSameBits(whole, half, "fp16, ratio 0.5");
}

// Save/resume with ratio 0.5 is bit-identical, and a checkpoint does not
// depend on the placement: one saved at ratio 1 resumes at 0.5 and back.
TEST(TrainerRatio, SaveResumeIsBitIdentical) {
  const Outcome straight = Train(Small(6, 0.5), 6);
  ASSERT_EQ(straight.losses.size(), 6u);
  for (double saved_at : {0.5, 1.0}) {
    SCOPED_TRACE(saved_at);
    TempDir dir;
    std::ostringstream log;
    {
      ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(Small(3, saved_at), log));
      for (int i = 0; i < 3; ++i) ASSERT_OK(t->Step().status());
      ASSERT_OK(t->Save(dir.path()));
    }
    for (double resumed_at : {0.5, 1.0}) {
      SCOPED_TRACE(resumed_at);
      TrainOptions r = Small(6, resumed_at);
      r.resume_dir = dir.path();
      ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(r, log));
      ASSERT_EQ(t->step(), 3);
      for (int i = 3; i < 6; ++i) {
        ASSERT_OK_AND_ASSIGN(StepReport rep, t->Step());
        EXPECT_EQ(rep.loss, straight.losses[static_cast<size_t>(i)]) << "step " << i + 1;
      }
      for (size_t k = 0; k < Names().size(); ++k) {
        ASSERT_OK_AND_ASSIGN(std::vector<float> p, t->Parameter(Names()[k]));
        EXPECT_EQ(p, straight.params[k]) << Names()[k];
      }
    }
  }
}

TEST(TrainerRatio, DryRunShowsTheSplit) {
  TrainOptions o = Small(1, 0.5);
  ASSERT_OK_AND_ASSIGN(std::string table, Trainer::DryRun(o));
  EXPECT_THAT(table, HasSubstr("optimizer: first 2 of 6 shards (68416 params, 31.3%) on the GPU "
                               "(offload_optimizer.ratio 0.5, GPU Adam), the rest on the host (CPU Adam)"));
  // The optimizer row: 68416 x 12 B on the GPU, 150080 x 12 B on the host.
  EXPECT_THAT(table, ContainsRegex("optimizer \\(fp32 master, m, v\\) +802 KiB +1\\.72 MiB"));
}

// A GPU budget that holds the plan with the optimizer offloaded but not with
// the state the ratio keeps on the GPU: the error says the ratio is why.
TEST(TrainerRatio, RatioThatOverfillsTheGpuIsAClearError) {
  TrainOptions o = Small(1, 1.0);
  o.gpu_memory_limit = 3 * kMiB;
  ASSERT_OK(Trainer::DryRun(o).status());
  o.config.zero.offload_optimizer.ratio = 0.0;
  auto d = Trainer::DryRun(o);
  EXPECT_THAT(d, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_THAT(d.status().ToString(),
              AllOf(HasSubstr("with zero_optimization.offload_optimizer.ratio 0"),
                    HasSubstr("raise zero_optimization.offload_optimizer.ratio or --gpu-memory-limit")));
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_THAT(t, StatusIs(StatusCode::kOutOfMemory));
}

// The config rule: a ratio < 1 needs an offload device; 0 and 1 are allowed.
TEST(TrainerRatio, ConfigRules) {
  auto parse = [](const nlohmann::json& zero) {
    nlohmann::json j = {{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 1},
                        {"zero_optimization", zero}};
    std::vector<std::string> warnings;
    return ParseConfig(j, "ds.json", 1, &warnings);
  };
  auto r = parse({{"stage", 3}, {"offload_optimizer", {{"ratio", 0.3}}}});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().ToString(),
              AllOf(HasSubstr("ds.json: zero_optimization.offload_optimizer.ratio: 0.3 needs"),
                    HasSubstr("\"cpu\" or \"nvme\"")));
  r = parse({{"offload_optimizer", {{"device", "none"}, {"ratio", 0.3}}}});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  r = parse({{"offload_optimizer", {{"device", "cpu"}, {"ratio", 1.5}}}});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().ToString(), HasSubstr("[0, 1]"));
  ASSERT_OK_AND_ASSIGN(Config zero, parse({{"offload_optimizer", {{"device", "cpu"}, {"ratio", 0}}}}));
  EXPECT_EQ(zero.zero.offload_optimizer.ratio, 0.0);
  ASSERT_OK_AND_ASSIGN(Config legacy, parse({{"cpu_offload", true}, {"offload_optimizer", {{"ratio", 0.3}}}}));
  EXPECT_EQ(legacy.zero.offload_optimizer.device, "cpu");
  EXPECT_EQ(legacy.zero.offload_optimizer.ratio, 0.3);
  ASSERT_OK_AND_ASSIGN(Config plain, parse({{"offload_optimizer", {{"ratio", 1.0}}}}));
  EXPECT_EQ(plain.zero.offload_optimizer.device, "none");
  // The effective config (what checkpoints record) reads back the same.
  std::vector<std::string> warnings;
  ASSERT_OK_AND_ASSIGN(Config back, ParseConfig(ConfigToJson(legacy), "back", 1, &warnings));
  EXPECT_EQ(back.zero.offload_optimizer.ratio, 0.3);
}

}  // namespace
}  // namespace strata
