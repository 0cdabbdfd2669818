// SPDX-License-Identifier: Apache-2.0
// `strata train` as a user runs it (the binary, tests/engine/strata_cli.h):
// the command line's values are used or refused, never replaced without a
// word; typos get "did you mean"; files that are not regular files are
// errors, not hangs; a resume says what it would change; --version tells
// the build. Every run here has a time limit and must end by exiting.
#include <sys/stat.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/safetensors.h"
#include "tests/engine/strata_cli.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::RunStrata;
using ::strata::testing::StrataRun;
using ::strata::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

// A config small enough to train a few steps in a second on the CPU backend.
json TinyConfig() {
  return {{"train_micro_batch_size_per_gpu", 2},
          {"gradient_accumulation_steps", 1},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
          {"steps_per_print", 1},
          {"model", {{"n_layer", 1}, {"n_embd", 32}, {"n_head", 2}, {"vocab_size", 256}, {"seq_len", 16}}},
          {"data", {{"path", testing::SourcePath("data/kjv.txt")}, {"val_fraction", 0}}}};
}

std::string WriteJson(const TempDir& dir, const std::string& name, const json& j) {
  const std::string p = dir.File(name);
  std::ofstream(p) << j.dump(2);
  return p;
}

void ExpectUsageError(const StrataRun& r, const std::string& what) {
  EXPECT_FALSE(r.timed_out) << what;
  EXPECT_FALSE(r.signalled) << r.output;
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr(what));
}

// Regression: --steps -5 trained the default 40; a zero memory limit meant
// the default.
TEST(Cli, InvalidValuesAreErrors) {
  TempDir dir;
  ExpectUsageError(RunStrata({"train", "--steps", "-5"}), "--steps -5: must be at least 1");
  ExpectUsageError(RunStrata({"train", "--steps", "0"}), "--steps 0: must be at least 1");
  ExpectUsageError(RunStrata({"train", "--gpu-memory-limit", "0"}), "--gpu-memory-limit 0: must be more than 0");
  ExpectUsageError(RunStrata({"train", "--host-memory-limit", "0GiB"}), "--host-memory-limit 0GiB: must be more than 0");
  ExpectUsageError(RunStrata({"train", "--save", dir.File("ck"), "--save-every", "0"}), "--save-every 0");
  ExpectUsageError(RunStrata({"train", "--save-every", "5"}), "--save-every needs --save");
  ExpectUsageError(RunStrata({"train", "--threads", "-1"}), "--threads -1");
  ExpectUsageError(RunStrata({"train", "--threads", "100000"}), "--threads 100000: must be from 0 (all) to 4096");
  ExpectUsageError(RunStrata({"train", "--backend", "gpu"}), "--backend \"gpu\" is not allowed");
  ExpectUsageError(RunStrata({"train", "--config", ""}), "--config was given an empty path");
  ExpectUsageError(RunStrata({"train", "--trace", ""}), "--trace was given an empty path");
  ExpectUsageError(RunStrata({"train", "--trace", dir.path()}), "--trace");  // a directory, not a file
  ExpectUsageError(RunStrata({"train", "--steps", "many"}), "the argument ('many') for option '--steps' is invalid");
  ExpectUsageError(RunStrata({"train", "--allow-config-change"}), "--allow-config-change is for --resume");
}

TEST(Cli, AMisspeltOptionOrCommandGetsDidYouMean) {
  ExpectUsageError(RunStrata({"train", "--stpes", "3"}), "unknown option --stpes; did you mean --steps?");
  ExpectUsageError(RunStrata({"train", "--dry-rn"}), "did you mean --dry-run?");
  // No prefix guessing: --step is not silently --steps.
  ExpectUsageError(RunStrata({"train", "--step", "3"}), "unknown option --step; did you mean --steps?");
  ExpectUsageError(RunStrata({"trian"}), "unknown command 'trian'; did you mean 'train'?");
}

