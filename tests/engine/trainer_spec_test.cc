// SPDX-License-Identifier: Apache-2.0
// The speculative update (engine/trainer.h): with gradient clipping the
// offloaded shards are updated during the backward into a second master/m/v
// on the assumption that the clip coefficient will be 1, committed (the sets
// swap) when it is, redone from the untouched state when it is not. CPU
// backend (the GPU tier a host stand-in, the copy engine a memcpy thread:
// the code paths of CUDA). Whatever happens, the result must be the
// post-backward update's, bit for bit: losses, norms, the final master
// weights and moments (the checkpoint), the parameters (the validation loss).
//
// The tiny model's global norms over its first steps are about 3.1, 2.1,
// 2.0, 2.0, 2.1, 1.8, 1.7, 1.5: a threshold of 100 never clips, 0.5 always
// does, 2.5 clips the first step only.
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "engine/config.h"
#include "engine/planner.h"
#include "engine/trainer.h"
#include "optim/grad_clip.h"
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

constexpr double kNeverClips = 100, kAlwaysClips = 0.5, kClipsFirst = 2.5;
constexpr char kSpeculativeLine[] =
    "optimizer update: during backward, speculative (gradient_clipping 1.0: updates assume the norm is within it "
    "and are redone when it is not)";

struct Case {
  std::string precision = "bf16";  // fp32 or bf16
  std::string schedule = "layer-major";
  int64_t accum = 1;
  bool streamed = false;       // parameters streamed, gradients on the host (a tight GPU)
  double ratio = 1.0;          // offload_optimizer.ratio
  std::string assist = "off";  // trainer.gpu_assisted_optimizer
  bool assist_takes_all = false;

  std::string What() const {
    return precision + ", " + schedule + ", accumulation " + std::to_string(accum) +
           (streamed ? ", streamed" : ", resident") + (ratio < 1 ? ", ratio " + std::to_string(ratio) : "") +
           (assist == "on" ? (assist_takes_all ? ", gpu-assisted (all)" : ", gpu-assisted (shared)") : "");
  }
};

// Two blocks of d 64, AdamW with weight decay, the optimizer state on the
// host, gradient clipping at `clip`.
TrainOptions Options(const Case& k, double clip) {
  TrainOptions o = testing::TinyTrainer(2);
  Config& c = o.config;
  c.bf16 = k.precision == "bf16";
  c.grad_accum = k.accum;
  c.train_batch_size = c.micro_batch * k.accum;
  c.trainer.schedule = k.schedule;
  c.trainer.gpu_assisted_optimizer = k.assist;
  c.optimizer.weight_decay = 0.1;
  c.gradient_clipping = clip;
  c.zero.offload_optimizer.device = "cpu";
  c.zero.offload_optimizer.ratio = k.ratio;
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.host_memory_limit = 256 * kMiB;
  o.gpu_memory_limit = 256 * kMiB;
  if (k.streamed) {
    c.zero.offload_param.device = "cpu";
    c.activation_checkpointing.cpu_checkpointing = true;
    o.gpu_memory_limit = ((c.bf16 ? 2000 : 2600) + (k.ratio < 1 ? 512 : 0)) * kKiB;
  }
  o.assist_chunk_params = 1000;  // many chunks, a ragged last one
  o.assist_takes_all = k.assist_takes_all;
  return o;
}

TrainOptions After(TrainOptions o) {
  o.optimizer_after_backward = true;
  return o;
}

std::vector<Speculation> Speculations(const Outcome& o) {
  std::vector<Speculation> v;
  for (const StepReport& r : o.reports) v.push_back(r.speculation);
  return v;
}

std::string Names(const std::vector<Speculation>& v) {
  std::string s;
  for (Speculation x : v) s += std::string(s.empty() ? "" : " ") + SpeculationName(x);
  return s;
}

// What each step should report given the run's norms (the post-backward
// run's, the same bits): a step speculates after one whose clip coefficient
// was exactly 1 (or every step, forced), and commits when its own is.
std::vector<Speculation> Expected(const Outcome& ref, double clip, bool every_step) {
  std::vector<Speculation> v;
  bool last_one = false;
  for (const StepReport& r : ref.reports) {
    const bool one = optim::ClipCoefficient(r.grad_norm, clip) == 1.0;
    const bool spec = every_step || last_one;
    v.push_back(!spec ? Speculation::kNone : one ? Speculation::kCommitted : Speculation::kMissed);
    last_one = one;
  }
  return v;
}

