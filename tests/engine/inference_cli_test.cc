// SPDX-License-Identifier: Apache-2.0
// strata generate and strata eval as a user runs them: a model trained and
// saved by strata train; eval prints the val loss the trainer printed for
// the same file and windows; generate streams the prompt and its
// continuation, the same for a seed and other for another, and runs a
// Hugging Face Llama directory; bad arguments are
// errors (exit 2) that name the argument.
#include <cmath>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/engine/strata_cli.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::RunStrata;
using ::strata::testing::StrataRun;
using ::testing::HasSubstr;

class InferenceCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new ::strata::testing::TempDir();
    const std::string text = ::strata::testing::FileBytes(::strata::testing::SourcePath("data/kjv.txt"));
    std::ofstream(tmp_->File("val.txt"), std::ios::binary) << text.substr(100000, 4000);
    std::ofstream(tmp_->File("cfg.json"))
        << R"({"train_micro_batch_size_per_gpu": 2, "model": {"n_layer": 2, "n_embd": 64, "n_head": 4,
              "vocab_size": 256, "seq_len": 64}, "trainer": {"steps": 20, "eval_batches": 3},
              "data": {"val_path": ")" << tmp_->File("val.txt") << R"("}})";
    train_ = new StrataRun(RunStrata({"train", "--config", tmp_->File("cfg.json"), "--data",
                                      ::strata::testing::SourcePath("data/kjv.txt"), "--save", tmp_->File("save"),
                                      "--backend", "cpu", "--threads", "2"},
                                     120));
  }
  static void TearDownTestSuite() {
    delete train_;
    delete tmp_;
  }
  void SetUp() override { ASSERT_EQ(train_->rc, 0) << train_->output; }
  static std::string Model() { return tmp_->File("save"); }

  static ::strata::testing::TempDir* tmp_;
  static StrataRun* train_;
};
::strata::testing::TempDir* InferenceCli::tmp_ = nullptr;
StrataRun* InferenceCli::train_ = nullptr;

std::string Match(const std::string& text, const std::string& re) {
  std::smatch m;
  return std::regex_search(text, m, std::regex(re)) ? m[1].str() : "";
}

TEST_F(InferenceCli, EvalPrintsTheTrainersValLoss) {
  const std::string trained = Match(train_->output, R"(step 20 \| val loss ([0-9.]+))");
  ASSERT_FALSE(trained.empty()) << train_->output;
  const StrataRun e = RunStrata({"eval", "--model", Model(), "--data", tmp_->File("val.txt"), "--backend", "cpu"});
  ASSERT_EQ(e.rc, 0) << e.output;
  EXPECT_EQ(Match(e.output, R"(val loss ([0-9.]+) \|)"), trained) << e.output;
  EXPECT_THAT(e.output, HasSubstr("3 batches of 2 x 64 tokens"));
  const std::string ppl = Match(e.output, R"(perplexity ([0-9.]+))");
  ASSERT_FALSE(ppl.empty()) << e.output;
  EXPECT_NEAR(std::stod(ppl), std::exp(std::stod(trained)), 0.01 * std::stod(ppl));
}

TEST_F(InferenceCli, GenerateStreamsTheSameTextForASeed) {
  auto gen = [&](const std::string& seed) {
    return RunStrata({"generate", "--model", Model(), "--prompt", "In the beginning", "--max-new-tokens", "30", "--seed",
                      seed, "--backend", "cpu", "--top-k", "20"});
  };
  const StrataRun a = gen("1"), b = gen("1"), c = gen("2");
  ASSERT_EQ(a.rc, 0) << a.output;
  EXPECT_EQ(a.output.rfind("In the beginning", 0), 0u) << a.output;
  EXPECT_THAT(a.output, HasSubstr("30 new tokens"));
  auto text = [](const std::string& out) { return out.substr(0, out.find("\ngenerate: ")); };
  EXPECT_EQ(text(a.output), text(b.output));
  EXPECT_NE(text(a.output), text(c.output));
  EXPECT_EQ(text(a.output).size(), std::string("In the beginning").size() + 30);
  // Ids in, ids out, one per line.
  const StrataRun ids = RunStrata({"generate", "--model", Model(), "--tokens", "73,110", "--max-new-tokens", "4",
                                   "--print-ids", "--temperature", "0", "--backend", "cpu"});
  ASSERT_EQ(ids.rc, 0) << ids.output;
  EXPECT_TRUE(std::regex_search(ids.output, std::regex(R"(^(\d+\n){4}generate: )"))) << ids.output;
}

