// SPDX-License-Identifier: Apache-2.0
// Hugging Face "auto" values (engine/config_auto.h): the templates that
// transformers' DeepSpeed docs publish (tests/data/ds_config_zero{2,3}.json)
// list every unresolved "auto" in one error, and plan once a trainer section
// gives the TrainingArguments; each source resolves what HF's
// HfTrainerDeepSpeedConfig resolves from it; values that disagree with the
// trainer's are errors.
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "engine/config.h"
#include "engine/trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

json Template(const std::string& name) {
  std::ifstream in(testing::SourcePath("tests/data/" + name));
  return json::parse(in);
}

// TrainingArguments as a trainer section gives them.
json HfTrainer() {
  return {{"per_device_train_batch_size", 2}, {"gradient_accumulation_steps", 3}, {"learning_rate", 3e-4},
          {"adam_beta1", 0.9},  {"adam_beta2", 0.95}, {"adam_epsilon", 1e-8}, {"weight_decay", 0.01},
          {"max_grad_norm", 1.0}, {"warmup_steps", 10}, {"bf16", true}, {"steps", 4}};
}

json SmallModel() { return {{"n_layer", 2}, {"n_embd", 64}, {"n_head", 4}, {"vocab_size", 256}, {"seq_len", 32}}; }

Result<Config> Parse(const json& j, ConfigSources s = {}) { return ParseConfig(j, "ds.json", s, nullptr); }

// Regression: the templates' "auto" values were an error at a time (five
// edits); one error lists them all, each with what resolves it.
TEST(ConfigAuto, TheHfTemplatesListEveryUnresolvedAutoAtOnce) {
  for (const char* name : {"ds_config_zero2.json", "ds_config_zero3.json"}) {
    SCOPED_TRACE(name);
    auto r = LoadConfig(testing::SourcePath(std::string("tests/data/") + name), 1, nullptr);
    ASSERT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    const std::string m(r.status().message());
    EXPECT_THAT(m, HasSubstr("12 \"auto\" values have nothing to resolve them")) << m;
    for (const char* line :
         {"train_micro_batch_size_per_gpu: trainer.per_device_train_batch_size",
          "gradient_accumulation_steps: trainer.gradient_accumulation_steps", "train_batch_size: follows from",
          "gradient_clipping: trainer.max_grad_norm", "optimizer.params.lr: trainer.learning_rate",
          "optimizer.params.betas: trainer.adam_beta1 and trainer.adam_beta2",
          "optimizer.params.eps: trainer.adam_epsilon", "optimizer.params.weight_decay: trainer.weight_decay",
          "scheduler.params.warmup_max_lr: trainer.learning_rate",
          "scheduler.params.warmup_num_steps: trainer.warmup_steps or trainer.warmup_ratio", "fp16.enabled: trainer.bf16",
          "bf16.enabled: trainer.bf16"})
      EXPECT_THAT(m, HasSubstr(line)) << m;
    // Nothing else: no "auto" is reported twice, and warmup_min_lr resolves (0).
    EXPECT_THAT(m, Not(HasSubstr("warmup_min_lr")));
    EXPECT_THAT(m, Not(HasSubstr("errors)")));
  }
}

// With a trainer section (and a model) the templates read as HF would fill
// them, and plan.
TEST(ConfigAuto, TheHfTemplatesPlanWithATrainerSection) {
  for (const char* name : {"ds_config_zero2.json", "ds_config_zero3.json"}) {
    SCOPED_TRACE(name);
    json j = Template(name);
    j["trainer"] = HfTrainer();
    j["model"] = SmallModel();
    TempDir dir;
    const std::string path = dir.File(name);
    std::ofstream(path) << j.dump(2);
    std::vector<std::string> warnings;
    ASSERT_OK_AND_ASSIGN(Config c, LoadConfig(path, 1, &warnings));
    EXPECT_EQ(c.micro_batch, 2);
    EXPECT_EQ(c.grad_accum, 3);
    EXPECT_EQ(c.train_batch_size, 6);
    EXPECT_EQ(c.gradient_clipping, 1.0);
    EXPECT_EQ(c.optimizer.lr, 3e-4);
    EXPECT_EQ(c.optimizer.beta2, 0.95);
    EXPECT_EQ(c.optimizer.weight_decay, 0.01);
    EXPECT_TRUE(c.bf16);
    EXPECT_FALSE(c.fp16.enabled);
    EXPECT_EQ(c.scheduler.type, "WarmupLR");
    EXPECT_EQ(c.scheduler.params.at("warmup_min_lr"), optim::LrParamValue(int64_t{0}));
    EXPECT_EQ(c.scheduler.params.at("warmup_max_lr"), optim::LrParamValue(3e-4));
    EXPECT_EQ(c.scheduler.params.at("warmup_num_steps"), optim::LrParamValue(int64_t{10}));
    EXPECT_EQ(c.trainer.steps, 4);
    if (c.zero.stage == 3) {
      EXPECT_EQ(c.zero.reduce_bucket_size, 64u * 64u);  // hidden_size²
      EXPECT_EQ(c.zero.prefetch_bucket_size, 3686u);    // 0.9 hidden_size²
      EXPECT_EQ(c.zero.param_persistence_threshold, 640u);
    } else {
      EXPECT_EQ(c.zero.reduce_bucket_size, 200'000'000u);  // given, not "auto"
    }
    TrainOptions o;
    o.config = c;
    o.backend = "cpu";
    o.gpu_memory_limit = 256 * kMiB;
    o.host_memory_limit = 256 * kMiB;
    ASSERT_OK_AND_ASSIGN(std::string plan, Trainer::DryRun(o));
    EXPECT_THAT(plan, AllOf(HasSubstr("bf16"), HasSubstr("micro 2 x accumulation 3"), HasSubstr("budget")));
  }
}

