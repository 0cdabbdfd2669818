// SPDX-License-Identifier: Apache-2.0
// Hugging Face model directories in: the reader (engine/hf_weights.h) on the
// tiny Llama that save_pretrained sharded (tests/data/llama_tiny_hf: names,
// shapes, dtypes and values against the reference's parameters) and on
// GPT-2 shaped directories these tests write (one file or shards; bf16,
// fp16, fp32), the trainer initialized from them (--init-from; resident, and
// streamed into host and NVMe homes), and the
// errors: a missing or unexpected tensor, a wrong shape or dtype, a
// truncated shard, an index naming a missing file, each naming the file and
// the tensor.
#include "engine/hf_weights.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "base/half.h"
#include "engine/model_config.h"
#include "engine/trainer.h"
#include "models/gpt2.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

// ---- the tiny Llama of save_pretrained ------------------------------------------

TEST(HfWeights, ReadsTheShardedLlamaDirectory) {
  const std::string dir = testing::SourcePath("tests/data/llama_tiny_hf");
  ASSERT_OK_AND_ASSIGN(HfWeights w, HfWeights::Open(dir));
  EXPECT_EQ(w.index_path(), dir + "/model.safetensors.index.json");
  ASSERT_EQ(w.files().size(), 5u);
  EXPECT_EQ(w.files()[0], dir + "/model-00001-of-00005.safetensors");
  // Every tensor of the index, in the file it names, as the config's shape says.
  const nlohmann::json index = nlohmann::json::parse(testing::FileBytes(w.index_path()));
  const nlohmann::json& map = index["weight_map"];
  ASSERT_EQ(w.tensors().size(), map.size());
  ASSERT_EQ(w.tensors().size(), 2u + 2u * 9u + 1u);  // embed, lm_head, 9 per layer, norm
  for (auto it = map.begin(); it != map.end(); ++it) {
    const HfTensor* t = w.Find(it.key());
    ASSERT_NE(t, nullptr) << it.key();
    EXPECT_EQ(t->file, dir + "/" + it.value().get<std::string>());
    EXPECT_EQ(t->entry.dtype, DType::kBF16) << it.key();
  }
  // d 64, 4 heads of 16, 2 key/value heads, FFN 176, vocabulary 256.
  const std::vector<std::pair<std::string, Shape>> shapes = {
      {"model.embed_tokens.weight", Shape{256, 64}},
      {"lm_head.weight", Shape{256, 64}},
      {"model.norm.weight", Shape{64}},
      {"model.layers.1.self_attn.q_proj.weight", Shape{64, 64}},
      {"model.layers.1.self_attn.k_proj.weight", Shape{32, 64}},
      {"model.layers.1.self_attn.v_proj.weight", Shape{32, 64}},
      {"model.layers.1.self_attn.o_proj.weight", Shape{64, 64}},
      {"model.layers.0.mlp.gate_proj.weight", Shape{176, 64}},
      {"model.layers.0.mlp.up_proj.weight", Shape{176, 64}},
      {"model.layers.0.mlp.down_proj.weight", Shape{64, 176}},
      {"model.layers.0.input_layernorm.weight", Shape{64}},
      {"model.layers.0.post_attention_layernorm.weight", Shape{64}},
  };
  for (const auto& [name, shape] : shapes) {
    const HfTensor* t = w.Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->entry.shape, shape) << name;
  }
  EXPECT_EQ(w.Find("model.layers.2.mlp.up_proj.weight"), nullptr);
}

