// SPDX-License-Identifier: Apache-2.0
#include "engine/config.h"

#include <fstream>
#include <map>
#include <set>

#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using json = nlohmann::json;

// DeepSpeed requires a batch size (Config.ABatchSizeIsRequired); the tests
// about other keys get micro batch 1 when they give none.
json WithBatch(json j) {
  if (j.is_object() && !j.contains("train_batch_size") && !j.contains("train_micro_batch_size_per_gpu") &&
      !j.contains("gradient_accumulation_steps"))
    j["train_micro_batch_size_per_gpu"] = 1;
  return j;
}

Result<Config> Parse(const std::string& text, std::vector<std::string>* warnings = nullptr, int world = 1) {
  return ParseConfig(WithBatch(json::parse(text)), "ds.json", world, warnings);
}

std::string Err(const std::string& text, int world = 1) {
  auto r = Parse(text, nullptr, world);
  EXPECT_FALSE(r.ok()) << text;
  return std::string(r.status().message());
}

// The status's code, and its message containing `text`.
template <typename T>
void ExpectStatus(const T& r, StatusCode code, const std::string& text) {
  const Status s = ::strata::testing::GetStatus(r);
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_THAT(std::string(s.message()), HasSubstr(text)) << s.ToString();
}

TEST(Config, ReadsARealZero3OffloadConfig) {
  std::vector<std::string> warnings;
  ASSERT_OK_AND_ASSIGN(Config c, Parse(R"({
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 16,
    "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 100}},
    "gradient_clipping": 1.0,
    "zero_optimization": {
      "stage": 3, "overlap_comm": true, "contiguous_gradients": true,
      "offload_param": {"device": "cpu", "pin_memory": true},
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pipeline_read": true, "pipeline_write": true},
      "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": "auto",
      "sub_group_size": 1e9, "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
      "stage3_gather_16bit_weights_on_model_save": true
    },
    "aio": {"block_size": 1048576, "queue_depth": 16, "thread_count": 2, "single_submit": false, "overlap_events": true},
    "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": true},
    "steps_per_print": 10, "wall_clock_breakdown": true,
    "flops_profiler": {"enabled": false}, "tensorboard": {"enabled": true, "output_path": "tb"},
    "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 50257, "seq_len": 256},
    "data": {"path": "data/kjv.txt"}
  })", &warnings));
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_EQ(c.micro_batch, 4);
  EXPECT_EQ(c.grad_accum, 16);
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.precision(), "bf16");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_EQ(c.scheduler.type, "WarmupCosineLR");
  EXPECT_EQ(c.scheduler.params.at("total_num_steps"), optim::LrParamValue(int64_t{1000}));
  EXPECT_EQ(c.zero.offload_optimizer.device, "nvme");
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_TRUE(c.zero.offload_optimizer.pipeline_read);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 50'000'000u);
  EXPECT_EQ(c.zero.param_persistence_threshold, 640u);  // "auto": 10 × n_embd, as the HF Trainer sets it
  EXPECT_EQ(c.aio.intra_op_parallelism, 2);
  EXPECT_TRUE(c.activation_checkpointing.cpu_checkpointing);
  EXPECT_EQ(c.model.vocab_size, 50257);
  // One warning per ignored DeepSpeed key, each naming it, and one for the
  // tuned ZeRO knobs (which the planner supersedes).
  ASSERT_EQ(warnings.size(), 5u);
  std::string all;
  for (auto& w : warnings) all += w + "\n";
  EXPECT_THAT(all, HasSubstr("zero_optimization.contiguous_gradients"));
  EXPECT_THAT(all, HasSubstr("stage3_gather_16bit_weights_on_model_save"));
  EXPECT_THAT(all, HasSubstr("flops_profiler"));
  EXPECT_THAT(all, HasSubstr("tensorboard"));
}

