// SPDX-License-Identifier: Apache-2.0
// The speculative update on the CUDA backend, where its ordering is real:
// speculated parameters go up on the H2D stream (or are written by the
// GPU-assisted worker's Adam on the D2H stream) while the backward runs, a
// miss has either worker redo a shard either one speculated, and a failed
// step restores the parameters it wrote. Same bits as the post-backward
// update whether every step commits (a threshold never reached) or every
// step misses (speculating at every step with one always exceeded).
#include <functional>
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

using ::strata::testing::ExpectSameBits;
using ::strata::testing::Outcome;
using ::strata::testing::Parameters;
using ::strata::testing::StatusIs;
using ::strata::testing::Train;
using ::testing::HasSubstr;

TrainOptions TinyGpu(double clip) { return testing::TinyGpuTrainer(/*bf16=*/true, clip); }

TEST(TrainerSpeculativeGpu, SameBitsAsAfterBackward) {
  STRATA_SKIP_WITHOUT_GPU();
  // What each case changes (the rest: bf16, accumulation 1, layer-major,
  // the GPU-assisted worker "auto").
  struct Case {
    const char* what;
    std::function<void(Config&)> set;
  };
  const Case cases[] = {
      {"assist auto", [](Config&) {}},
      {"assist off", [](Config& c) { c.trainer.gpu_assisted_optimizer = "off"; }},
      {"accumulation 3, micro-batch-major",
       [](Config& c) {
         c.grad_accum = 3;
         c.train_batch_size = c.micro_batch * 3;
         c.trainer.schedule = "micro-batch-major";
       }},
      {"ratio 0.5", [](Config& c) { c.zero.offload_optimizer.ratio = 0.5; }},
  };
  struct Threshold {
    double clip;
    bool every_step;
    Speculation want;  // every step after the first (every step when forced)
  };
  const Threshold thresholds[] = {{100.0, false, Speculation::kCommitted}, {1e-3, true, Speculation::kMissed}};
  for (const Case& c : cases)
    for (const Threshold& th : thresholds) {
      SCOPED_TRACE(std::string(c.what) + ", gradient_clipping " + std::to_string(th.clip));
      TrainOptions o = TinyGpu(th.clip);
      o.config.trainer.gpu_assisted_optimizer = "auto";
      c.set(o.config);
      o.speculate_every_step = th.every_step;
      // One trainer on the device at a time (each counts the other's memory).
      const Outcome s = Train(o, 4);
      o.optimizer_after_backward = true;
      const Outcome p = Train(o, 4);
      ASSERT_EQ(s.reports.size(), 4u) << s.plan;
      ASSERT_EQ(p.reports.size(), 4u) << p.plan;
      EXPECT_TRUE(s.info.optimizer_speculative) << s.info.optimizer_update;
      for (size_t i = th.every_step ? 0 : 1; i < 4; ++i)
        EXPECT_EQ(SpeculationName(s.reports[i].speculation), std::string(SpeculationName(th.want))) << "step " << i + 1;
      ExpectSameBits(s, p, /*same_bytes=*/false);
    }
}

// A NaN in block 1's gradient at a speculative step: the step fails, and the
// shards speculated before and after it (their parameters written on the
// GPU) hold the last step's parameters again; the error does not stick.
TEST(TrainerSpeculativeGpu, NonFiniteGradientLeavesTheStateUntouched) {
  STRATA_SKIP_WITHOUT_GPU();
  const std::vector<std::string> names = {"transformer.ln_f.weight", "transformer.h.2.mlp.c_fc.weight",
                                          "transformer.h.1.mlp.c_fc.weight", "transformer.wte.weight"};
  std::vector<double> vals;
  for (bool after : {false, true}) {
    SCOPED_TRACE(after ? "after backward" : "speculative");
    TrainOptions o = TinyGpu(100.0);
    o.optimizer_after_backward = after;
    o.inject_nonfinite_shard = "blk1";
    o.inject_nonfinite_step = 2;
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    ASSERT_EQ(t->Info().optimizer_speculative, !after);
    ASSERT_OK(t->Step().status());
    const std::vector<std::vector<float>> before = Parameters(*t, names);
    auto r = t->Step();
    EXPECT_THAT(r, StatusIs(StatusCode::kFailedPrecondition));
    EXPECT_THAT(r.status().ToString(), HasSubstr("non-finite gradients at step 2"));
    const std::vector<std::vector<float>> now = Parameters(*t, names);
    for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(now[i], before[i]) << names[i] << " was updated";
    ASSERT_OK_AND_ASSIGN(double val, t->Evaluate(1));
    vals.push_back(val);
    testing::TempDir ck;
    EXPECT_OK(t->Save(ck.path()));
  }
  EXPECT_EQ(vals[0], vals[1]) << "the speculated shards' parameters were not restored";
}

}  // namespace
}  // namespace strata
