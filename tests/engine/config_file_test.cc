// SPDX-License-Identifier: Apache-2.0
// A config file at the input boundary (engine/config_json.h, engine/config.h):
// each crash, hang and silent change of the reliability issue as a
// regression test, and the rules that replace them (all errors at once,
// null as the default, paths relative to the file, a model required).
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/config.h"
#include "engine/config_json.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

std::string Write(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string p = dir.File(name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

std::string LoadError(const std::string& path) {
  auto r = LoadConfig(path, 1, nullptr);
  EXPECT_FALSE(r.ok()) << path;
  return r.status().ToString();
}

// Regression: "lr": 1e999 aborted on an uncaught nlohmann out_of_range.
TEST(ConfigFile, ANumberBeyondDoubleIsAnErrorNamingTheKey) {
  TempDir dir;
  const std::string p =
      Write(dir, "big.json", "{\"train_micro_batch_size_per_gpu\": 1,\n \"optimizer\": {\"type\": \"AdamW\", "
                             "\"params\": {\"lr\": 1e999}}}");
  EXPECT_THAT(LoadError(p), AllOf(HasSubstr("InvalidArgument"), HasSubstr(p + ":2:"),
                                  HasSubstr("optimizer.params.lr: the number 1e999 is out of range")));
  const std::string q = Write(dir, "arr.json", "{\"optimizer\": {\"params\": {\"betas\": [0.9, -1e400]}}}");
  EXPECT_THAT(LoadError(q), HasSubstr("optimizer.params.betas[1]: the number -1e400 is out of range"));
}

// Regression: 100,000 nested levels overflowed the stack while the error
// message was built; the depth is bounded where the file is read and where
// a value built in code is parsed.
TEST(ConfigFile, DeepNestingIsAnErrorNotAStackOverflow) {
  TempDir dir;
  std::string deep = "{\"model\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const std::string p = Write(dir, "deep.json", deep);
  EXPECT_THAT(LoadError(p), AllOf(HasSubstr("nested deeper than 64 levels"), HasSubstr("model")));
  json j = json::array();
  for (int i = 0; i < 100000; ++i) j = json::array({std::move(j)});
  json top = {{"train_micro_batch_size_per_gpu", 1}, {"model", std::move(j)}};
  auto r = ParseConfig(top, "code", 1, nullptr);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().ToString(), HasSubstr("nested deeper than 64 levels"));
}

// Regression: --config /dev/zero read forever and ended in bad_alloc; a
// FIFO blocked in open(); a directory was not named as one.
TEST(ConfigFile, OnlyARegularFileOfAFewMegabytesIsRead) {
  TempDir dir;
  EXPECT_THAT(LoadError("/dev/zero"), HasSubstr("/dev/zero: is a character device; a config must be a regular"));
  EXPECT_THAT(LoadError(dir.path()), HasSubstr(dir.path() + ": is a directory"));
  const std::string fifo = dir.File("pipe.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THAT(LoadError(fifo), HasSubstr("is a FIFO"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  const std::string big = Write(dir, "big.json", "{\"a\": \"" + std::string(5 << 20, 'x') + "\"}");
  EXPECT_THAT(LoadError(big), HasSubstr("a config file is at most 4194304 bytes (4 MiB)"));
  auto small = ReadConfigText(big, 100);
  EXPECT_THAT(small, StatusIs(StatusCode::kInvalidArgument));
}

// Regression: duplicate keys took the last value; DeepSpeed refuses them.
TEST(ConfigFile, ADuplicateKeyIsAnErrorNamingBothPositions) {
  TempDir dir;
  const std::string p = Write(dir, "dup.json",
                              "{\n  \"train_micro_batch_size_per_gpu\": 4,\n  \"zero_optimization\": {\"stage\": 2,\n"
                              "    \"stage\": 3}\n}\n");
  EXPECT_THAT(LoadError(p), HasSubstr(p + ":4:5: zero_optimization.stage: duplicate key (first at 3:25)"));
}

// Every error of a file at once, each with its key path; one error is its
// own text (as before).
TEST(ConfigFile, AllErrorsAreReportedTogether) {
  auto r = ParseConfig(json::parse(R"({"train_micro_batch_size_per_gpu": 0, "fp16": {"enabled": "yes"},
                                       "zero_optimization": {"stage": 7, "overlap_com": true},
                                       "steps_per_prnt": 3})"),
                       "ds.json", 1, nullptr);
  ASSERT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  const std::string m(r.status().message());
  EXPECT_EQ(m.rfind("ds.json: train_micro_batch_size_per_gpu: 0 is out of range", 0), 0u) << m;
  EXPECT_THAT(m, AllOf(HasSubstr("\n  ds.json: fp16.enabled: \"yes\" is not allowed"),
                       HasSubstr("\n  ds.json: zero_optimization.stage: 7 is out of range"),
                       HasSubstr("\n  ds.json: zero_optimization.overlap_com: unknown key"),
                       HasSubstr("\n  ds.json: steps_per_prnt: unknown key"), HasSubstr("\n(5 errors)")))
      << m;
  auto one = ParseConfig(json::parse(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 4}})"),
                         "ds.json", 1, nullptr);
  EXPECT_EQ(std::string(one.status().message()),
            "ds.json: zero_optimization.stage: 4 is out of range (allowed: an integer from 0 to 3)");
}