// The directory holds the reference's parameters rounded to bf16.
TEST(HfWeights, TheLlamaDirectoryHoldsTheReferencesParametersInBf16) {
  ASSERT_OK_AND_ASSIGN(HfWeights w, HfWeights::Open(testing::SourcePath("tests/data/llama_tiny_hf")));
  ASSERT_OK_AND_ASSIGN(SafetensorsFile ref,
                       SafetensorsFile::Open(testing::SourcePath("tests/data/llama_tiny_ref.safetensors")));
  size_t checked = 0, exact = 0;
  for (const auto& [name, t] : w.tensors()) {
    ASSERT_OK_AND_ASSIGN(std::vector<double> want, ref.ReadF64("param." + name));
    std::vector<float> got(static_cast<size_t>(t.entry.shape.numel()));
    ASSERT_OK(w.ReadF32Into(t, got));
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      // Within bf16's rounding (half an ulp: 2^-9 relative), and nearly always
      // the float's bf16 (rounding f64 -> bf16 directly can differ at a tie).
      ASSERT_NEAR(got[i], want[i], std::abs(want[i]) * 0x1p-8 + 1e-30) << name << "[" << i << "]";
      exact += got[i] == BF16ToFloat(FloatToBF16(static_cast<float>(want[i])));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 125248u);  // the index's total_parameters
  EXPECT_GE(exact, checked - checked / 1000);
}

// ---- GPT-2 shaped directories written here ---------------------------------------

struct NamedValues {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The tiny trainer's GPT-2 (2 layers, d 64, 4 heads, 256 tokens, 32 positions):
// every parameter with values from `seed`.
std::vector<NamedValues> Gpt2Tensors(uint64_t seed) {
  models::GptConfig g;
  g.n_layer = 2;
  g.n_embd = 64;
  g.n_head = 4;
  g.vocab_size = 256;
  g.seq_len = 32;
  auto spec = models::Gpt2Spec(g);
  EXPECT_OK(spec.status());
  std::vector<NamedValues> out;
  for (const models::ParamSpec& p : spec->params)
    out.push_back({p.name, p.shape, testing::RandomFloats(static_cast<size_t>(p.numel), seed++, -0.2f, 0.2f)});
  return out;
}

std::vector<uint8_t> Encode(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> out(v.size() * DTypeSize(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? FloatToBF16(v[i]) : FloatToHalf(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

float RoundTo(float x, DType dtype) {
  if (dtype == DType::kBF16) return BF16ToFloat(FloatToBF16(x));
  if (dtype == DType::kF16) return HalfToFloat(FloatToHalf(x));
  return x;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// A model directory as save_pretrained writes one: config.json and one
// model.safetensors (shards == 1) or `shards` files with the index.
void WriteHfDir(const std::string& dir, const std::vector<NamedValues>& tensors, DType dtype, int shards) {
  fs::create_directories(dir);
  WriteText(dir + "/config.json", R"({"model_type": "gpt2", "n_head": 4, "architectures": ["GPT2LMHeadModel"]})");
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  const size_t per = (tensors.size() + static_cast<size_t>(shards) - 1) / static_cast<size_t>(shards);
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    const std::string file = shards == 1 ? "model.safetensors" : name;
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<HostTensor> host;
    for (size_t i = per * static_cast<size_t>(s); i < std::min(tensors.size(), per * (s + 1)); ++i) {
      bytes.push_back(Encode(tensors[i].values, dtype));
      host.push_back({tensors[i].name, dtype, Shape(std::span<const int64_t>(tensors[i].shape)), nullptr});
      weight_map[tensors[i].name] = file;
      total += bytes.back().size();
    }
    for (size_t i = 0; i < host.size(); ++i) host[i].data = bytes[i].data();
    ASSERT_OK(WriteSafetensors(dir + "/" + file, host, {{"format", "pt"}}));
  }
  if (shards > 1)
    WriteText(dir + "/model.safetensors.index.json",
              nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2));
}

TrainOptions Tiny() {
  TrainOptions o = testing::TinyTrainer(2);
  o.steps = 1;
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.gpu_memory_limit = 256 * kMiB;
  o.host_memory_limit = 256 * kMiB;
  return o;
}

Result<std::unique_ptr<Trainer>> TrainerFrom(const std::string& init_from) {
  TrainOptions o = Tiny();
  o.init_from = init_from;
  std::ostringstream log;
  return Trainer::Create(o, log);
}

struct DirCase {
  DType dtype;
  int shards;
};

class HfInit : public ::testing::TestWithParam<DirCase> {};

// Every parameter is the file's value (converted from its dtype), from one
// file or from shards alike; the model's shape is read off the directory.
TEST_P(HfInit, TheTrainerStartsFromTheDirectorysValues) {
  TempDir tmp;
  const std::vector<NamedValues> tensors = Gpt2Tensors(7);
  const std::string dir = tmp.File("gpt2");
  WriteHfDir(dir, tensors, GetParam().dtype, GetParam().shards);
  ASSERT_OK_AND_ASSIGN(HfWeights w, HfWeights::Open(dir));
  EXPECT_EQ(w.files().size(), static_cast<size_t>(GetParam().shards));
  EXPECT_EQ(w.index_path().empty(), GetParam().shards == 1);

  ASSERT_OK_AND_ASSIGN(WeightsModel m, ModelFromHfWeights(dir));
  EXPECT_EQ(m.model.n_layer, 2);
  EXPECT_EQ(m.model.n_embd, 64);
  EXPECT_EQ(m.model.n_head, 4);
  EXPECT_EQ(m.model.vocab_size, 256);
  EXPECT_EQ(m.model.seq_len, 32);
  EXPECT_EQ(m.dtype, GetParam().dtype == DType::kBF16 ? "bf16" : GetParam().dtype == DType::kF16 ? "fp16" : "fp32");

  ASSERT_OK_AND_ASSIGN(auto t, TrainerFrom(dir));
  for (const NamedValues& nv : tensors) {
    ASSERT_OK_AND_ASSIGN(std::vector<float> got, t->Parameter(nv.name));
    ASSERT_EQ(got.size(), nv.values.size()) << nv.name;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], RoundTo(nv.values[i], GetParam().dtype)) << nv.name << "[" << i << "]";
  }
  ASSERT_OK(t->Step().status());  // and it trains from there
}

INSTANTIATE_TEST_SUITE_P(DTypesAndShards, HfInit,
                         ::testing::Values(DirCase{DType::kF32, 1}, DirCase{DType::kBF16, 1},
                                           DirCase{DType::kF16, 1}, DirCase{DType::kF32, 3},
                                           DirCase{DType::kBF16, 4}, DirCase{DType::kF16, 2}),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param.dtype)) + "_" +
                                  std::to_string(info.param.shards) + "files";
                         });