// The speculative run against the forced post-backward one, over `steps`.
// Returns the speculative run's reports' outcomes.
std::vector<Speculation> ExpectSpeculationMatches(const Case& k, double clip, bool every_step, int64_t steps = 3) {
  SCOPED_TRACE(k.What() + ", gradient_clipping " + std::to_string(clip) + (every_step ? ", every step" : ""));
  TrainOptions o = Options(k, clip);
  o.speculate_every_step = every_step;
  const Outcome s = Train(o, steps);
  const Outcome p = Train(After(o), steps);
  EXPECT_EQ(s.reports.size(), static_cast<size_t>(steps)) << s.plan;
  EXPECT_EQ(p.reports.size(), static_cast<size_t>(steps)) << p.plan;
  EXPECT_TRUE(s.info.optimizer_speculative) << s.info.optimizer_update;
  EXPECT_FALSE(s.info.optimizer_during_backward);
  EXPECT_GT(s.info.speculative_bytes, 0u);
  EXPECT_FALSE(p.info.optimizer_speculative);
  if (k.ratio == 1) {
    EXPECT_EQ(s.grads_on_host, k.streamed) << s.plan;
  }
  const std::vector<Speculation> got = Speculations(s);
  EXPECT_EQ(Names(got), Names(Expected(p, clip, every_step)));
  for (const StepReport& r : p.reports) EXPECT_EQ(r.speculation, Speculation::kNone);
  bool missed = false;
  for (Speculation x : got) missed |= x == Speculation::kMissed;
  // A miss redoes shards, and their parameters go up again; which shards the
  // GPU-assisted worker streams depends on the workers' timing.
  ExpectSameBits(s, p, /*same_bytes=*/!missed && (k.assist != "on" || k.assist_takes_all));
  EXPECT_LT(s.reports.back().loss, s.reports.front().loss);
  return got;
}

std::vector<Case> Matrix() {
  std::vector<Case> v;
  for (const char* precision : {"fp32", "bf16"})
    for (const char* schedule : {"layer-major", "micro-batch-major"})
      for (int64_t accum : {1, 3})
        for (bool streamed : {false, true})
          v.push_back(Case{.precision = precision, .schedule = schedule, .accum = accum, .streamed = streamed});
  return v;
}

// (a) The norm never exceeds the threshold: every step after the first
// speculates and commits.
TEST(TrainerSpeculative, NeverClippedCommitsEveryStepAfterTheFirst) {
  for (const Case& k : Matrix()) {
    const std::vector<Speculation> got = ExpectSpeculationMatches(k, kNeverClips, false);
    EXPECT_EQ(Names(got), "none committed committed");
  }
}

// (b) The norm always exceeds it: no step speculates (the first has no
// history, each later one follows a clipped step).
TEST(TrainerSpeculative, AlwaysClippedNeverSpeculates) {
  for (const Case& k : Matrix()) {
    // (Neither the placement nor the schedule plays a part when nothing speculates.)
    if (k.streamed || k.schedule != "layer-major") continue;
    const std::vector<Speculation> got = ExpectSpeculationMatches(k, kAlwaysClips, false);
    EXPECT_EQ(Names(got), "none none none");
  }
}

// (c) Speculating at every step (the test switch) with a threshold only the
// first step's norm exceeds: it misses and is redone, the others commit.
TEST(TrainerSpeculative, MissesAreRedoneToTheSameBits) {
  for (const Case& k : Matrix()) {
    const std::vector<Speculation> got = ExpectSpeculationMatches(k, kClipsFirst, true);
    EXPECT_EQ(got.front(), Speculation::kMissed) << Names(got);
    EXPECT_EQ(got.back(), Speculation::kCommitted) << Names(got);
  }
}

// The rule alone, where it leads to a miss: with a threshold of 2.05 the
// norms (2.04 at step 4, 2.10 at step 5 in this configuration) make step 4
// speculate and commit and step 5 speculate and miss.
TEST(TrainerSpeculative, TheRuleMissesWhereTheNormRisesAgain) {
  Case k;
  k.accum = 2;
  TrainOptions o = Options(k, 2.05);
  o.config.optimizer.weight_decay = 0;
  const Outcome s = Train(o, 6);
  const Outcome p = Train(After(o), 6);
  ASSERT_EQ(s.reports.size(), 6u);
  const std::vector<Speculation> want = Expected(p, 2.05, false);
  EXPECT_EQ(Names(Speculations(s)), Names(want));
  bool missed = false, committed = false;
  for (Speculation x : want) missed |= x == Speculation::kMissed, committed |= x == Speculation::kCommitted;
  EXPECT_TRUE(missed && committed) << "the norms changed (" << Names(want)
                                   << "): pick a threshold that the norm falls below and then exceeds";
  ExpectSameBits(s, p, false);
}

