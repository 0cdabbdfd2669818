#include "engine/config.h"

#include <fstream>
#include <map>

#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using json = nlohmann::json;

Result<Config> Parse(const std::string& text, std::vector<std::string>* warnings = nullptr, int world = 1) {
  return ParseConfig(json::parse(text), "ds.json", world, warnings);
}

std::string Err(const std::string& text, int world = 1) {
  auto r = Parse(text, nullptr, world);
  EXPECT_FALSE(r.ok()) << text;
  return std::string(r.status().message());
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
  EXPECT_EQ(c.zero.param_persistence_threshold, 100'000u);  // "auto" keeps the default
  EXPECT_EQ(c.aio.intra_op_parallelism, 2);
  EXPECT_TRUE(c.activation_checkpointing.cpu_checkpointing);
  EXPECT_EQ(c.model.vocab_size, 50257);
  // One warning per ignored DeepSpeed key, each naming it.
  ASSERT_EQ(warnings.size(), 4u);
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
  ASSERT_OK_AND_ASSIGN(Config d, Parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto"})"));
  EXPECT_EQ(d.train_batch_size, 2);
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

// DeepSpeed's fetch-heuristic and communication knobs are checked, but the
// planner decides what they decide there: one warning names those set away
// from DeepSpeed's default, as written; defaults say nothing.
TEST(Config, TuningKnobsThePlannerSupersedesWarnOnce) {
  std::vector<std::string> w;
  ASSERT_OK(Parse(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e8,
                      "max_reuse_distance": 1e9, "stage3_param_persistence_threshold": 1e6,
                      "reduce_bucket_size": 2e8, "overlap_comm": false}})", &w).status());
  ASSERT_EQ(w.size(), 1u);
  EXPECT_THAT(w[0], HasSubstr("zero_optimization.stage3_prefetch_bucket_size, "
                              "zero_optimization.stage3_param_persistence_threshold, "
                              "zero_optimization.reduce_bucket_size, zero_optimization.overlap_comm: "
                              "accepted, no effect in strata"));
  EXPECT_THAT(w[0], ::testing::Not(HasSubstr("max_reuse_distance")));  // 1e9 is DeepSpeed's default
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

// DefaultConfig() is the struct defaults under its own name, and so is an
// empty config file: neither has a copy of the defaults of its own.
TEST(Config, DefaultConfigIsTheStructDefaults) {
  Config d = DefaultConfig();
  EXPECT_EQ(d.source, "(built-in default)");  // the one deliberate difference
  d.source = Config{}.source;
  EXPECT_TRUE(d == Config{});
  EXPECT_EQ(ConfigToJson(DefaultConfig()), ConfigToJson(Config{}));
  ASSERT_OK_AND_ASSIGN(Config e, Parse("{}"));
  EXPECT_EQ(e.source, "ds.json");
  e.source = Config{}.source;
  EXPECT_TRUE(e == Config{});
}

// The defaults that are not DeepSpeed's, as they are (config.h says why).
TEST(Config, DefaultsThatAreNotDeepSpeeds) {
  const Config c;
  EXPECT_EQ(c.micro_batch, 8);  // DeepSpeed requires a batch size
  EXPECT_EQ(c.grad_accum, 1);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.optimizer.beta2, 0.95);  // DeepSpeed: 0.999
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);  // DeepSpeed: 0
  EXPECT_EQ(c.gradient_clipping, 1.0);  // DeepSpeed: 0
  EXPECT_EQ(c.steps_per_print, 5);  // DeepSpeed: 10
}

// configs/default.json writes out the built-in demo (with the corpus's path).
TEST(Config, DefaultJsonIsTheBuiltInDemo) {
  ASSERT_OK_AND_ASSIGN(Config c, LoadConfig(std::string(STRATA_SOURCE_DIR) + "/configs/default.json", 1, nullptr));
  EXPECT_EQ(c.data.path, "data/kjv.txt");
  Config d = DefaultConfig();
  d.source = c.source;
  d.data.path = c.data.path;
  EXPECT_EQ(ConfigToJson(c), ConfigToJson(d));
  EXPECT_TRUE(c == d);
}

}  // namespace
}  // namespace strata