TEST(Config, TypoIsAnErrorWithTheNearestKey) {
  EXPECT_THAT(Err(R"({"zero_optimization": {"stage": 3, "overlap_com": true}})"),
              AllOf(HasSubstr("zero_optimization.overlap_com"), HasSubstr("did you mean \"overlap_comm\"")));
  EXPECT_THAT(Err(R"({"train_micro_batch_size": 4})"),
              AllOf(HasSubstr("train_micro_batch_size"), HasSubstr("train_micro_batch_size_per_gpu")));
  EXPECT_THAT(Err(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decai": 0.1}}})"),
              AllOf(HasSubstr("optimizer.params.weight_decai"), HasSubstr("weight_decay")));
  EXPECT_THAT(Err(R"({"fp16": {"enabled": true, "initial_scale_pow": 12}})"),
              HasSubstr("initial_scale_power"));
}

TEST(Config, BadValuesNameTheAllowedOnes) {
  EXPECT_THAT(Err(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})"),
              AllOf(HasSubstr("zero_optimization.offload_optimizer.device"), HasSubstr("\"gpu\""),
                    HasSubstr("none, cpu, nvme")));
  EXPECT_THAT(Err(R"({"zero_optimization": {"stage": 4}})"), AllOf(HasSubstr("zero_optimization.stage"), HasSubstr("0 to 3")));
  EXPECT_THAT(Err(R"({"optimizer": {"type": "Lamb", "params": {}}})"), HasSubstr("allowed: Adam, AdamW"));
  EXPECT_THAT(Err(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})"), HasSubstr("optimizer.params.betas"));
  EXPECT_THAT(Err(R"({"bf16": {"enabled": "yes"}})"), HasSubstr("allowed: true, false"));
  EXPECT_THAT(Err(R"({"aio": {"block_size": 1000}})"), HasSubstr("aio.block_size"));
  EXPECT_THAT(Err(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})"),
              HasSubstr("nvme_path"));
  EXPECT_THAT(Err(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})"),
              AllOf(HasSubstr("scheduler.params.total_num_steps"), HasSubstr("required")));
  EXPECT_THAT(Err(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cubic"}}})"),
              HasSubstr("\"log\", \"linear\""));
  EXPECT_THAT(Err(R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})"), HasSubstr("\"auto\""));
  EXPECT_THAT(Err(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})"), HasSubstr("choose one"));
  EXPECT_THAT(Err(R"({"model": {"n_embd": 100, "n_head": 3}})"), HasSubstr("does not divide"));
  EXPECT_THAT(Err(R"({"zero_optimization": {"prefetch_bucket_size": 10, "stage3_prefetch_bucket_size": 20}})"),
              HasSubstr("keep one"));
  EXPECT_THAT(Err(R"({"trainer": {"schedule": "sideways"}})"),
              AllOf(HasSubstr("trainer.schedule"), HasSubstr("layer-major"), HasSubstr("micro-batch-major")));
  EXPECT_THAT(Err(R"({"trainer": {"gpu_assisted_optimizer": "maybe"}})"),
              AllOf(HasSubstr("trainer.gpu_assisted_optimizer"), HasSubstr("auto")));
  EXPECT_THAT(Err(R"({"trainer": {"save_dtype": "fp16"}})"),
              AllOf(HasSubstr("trainer.save_dtype"), HasSubstr("bf16"), HasSubstr("fp32")));
  EXPECT_THAT(Err(R"({"trainer": {"save_max_shard_size": "5 parsecs"}})"),
              AllOf(HasSubstr("trainer.save_max_shard_size"), HasSubstr("parsecs")));
  EXPECT_THAT(Err(R"({"trainer": {"save_max_shard_size": "0"}})"), HasSubstr("more than 0"));
  ASSERT_OK_AND_ASSIGN(Config c, Parse(R"({"trainer": {"save_dtype": "fp32", "save_max_shard_size": "2GiB"}})"));
  EXPECT_EQ(c.trainer.save_dtype, "fp32");
  EXPECT_EQ(c.trainer.save_max_shard_size, "2GiB");
}