TEST(Cli, VersionTellsTheBuild) {
  StrataRun r = RunStrata({"--version"});
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, AllOf(HasSubstr("strata 0."), HasSubstr("(git "), HasSubstr("compiler: "),
                              HasSubstr("CUDA code: "), HasSubstr("CUDA: "),
                              HasSubstr("CPU Adam SIMD paths compiled: scalar"), HasSubstr("; this CPU takes ")));
}

// Regression: a FIFO as --config or --data blocked in open() forever;
// /dev/zero read forever; a directory was not named as one.
TEST(Cli, FilesThatAreNotRegularAreErrorsNotHangs) {
  TempDir dir;
  const std::string fifo = dir.File("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ExpectUsageError(RunStrata({"train", "--config", fifo}, 20), "is a FIFO");
  ExpectUsageError(RunStrata({"train", "--data", fifo, "--dry-run"}, 20), "is a FIFO");
  ExpectUsageError(RunStrata({"train", "--config", "/dev/zero"}, 20), "is a character device");
  ExpectUsageError(RunStrata({"train", "--config", dir.path()}, 20), "is a directory");
  ExpectUsageError(RunStrata({"train", "--log-json", fifo}, 20), "is a FIFO");
  // Data is opened by the run: a FIFO there is refused without blocking too.
  const std::string cfg = WriteJson(dir, "c.json", TinyConfig());
  ExpectUsageError(RunStrata({"train", "--config", cfg, "--data", dir.path(), "--backend", "cpu"}, 60),
                   "is a directory");
}

// Regression: a --config without a model trained the built-in byte model;
// `strata train` without arguments keeps the demo.
TEST(Cli, AConfigWithoutAModelIsAnErrorTheDemoStays) {
  TempDir dir;
  json j = TinyConfig();
  j.erase("model");
  ExpectUsageError(RunStrata({"train", "--config", WriteJson(dir, "c.json", j), "--dry-run", "--backend", "cpu"}),
                   "no \"model\" section");
  StrataRun demo = RunStrata({"train", "--dry-run", "--backend", "cpu"});
  ASSERT_EQ(demo.rc, 0) << demo.output;
  EXPECT_THAT(demo.output, AllOf(HasSubstr("4 layers, d 128"), HasSubstr("micro 8 x accumulation 1")));
  // With --init-from the weights are the model (their shape, the heads from
  // their config.json).
  const std::string weights = dir.File("model.safetensors");
  std::vector<uint16_t> zeros(256 * 64, 0);
  ASSERT_OK(WriteSafetensors(weights, {{"wte.weight", DType::kBF16, Shape({256, 64}), zeros.data()},
                                       {"wpe.weight", DType::kBF16, Shape({16, 64}), zeros.data()},
                                       {"h.0.ln_1.weight", DType::kBF16, Shape({64}), zeros.data()},
                                       {"h.1.ln_1.weight", DType::kBF16, Shape({64}), zeros.data()}}));
  std::ofstream(dir.File("config.json")) << R"({"n_head": 4})";
  StrataRun from = RunStrata(
      {"train", "--config", dir.File("c.json"), "--init-from", weights, "--dry-run", "--backend", "cpu"});
  ASSERT_EQ(from.rc, 0) << from.output;
  EXPECT_THAT(from.output, HasSubstr("2 layers, d 64, 4 heads, vocab 256"));
  // The model directory itself (it was "is a directory; give a file").
  StrataRun from_dir = RunStrata(
      {"train", "--config", dir.File("c.json"), "--init-from", dir.path(), "--dry-run", "--backend", "cpu"});
  ASSERT_EQ(from_dir.rc, 0) << from_dir.output;
  EXPECT_THAT(from_dir.output, HasSubstr("2 layers, d 64, 4 heads, vocab 256"));
}

// Stage 0/1/2 on one rank: the plan's header says what the stage means.
TEST(Cli, ThePlanSaysWhatTheStageMeansOnOneRank) {
  TempDir dir;
  for (int stage : {0, 1, 2, 3}) {
    json j = TinyConfig();
    j["zero_optimization"] = {{"stage", stage}};
    StrataRun r = RunStrata({"train", "--config", WriteJson(dir, "c.json", j), "--dry-run", "--backend", "cpu"});
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_THAT(r.output, AllOf(HasSubstr("zero_optimization.stage " + std::to_string(stage)),
                                HasSubstr("on 1 rank: with one rank there is nothing to partition across")));
  }
}

// Regression: --resume of a step-3 checkpoint with --steps 2 ran nothing
// without a word, and a resume with another learning rate or batch went on.
TEST(Cli, AResumeSaysWhatItWouldDoAndChange) {
  TempDir dir;
  const std::string cfg = WriteJson(dir, "c.json", TinyConfig());
  const std::string ck = dir.File("ck");
  StrataRun first = RunStrata({"train", "--config", cfg, "--backend", "cpu", "--steps", "3", "--save", ck});
  ASSERT_EQ(first.rc, 0) << first.output;
  ExpectUsageError(RunStrata({"train", "--config", cfg, "--backend", "cpu", "--steps", "2", "--resume", ck}),
                   "is at step 3, past the run's 2 steps (--steps): nothing to train");
  StrataRun same = RunStrata({"train", "--config", cfg, "--backend", "cpu", "--steps", "3", "--resume", ck});
  EXPECT_EQ(same.rc, 0) << same.output;
  EXPECT_THAT(same.output, HasSubstr("nothing to train"));
  json changed = TinyConfig();
  changed["optimizer"]["params"]["lr"] = 2e-3;
  changed["train_micro_batch_size_per_gpu"] = 4;
  changed["steps_per_print"] = 2;
  const std::string cfg2 = WriteJson(dir, "c2.json", changed);
  StrataRun refused = RunStrata({"train", "--config", cfg2, "--backend", "cpu", "--steps", "4", "--resume", ck});
  ExpectUsageError(refused, "would not continue it bit for bit");
  EXPECT_THAT(refused.output, AllOf(HasSubstr("optimizer.params.lr: 0.001 -> 0.002"),
                                    HasSubstr("train_micro_batch_size_per_gpu: 2 -> 4"),
                                    HasSubstr("steps_per_print: 1 -> 2 (keeps the bits)"),
                                    HasSubstr("--allow-config-change")));
  StrataRun allowed = RunStrata(
      {"train", "--config", cfg2, "--backend", "cpu", "--steps", "4", "--resume", ck, "--allow-config-change"});
  EXPECT_EQ(allowed.rc, 0) << allowed.output;
  EXPECT_THAT(allowed.output, AllOf(HasSubstr("resume: config change: optimizer.params.lr"), HasSubstr("step 4/4")));
}

// The HF templates through the binary: with a trainer section and a model
// they plan; as published, one error lists the "auto" values.
TEST(Cli, TheHfTemplatePlans) {
  TempDir dir;
  std::ifstream in(testing::SourcePath("tests/data/ds_config_zero3.json"));
  json j = json::parse(in);
  const std::string as_published = WriteJson(dir, "z3.json", j);
  j["trainer"] = {{"per_device_train_batch_size", 2}, {"gradient_accumulation_steps", 1}, {"learning_rate", 1e-4},
                  {"adam_beta1", 0.9}, {"adam_beta2", 0.999}, {"adam_epsilon", 1e-8}, {"weight_decay", 0.0},
                  {"max_grad_norm", 1.0}, {"warmup_steps", 5}, {"fp16", false}, {"bf16", false}};
  j["model"] = TinyConfig()["model"];
  StrataRun r = RunStrata({"train", "--config", WriteJson(dir, "z3t.json", j), "--dry-run", "--backend", "cpu"});
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, AllOf(HasSubstr("zero_optimization.stage 3"), HasSubstr("fp32")));
  ExpectUsageError(RunStrata({"train", "--config", as_published, "--dry-run", "--backend", "cpu"}),
                   "\"auto\" values have nothing to resolve them");
}

}  // namespace
}  // namespace strata