// Regression: a file with no batch size silently trained micro batch 8.
TEST(ConfigFile, ABatchSizeIsRequired) {
  auto r = ParseConfig(json::parse(R"({"gradient_accumulation_steps": 2})"), "ds.json", 1, nullptr);
  ASSERT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("train_batch_size: no batch size: give train_micro_batch_size_per_gpu"));
  // null is DeepSpeed's None: not given.
  auto n = ParseConfig(json::parse(R"({"train_batch_size": null, "train_micro_batch_size_per_gpu": 3,
                                      "gradient_accumulation_steps": null})"),
                       "ds.json", 1, nullptr);
  ASSERT_OK(n.status());
  EXPECT_EQ(n->train_batch_size, 3);
}

// null where DeepSpeed's default is None means the default; elsewhere it is
// a wrong type, named.
TEST(ConfigFile, NullIsTheDefaultWhereDeepSpeedsIsNone) {
  ASSERT_OK_AND_ASSIGN(Config c, ParseConfig(json::parse(R"({"train_micro_batch_size_per_gpu": 1,
      "activation_checkpointing": {"number_checkpoints": null},
      "zero_optimization": {"offload_param": null, "offload_optimizer": {"device": "cpu", "nvme_path": null}},
      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
                                                   "cycle_second_step_size": null}}})"),
                                             "ds.json", 1, nullptr));
  EXPECT_EQ(c.activation_checkpointing.number_checkpoints, 0);
  EXPECT_EQ(c.zero.offload_param.device, "none");
  EXPECT_EQ(c.zero.offload_optimizer.device, "cpu");
  EXPECT_FALSE(c.scheduler.params.count("cycle_second_step_size"));
  auto lr = ParseConfig(json::parse(R"({"train_micro_batch_size_per_gpu": 1,
                                       "optimizer": {"type": "AdamW", "params": {"lr": null}}})"),
                        "ds.json", 1, nullptr);
  EXPECT_THAT(std::string(lr.status().message()), HasSubstr("optimizer.params.lr: null is not a number"));
}

// Regression: a --config without a model silently trained the built-in byte
// model on the bundled text.
TEST(ConfigFile, AConfigWithoutAModelSaysHowToGiveOne) {
  json j = {{"train_micro_batch_size_per_gpu", 2}};
  ConfigSources s;
  s.require_model = true;
  auto r = ParseConfig(j, "ds.json", s, nullptr);
  ASSERT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("no \"model\" section"), HasSubstr("--init-from"), HasSubstr("n_layer")));
  ModelConfig m;
  m.n_layer = 12;
  m.n_embd = 768;
  m.n_head = 12;
  m.vocab_size = 50257;
  m.seq_len = 1024;
  s.model = m;
  ASSERT_OK_AND_ASSIGN(Config c, ParseConfig(j, "ds.json", s, nullptr));
  EXPECT_TRUE(c.model == m);
}