TEST(Config, IgnoringWhatChangesTheResultIsAnError) {
  EXPECT_THAT(Err(R"({"amp": {"enabled": true}})"), AllOf(HasSubstr("amp"), HasSubstr("would change the training result")));
  EXPECT_THAT(Err(R"({"progressive_layer_drop": {"enabled": true}})"), HasSubstr("progressive_layer_drop"));
  EXPECT_THAT(Err(R"({"zero_optimization": {"zero_quantized_gradients": true}})"),
              HasSubstr("zero_optimization.zero_quantized_gradients"));
  EXPECT_THAT(Err(R"({"optimizer": {"type": "Adam", "params": {"amsgrad": true}}})"), HasSubstr("amsgrad"));
  std::vector<std::string> w;
  // The same keys disabled are only warnings.
  ASSERT_OK(Parse(R"({"amp": {"enabled": false}, "optimizer": {"type": "Adam", "params": {"amsgrad": false}}})", &w).status());
  EXPECT_EQ(w.size(), 2u);
}

TEST(Config, BatchSizeRule) {
  ASSERT_OK_AND_ASSIGN(Config a, Parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", nullptr, 2));
  EXPECT_EQ(a.grad_accum, 4);
  ASSERT_OK_AND_ASSIGN(Config b, Parse(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})"));
  EXPECT_EQ(b.micro_batch, 16);
  ASSERT_OK_AND_ASSIGN(Config c, Parse(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})"));
  EXPECT_EQ(c.train_batch_size, 15);
  // "auto" with the other two given is derived by the rule.
  ASSERT_OK_AND_ASSIGN(Config d, Parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})"));
  EXPECT_EQ(d.train_batch_size, 6);
  std::string e = Err(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8})");
  EXPECT_THAT(e, AllOf(HasSubstr("train_batch_size"), HasSubstr("inconsistent"), HasSubstr("30 vs 4 × 8 × 1")));
  EXPECT_THAT(Err(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})"), HasSubstr("not divisible"));
}

TEST(Config, LegacyAndAliasSpellings) {
  std::vector<std::string> w;
  ASSERT_OK_AND_ASSIGN(Config c, Parse(R"({"zero_optimization": {"cpu_offload": true, "stage3_max_live_parameters": 3e8},
                                         "aio": {"intra_op_parallelism": 4}})", &w));
  EXPECT_EQ(c.zero.offload_optimizer.device, "cpu");
  EXPECT_EQ(c.zero.max_live_parameters, 300'000'000u);
  EXPECT_EQ(c.aio.intra_op_parallelism, 4);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_THAT(w[0], HasSubstr("deprecated"));
  EXPECT_THAT(w[1], HasSubstr("zero_optimization.stage3_max_live_parameters: accepted, no effect in strata"));
}

