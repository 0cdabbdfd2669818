// The whole trainer on the CPU backend against the independent transformers
// Llama reference (tests/data/llama_tiny_ref.safetensors, or the file named
// by $STRATA_LLAMA_REF; GQA 4:2, SwiGLU, RMSNorm, RoPE, untied head): the
// loss, the gradient norm, every parameter after one and after three AdamW
// steps and the losses after them (tests/engine/gpt2_parity.h's checks, which
// are family-neutral), all-resident and offloaded, fp32 and bf16.
#include <cstdlib>
#include <sstream>

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

// bf16 parameters and activations, fp32 gradients and masters: bounds as GPT-2's.
const testing::Gpt2ParityTolerance kBf16{
    .loss = 3e-4, .grad_norm = 2.5e-3, .flat = 3.0, .near_zero = 0, .update = 1.2e-2, .determined = 0.3};

TEST_F(LlamaParity, Bf16AdamWStepsTrackTransformers) {
  TrainOptions o = testing::Gpt2RefOptions(*ref_, "cpu", /*bf16=*/false);
  o.config.bf16 = true;
  testing::CheckTrainerAgainstGpt2Ref(*ref_, o, kBf16, "llama cpu bf16", one_step());
}

}  // namespace
}  // namespace strata