// With the optimizer state and the blocks' parameters offloaded (host, or
// NVMe), the weights stream into their homes: the same values, and the GPU
// tier's peak is below an all-resident run's by more than the moments
// (8 bytes a parameter): the fp32 state never went through the GPU.
TEST(HfInitOffloaded, TheWeightsStreamIntoHostAndNvmeHomes) {
  TempDir tmp;
  const std::vector<NamedValues> tensors = Gpt2Tensors(11);
  WriteHfDir(tmp.File("m"), tensors, DType::kBF16, 3);
  uint64_t numel = 0;
  for (const NamedValues& nv : tensors) numel += nv.values.size();
  uint64_t resident_peak = 0;
  {
    ASSERT_OK_AND_ASSIGN(auto t, TrainerFrom(tmp.File("m")));
    resident_peak = t->Info().gpu_tier_peak;
  }
  for (const char* device : {"cpu", "nvme"}) {
    SCOPED_TRACE(device);
    TrainOptions o = Tiny();
    o.init_from = tmp.File("m");
    for (OffloadConfig* off : {&o.config.zero.offload_param, &o.config.zero.offload_optimizer}) {
      off->device = device;
      off->nvme_path = tmp.path();
    }
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    EXPECT_EQ(t->Info().optimizer_gpu_shards, 0);
    EXPECT_LT(t->Info().gpu_tier_peak + 8 * numel, resident_peak);
    for (const NamedValues& nv : tensors) {
      ASSERT_OK_AND_ASSIGN(std::vector<float> got, t->Parameter(nv.name));
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], RoundTo(nv.values[i], DType::kBF16)) << nv.name;
    }
    ASSERT_OK(t->Step().status());
  }
}

