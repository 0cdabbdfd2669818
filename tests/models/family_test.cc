// SPDX-License-Identifier: Apache-2.0
// The family registry (models/family.h): architecture names and HF classes,
// the config.json readers (transformers 4's rope_theta/rope_scaling and 5's
// rope_parameters, Qwen2's biases, what the block does not compute) and
// writers (the architecture's own class and fields, read back the same).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/family.h"
#include "tests/test_util.h"

namespace strata::models {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// transformers 5's save_pretrained of the tiny Llama (the fixture's config.json).
json Tiny5() {
  return json::parse(R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false, "head_dim": 16,
    "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 176, "max_position_embeddings": 32,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 10000.0,
    "rope_type": "default"}, "tie_word_embeddings": false, "vocab_size": 256, "dtype": "bfloat16"})");
}

TEST(Family, NamesAndClassesFindTheirFamily) {
  for (const char* a : {"gpt2", "GPT2LMHeadModel"}) EXPECT_EQ(std::string((*FindFamily(a))->name), "gpt2");
  for (const char* a : {"llama", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})
    EXPECT_EQ(std::string((*FindFamily(a))->name), "llama");
  auto bad = FindFamily("FalconForCausalLM");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("\"FalconForCausalLM\" is not supported"));
  EXPECT_THAT(bad.status().message(), HasSubstr("Qwen2ForCausalLM"));
}

TEST(Family, ReadsTransformers5AndBuildsTheModel) {
  ASSERT_OK_AND_ASSIGN(ModelDesc d, ReadHfConfig(Tiny5(), "config.json"));
  EXPECT_EQ(d.arch, "llama");
  EXPECT_EQ(d.hf_architecture, "LlamaForCausalLM");
  EXPECT_EQ(d.n_layer, 2);
  EXPECT_EQ(d.n_kv_head, 2);
  EXPECT_EQ(d.intermediate_size, 176);
  EXPECT_EQ(d.seq_len, 32);
  EXPECT_DOUBLE_EQ(d.norm_eps, 1e-5);
  EXPECT_EQ(d.rope.type, kernels::RopeParams::kDefault);
  EXPECT_FLOAT_EQ(d.rope.theta, 10000.f);
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, BuildModel(d));
  EXPECT_EQ(spec.kv_heads(), 2);
  ASSERT_OK(spec.Find("lm_head.weight").status());
}

TEST(Family, ReadsTransformers4RopeScaling) {
  json j = Tiny5();
  j.erase("rope_parameters");
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  ASSERT_OK_AND_ASSIGN(ModelDesc d, ReadHfConfig(j, "config.json"));
  EXPECT_EQ(d.rope.type, kernels::RopeParams::kLlama3);
  EXPECT_FLOAT_EQ(d.rope.theta, 500000.f);
  EXPECT_FLOAT_EQ(d.rope.factor, 8.f);
  EXPECT_EQ(d.rope.original_max_positions, 8192);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // the older key
  ASSERT_OK_AND_ASSIGN(d, ReadHfConfig(j, "config.json"));
  EXPECT_EQ(d.rope.type, kernels::RopeParams::kLinear);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
  EXPECT_THAT(ReadHfConfig(j, "c.json").status().message(), HasSubstr("rope type \"yarn\" is not supported"));
  j["rope_scaling"] = nullptr;  // transformers 4's "none"
  ASSERT_OK_AND_ASSIGN(d, ReadHfConfig(j, "config.json"));
  EXPECT_EQ(d.rope.type, kernels::RopeParams::kDefault);
}

TEST(Family, QwenHasQkvBiasesAndMistralItsWindow) {
  json j = Tiny5();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j.erase("attention_bias");
  ASSERT_OK_AND_ASSIGN(ModelDesc d, ReadHfConfig(j, "config.json"));
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, BuildModel(d));
  EXPECT_EQ(spec.hf_architecture, "Qwen2ForCausalLM");
  EXPECT_OK(spec.Find("model.layers.0.self_attn.q_proj.bias").status());
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = 16;  // shorter than the 32 positions trained
  ASSERT_OK_AND_ASSIGN(d, ReadHfConfig(j, "config.json"));
  EXPECT_THAT(BuildModel(d).status().message(), HasSubstr("sliding_window = 16"));
}