// DeepSpeed's fetch-heuristic knobs are checked, but the planner decides
// what they decide there: one warning names those set away from
// DeepSpeed's default, as written; defaults say nothing. The bucket sizes,
// the prefetch bucket and overlap_comm (at every stage: the gradients' sums
// beside the backward) are obeyed: no warning names them.
TEST(Config, TuningKnobsThePlannerSupersedesWarnOnce) {
  std::vector<std::string> w;
  ASSERT_OK(Parse(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e8,
                      "max_reuse_distance": 1e9, "stage3_param_persistence_threshold": 1e6,
                      "reduce_bucket_size": 2e8, "allgather_bucket_size": 1e7, "overlap_comm": false,
                      "stage3_max_live_parameters": 1e8}})", &w).status());
  ASSERT_EQ(w.size(), 1u);
  EXPECT_THAT(w[0], HasSubstr("zero_optimization.stage3_max_live_parameters, "
                              "zero_optimization.stage3_param_persistence_threshold: "
                              "accepted, no effect in strata"));
  for (const char* obeyed : {"stage3_prefetch_bucket_size", "reduce_bucket_size", "allgather_bucket_size",
                             "overlap_comm"})
    EXPECT_THAT(w[0], ::testing::Not(HasSubstr(std::string("zero_optimization.") + obeyed)));
  EXPECT_THAT(w[0], ::testing::Not(HasSubstr("max_reuse_distance")));  // 1e9 is DeepSpeed's default
  w.clear();
  ASSERT_OK(Parse(R"({"zero_optimization": {"stage": 2, "overlap_comm": false}})", &w).status());
  EXPECT_TRUE(w.empty()) << w.front();
  // Bad values are still errors.
  EXPECT_THAT(Parse(R"({"zero_optimization": {"stage3_prefetch_bucket_size": -1}})").status(),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(Config, LauncherWorldSize) {
  auto env = [](std::map<std::string, std::string> vars) {
    return [vars](const char* k) -> const char* {
      auto it = vars.find(k);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  EXPECT_EQ(*LauncherWorldSize(env({})), 1);
  EXPECT_EQ(*LauncherWorldSize(env({{"WORLD_SIZE", "4"}})), 4);
  EXPECT_EQ(*LauncherWorldSize(env({{"OMPI_COMM_WORLD_SIZE", "2"}})), 2);
  EXPECT_EQ(*LauncherWorldSize(env({{"PMI_SIZE", "1"}})), 1);
  EXPECT_EQ(*LauncherWorldSize(env({{"WORLD_SIZE", "1"}, {"PMI_SIZE", "8"}})), 1);  // WORLD_SIZE first
  for (const char* bad : {"0", "-2", "two", "3x"}) {
    auto r = LauncherWorldSize(env({{"WORLD_SIZE", bad}}));
    ASSERT_THAT(r, StatusIs(StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(std::string("WORLD_SIZE=\"") + bad + "\""));
  }
}

TEST(Config, FileErrorsNameTheFileAndLine) {
  TempDir dir;
  std::string p = dir.File("bad.json");
  std::ofstream(p) << "{\n  \"train_batch_size\": 8,\n  \"bf16\": {\"enabled\": tru}\n}\n";
  auto r = LoadConfig(p, 1, nullptr);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(p + ":3:"));
  EXPECT_THAT(LoadConfig(dir.File("missing.json"), 1, nullptr), StatusIs(StatusCode::kIoError));
  std::string ok = dir.File("ok.json");
  std::ofstream(ok) << "// comments are allowed\n{\"train_micro_batch_size_per_gpu\": 2}\n";
  ASSERT_OK(LoadConfig(ok, 1, nullptr).status());
}

TEST(Config, EditDistance) {
  EXPECT_EQ(EditDistance("overlap_com", "overlap_comm"), 1u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST(Config, JsonRoundTrip) {
  std::vector<std::string> w;
  ASSERT_OK_AND_ASSIGN(Config a, Parse(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
    "bf16": {"enabled": true}, "gradient_clipping": 0.5,
    "optimizer": {"type": "Adam", "params": {"lr": 2e-4, "betas": [0.8, 0.9], "adam_w_mode": false}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_type": "linear"}},
    "zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "/x"}},
    "model": {"n_layer": 3, "n_embd": 96, "n_head": 3}})", &w));
  json j = ConfigToJson(a);
  std::vector<std::string> w2;
  ASSERT_OK_AND_ASSIGN(Config b, ParseConfig(j, "round-trip", 1, &w2));
  EXPECT_TRUE(w2.empty());
  EXPECT_EQ(ConfigToJson(b), j);
  EXPECT_EQ(b.grad_accum, 8);
  EXPECT_FALSE(b.optimizer.adam_w_mode);
  EXPECT_EQ(b.scheduler.params.at("warmup_type"), optim::LrParamValue(std::string("linear")));
  EXPECT_EQ(b.zero.offload_optimizer.nvme_path, "/x");
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// A valid config with every field away from its default (bf16: with fp16
// enabled it would be an error; the test flips the two).
Config EveryFieldSet() {
  Config c;
  c.source = "every-field";
  c.world_size = 2;
  c.train_batch_size = 30;
  c.micro_batch = 3;
  c.grad_accum = 5;
  c.fp16.enabled = true;
  c.fp16.loss_scale = 128;
  c.fp16.initial_scale_power = 12;
  c.fp16.loss_scale_window = 500;
  c.fp16.hysteresis = 3;
  c.fp16.consecutive_hysteresis = true;
  c.fp16.min_loss_scale = 0.5;
  c.optimizer.type = "Adam";
  c.optimizer.lr = 2e-4;
  c.optimizer.beta1 = 0.8;
  c.optimizer.beta2 = 0.99;
  c.optimizer.eps = 1e-6;
  c.optimizer.weight_decay = 0.01;
  c.optimizer.adam_w_mode = false;
  c.optimizer.bias_correction = false;
  c.scheduler.type = "OneCycle";
  c.scheduler.params = {{"cycle_min_lr", 1e-5},
                        {"cycle_max_lr", int64_t{1}},
                        {"decay_lr_rate", 0.5},
                        {"cycle_first_step_size", int64_t{100}},
                        {"cycle_second_step_size", 50.5},
                        {"cycle_first_stair_count", int64_t{1}},
                        {"cycle_second_stair_count", int64_t{2}},
                        {"decay_step_size", int64_t{10}},
                        {"cycle_momentum", false},
                        {"cycle_min_mom", 0.7},
                        {"cycle_max_mom", 0.85},
                        {"decay_mom_rate", 0.1},
                        {"last_batch_iteration", uint64_t{10'000'000'000'000'000'000u}}};
  c.gradient_clipping = 0.5;
  c.zero.stage = 2;
  c.zero.offload_param.device = "cpu";
  c.zero.offload_param.nvme_path = "/p";
  c.zero.offload_param.pin_memory = false;
  c.zero.offload_param.buffer_count = 6;
  c.zero.offload_param.buffer_size = 200'000'000;
  c.zero.offload_param.max_in_cpu = 2'000'000'000;
  c.zero.offload_optimizer.device = "nvme";
  c.zero.offload_optimizer.nvme_path = "/o";
  c.zero.offload_optimizer.pin_memory = false;
  c.zero.offload_optimizer.buffer_count = 7;
  c.zero.offload_optimizer.pipeline_read = true;
  c.zero.offload_optimizer.pipeline_write = true;
  c.zero.offload_optimizer.ratio = 0.25;
  c.zero.overlap_comm = false;
  c.zero.reduce_bucket_size = 1;
  c.zero.allgather_bucket_size = 2;
  c.zero.prefetch_bucket_size = 3;
  c.zero.max_live_parameters = 4;
  c.zero.max_reuse_distance = 5;
  c.zero.param_persistence_threshold = 6;
  c.zero.sub_group_size = 7;
  c.activation_checkpointing.partition_activations = true;
  c.activation_checkpointing.cpu_checkpointing = true;
  c.activation_checkpointing.number_checkpoints = 2;
  c.aio.block_size = 8192;
  c.aio.queue_depth = 16;
  c.aio.intra_op_parallelism = 2;
  c.aio.single_submit = true;
  c.aio.overlap_events = false;
  c.steps_per_print = 7;
  c.wall_clock_breakdown = true;
  c.model.n_layer = 2;
  c.model.n_embd = 96;
  c.model.n_head = 3;
  c.model.vocab_size = 1000;
  c.model.seq_len = 64;
  c.model.arch = "llama";
  c.model.n_kv_head = 1;
  c.model.intermediate_size = 200;
  c.model.rms_norm_eps = 1e-5;
  c.model.rope_theta = 500000;
  c.model.rope_scaling.rope_type = "llama3";
  c.model.rope_scaling.factor = 8;
  c.model.rope_scaling.low_freq_factor = 2;
  c.model.rope_scaling.high_freq_factor = 8;
  c.model.rope_scaling.original_max_position_embeddings = 1024;
  c.model.tie_word_embeddings = true;
  c.model.attention_bias = true;
  c.data.path = "a.bin";
  c.data.format = "tokens";
  c.data.val_path = "b.bin";
  c.data.val_fraction = 0.1;
  c.data.sampling = "sequential";
  c.data.seed = 9;
  c.trainer.steps = 11;
  c.trainer.seed = 12;
  c.trainer.eval_interval = 3;
  c.trainer.eval_batches = 2;
  c.trainer.gpu_assisted_optimizer = "off";
  c.trainer.schedule = "micro-batch-major";
  c.trainer.nvme_checksum = "xxh64";
  c.trainer.save_dtype = "fp32";
  c.trainer.save_max_shard_size = "2GiB";
  return c;
}

// Every value in `defaults` (what ConfigToJson writes for Config{}) has a
// counterpart in `j` that differs, but those at the paths in `same`.
void ExpectEveryValueDiffers(const json& j, const json& defaults, const std::string& path,
                             const std::set<std::string>& same) {
  ASSERT_EQ(j.type(), defaults.type()) << path;
  if (defaults.is_object()) {
    for (auto it = defaults.begin(); it != defaults.end(); ++it) {
      ASSERT_TRUE(j.contains(it.key())) << path << "." << it.key();
      ExpectEveryValueDiffers(j[it.key()], it.value(), path.empty() ? it.key() : path + "." + it.key(), same);
    }
  } else if (defaults.is_array()) {
    ASSERT_EQ(j.size(), defaults.size()) << path;
    for (size_t i = 0; i < j.size(); ++i) ExpectEveryValueDiffers(j[i], defaults[i], path + "." + std::to_string(i), same);
  } else if (!same.count(path)) {
    EXPECT_NE(j, defaults) << path << " has its default value";
  }
}

// What ConfigToJson writes, ParseConfig reads back: field by field (Config's
// operator== compares every member), from a config with every field away
// from its default.
TEST(Config, EveryFieldRoundTripsThroughJson) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    Config c = EveryFieldSet();
    if (bf16) {
      c.fp16.enabled = false;
      c.bf16 = true;
      c.bf16_optimizer_states = true;  // (bf16 training only)
    }
    const json j = ConfigToJson(c);
    ExpectEveryValueDiffers(j, ConfigToJson(Config{}), "",
                            bf16 ? std::set<std::string>{"fp16.enabled"}
                                 : std::set<std::string>{"bf16.enabled", "bf16.bf16_optimizer_states"});
    ASSERT_TRUE(j.contains("scheduler"));  // absent by default (the constant lr)
    for (const optim::LrParamSpec& p : optim::FindLrScheduleSpec("OneCycle")->params)
      EXPECT_TRUE(j["scheduler"]["params"].contains(p.name)) << p.name;

    std::vector<std::string> w;
    ASSERT_OK_AND_ASSIGN(Config back, ParseConfig(j, c.source, c.world_size, &w));
    EXPECT_EQ(ConfigToJson(back).dump(1), j.dump(1));
    EXPECT_EQ(back.source, c.source);
    EXPECT_EQ(back.world_size, c.world_size);
    EXPECT_EQ(back.train_batch_size, c.train_batch_size);
    EXPECT_EQ(back.micro_batch, c.micro_batch);
    EXPECT_EQ(back.grad_accum, c.grad_accum);
    EXPECT_TRUE(back.fp16 == c.fp16);
    EXPECT_EQ(back.bf16, c.bf16);
    EXPECT_EQ(back.bf16_optimizer_states, c.bf16_optimizer_states);
    EXPECT_TRUE(back.optimizer == c.optimizer);
    EXPECT_TRUE(back.scheduler == c.scheduler);
    EXPECT_EQ(back.gradient_clipping, c.gradient_clipping);
    EXPECT_TRUE(back.zero.offload_param == c.zero.offload_param);
    EXPECT_TRUE(back.zero.offload_optimizer == c.zero.offload_optimizer);
    EXPECT_TRUE(back.zero == c.zero);
    EXPECT_TRUE(back.activation_checkpointing == c.activation_checkpointing);
    EXPECT_TRUE(back.aio == c.aio);
    EXPECT_EQ(back.steps_per_print, c.steps_per_print);
    EXPECT_EQ(back.wall_clock_breakdown, c.wall_clock_breakdown);
    EXPECT_TRUE(back.model == c.model);
    EXPECT_TRUE(back.data == c.data);
    EXPECT_TRUE(back.trainer == c.trainer);
    EXPECT_TRUE(back == c);
    // The tuned ZeRO knobs are the one warning.
    ASSERT_EQ(w.size(), 1u);
    EXPECT_THAT(w[0], HasSubstr("accepted, no effect in strata"));
  }
}

// Each scheduler type with every parameter given (kinds only matter here)
// round-trips, and a number keeps the kind it was written with.
TEST(Config, SchedulerParamsRoundTripAsWritten) {
  for (const optim::LrScheduleSpec& spec : optim::LrScheduleSpecs()) {
    SCOPED_TRACE(std::string(spec.name));
    Config c;
    c.scheduler.type = std::string(spec.name);
    int i = 0;
    for (const optim::LrParamSpec& p : spec.params) {
      optim::LrParamValue& v = c.scheduler.params[std::string(p.name)];
      switch (p.kind) {
        case optim::LrParamKind::kNumber: v = ++i % 2 ? optim::LrParamValue(0.25 * i) : int64_t{i}; break;
        case optim::LrParamKind::kSteps: v = ++i % 2 ? optim::LrParamValue(int64_t{100 * i}) : 12.5 * i; break;
        case optim::LrParamKind::kBool: v = false; break;
        case optim::LrParamKind::kWarmupType: v = std::string("linear"); break;
      }
    }
    ASSERT_OK_AND_ASSIGN(Config back, ParseConfig(ConfigToJson(c), "rt", 1, nullptr));
    EXPECT_TRUE(back.scheduler == c.scheduler);
    EXPECT_EQ(ConfigToJson(back), ConfigToJson(c));
  }
  ASSERT_OK_AND_ASSIGN(Config c, Parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10,
      "warmup_min_lr": 0.0, "warmup_max_lr": 5e2, "last_batch_iteration": 10000000000000000000}}})"));
  EXPECT_EQ(c.scheduler.params.at("warmup_num_steps"), optim::LrParamValue(int64_t{10}));
  EXPECT_EQ(c.scheduler.params.at("warmup_max_lr"), optim::LrParamValue(500.0));
  EXPECT_EQ(ConfigToJson(c)["scheduler"].dump(),
            R"({"params":{"last_batch_iteration":10000000000000000000,"warmup_max_lr":500.0,"warmup_min_lr":0.0,)"
            R"("warmup_num_steps":10},"type":"WarmupLR"})");
}

TEST(Config, MissingRequiredSchedulerParamIsAnErrorNamingIt) {
  const std::map<std::string, std::vector<std::string>> required = {
      {"WarmupLR", {}},
      {"WarmupDecayLR", {"total_num_steps"}},
      {"WarmupCosineLR", {"total_num_steps"}},
      {"OneCycle", {"cycle_min_lr", "cycle_max_lr"}},
  };
  for (const auto& [type, names] : required) {
    json all = json::object();
    for (const auto& n : names) all[n] = 5000;
    EXPECT_OK(ParseConfig(WithBatch({{"scheduler", {{"type", type}, {"params", all}}}}), "ds.json", 1, nullptr).status())
        << type;
    for (const auto& n : names) {
      json params = all;
      params.erase(n);
      EXPECT_EQ(Err(json{{"scheduler", {{"type", type}, {"params", params}}}}.dump()),
                "ds.json: scheduler.params." + n + ": required for scheduler " + type);
    }
  }
  EXPECT_EQ(Err(R"({"scheduler": {"type": "OneCycle"}})"),
            "ds.json: scheduler.params.cycle_min_lr: required for scheduler OneCycle");  // the first, in table order
}

// A config file's missing keys mean what they mean to DeepSpeed: the struct
// defaults, which are DeepSpeed's (config.h). A file with only a batch size
// is Config{}.
TEST(Config, AFileWithOnlyABatchSizeIsTheStructDefaults) {
  ASSERT_OK_AND_ASSIGN(Config e, ParseConfig(json{{"train_micro_batch_size_per_gpu", 1}}, "ds.json", 1, nullptr));
  EXPECT_EQ(e.source, "ds.json");
  e.source = Config{}.source;
  EXPECT_TRUE(e == Config{});
}

// The defaults are DeepSpeed's (its code's: constants.py, the ZeRO config's
// fields, torch's Adam), but the two the comments in config.h give.
TEST(Config, DefaultsAreDeepSpeeds) {
  const Config c;
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0);
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.gradient_clipping, 0);  // GRADIENT_CLIPPING_DEFAULT (the docs' table says 1.0)
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(c.grad_accum, 1);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1);
  EXPECT_EQ(c.aio.block_size, 1u << 20);
  EXPECT_EQ(c.aio.queue_depth, 8);
  // strata's: pinned host memory (speed only), and AdamW when there is no
  // optimizer section (DeepSpeed would use the client's).
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c.optimizer.type, "AdamW");
}