// The model of --init-from weights: the shape from the tensors, the heads
// from the config.json beside them (without one, an error: a guess would
// train another model), the dtype for "auto" precision.
TEST(ConfigFile, TheModelOfHfWeights) {
  TempDir dir;
  const std::string weights = dir.File("model.safetensors");
  // The names and shapes of HF GPT-2 (2 blocks, d 64, 40 positions, vocab
  // 256) in bf16; the values do not matter here.
  std::vector<uint16_t> zeros(256 * 64, 0);
  ASSERT_OK(WriteSafetensors(weights, {{"wte.weight", DType::kBF16, Shape({256, 64}), zeros.data()},
                                       {"wpe.weight", DType::kBF16, Shape({40, 64}), zeros.data()},
                                       {"h.0.ln_1.weight", DType::kBF16, Shape({64}), zeros.data()},
                                       {"h.1.ln_1.weight", DType::kBF16, Shape({64}), zeros.data()}}));
  auto none = ModelFromHfWeights(weights);
  ASSERT_THAT(none, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(none.status().ToString(), HasSubstr("no config.json beside them"));
  std::ofstream(dir.File("config.json")) << R"({"model_type": "gpt2", "n_head": 4, "n_embd": 64})";
  ASSERT_OK_AND_ASSIGN(WeightsModel w, ModelFromHfWeights(weights));
  EXPECT_EQ(w.model.n_layer, 2);
  EXPECT_EQ(w.model.n_embd, 64);
  EXPECT_EQ(w.model.n_head, 4);
  EXPECT_EQ(w.model.vocab_size, 256);
  EXPECT_EQ(w.model.seq_len, 40);
  EXPECT_THAT(w.n_head_from, HasSubstr("config.json (n_head)"));
  EXPECT_EQ(w.dtype, "bf16");
}

// data.path and the other paths in a file are relative to its folder.
TEST(ConfigFile, PathsAreRelativeToTheFilesFolder) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.File("sub").c_str(), 0700), 0);
  const std::string p =
      Write(dir, "sub/ds.json", R"({"train_micro_batch_size_per_gpu": 1,
        "data": {"path": "train.bin", "val_path": "/abs/val.bin"},
        "zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "nvme"}}})");
  ASSERT_OK_AND_ASSIGN(Config c, LoadConfig(p, 1, nullptr));
  EXPECT_EQ(c.data.path, dir.File("sub/train.bin"));
  EXPECT_EQ(c.data.val_path, "/abs/val.bin");
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, dir.File("sub/nvme"));
}

// A UTF-8 BOM is skipped; invalid UTF-8 is an error whose message stays
// printable; an error message never prints a whole large value.
TEST(ConfigFile, BomsInvalidUtf8AndLargeValuesInMessages) {
  TempDir dir;
  const std::string bom = Write(dir, "bom.json", "\xEF\xBB\xBF{\"train_micro_batch_size_per_gpu\": 2}");
  ASSERT_OK(LoadConfig(bom, 1, nullptr).status());
  const std::string bad = Write(dir, "bad.json", "{\"data\": {\"path\": \"a\xFF\xFE\"}}");
  const std::string e = LoadError(bad);
  EXPECT_THAT(e, AllOf(HasSubstr("not valid JSON"), HasSubstr("\\xFF")));
  EXPECT_TRUE(IsUtf8(e));
  json huge = {{"train_micro_batch_size_per_gpu", 1}, {"steps_per_print", std::string(1 << 20, 'y')}};
  auto r = ParseConfig(huge, "ds.json", 1, nullptr);
  EXPECT_LT(r.status().ToString().size(), 300u);
}

}  // namespace
}  // namespace strata
