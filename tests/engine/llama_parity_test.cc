// SPDX-License-Identifier: Apache-2.0
// The whole trainer on the CPU backend against the independent transformers
// Llama reference (tests/data/llama_tiny_ref.safetensors, or the file named
// by $STRATA_LLAMA_REF; GQA 4:2, SwiGLU, RMSNorm, RoPE, untied head): the
// loss, the gradient norm, every parameter after one and after three AdamW
// steps and the losses after them (tests/engine/gpt2_parity.h's checks, which
// are family-neutral), all-resident and offloaded, fp32 and bf16.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/trainer.h"
#include "tests/engine/gpt2_parity.h"
#include "tests/test_util.h"

namespace strata {
namespace {

std::string LlamaRefPath() {
  const char* env = std::getenv("STRATA_LLAMA_REF");
  return env && *env ? env : testing::SourcePath("tests/data/llama_tiny_ref.safetensors");
}

class LlamaParity : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = testing::LoadGpt2Ref(LlamaRefPath());
    ASSERT_OK(r.status());
    ref_.emplace(std::move(r).value());
    ASSERT_TRUE(ref_->config.contains("n_kv_head")) << ref_->file.path() << " is not a Llama reference";
  }
  // The shipped file was made by make_llama_ref.py before it restored the
  // model's buffers after writing the bf16 HF directory: its loss and
  // gradients (and so the first AdamW step) are of the float64 model, but
  // loss_after_step and the steps after the first ran with the rotary
  // inv_freq rounded to bf16 (strata's loss on the file's own updated.*
  // parameters is 5.4217300, its loss_after_step 5.4216858; with inv_freq
  // rounded to bf16 strata gives 5.4216858 too). A file made by the current
  // script says buffers_restored and is checked through every step.
  bool one_step() const {
    const bool ok = ref_->config.value("buffers_restored", false);
    if (!ok)
      std::printf("[ parity ] %s predates buffers_restored: checking the loss, the gradient norm and the first "
                  "AdamW step only\n", ref_->file.path().c_str());
    return !ok;
  }
  std::optional<testing::Gpt2Ref> ref_;
};

// fp32. Seen on the shipped file: see the printed line (bounds as GPT-2's).
const testing::Gpt2ParityTolerance kFp32{
    .loss = 2e-7, .grad_norm = 2e-7, .flat = 1e-2, .near_zero = 2.0, .update = 1.5e-4, .determined = 0};

TEST_F(LlamaParity, AdamWStepsMatchTransformers) {
  TrainOptions o = testing::Gpt2RefOptions(*ref_, "cpu", /*bf16=*/false);
  EXPECT_EQ(o.config.model.arch, "llama");
  testing::CheckTrainerAgainstGpt2Ref(*ref_, o, kFp32, "llama cpu fp32", one_step());
}

TEST_F(LlamaParity, OffloadedPlacementMatchesToo) {
  testing::TempDir nvme;
  TrainOptions o = testing::Gpt2RefOptions(*ref_, "cpu", /*bf16=*/false);
  o.config.zero.offload_param.device = "cpu";
  o.config.zero.offload_optimizer.device = "nvme";
  o.config.zero.offload_optimizer.nvme_path = nvme.path();
  o.config.activation_checkpointing.cpu_checkpointing = true;
  testing::CheckTrainerAgainstGpt2Ref(*ref_, o, kFp32, "llama cpu fp32 offloaded", one_step());
}

// bf16 parameters and activations, fp32 gradients and masters. Bounds about
// twice the worst error the correct code showed on seven draws of the fixture
// (make_llama_ref.py --seed 1..6 with transformers 4.44, and the shipped file
// from transformers 5.17): loss rel 5.3e-4, gradient norm rel 1.7e-3, the
// three steps' update as a whole rel 1.55e-2 (RMSNorm weights: updates of
// about 3e-3 on weights near 1, where bf16's spacing is 7.8e-3).
const testing::Gpt2ParityTolerance kBf16{
    .loss = 1e-3, .grad_norm = 3.5e-3, .flat = 3.0, .near_zero = 0, .update = 3e-2, .determined = 0.3};

TEST_F(LlamaParity, Bf16AdamWStepsTrackTransformers) {
  TrainOptions o = testing::Gpt2RefOptions(*ref_, "cpu", /*bf16=*/false);
  o.config.bf16 = true;
  testing::CheckTrainerAgainstGpt2Ref(*ref_, o, kBf16, "llama cpu bf16", one_step());
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// --init-from a Hugging Face Llama directory: config.json (transformers 5's,
// as the fixture's llama_tiny_hf has it) gives the model, model.safetensors
// under HF names the weights; the first step's loss is the reference's.
TEST_F(LlamaParity, InitFromAHuggingFaceDirectory) {
  testing::TempDir dir;
  const nlohmann::json& m = ref_->config;
  nlohmann::json cfg{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                     {"hidden_size", m.at("n_embd")}, {"intermediate_size", m.at("ffn_dim")},
                     {"num_hidden_layers", m.at("n_layer")}, {"num_attention_heads", m.at("n_head")},
                     {"num_key_value_heads", m.at("n_kv_head")}, {"vocab_size", m.at("vocab_size")},
                     {"max_position_embeddings", m.at("seq_len")}, {"rms_norm_eps", m.at("rms_norm_eps")},
                     {"tie_word_embeddings", m.at("tied_lm_head")}, {"hidden_act", "silu"},
                     {"rope_parameters", {{"rope_theta", m.at("rope_theta")}, {"rope_type", "default"}}},
                     {"dtype", "float32"}};
  std::ofstream(dir.File("config.json")) << cfg.dump(2);
  std::vector<std::vector<float>> values;
  std::vector<HostTensor> tensors;
  for (const auto& e : ref_->file.entries()) {
    if (e.name.rfind("param.", 0) != 0) continue;
    ASSERT_OK_AND_ASSIGN(std::vector<float> v, ref_->file.ReadF32(e.name));
    values.push_back(std::move(v));
    tensors.push_back(HostTensor{e.name.substr(6), DType::kF32, e.shape, nullptr});
  }
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = values[i].data();
  ASSERT_OK(WriteSafetensors(dir.File("model.safetensors"), tensors));

  ASSERT_OK_AND_ASSIGN(WeightsModel w, ModelFromHfWeights(dir.path()));
  EXPECT_TRUE(w.from_config_json);
  EXPECT_EQ(w.model.arch, "LlamaForCausalLM");
  EXPECT_EQ(w.model.n_kv_head, m.at("n_kv_head").get<int>());
  EXPECT_EQ(w.model.seq_len, m.at("seq_len").get<int>());
  EXPECT_EQ(w.dtype, "fp32");
  TrainOptions o = testing::Gpt2RefOptions(*ref_, "cpu", /*bf16=*/false);
  o.config.model = w.model;
  o.init_from = dir.path();
  o.init_prefix = "";
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_OK_AND_ASSIGN(auto tokens, ref_->file.ReadI32("input_ids"));
  ASSERT_OK_AND_ASSIGN(auto targets, ref_->file.ReadI32("targets"));
  ASSERT_OK_AND_ASSIGN(auto loss, ref_->file.ReadF64("loss"));
  ASSERT_OK_AND_ASSIGN(StepReport r, t->StepWith(tokens.data(), targets.data()));
  EXPECT_LE(std::fabs(r.loss - loss[0]) / loss[0], 2e-7) << r.loss << " vs " << loss[0];
}

}  // namespace
}  // namespace strata