TEST(ConfigAuto, TheCommandLinesStepsAndTheWeightsDtypeResolve) {
  json j = Template("ds_config_zero2.json");
  json t = HfTrainer();
  t.erase("bf16");
  t.erase("warmup_steps");
  t["warmup_ratio"] = 0.1;
  j["trainer"] = t;
  j["scheduler"] = {{"type", "WarmupDecayLR"},
                    {"params", {{"warmup_min_lr", "auto"}, {"warmup_max_lr", "auto"}, {"warmup_num_steps", "auto"},
                                {"total_num_steps", "auto"}}}};
  ConfigSources s;
  s.steps = 95;          // --steps
  s.model_dtype = "fp16";  // --init-from weights in fp16
  ASSERT_OK_AND_ASSIGN(Config c, Parse(j, s));
  EXPECT_EQ(c.scheduler.params.at("total_num_steps"), optim::LrParamValue(int64_t{95}));
  EXPECT_EQ(c.scheduler.params.at("warmup_num_steps"), optim::LrParamValue(int64_t{10}));  // ceil(9.5)
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16);
  // Without --steps the trainer section's steps count.
  s.steps = -1;
  ASSERT_OK_AND_ASSIGN(Config d, Parse(j, s));
  EXPECT_EQ(d.scheduler.params.at("total_num_steps"), optim::LrParamValue(int64_t{4}));
  EXPECT_EQ(d.scheduler.params.at("warmup_num_steps"), optim::LrParamValue(int64_t{1}));
}

// As HF's "mismatch" check: a value given in the config and the trainer
// section must agree; every disagreement is named.
TEST(ConfigAuto, ValuesThatDisagreeWithTheTrainerAreErrors) {
  json j = {{"train_micro_batch_size_per_gpu", 4}, {"gradient_clipping", 0.5},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}}, {"bf16", {{"enabled", true}}},
            {"trainer", HfTrainer()}};
  auto r = Parse(j);
  ASSERT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  const std::string m(r.status().message());
  EXPECT_THAT(m, AllOf(HasSubstr("train_micro_batch_size_per_gpu: 4 disagrees with trainer.per_device_train_batch_size (2)"),
                       HasSubstr("gradient_clipping: 0.5 disagrees with trainer.max_grad_norm (1.0)"),
                       HasSubstr("optimizer.params.lr: 0.0001 disagrees with trainer.learning_rate (0.0003)"),
                       HasSubstr("(3 errors)")))
      << m;
  // The trainer's precision must be the config's, a section left out included.
  json k = {{"train_micro_batch_size_per_gpu", 2}, {"trainer", {{"bf16", true}}}};
  auto p = Parse(k);
  ASSERT_THAT(p, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("asks for bf16 (trainer.bf16) but the config trains fp32"));
}

// A batch "auto" with the other two given is the batch rule's; the trainer's
// keys are known to the reader (a typo among them gets the nearest).
TEST(ConfigAuto, TheBatchRuleDerivesAnAutoAndTrainerKeysAreKnown) {
  ASSERT_OK_AND_ASSIGN(Config c, Parse({{"train_batch_size", 12}, {"train_micro_batch_size_per_gpu", "auto"},
                                        {"gradient_accumulation_steps", 3}}));
  EXPECT_EQ(c.micro_batch, 4);
  auto r = Parse({{"train_micro_batch_size_per_gpu", 1}, {"trainer", {{"learning_rat", 1e-3}}}});
  ASSERT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("did you mean \"learning_rate\""));
  auto bad = Parse({{"train_micro_batch_size_per_gpu", 1}, {"trainer", {{"learning_rate", "fast"}}}});
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("trainer.learning_rate: \"fast\" is not a number"));
}

}  // namespace
}  // namespace strata