// offload_optimizer.ratio 0.5: the GPU-state prefix is updated after the
// backward with the true multiplier, the rest speculatively.
TEST(TrainerSpeculative, WithAGpuStatePrefix) {
  for (const char* schedule : {"layer-major", "micro-batch-major"})
    for (bool streamed : {false, true}) {
      const Case k{.schedule = schedule, .accum = 3, .streamed = streamed, .ratio = 0.5};
      ExpectSpeculationMatches(k, kNeverClips, false);
      ExpectSpeculationMatches(k, kClipsFirst, true);
    }
}

// The GPU-assisted worker (its CPU stand-in: the same chunk pipeline) writes
// its chunks back into the other set; after a miss either worker redoes a
// shard either one speculated.
TEST(TrainerSpeculative, WithTheGpuAssistedOptimizer) {
  for (const char* precision : {"fp32", "bf16"})
    for (bool all : {true, false}) {
      const Case k{.precision = precision, .accum = 3, .assist = "on", .assist_takes_all = all};
      ExpectSpeculationMatches(k, kNeverClips, false);
      ExpectSpeculationMatches(k, kClipsFirst, true);
    }
}

// Saved after committed speculative steps (Save waits for the update and
// reads the committed set), resumed, continued: the uninterrupted run's
// bits. The resumed trainer has no norm history: its first step does not
// speculate.
TEST(TrainerSpeculative, SaveResumeIsBitIdentical) {
  for (double ratio : {1.0, 0.5}) {
    Case k;
    k.accum = 3;
    k.ratio = ratio;
    SCOPED_TRACE(k.What());
    const Outcome straight = Train(Options(k, kNeverClips), 5);
    ASSERT_EQ(straight.reports.size(), 5u);
    EXPECT_EQ(Names(Speculations(straight)), "none committed committed committed committed");
    TempDir dir;
    std::ostringstream log;
    {
      ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(Options(k, kNeverClips), log));
      for (int i = 0; i < 3; ++i) ASSERT_OK(t->Step().status());
      ASSERT_OK(t->Save(dir.path()));
    }
    TrainOptions r = Options(k, kNeverClips);
    r.resume_dir = dir.path();
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(r, log));
    EXPECT_EQ(t->step(), 3);
    for (int i = 3; i < 5; ++i) {
      ASSERT_OK_AND_ASSIGN(StepReport rep, t->Step());
      EXPECT_EQ(rep.speculation, i == 3 ? Speculation::kNone : Speculation::kCommitted) << "step " << i + 1;
      EXPECT_EQ(rep.loss, straight.reports[static_cast<size_t>(i)].loss) << "step " << i + 1;
      EXPECT_EQ(rep.grad_norm, straight.reports[static_cast<size_t>(i)].grad_norm) << "step " << i + 1;
    }
    TempDir ck;
    ASSERT_OK(t->Save(ck.path()));
    EXPECT_TRUE(FileBytes(ck.path() + "/step-000005/master.safetensors") == straight.model) << "master weights differ";
    EXPECT_TRUE(FileBytes(ck.path() + "/step-000005/optimizer.safetensors") == straight.optimizer)
        << "moments differ";
    ASSERT_OK_AND_ASSIGN(double val, t->Evaluate(1));
    EXPECT_EQ(val, straight.val_loss);
  }
}