// A Hugging Face LlamaForCausalLM directory (sharded bf16 weights, untied
// head, GQA): greedy ids from --tokens, the same run to run.
TEST(InferenceCliLlama, GenerateRunsAHuggingFaceLlamaDirectory) {
  auto gen = [] {
    return RunStrata({"generate", "--model", ::strata::testing::SourcePath("tests/data/llama_tiny_hf"), "--tokens",
                      "1,17,42,99", "--max-new-tokens", "8", "--print-ids", "--temperature", "0", "--backend", "cpu"});
  };
  const StrataRun a = gen(), b = gen();
  ASSERT_EQ(a.rc, 0) << a.output;
  EXPECT_TRUE(std::regex_search(a.output, std::regex(R"(^(\d+\n){8}generate: )"))) << a.output;
  EXPECT_EQ(a.output.substr(0, a.output.find("generate: ")), b.output.substr(0, b.output.find("generate: ")));
}

TEST_F(InferenceCli, BadArgumentsAreNamed) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::string m = Model();
  const std::vector<Case> cases = {
      {{"generate", "--prompt", "x"}, "--model DIR is required"},
      {{"generate", "--model", m}, "--prompt TEXT, --prompt-file FILE or --tokens IDS"},
      {{"generate", "--model", m, "--prompt", "x", "--tokens", "1"}, "exclude each other"},
      {{"generate", "--model", m, "--prompt", "x", "--max-new-tokens", "0"}, "--max-new-tokens 0"},
      {{"generate", "--model", m, "--prompt", "x", "--max-new-tokens", "64"}, "--max-new-tokens 64: the prompt's 1 tokens leave 63"},
      {{"generate", "--model", m, "--tokens", "1,x"}, "--tokens: \"x\" is not a token id"},
      {{"generate", "--model", m, "--tokens", "256"}, "--tokens: 256 is outside the model's vocabulary [0, 256)"},
      {{"generate", "--model", m, "--prompt", "x", "--top-p", "2"}, "--top-p"},
      {{"generate", "--model", m, "--prompt", "x", "--temperature", "-1"}, "--temperature"},
      {{"generate", "--model", m, "--prompt", "x", "--dtype", "fp8"}, "--dtype \"fp8\""},
      {{"generate", "--model", m, "--prompt", "x", "--temprature", "0"}, "did you mean --temperature?"},
      {{"generate", "--model", tmp_->File("none"), "--prompt", "x"}, "--model"},
      {{"eval", "--model", m}, "--data FILE is required"},
      {{"eval", "--model", m, "--data", tmp_->File("val.txt"), "--batches", "0"}, "--batches 0"},
      {{"eval", "--model", m, "--data", tmp_->File("val.txt"), "--seq", "65"}, "--seq 65"},
      {{"eval", "--model", m, "--data", tmp_->File("missing.txt")}, "--data"},
      {{"eval", "--model", m, "--dat", "x"}, "did you mean --data?"},
      {{"generat"}, "did you mean 'generate'?"},
  };
  for (const Case& c : cases) {
    const StrataRun r = RunStrata(c.args);
    std::string cmd;
    for (const auto& a : c.args) cmd += a + " ";
    EXPECT_NE(r.rc, 0) << cmd;
    if (c.says != "--model" && c.says != "--data") {
      EXPECT_EQ(r.rc, 2) << cmd << "\n" << r.output;
    }
    EXPECT_THAT(r.output, HasSubstr(c.says)) << cmd;
  }
}

}  // namespace
}  // namespace strata
