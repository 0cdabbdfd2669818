// SPDX-License-Identifier: Apache-2.0
// --init-from a Hugging Face Llama directory (tests/data/llama_tiny_hf, as
// transformers 5 saved it, and the same model with transformers 4's
// config.json): the sequence length the source's config.json allows
// (max_position_embeddings: taken without a model section, a shorter
// model.seq_len kept, a longer one an error naming both), and the step
// directory's config.json keeping the source's RoPE style and keys, so the
// model round-trips without its config changing shape.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "engine/model_config.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::FileBytes;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;
using nlohmann::json;

std::string Fixture() { return ::strata::testing::SourcePath("tests/data/llama_tiny_hf"); }

// The fixture's model as a config section: 2 layers, d 64, 4 heads / 2 KV
// heads, SwiGLU 176, vocabulary 256, untied; `seq_len` positions.
TrainOptions FromFixture(const std::string& dir, int seq_len) {
  TrainOptions o = testing::TinyTrainer(2, 64, seq_len);
  Config& c = o.config;
  c.source = "test.json";
  c.model.arch = "LlamaForCausalLM";
  c.model.n_kv_head = 2;
  c.model.intermediate_size = 176;
  c.model.rms_norm_eps = 1e-5;
  c.bf16 = true;
  o.init_from = dir;
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.gpu_memory_limit = 256 * kMiB;
  o.host_memory_limit = 256 * kMiB;
  return o;
}

json ReadJson(const std::string& path) { return json::parse(FileBytes(path)); }

std::set<std::string> Keys(const json& j) {
  std::set<std::string> k;
  for (auto it = j.begin(); it != j.end(); ++it) k.insert(it.key());
  return k;
}

TEST(InitFromSeqLen, WithoutAModelSectionItIsMaxPositionEmbeddings) {
  ASSERT_OK_AND_ASSIGN(WeightsModel w, ModelFromHfWeights(Fixture()));
  EXPECT_TRUE(w.from_config_json);
  EXPECT_EQ(w.model.seq_len, 32);  // the fixture's max_position_embeddings
}

TEST(InitFromSeqLen, AShorterOneIsKeptALongerOneIsAnErrorNamingBoth) {
  for (int seq : {16, 32}) {
    TrainOptions o = FromFixture(Fixture(), seq);
    EXPECT_OK(CheckSeqLenWithinSource(o.config, o.init_from)) << seq;
  }
  TrainOptions o = FromFixture(Fixture(), 64);
  const Status s = CheckSeqLenWithinSource(o.config, o.init_from);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  for (const char* part : {"test.json: model.seq_len 64", "max_position_embeddings 32", "llama_tiny_hf/config.json"})
    EXPECT_THAT(std::string(s.message()), HasSubstr(part));
  // The run and --dry-run stop on it before anything is loaded.
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().ToString(), HasSubstr("model.seq_len 64 is longer than the --init-from model's "
                                               "max_position_embeddings 32"));
  EXPECT_THAT(Trainer::DryRun(o).status().ToString(), HasSubstr("max_position_embeddings 32"));
  // A shorter one trains.
  ASSERT_OK_AND_ASSIGN(auto ok, Trainer::Create(FromFixture(Fixture(), 16), log));
  ASSERT_OK_AND_ASSIGN(StepReport r, ok->Step());
  EXPECT_TRUE(std::isfinite(r.loss));
}

TEST(InitFromSeqLen, GptNPositionsToo) {
  TempDir dir;
  std::ofstream(dir.File("config.json")) << R"({"architectures": ["GPT2LMHeadModel"], "n_positions": 64})";
  TrainOptions o = testing::TinyTrainer(2, 64, 128);
  o.init_from = dir.File("model.safetensors");  // (a file in the directory: its config.json is read)
  const Status s = CheckSeqLenWithinSource(o.config, o.init_from);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.seq_len 128 is longer than the --init-from model's n_positions 64"));
  o.config.model.seq_len = 64;
  EXPECT_OK(CheckSeqLenWithinSource(o.config, o.init_from));
}

// The fixture's directory with a transformers 4 config.json: top-level
// rope_theta and rope_scaling, torch_dtype, no rope_parameters.
std::string Transformers4Copy(const TempDir& dir) {
  for (const auto& e : fs::directory_iterator(Fixture()))
    fs::copy_file(e.path(), dir.path() + "/" + e.path().filename().string());
  json c = ReadJson(Fixture() + "/config.json");
  c["rope_theta"] = c["rope_parameters"]["rope_theta"];
  c["rope_scaling"] = nullptr;
  c.erase("rope_parameters");
  c["torch_dtype"] = c["dtype"];
  c.erase("dtype");
  c["transformers_version"] = "4.46.0";
  std::ofstream(dir.File("config.json"), std::ios::trunc) << c.dump(2);
  return dir.path();
}

// One step from `source`, saved: the step directory's config.json.
json SavedConfig(const std::string& source) {
  std::ostringstream log;
  auto t = Trainer::Create(FromFixture(source, 32), log);
  EXPECT_OK(t.status());
  if (!t.ok()) return json();
  EXPECT_OK((*t)->Step().status());
  TempDir out;
  EXPECT_OK((*t)->Save(out.path()));
  return ReadJson(out.path() + "/step-000001/config.json");
}

TEST(InitFromRopeStyle, Transformers5KeepsRopeParameters) {
  const json src = ReadJson(Fixture() + "/config.json");
  const json c = SavedConfig(Fixture());
  EXPECT_EQ(Keys(c), Keys(src));  // the same fields: no rope_theta / rope_scaling / torch_dtype added
  EXPECT_EQ(c.at("rope_parameters"), src.at("rope_parameters"));
  EXPECT_FALSE(c.contains("rope_theta"));
  EXPECT_FALSE(c.contains("rope_scaling"));
  EXPECT_EQ(c.at("dtype"), "bfloat16");
  EXPECT_EQ(c.at("max_position_embeddings"), 32);
}

TEST(InitFromRopeStyle, Transformers4KeepsRopeThetaAndRopeScaling) {
  TempDir dir;
  const std::string source = Transformers4Copy(dir);
  const json src = ReadJson(source + "/config.json");
  const json c = SavedConfig(source);
  EXPECT_EQ(Keys(c), Keys(src));  // no rope_parameters or dtype added
  EXPECT_FALSE(c.contains("rope_parameters"));
  EXPECT_DOUBLE_EQ(c.at("rope_theta").get<double>(), 10000.0);
  EXPECT_TRUE(c.at("rope_scaling").is_null());
  EXPECT_EQ(c.at("torch_dtype"), "bfloat16");
  // Without a rope_scaling key in the source, none is added for the default RoPE.
  json no_scaling = src;
  no_scaling.erase("rope_scaling");
  std::ofstream(dir.File("config.json"), std::ios::trunc) << no_scaling.dump(2);
  const json d = SavedConfig(source);
  EXPECT_EQ(Keys(d), Keys(no_scaling));
  EXPECT_FALSE(d.contains("rope_scaling"));
}

}  // namespace
}  // namespace strata
