// SPDX-License-Identifier: Apache-2.0
// Hugging Face weights out (engine/hf_weights_writer.h): huggingface_hub's
// sharding rule, and checkpoints whose model-*.safetensors and index load
// back (HfWeights, --init-from) as the masters in bf16 or fp32, with
// config.json's torch_dtype to match.
#include "engine/hf_weights_writer.h"

#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "base/half.h"
#include "engine/hf_weights.h"
#include "engine/model_config.h"
#include "engine/trainer.h"
#include "models/gpt2.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::FileBytes;
using ::strata::testing::TempDir;

models::ModelSpec SpecWithParams(const std::vector<int64_t>& numels) {
  models::ModelSpec s;
  for (size_t i = 0; i < numels.size(); ++i)
    s.params.push_back(models::ParamSpec{"p" + std::to_string(i), 0, 0, {numels[i]}, numels[i], {}});
  return s;
}

// Sizes in fp32 bytes against max 100: 40+40 fill a shard, the next 40 starts
// another; 400 is over the limit: a shard of its own, listed when met, while
// the shard being filled goes on after it.
TEST(HfShardPlan, FollowsHuggingFaceHubsSplit) {
  const HfShardPlan plan = PlanHfShards(SpecWithParams({10, 10, 10, 100, 10, 5}), DType::kF32, 100);
  // shard_list: [p0 p1], [p3] (oversized, met while [p2] fills), [p2 p4 p5]
  ASSERT_EQ(plan.files.size(), 3u);
  EXPECT_EQ(plan.files[0], "model-00001-of-00003.safetensors");
  EXPECT_EQ(plan.files[2], "model-00003-of-00003.safetensors");
  EXPECT_EQ(plan.file_of, (std::vector<size_t>{0, 0, 2, 1, 2, 2}));
  EXPECT_EQ(plan.total_bytes, 4u * 145u);
  // A tensor exactly at the limit fits; everything in one shard is model.safetensors.
  EXPECT_EQ(PlanHfShards(SpecWithParams({25}), DType::kF32, 100).file_of, (std::vector<size_t>{0}));
  const HfShardPlan one = PlanHfShards(SpecWithParams({10, 10}), DType::kBF16, 40);
  EXPECT_EQ(one.files, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(PlanHfShards(SpecWithParams({10, 10}), DType::kF32, 40).files.size(), 2u);
}

TrainOptions Tiny(int64_t steps) {
  TrainOptions o = testing::TinyTrainer(2);
  o.steps = steps;
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.gpu_memory_limit = 256 * kMiB;
  o.host_memory_limit = 256 * kMiB;
  return o;
}

// A trained model saved with `dtype` and `max_shard`; its step directory.
std::string TrainAndSave(TrainOptions o, const std::string& dir, std::unique_ptr<Trainer>* out) {
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return "";
  EXPECT_OK((*t)->Step().status());
  EXPECT_OK((*t)->Save(dir));
  *out = std::move(*t);
  return dir + "/step-000001";
}

struct SaveCase {
  const char* dtype;
  const char* max_shard;
  bool sharded;
};

class HfSave : public ::testing::TestWithParam<SaveCase> {};

TEST_P(HfSave, TheStepDirectoryHoldsTheMastersAsHuggingFaceWeights) {
  TempDir tmp;
  TrainOptions o = Tiny(1);
  o.config.trainer.save_dtype = GetParam().dtype;
  o.config.trainer.save_max_shard_size = GetParam().max_shard;
  std::unique_ptr<Trainer> t;
  const std::string step = TrainAndSave(o, tmp.path(), &t);
  ASSERT_TRUE(t);
  const bool bf16 = std::string(GetParam().dtype) == "bf16";
  ASSERT_OK_AND_ASSIGN(const models::ModelSpec spec, ModelSpecFor(o.config));
  ASSERT_OK_AND_ASSIGN(const uint64_t max_shard, ParseBytes(GetParam().max_shard));
  const HfShardPlan plan = PlanHfShards(spec, bf16 ? DType::kBF16 : DType::kF32, max_shard);
  ASSERT_OK_AND_ASSIGN(HfWeights w, HfWeights::Open(step));
  EXPECT_EQ(w.files().size(), plan.files.size());
  EXPECT_EQ(plan.files.size() > 1, GetParam().sharded);
  const nlohmann::json manifest = nlohmann::json::parse(FileBytes(step + "/manifest.json"));
  if (GetParam().sharded) {
    EXPECT_EQ(w.index_path(), step + "/model.safetensors.index.json");
    EXPECT_FALSE(fs::exists(step + "/model.safetensors"));  // transformers would prefer it
    const nlohmann::json index = nlohmann::json::parse(FileBytes(w.index_path()));
    uint64_t total = 0;
    for (const auto& [name, tensor] : w.tensors()) total += tensor.entry.bytes;
    EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
    EXPECT_EQ(index["weight_map"].size(), w.tensors().size());
    EXPECT_EQ(manifest["files"]["model"], "model.safetensors.index.json");
    for (const auto& [name, tensor] : w.tensors())
      EXPECT_EQ(index["weight_map"][name], plan.files[plan.file_of[static_cast<size_t>(
                                               spec.Find(name).value() - spec.params.data())]])
          << name;
  } else {
    EXPECT_EQ(manifest["files"]["model"], "model.safetensors");
  }
  EXPECT_EQ(manifest["files"]["model_dtype"], bf16 ? "bf16" : "f32");
  const nlohmann::json config = nlohmann::json::parse(FileBytes(step + "/config.json"));
  EXPECT_EQ(config["torch_dtype"], bf16 ? "bfloat16" : "float32");
  // Every parameter, named as the model names it: the master (rounded to bf16).
  ASSERT_EQ(w.tensors().size(), spec.params.size());
  for (const models::ParamSpec& p : spec.params) {
    const HfTensor* h = w.Find(p.name);
    ASSERT_NE(h, nullptr) << p.name;
    EXPECT_EQ(h->entry.dtype, bf16 ? DType::kBF16 : DType::kF32);
    EXPECT_EQ(SafetensorsFile::Open(h->file)->metadata().at("step"), "1");
    std::vector<float> got(static_cast<size_t>(p.numel));
    ASSERT_OK(w.ReadF32Into(*h, got));
    ASSERT_OK_AND_ASSIGN(std::vector<float> master, t->Parameter(p.name));
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], bf16 ? BF16ToFloat(FloatToBF16(master[i])) : master[i]) << p.name << "[" << i << "]";
  }
  // --init-from the step directory starts from those values; --resume from
  // it restores the masters themselves.
  TrainOptions from = Tiny(1);
  from.init_from = step;
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto tuned, Trainer::Create(from, log));
  const std::string probe = "transformer.h.1.mlp.c_proj.weight";
  ASSERT_OK_AND_ASSIGN(auto a, tuned->Parameter(probe));
  ASSERT_OK_AND_ASSIGN(auto master, t->Parameter(probe));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], bf16 ? BF16ToFloat(FloatToBF16(master[i])) : master[i]);
  TrainOptions resume = Tiny(2);
  resume.resume_dir = tmp.path();
  ASSERT_OK_AND_ASSIGN(auto resumed, Trainer::Create(resume, log));
  EXPECT_EQ(*resumed->Parameter(probe), master);
}

INSTANTIATE_TEST_SUITE_P(DTypesAndShardSizes, HfSave,
                         ::testing::Values(SaveCase{"bf16", "5GB", false}, SaveCase{"fp32", "5GB", false},
                                           SaveCase{"bf16", "20KB", true}, SaveCase{"fp32", "20KB", true}),
                         [](const auto& info) {
                           return std::string(info.param.dtype) + (info.param.sharded ? "_sharded" : "_one_file");
                         });

}  // namespace
}  // namespace strata
