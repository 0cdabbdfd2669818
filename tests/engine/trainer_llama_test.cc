// SPDX-License-Identifier: Apache-2.0
// The trainer on a tiny Llama-family model (GQA 4:2, SwiGLU, RMSNorm, RoPE,
// untied head) on the CPU backend, as the GPT trainer tests do: the loss
// falls on real text, offloaded placements give the same losses as
// all-resident (fp32 and bf16), resume is bit-identical, and the step
// directory is a Hugging Face LlamaForCausalLM directory (config.json with
// the architecture's own class and fields, HF names and layouts).
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/safetensors.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::TempDir;
using ::testing::HasSubstr;

TrainOptions TinyLlama(int64_t steps) {
  TrainOptions o = testing::TinyTrainer(2);
  Config& c = o.config;
  c.model.arch = "llama";
  c.model.n_kv_head = 2;
  c.model.intermediate_size = 176;
  c.model.rms_norm_eps = 1e-5;
  c.trainer.eval_batches = 2;
  o.steps = steps;
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.gpu_memory_limit = 256 * kMiB;
  o.host_memory_limit = 256 * kMiB;
  return o;
}

std::vector<double> Losses(const TrainOptions& o, int64_t steps, std::string* plan = nullptr) {
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return {};
  if (plan) *plan = (*t)->PlanTable();
  std::vector<double> out;
  for (int64_t i = 0; i < steps; ++i) {
    auto r = (*t)->Step();
    EXPECT_OK(r.status());
    if (!r.ok()) break;
    out.push_back(r->loss);
  }
  return out;
}

TEST(TrainerLlama, LossFallsOnRealText) {
  auto losses = Losses(TinyLlama(30), 30);
  ASSERT_EQ(losses.size(), 30u);
  const double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[27] + losses[28] + losses[29]) / 3;
  EXPECT_NEAR(losses[0], std::log(256.0), 0.3);
  EXPECT_LT(last, first - 1.0) << "first " << first << " last " << last;
}

void ExpectOffloadedMatches(bool bf16) {
  SCOPED_TRACE(bf16 ? "bf16" : "fp32");
  TempDir nvme;
  TrainOptions resident = TinyLlama(3);
  resident.config.bf16 = bf16;
  std::string plan_r, plan_o;
  auto a = Losses(resident, 3, &plan_r);
  TrainOptions off = TinyLlama(3);
  off.config.bf16 = bf16;
  off.config.zero.offload_optimizer.device = "nvme";
  off.config.zero.offload_optimizer.nvme_path = nvme.path();
  off.config.zero.offload_param.device = "cpu";
  off.config.activation_checkpointing.cpu_checkpointing = true;
  auto b = Losses(off, 3, &plan_o);
  EXPECT_THAT(plan_o, HasSubstr("nvme"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1 << "\n" << plan_r << plan_o;
}

TEST(TrainerLlama, OffloadedPlacementsGiveTheSameLosses) { ExpectOffloadedMatches(false); }
TEST(TrainerLlama, OffloadedPlacementsGiveTheSameLossesInBf16) { ExpectOffloadedMatches(true); }

TEST(TrainerLlama, ResumeIsBitIdentical) {
  TempDir dir;
  auto straight = Losses(TinyLlama(6), 6);
  ASSERT_EQ(straight.size(), 6u);
  std::ostringstream log;
  {
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(TinyLlama(3), log));
    for (int i = 0; i < 3; ++i) ASSERT_OK(t->Step().status());
    ASSERT_OK(t->Save(dir.path()));
  }
  TrainOptions r = TinyLlama(6);
  r.resume_dir = dir.path();
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(r, log));
  EXPECT_EQ(t->step(), 3);
  for (int i = 3; i < 6; ++i) {
    ASSERT_OK_AND_ASSIGN(StepReport rep, t->Step());
    EXPECT_EQ(rep.loss, straight[static_cast<size_t>(i)]) << "step " << i + 1;
  }
  // A GPT-2 config does not resume a Llama checkpoint.
  TrainOptions gpt = testing::TinyTrainer(2);
  gpt.backend = "cpu";
  gpt.cpu_threads = 2;
  gpt.gpu_memory_limit = 256 * kMiB;
  gpt.host_memory_limit = 256 * kMiB;
  gpt.resume_dir = dir.path();
  auto refused = Trainer::Create(gpt, log);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().ToString(), HasSubstr("is \"LlamaForCausalLM\" but the configured model has"));
}

TEST(TrainerLlama, StepDirectoryIsAHuggingFaceLlama) {
  TempDir dir;
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(TinyLlama(1), log));
  ASSERT_OK(t->Step().status());
  ASSERT_OK(t->Save(dir.path()));
  const std::string step = dir.path() + "/step-000001";
  ASSERT_OK_AND_ASSIGN(auto f, SafetensorsFile::Open(step + "/model.safetensors"));
  const SafetensorsEntry* k = f.Find("model.layers.1.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (Shape{32, 64}));  // nn.Linear [out, in]: 2 kv heads of 16
  const SafetensorsEntry* head = f.Find("lm_head.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->shape, (Shape{256, 64}));
  EXPECT_EQ(f.Find("model.layers.0.mlp.gate_proj.weight")->shape, (Shape{176, 64}));
  std::ifstream in(step + "/config.json");
  ASSERT_TRUE(in.good()) << step << "/config.json";
  const nlohmann::json c = nlohmann::json::parse(in);
  EXPECT_EQ(c.at("architectures"), nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c.at("model_type"), "llama");
  EXPECT_EQ(c.at("num_key_value_heads"), 2);
  EXPECT_EQ(c.at("num_attention_heads"), 4);
  EXPECT_EQ(c.at("intermediate_size"), 176);
  EXPECT_EQ(c.at("hidden_size"), 64);
  EXPECT_EQ(c.at("max_position_embeddings"), 32);
  EXPECT_EQ(c.at("tie_word_embeddings"), false);
  EXPECT_DOUBLE_EQ(c.at("rms_norm_eps").get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(c.at("rope_theta").get<double>(), 10000.0);
}

}  // namespace
}  // namespace strata