// The mode line, the plan's second set, and each reason not to speculate.
TEST(TrainerSpeculative, TheModeAndWhyNot) {
  Case k;
  {
    const TrainOptions o = Options(k, 1.0);
    ASSERT_OK_AND_ASSIGN(std::string dry, Trainer::DryRun(o));
    EXPECT_THAT(dry, HasSubstr(kSpeculativeLine));
    EXPECT_THAT(dry, HasSubstr("optimizer, second set (speculative update)"));
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    EXPECT_THAT(t->PlanTable(), HasSubstr(kSpeculativeLine));
    EXPECT_THAT(t->PlanTable(), HasSubstr("optimizer, second set (speculative update)"));
    const TrainerInfo info = t->Info();
    EXPECT_TRUE(info.optimizer_speculative);
    EXPECT_FALSE(info.optimizer_during_backward);
    // 12 B for each offloaded parameter: all of them here.
    const Plan& plan = t->plan();
    EXPECT_EQ(info.speculative_bytes, plan.total_params * 12);
    EXPECT_EQ(plan.speculative_bytes, plan.total_params * 12);
    EXPECT_TRUE(plan.speculative_fits);
  }
  {
    // offload_optimizer.ratio 0.5: only the offloaded shards have a second set.
    Case half = k;
    half.ratio = 0.5;
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(Options(half, 1.0), log));
    const Plan& plan = t->plan();
    ASSERT_GT(plan.optimizer_gpu_params, 0u);
    EXPECT_EQ(t->Info().speculative_bytes, (plan.total_params - plan.optimizer_gpu_params) * 12);
  }
  struct WhyNot {
    const char* what;
    std::function<void(TrainOptions&)> set;
    const char* line;
  };
  TempDir nvme;
  const std::vector<WhyNot> whys = {
      {"switched off", [](TrainOptions& o) { o.speculative_update = false; },
       "optimizer update: after backward (gradient_clipping 1.0 needs the global norm; speculation is off)"},
      {"forced after", [](TrainOptions& o) { o.optimizer_after_backward = true; },
       "optimizer update: after backward (asked for: --optimizer-after-backward)"},
      {"optimizer state on NVMe",
       [&](TrainOptions& o) {
         o.config.zero.offload_optimizer.device = "nvme";
         o.config.zero.offload_optimizer.nvme_path = nvme.path();
       },
       "optimizer update: after backward (gradient_clipping 1.0 needs the global norm; no speculation with the "
       "optimizer state on NVMe"},
      {"fp16 with a dynamic loss scale",
       [](TrainOptions& o) {
         o.config.bf16 = false;
         o.config.fp16.enabled = true;
       },
       "optimizer update: after backward (gradient_clipping 1.0 needs the global norm, and fp16's dynamic loss "
       "scale skips the step on overflow)"},
  };
  for (const WhyNot& w : whys) {
    SCOPED_TRACE(w.what);
    TrainOptions o = Options(k, 1.0);
    w.set(o);
    ASSERT_OK_AND_ASSIGN(std::string dry, Trainer::DryRun(o));
    EXPECT_THAT(dry, HasSubstr(w.line));
    EXPECT_THAT(dry, ::testing::Not(HasSubstr("second set")));
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    EXPECT_THAT(t->PlanTable(), HasSubstr(w.line));
    EXPECT_FALSE(t->Info().optimizer_speculative);
    EXPECT_EQ(t->Info().speculative_bytes, 0u);
    EXPECT_FALSE(t->plan().speculative_fits);
    for (int i = 0; i < 2; ++i) {
      ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
      EXPECT_EQ(r.speculation, Speculation::kNone);
    }
  }
}

// A host budget the plan fits but not with the second set: the update runs
// after the backward and the reason gives the figures.
TEST(TrainerSpeculative, NoRoomForTheSecondSet) {
  Case k;
  TrainOptions o = Options(k, 1.0);
  uint64_t without = 0, second = 0;
  {
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    second = t->plan().speculative_bytes;
  }
  {
    TrainOptions off = o;
    off.speculative_update = false;
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(off, log));
    without = t->plan().host_total;
  }
  ASSERT_GT(second, 0u);
  // Room for the plan without the second set, and half of it.
  o.host_memory_limit = without + second / 2;
  ASSERT_OK_AND_ASSIGN(std::string dry, Trainer::DryRun(o));
  EXPECT_THAT(dry, HasSubstr("optimizer update: after backward (gradient_clipping 1.0 needs the global norm; "
                             "speculating would need " +
                             FormatBytes(second) + " more host memory for a second master/m/v, and the plan "
                             "leaves " + FormatBytes(second / 2) + " of the " + FormatBytes(without + second / 2) +
                             " host budget)"));
  EXPECT_THAT(dry, ::testing::Not(HasSubstr("second set")));
}

// The plan counts everything the host tier holds — the state, the second
// set, the optimizer's staging, the non-finite counts, each allocation's
// page rounding — so with a host budget of exactly the plan's host total,
// the decision it made (speculate) is the one that runs: everything is
// allocated, and the tier never holds more than that total.
TEST(TrainerSpeculative, TheHostTierHoldsWhatThePlanCounts) {
  for (bool streamed : {false, true}) {
    SCOPED_TRACE(streamed ? "streamed" : "resident");
    Case k;
    k.streamed = streamed;
    TrainOptions o = Options(k, kNeverClips);
    {
      std::ostringstream log;
      ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
      ASSERT_TRUE(t->plan().speculative_fits);
      o.host_memory_limit = t->plan().host_total;
    }
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    EXPECT_TRUE(t->plan().speculative_fits);
    EXPECT_TRUE(t->Info().optimizer_speculative);
    EXPECT_THAT(t->PlanTable(), HasSubstr("second set"));
    for (int i = 0; i < 3; ++i) {
      ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
      EXPECT_EQ(r.speculation, i == 0 ? Speculation::kNone : Speculation::kCommitted) << "step " << i + 1;
    }
    EXPECT_LE(t->Info().host_tier_peak, t->plan().host_total);
    // One byte less: the plan no longer has room for the second set.
    o.host_memory_limit -= 1;
    ASSERT_OK_AND_ASSIGN(std::string dry, Trainer::DryRun(o));
    EXPECT_THAT(dry, ::testing::Not(HasSubstr("second set")));
  }
}

