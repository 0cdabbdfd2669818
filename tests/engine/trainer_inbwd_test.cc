// SPDX-License-Identifier: Apache-2.0
// The optimizer update during the backward (CPU backend: the GPU tier is a
// host stand-in, the copy engine a memcpy thread, so the same code paths run
// as on CUDA, with the CPU Adam in the GPU Adam's place). With no gradient
// clipping and no dynamic loss scale the offloaded shards are updated while
// the backward runs, each once its gradient is final; the result must be the
// post-backward update's, bit for bit: losses, norms, the per-step PCIe
// bytes, and the final master weights and moments (the checkpoint's files).
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "engine/config.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::ExpectSameBits;
using ::strata::testing::FileBytes;
using ::strata::testing::Outcome;
using ::strata::testing::Parameters;
using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::strata::testing::Train;
using ::testing::HasSubstr;

enum class Placement {
  kHost,          // optimizer state on the host, parameters and gradients on the GPU (staged)
  kHostStreamed,  // ... with the parameters streamed and the gradients on the host (a tight GPU)
  kNvme,          // optimizer state on NVMe (pipelined), parameters streamed, gradients on the host
};

const char* Name(Placement p) {
  return p == Placement::kHost ? "host" : p == Placement::kHostStreamed ? "host, streamed" : "nvme";
}

struct Case {
  std::string precision = "fp32";  // fp32, bf16, fp16 (a static loss scale)
  std::string schedule = "layer-major";
  int64_t accum = 1;
  Placement placement = Placement::kHost;
  double ratio = 1.0;          // offload_optimizer.ratio
  std::string assist = "off";  // trainer.gpu_assisted_optimizer
  bool assist_takes_all = false;

  std::string What() const {
    return precision + ", " + schedule + ", accumulation " + std::to_string(accum) + ", " + Name(placement) +
           (ratio < 1 ? ", ratio " + std::to_string(ratio) : std::string()) +
           (assist == "on" ? (assist_takes_all ? ", gpu-assisted (all)" : ", gpu-assisted (shared)") : std::string());
  }
};

// Two blocks of d 64, 4 x 32 tokens per micro-batch, AdamW with weight
// decay, no gradient clipping.
TrainOptions Options(const Case& k, const std::string& nvme_dir, int64_t steps) {
  TrainOptions o = testing::TinyTrainer(2);
  Config& c = o.config;
  c.bf16 = k.precision == "bf16";
  if (k.precision == "fp16") {
    c.fp16.enabled = true;
    c.fp16.loss_scale = 128;
  }
  c.grad_accum = k.accum;
  c.train_batch_size = c.micro_batch * k.accum;
  c.trainer.schedule = k.schedule;
  c.trainer.gpu_assisted_optimizer = k.assist;
  c.optimizer.weight_decay = 0.1;
  c.gradient_clipping = 0;  // DeepSpeed's default (DefaultConfig has the CLI's 1.0)
  auto& oo = c.zero.offload_optimizer;
  oo.device = "cpu";
  oo.ratio = k.ratio;
  o.steps = steps;
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.gpu_memory_limit = 256 * kMiB;
  o.host_memory_limit = 256 * kMiB;
  o.assist_chunk_params = 1000;  // many chunks, a ragged last one
  o.host_piece_params = 1000;    // the CPU worker's pieces too
  o.assist_takes_all = k.assist_takes_all;
  if (k.placement != Placement::kHost) {
    c.zero.offload_param.device = "cpu";
    c.activation_checkpointing.cpu_checkpointing = true;
    // (A GPU-state prefix needs room for its state too.)
    o.gpu_memory_limit = ((k.precision == "bf16" ? 2000 : 2600) + (k.ratio < 1 ? 512 : 0)) * kKiB;
  }
  if (k.placement == Placement::kNvme) {
    oo.device = "nvme";
    oo.nvme_path = nvme_dir;
    oo.pipeline_read = oo.pipeline_write = true;
  }
  return o;
}