TEST(Family, WhatTheBlockDoesNotComputeIsAnErrorNamingTheField) {
  for (auto [key, value] : {std::pair<const char*, json>{"attention_bias", true}, {"mlp_bias", true},
                            {"hidden_act", "gelu"}, {"head_dim", 32}}) {
    json j = Tiny5();
    j[key] = value;
    auto r = ReadHfConfig(j, "dir/config.json");
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_THAT(r.status().message(), HasSubstr(std::string("\"") + key + "\"")) << key;
    EXPECT_THAT(r.status().message(), HasSubstr("dir/config.json")) << key;
  }
  json j = Tiny5();
  j.erase("num_hidden_layers");
  EXPECT_THAT(ReadHfConfig(j, "c.json").status().message(), HasSubstr("no \"num_hidden_layers\""));
  j = Tiny5();
  j["architectures"] = {"BertModel"};
  EXPECT_THAT(ReadHfConfig(j, "c.json").status().message(), HasSubstr("\"BertModel\" is not supported"));
}

TEST(Family, WriterGivesTheArchitecturesOwnFieldsAndReadsBack) {
  ASSERT_OK_AND_ASSIGN(ModelDesc d, ReadHfConfig(Tiny5(), "config.json"));
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, BuildModel(d));
  // Over transformers 5's file: rope_parameters kept in its style.
  ASSERT_OK_AND_ASSIGN(json c5, WriteHfConfig(spec, Tiny5()));
  EXPECT_TRUE(c5.contains("rope_parameters"));
  EXPECT_FALSE(c5.contains("rope_scaling"));
  // Fresh: transformers 4's style, which both read.
  ASSERT_OK_AND_ASSIGN(json c, WriteHfConfig(spec, json::object()));
  EXPECT_EQ(c.at("architectures"), json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c.at("model_type"), "llama");
  EXPECT_EQ(c.at("num_key_value_heads"), 2);
  EXPECT_EQ(c.at("head_dim"), 16);
  EXPECT_TRUE(c.at("rope_scaling").is_null());
  for (const json& w : {c, c5}) {
    ASSERT_OK_AND_ASSIGN(ModelDesc back, ReadHfConfig(w, "written"));
    ASSERT_OK_AND_ASSIGN(ModelSpec again, BuildModel(back));
    EXPECT_EQ(again.NumParameters(), spec.NumParameters());
    EXPECT_EQ(again.block.rope, spec.block.rope);
    EXPECT_EQ(again.block.norm_eps, spec.block.norm_eps);
  }
  // GPT-2: GPT2Config's fields.
  ModelDesc g;
  g.arch = "gpt2", g.n_layer = 2, g.n_embd = 64, g.n_head = 4, g.vocab_size = 256, g.seq_len = 32;
  ASSERT_OK_AND_ASSIGN(ModelSpec gs, BuildModel(g));
  ASSERT_OK_AND_ASSIGN(json gc, WriteHfConfig(gs, json::object()));
  EXPECT_EQ(gc.at("architectures"), json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(gc.at("n_positions"), 32);
  EXPECT_DOUBLE_EQ(gc.at("layer_norm_epsilon").get<double>(), 1e-5);
}

// The writer keeps the source's RoPE style: over transformers 4's file its
// top-level rope_theta and rope_scaling (llama3 scaling written back whole,
// no rope_parameters), over transformers 5's rope_parameters only.
TEST(Family, WriterKeepsTheSourcesRopeStyle) {
  json t4 = Tiny5();
  t4.erase("rope_parameters");
  t4["rope_theta"] = 500000.0;
  t4["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  ASSERT_OK_AND_ASSIGN(ModelDesc d4, ReadHfConfig(t4, "config.json"));
  ASSERT_OK_AND_ASSIGN(ModelSpec s4, BuildModel(d4));
  ASSERT_OK_AND_ASSIGN(json c4, WriteHfConfig(s4, t4));
  EXPECT_FALSE(c4.contains("rope_parameters"));
  EXPECT_DOUBLE_EQ(c4.at("rope_theta").get<double>(), 500000.0);
  EXPECT_EQ(c4.at("rope_scaling"), t4.at("rope_scaling"));
  json t5 = Tiny5();
  t5["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 20000.0}};
  ASSERT_OK_AND_ASSIGN(ModelDesc d5, ReadHfConfig(t5, "config.json"));
  ASSERT_OK_AND_ASSIGN(ModelSpec s5, BuildModel(d5));
  ASSERT_OK_AND_ASSIGN(json c5, WriteHfConfig(s5, t5));
  EXPECT_EQ(c5.at("rope_parameters"), t5.at("rope_parameters"));
  EXPECT_FALSE(c5.contains("rope_theta"));
  EXPECT_FALSE(c5.contains("rope_scaling"));
  for (const json& w : {c4, c5}) {
    ASSERT_OK_AND_ASSIGN(ModelDesc back, ReadHfConfig(w, "written"));
    EXPECT_EQ(back.rope, w.contains("rope_parameters") ? d5.rope : d4.rope);
  }
}

}  // namespace
}  // namespace strata::models