// A non-finite gradient at a speculative step: nothing was committed, so the
// state is the last step's, untouched, parameters included (the ones the
// speculated shards wrote are restored from their master weights), and the
// error does not stick: Save writes the last step's state, Evaluate sees the
// last step's parameters — exactly as with the update after the backward.
TEST(TrainerSpeculative, NonFiniteGradientLeavesTheStateUntouched) {
  const std::vector<std::string> names = {"transformer.ln_f.weight", "transformer.h.1.mlp.c_fc.weight",
                                          "transformer.h.0.attn.c_attn.weight", "transformer.wte.weight"};
  std::vector<std::string> saved;
  std::vector<double> vals;
  for (bool after : {false, true}) {
    SCOPED_TRACE(after ? "after backward" : "speculative");
    Case k;
    TrainOptions o = Options(k, kNeverClips);
    o.optimizer_after_backward = after;
    o.inject_nonfinite_shard = "blk0";
    o.inject_nonfinite_step = 2;
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    ASSERT_EQ(t->Info().optimizer_speculative, !after);
    ASSERT_OK_AND_ASSIGN(StepReport first, t->Step());
    EXPECT_EQ(first.speculation, Speculation::kNone);
    const std::vector<std::vector<float>> before = Parameters(*t, names);
    auto r = t->Step();
    EXPECT_THAT(r, StatusIs(StatusCode::kFailedPrecondition));
    EXPECT_THAT(r.status().ToString(), HasSubstr("non-finite gradients at step 2"));
    if (!after) {
      EXPECT_THAT(r.status().ToString(), HasSubstr("nothing of it was committed"));
    }
    const std::vector<std::vector<float>> now = Parameters(*t, names);
    for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(now[i], before[i]) << names[i] << " was updated";
    ASSERT_OK_AND_ASSIGN(double val, t->Evaluate(1));
    vals.push_back(val);
    TempDir ck;
    ASSERT_OK(t->Save(ck.path()));
    saved.push_back(FileBytes(ck.path() + "/step-000001/master.safetensors") +
                    FileBytes(ck.path() + "/step-000001/optimizer.safetensors"));
    EXPECT_FALSE(saved.back().empty());
  }
  EXPECT_EQ(vals[0], vals[1]) << "the speculated shards' parameters were not restored";
  EXPECT_TRUE(saved[0] == saved[1]) << "the checkpoints after the failed step differ";
}

// Trainer::Run says per logged line how many steps speculated and how they
// ended, and the JSON log has each step's outcome and each logged line's.
TEST(TrainerSpeculative, TheLogCountsTheSteps) {
  Case k;
  TrainOptions o = Options(k, kNeverClips);
  o.steps = 4;
  o.config.steps_per_print = 2;
  TempDir dir;
  o.log_json = dir.path() + "/log.jsonl";
  std::ostringstream log, out;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_OK(t->Run(out));
  // Step 1 alone, then steps 2 and the rest by twos.
  EXPECT_THAT(out.str(), HasSubstr("step 1/4 |"));
  EXPECT_THAT(out.str(), HasSubstr("speculative 0/1 (0 committed, 0 missed)"));
  EXPECT_THAT(out.str(), HasSubstr("speculative 1/1 (1 committed, 0 missed)"));
  EXPECT_THAT(out.str(), HasSubstr("speculative 2/2 (2 committed, 0 missed)"));
  std::ifstream f(o.log_json);
  std::string line;
  std::vector<std::string> logged, steps;  // the printed lines' steps', and every step's
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("type") == "log") logged.push_back(j.at("speculation").get<std::string>());
    if (j.at("type") == "step") steps.push_back(j.at("speculation").get<std::string>());
  }
  EXPECT_EQ(logged, (std::vector<std::string>{"none", "committed", "committed"}));
  EXPECT_EQ(steps, (std::vector<std::string>{"none", "committed", "committed", "committed"}));
}

}  // namespace
}  // namespace strata