// Streaming against the forced post-backward update, over 3 steps.
void ExpectStreamingMatches(const Case& k) {
  SCOPED_TRACE(k.What());
  TempDir nvme_a, nvme_b;
  TrainOptions during = Options(k, nvme_a.path(), 3);
  TrainOptions after = Options(k, nvme_b.path(), 3);
  after.optimizer_after_backward = true;
  const Outcome s = Train(during, 3);
  const Outcome p = Train(after, 3);
  ASSERT_EQ(s.reports.size(), 3u) << s.plan;
  ASSERT_EQ(p.reports.size(), 3u) << p.plan;
  EXPECT_TRUE(s.info.optimizer_during_backward) << s.info.optimizer_update;
  EXPECT_FALSE(p.info.optimizer_during_backward);
  EXPECT_THAT(p.info.optimizer_update, HasSubstr("after backward (asked for: --optimizer-after-backward)"));
  if (k.ratio == 1) {
    EXPECT_EQ(s.grads_on_host, k.placement != Placement::kHost) << s.plan;
  }
  if (k.assist == "on") {
    EXPECT_THAT(s.log, HasSubstr("GPU-assisted streaming"));
    if (k.assist_takes_all) {
      EXPECT_EQ(s.reports.back().optimizer_gpu_share, 1.0);
    }
  }
  // Shared between the two workers, which shards stream through the GPU
  // (and so the PCIe bytes) depends on their timing, in either mode.
  ExpectSameBits(s, p, /*same_bytes=*/k.assist != "on" || k.assist_takes_all);
  EXPECT_LT(s.reports.back().loss, s.reports.front().loss);
}

// The CPU worker's update in pieces (each updated as its gradient lands,
// its parameters uploaded at once) against whole shards: the same bits and
// the same bytes over every link.
TEST(TrainerInBackward, PiecesGiveTheWholeShardsBits) {
  for (const char* precision : {"fp32", "bf16"})
    for (Placement placement : {Placement::kHost, Placement::kHostStreamed, Placement::kNvme}) {
      Case k;
      k.precision = precision;
      k.placement = placement;
      SCOPED_TRACE(k.What());
      TempDir nvme_a, nvme_b;
      TrainOptions pieces = Options(k, nvme_a.path(), 3);
      TrainOptions whole = Options(k, nvme_b.path(), 3);
      pieces.host_piece_params = 999;  // a block's shard in tens of pieces, a ragged last one
      whole.host_piece_params = 1ull << 40;
      const Outcome a = Train(pieces, 3);
      const Outcome b = Train(whole, 3);
      ASSERT_EQ(a.reports.size(), 3u) << a.plan;
      ASSERT_EQ(b.reports.size(), 3u) << b.plan;
      ExpectSameBits(a, b, /*same_bytes=*/true);
    }
}

TEST(TrainerInBackward, SameBitsAsAfterBackward) {
  for (const char* precision : {"fp32", "bf16"})
    for (const char* schedule : {"layer-major", "micro-batch-major"})
      for (int64_t accum : {1, 3})
        for (Placement placement : {Placement::kHost, Placement::kHostStreamed, Placement::kNvme}) {
          Case k;
          k.precision = precision;
          k.schedule = schedule;
          k.accum = accum;
          k.placement = placement;
          ExpectStreamingMatches(k);
        }
}

TEST(TrainerInBackward, SameBitsWithAStaticFp16Scale) {
  for (int64_t accum : {1, 3}) {
    Case k;
    k.precision = "fp16";
    k.accum = accum;
    ExpectStreamingMatches(k);
  }
}

// offload_optimizer.ratio 0.5: the GPU-state prefix (embedding, block 0) is
// updated after the backward, the rest during it.
TEST(TrainerInBackward, SameBitsWithAGpuStatePrefix) {
  for (const char* schedule : {"layer-major", "micro-batch-major"})
    for (Placement placement : {Placement::kHost, Placement::kNvme}) {
      Case k;
      k.precision = "bf16";
      k.schedule = schedule;
      k.accum = 3;
      k.placement = placement;
      k.ratio = 0.5;
      ExpectStreamingMatches(k);
    }
}