// The built-in demo sets GPT training's usual values where they are not
// DeepSpeed's, and only those.
TEST(Config, TheDemoSetsItsOwnValues) {
  Config d = DefaultConfig();
  EXPECT_EQ(d.source, "(built-in default)");
  EXPECT_EQ(d.micro_batch, 8);
  EXPECT_EQ(d.train_batch_size, 8);
  EXPECT_EQ(d.grad_accum, 1);
  EXPECT_EQ(d.optimizer.beta2, 0.95);
  EXPECT_EQ(d.optimizer.weight_decay, 0.1);
  EXPECT_EQ(d.gradient_clipping, 1.0);
  EXPECT_EQ(d.steps_per_print, 5);
  Config back = d;
  back.source = Config{}.source;
  back.train_batch_size = back.micro_batch = 1;
  back.optimizer = OptimizerConfig{};
  back.gradient_clipping = 0;
  back.steps_per_print = 10;
  EXPECT_TRUE(back == Config{});
}

// configs/default.json writes out the built-in demo; its data path is
// relative to its folder.
TEST(Config, DefaultJsonIsTheBuiltInDemo) {
  const std::string path = std::string(STRATA_SOURCE_DIR) + "/configs/default.json";
  ASSERT_OK_AND_ASSIGN(Config c, LoadConfig(path, 1, nullptr));
  EXPECT_EQ(c.data.path, std::string(STRATA_SOURCE_DIR) + "/configs/../data/kjv.txt");
  Config d = DefaultConfig();
  d.source = c.source;
  d.data.path = c.data.path;
  EXPECT_EQ(ConfigToJson(c), ConfigToJson(d));
  EXPECT_TRUE(c == d);
}