// GPT-2's saved attention masks and a tied head's lm_head.weight are not
// parameters but are no error either.
TEST(HfInitErrors, SavedBuffersAndATiedHeadAreSkipped) {
  TempDir tmp;
  std::vector<NamedValues> tensors = Gpt2Tensors(3);
  tensors.push_back({"transformer.h.0.attn.bias", {1, 1, 32, 32}, std::vector<float>(1024, 1.f)});
  tensors.push_back({"lm_head.weight", {256, 64}, tensors[0].values});
  WriteHfDir(tmp.File("m"), tensors, DType::kBF16, 2);
  EXPECT_OK(TrainerFrom(tmp.File("m")).status());
}

TEST(HfInitErrors, AMissingTensorNamesItAndTheIndex) {
  TempDir tmp;
  std::vector<NamedValues> tensors = Gpt2Tensors(3);
  tensors.erase(tensors.begin() + 5);
  const std::string missing = Gpt2Tensors(3)[5].name;
  WriteHfDir(tmp.File("m"), tensors, DType::kBF16, 3);
  auto t = TrainerFrom(tmp.File("m"));
  EXPECT_THAT(t, StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(t.status().ToString(), AllOf(HasSubstr(missing), HasSubstr("model.safetensors.index.json")));
}

TEST(HfInitErrors, AnUnexpectedTensorNamesItAndItsFile) {
  TempDir tmp;
  std::vector<NamedValues> tensors = Gpt2Tensors(3);
  tensors.push_back({"transformer.h.2.ln_1.weight", {64}, std::vector<float>(64, 1.f)});  // a third layer
  WriteHfDir(tmp.File("m"), tensors, DType::kF32, 2);
  auto t = TrainerFrom(tmp.File("m"));
  EXPECT_THAT(t, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(t.status().ToString(),
              AllOf(HasSubstr("transformer.h.2.ln_1.weight"), HasSubstr("model-00002-of-00002.safetensors"),
                    HasSubstr("not a parameter")));
}

TEST(HfInitErrors, AWrongShapeOrDtypeNamesTheTensorAndItsFile) {
  TempDir tmp;
  std::vector<NamedValues> tensors = Gpt2Tensors(3);
  tensors[4].shape = {tensors[4].shape[0] * 2, tensors[4].shape[1] / 2};
  WriteHfDir(tmp.File("shape"), tensors, DType::kBF16, 2);
  auto t = TrainerFrom(tmp.File("shape"));
  EXPECT_THAT(t, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(t.status().ToString(),
              AllOf(HasSubstr(tensors[4].name), HasSubstr("model-00001-of-00002.safetensors"), HasSubstr("shape")));

  // An integer tensor where a weight belongs.
  tensors = Gpt2Tensors(3);
  const std::string dir = tmp.File("dtype");
  WriteHfDir(dir, tensors, DType::kF32, 1);
  std::vector<HostTensor> host;
  std::vector<std::vector<int32_t>> ints;
  for (const NamedValues& nv : tensors) ints.emplace_back(nv.values.size(), 1);
  for (size_t i = 0; i < tensors.size(); ++i)
    host.push_back({tensors[i].name, i == 2 ? DType::kI32 : DType::kF32,
                    Shape(std::span<const int64_t>(tensors[i].shape)),
                    i == 2 ? static_cast<const void*>(ints[i].data()) : tensors[i].values.data()});
  ASSERT_OK(WriteSafetensors(dir + "/model.safetensors", host));
  t = TrainerFrom(dir);
  EXPECT_THAT(t, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(t.status().ToString(),
              AllOf(HasSubstr(tensors[2].name), HasSubstr(dir + "/model.safetensors"), HasSubstr("i32")));
}

TEST(HfWeightsErrors, ATruncatedShardNamesItAndTheTensor) {
  TempDir tmp;
  const std::vector<NamedValues> tensors = Gpt2Tensors(3);
  WriteHfDir(tmp.File("m"), tensors, DType::kBF16, 3);
  const std::string shard = tmp.File("m/model-00003-of-00003.safetensors");
  ASSERT_EQ(::truncate(shard.c_str(), static_cast<off_t>(fs::file_size(shard) - 10)), 0);
  auto w = HfWeights::Open(tmp.File("m"));
  EXPECT_THAT(w, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(w.status().ToString(), AllOf(HasSubstr(shard), HasSubstr("truncated"), HasSubstr("'transformer.")));
  EXPECT_THAT(TrainerFrom(tmp.File("m")), StatusIs(StatusCode::kDataLoss));
}

TEST(HfWeightsErrors, AnIndexNamingAMissingFileNamesTheFileAndATensor) {
  TempDir tmp;
  WriteHfDir(tmp.File("m"), Gpt2Tensors(3), DType::kBF16, 3);
  fs::remove(tmp.File("m/model-00002-of-00003.safetensors"));
  auto w = HfWeights::Open(tmp.File("m"));
  EXPECT_THAT(w, StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(w.status().ToString(),
              AllOf(HasSubstr("model-00002-of-00003.safetensors"), HasSubstr("model.safetensors.index.json"),
                    HasSubstr("'transformer.")));
}

TEST(HfWeightsErrors, AnIndexAndFilesThatDisagreeAreDataLoss) {
  TempDir tmp;
  const std::vector<NamedValues> tensors = Gpt2Tensors(3);
  WriteHfDir(tmp.File("m"), tensors, DType::kBF16, 2);
  const std::string index = tmp.File("m/model.safetensors.index.json");
  const nlohmann::json good = nlohmann::json::parse(testing::FileBytes(index));
  // The index places a tensor in the file that does not hold it.
  nlohmann::json j = good;
  j["weight_map"][tensors[0].name] = "model-00002-of-00002.safetensors";
  WriteText(index, j.dump());
  auto w = HfWeights::Open(tmp.File("m"));
  EXPECT_THAT(w, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(w.status().ToString(), AllOf(HasSubstr(tensors[0].name), HasSubstr("does not hold it")));
  // A file holds a tensor the index does not list.
  j = good;
  j["weight_map"].erase(tensors[1].name);
  WriteText(index, j.dump());
  w = HfWeights::Open(tmp.File("m"));
  EXPECT_THAT(w, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(w.status().ToString(), AllOf(HasSubstr(tensors[1].name), HasSubstr("does not list it")));
  // Not an index at all; a file name that leaves the directory.
  WriteText(index, "{}");
  EXPECT_THAT(HfWeights::Open(tmp.File("m")), StatusIs(StatusCode::kDataLoss));
  j = good;
  j["weight_map"][tensors[0].name] = "../model-00001-of-00002.safetensors";
  WriteText(index, j.dump());
  EXPECT_THAT(HfWeights::Open(tmp.File("m")), StatusIs(StatusCode::kDataLoss));
}

TEST(HfWeightsErrors, ADirectoryWithoutSafetensorsSaysWhatItHas) {
  TempDir tmp;
  fs::create_directories(tmp.File("m"));
  EXPECT_THAT(HfWeights::Open(tmp.File("m")), StatusIs(StatusCode::kNotFound));
  WriteText(tmp.File("m/pytorch_model.bin"), "x");
  auto w = HfWeights::Open(tmp.File("m"));
  EXPECT_THAT(w, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(w.status().ToString(), HasSubstr("safe_serialization"));
}

}  // namespace
}  // namespace strata