// The GPU-assisted worker takes shards in the same order (here on the
// stand-in: the same chunk pipeline, the CPU Adam on the stand-in's memory).
TEST(TrainerInBackward, SameBitsWithTheGpuAssistedOptimizer) {
  for (const char* precision : {"fp32", "bf16"})
    for (bool all : {true, false}) {
      Case k;
      k.precision = precision;
      k.accum = 3;
      k.assist = "on";
      k.assist_takes_all = all;
      ExpectStreamingMatches(k);
    }
}

// Saved right after a step whose update runs during the backward (Save waits
// for it), resumed, continued: the uninterrupted run's bits.
TEST(TrainerInBackward, SaveResumeIsBitIdentical) {
  for (Placement placement : {Placement::kHost, Placement::kNvme}) {
    Case k;
    k.precision = "bf16";
    k.accum = 3;
    k.placement = placement;
    k.ratio = placement == Placement::kHost ? 0.5 : 1.0;
    SCOPED_TRACE(k.What());
    TempDir nvme_a, nvme_b, nvme_c, dir;
    const Outcome straight = Train(Options(k, nvme_a.path(), 4), 4);
    ASSERT_EQ(straight.reports.size(), 4u);
    ASSERT_TRUE(straight.info.optimizer_during_backward);
    std::ostringstream log;
    {
      ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(Options(k, nvme_b.path(), 4), log));
      for (int i = 0; i < 2; ++i) ASSERT_OK(t->Step().status());
      ASSERT_OK(t->Save(dir.path()));
    }
    TrainOptions r = Options(k, nvme_c.path(), 4);
    r.resume_dir = dir.path();
    Outcome resumed;
    {
      ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(r, log));
      EXPECT_EQ(t->step(), 2);
      for (int i = 2; i < 4; ++i) {
        ASSERT_OK_AND_ASSIGN(StepReport rep, t->Step());
        EXPECT_EQ(rep.loss, straight.reports[static_cast<size_t>(i)].loss) << "step " << i + 1;
        EXPECT_EQ(rep.grad_norm, straight.reports[static_cast<size_t>(i)].grad_norm) << "step " << i + 1;
      }
      TempDir ck;
      ASSERT_OK(t->Save(ck.path()));
      resumed.model = FileBytes(ck.path() + "/step-000004/master.safetensors");
      resumed.optimizer = FileBytes(ck.path() + "/step-000004/optimizer.safetensors");
    }
    EXPECT_TRUE(resumed.model == straight.model) << "master weights differ";
    EXPECT_TRUE(resumed.optimizer == straight.optimizer) << "moments differ";
  }
}

// Which mode runs, and why: the log, the plan table, --dry-run and Info say it.
TEST(TrainerInBackward, TheModeAndItsReason) {
  struct Want {
    const char* what;
    std::function<void(TrainOptions&)> set;
    bool during;
    const char* line;
  };
  const std::vector<Want> wants = {
      {"bf16, no clipping", [](TrainOptions&) {}, true, "optimizer update: during backward (no clipping, bf16)"},
      {"fp32", [](TrainOptions& o) { o.config.bf16 = false; }, true,
       "optimizer update: during backward (no clipping, fp32)"},
      {"fp16, static scale",
       [](TrainOptions& o) {
         o.config.bf16 = false;
         o.config.fp16.enabled = true;
         o.config.fp16.loss_scale = 128;
       },
       true, "optimizer update: during backward (no clipping, fp16, static loss scale 128.0)"},
      {"clipping", [](TrainOptions& o) { o.config.gradient_clipping = 1.0; }, false,
       "optimizer update: during backward, speculative (gradient_clipping 1.0: updates assume the norm is within "
       "it and are redone when it is not)"},
      {"fp16, dynamic scale",
       [](TrainOptions& o) {
         o.config.bf16 = false;
         o.config.fp16.enabled = true;
       },
       false, "optimizer update: after backward (fp16's dynamic loss scale skips the step on overflow)"},
      {"forced", [](TrainOptions& o) { o.optimizer_after_backward = true; }, false,
       "optimizer update: after backward (asked for: --optimizer-after-backward)"},
      {"state on the GPU", [](TrainOptions& o) { o.config.zero.offload_optimizer.device = "none"; }, false,
       "optimizer update: after backward (the optimizer state is on the GPU)"},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.what);
    Case k;
    k.precision = "bf16";
    TrainOptions o = Options(k, "", 2);
    w.set(o);
    ASSERT_OK_AND_ASSIGN(std::string dry, Trainer::DryRun(o));
    EXPECT_THAT(dry, HasSubstr(w.line));
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    EXPECT_THAT(t->PlanTable(), HasSubstr(w.line));
    EXPECT_THAT(t->PlanTable(), HasSubstr(w.line));
    const TrainerInfo info = t->Info();
    EXPECT_EQ(info.optimizer_during_backward, w.during);
    EXPECT_THAT(w.line, HasSubstr(info.optimizer_update));
    // Two steps in the mode (the dynamic scale's first steps may overflow and be skipped).
    for (int i = 0; i < 2; ++i) ASSERT_OK(t->Step().status());
    ASSERT_OK(t->Evaluate(1).status());
  }
}