// bf16.bf16_optimizer_states (DeepSpeed's key): read under bf16 and its
// alias, written back, and refused without bf16 training.
TEST(Config, Bf16OptimizerStates) {
  ASSERT_OK_AND_ASSIGN(Config a, Parse(R"({"bf16": {"enabled": true, "bf16_optimizer_states": true}})"));
  EXPECT_TRUE(a.bf16_optimizer_states);
  EXPECT_EQ(ConfigToJson(a)["bf16"]["bf16_optimizer_states"], true);
  ASSERT_OK_AND_ASSIGN(Config b, Parse(R"({"bfloat16": {"enabled": true, "bf16_optimizer_states": true}})"));
  EXPECT_TRUE(b.bf16_optimizer_states);
  ASSERT_OK_AND_ASSIGN(Config d, Parse(R"({"bf16": {"enabled": true}})"));
  EXPECT_FALSE(d.bf16_optimizer_states);  // fp32 moments by default
  for (const char* text : {R"({"bf16": {"bf16_optimizer_states": true}})",
                           R"({"bf16": {"enabled": false, "bf16_optimizer_states": true}})",
                           R"({"bfloat16": {"bf16_optimizer_states": true}})"}) {
    SCOPED_TRACE(text);
    ExpectStatus(Parse(text).status(), StatusCode::kInvalidArgument,
                 "bf16.bf16_optimizer_states is true but bf16.enabled is not");
  }
  ExpectStatus(Parse(R"({"bf16": {"enabled": true, "bf16_optimizer_states": 1}})").status(),
               StatusCode::kInvalidArgument, "bf16_optimizer_states");
  // DeepSpeed's bf16 masters would change the arithmetic: refused when on.
  ExpectStatus(Parse(R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true}})").status(),
               StatusCode::kInvalidArgument, "bf16_master_weights_and_grads");
  ASSERT_OK(Parse(R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": false}})").status());
}

}  // namespace
}  // namespace strata