// A non-finite gradient while the update runs during the backward: the shard
// whose gradient holds it is never updated, the shards claimed before it
// (ln_f, block 1: the backward's order) are, the error names the step and
// says the state may be partly updated, and it sticks: no later step, and no
// checkpoint of that state. After the backward the same fault leaves every
// shard untouched and the trainer usable.
TEST(TrainerInBackward, NonFiniteGradientIsNeverApplied) {
  const std::vector<std::string> names = {"transformer.ln_f.weight", "transformer.h.1.mlp.c_fc.weight",
                                          "transformer.h.0.attn.c_attn.weight", "transformer.wte.weight"};
  Case k;
  k.precision = "bf16";
  for (bool during : {true, false}) {
    SCOPED_TRACE(during ? "during backward" : "after backward");
    TrainOptions o = Options(k, "", 3);
    o.optimizer_after_backward = !during;
    o.inject_nonfinite_shard = "blk0";
    o.inject_nonfinite_step = 2;
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    ASSERT_EQ(t->Info().optimizer_during_backward, during);
    ASSERT_OK(t->Step().status());
    const std::vector<std::vector<float>> before = Parameters(*t, names);
    auto r = t->Step();
    EXPECT_THAT(r, StatusIs(StatusCode::kFailedPrecondition));
    EXPECT_THAT(r.status().ToString(), HasSubstr("non-finite gradients at step 2"));
    const std::vector<std::vector<float>> now = Parameters(*t, names);
    EXPECT_EQ(now[2], before[2]) << "block 0 (the non-finite gradient) was updated";
    EXPECT_EQ(now[3], before[3]) << "the embedding (after block 0) was updated";
    TempDir ck;
    if (during) {
      EXPECT_THAT(r.status().ToString(), HasSubstr("partly updated"));
      EXPECT_THAT(r.status().ToString(), HasSubstr("resume from the last checkpoint"));
      EXPECT_NE(now[0], before[0]) << "ln_f, claimed first, holds step 2's update";
      EXPECT_NE(now[1], before[1]) << "block 1, claimed second, holds step 2's update";
      // Sticky: the worker's own report names the shard.
      auto again = t->Step();
      EXPECT_THAT(again, StatusIs(StatusCode::kFailedPrecondition));
      EXPECT_THAT(again.status().ToString(), HasSubstr("blk0, which was not updated"));
      EXPECT_THAT(t->Save(ck.path()), StatusIs(StatusCode::kFailedPrecondition));
      EXPECT_FALSE(std::filesystem::exists(ck.path() + "/latest"));
      EXPECT_THAT(t->Evaluate(1), StatusIs(StatusCode::kFailedPrecondition));
    } else {
      EXPECT_EQ(now[0], before[0]);
      EXPECT_EQ(now[1], before[1]);
      ASSERT_OK(t->Save(ck.path()));
      EXPECT_TRUE(std::filesystem::exists(ck.path() + "/step-000001/master.safetensors"));
    }
  }
}

}  // namespace
}  // namespace strata
