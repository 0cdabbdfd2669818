// SPDX-License-Identifier: Apache-2.0
// The trainer on the CUDA backend against the transformers Llama reference
// (tests/data/llama_tiny_ref.safetensors or $STRATA_LLAMA_REF; the checks of
// tests/engine/gpt2_parity.h): fp32 and bf16, the optimizer state on the GPU
// and on the host. As on the CPU (llama_parity_test.cc), a file without
// `buffers_restored` is checked through the first AdamW step only.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/trainer.h"
#include "tests/engine/gpt2_parity.h"
#include "tests/test_util.h"

namespace strata {
namespace {

class LlamaParityGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_SKIP_WITHOUT_GPU();
    const char* env = std::getenv("STRATA_LLAMA_REF");
    auto r = testing::LoadGpt2Ref(env && *env ? env : testing::SourcePath("tests/data/llama_tiny_ref.safetensors"));
    ASSERT_OK(r.status());
    ref_.emplace(std::move(r).value());
    one_step_ = !ref_->config.value("buffers_restored", false);
  }
  std::optional<testing::Gpt2Ref> ref_;
  bool one_step_ = false;
};

// The GPT-2 CUDA bounds (gpt2_parity_gpu_test.cc); bf16's loss and update
// bounds widened to the CPU's measured Llama ones (llama_parity_test.cc).
const testing::Gpt2ParityTolerance kCudaFp32{
    .loss = 1e-6, .grad_norm = 1e-6, .flat = 1e-2, .near_zero = 2.0, .update = 1e-3, .determined = 0};
const testing::Gpt2ParityTolerance kCudaBf16{
    .loss = 1e-3, .grad_norm = 5e-3, .flat = 3.0, .near_zero = 0, .update = 3e-2, .determined = 0.3};

TEST_F(LlamaParityGpu, Fp32AdamWStepsMatchTransformers) {
  testing::CheckTrainerAgainstGpt2Ref(*ref_, testing::Gpt2RefOptions(*ref_, "cuda", false), kCudaFp32,
                                      "llama cuda fp32", one_step_);
}

TEST_F(LlamaParityGpu, Fp32WithTheOptimizerOnTheHost) {
  TrainOptions o = testing::Gpt2RefOptions(*ref_, "cuda", false);
  o.config.zero.offload_optimizer.device = "cpu";
  testing::CheckTrainerAgainstGpt2Ref(*ref_, o, kCudaFp32, "llama cuda fp32, optimizer on the host", one_step_);
}

TEST_F(LlamaParityGpu, Bf16AdamWStepsTrackTransformers) {
  testing::CheckTrainerAgainstGpt2Ref(*ref_, testing::Gpt2RefOptions(*ref_, "cuda", true), kCudaBf16,
                                      "llama cuda bf16", one_step_);
}

TEST_F(LlamaParityGpu, Bf16OffloadedTracksTransformers) {
  testing::TempDir nvme;
  TrainOptions o = testing::Gpt2RefOptions(*ref_, "cuda", true);
  o.config.zero.offload_param.device = "cpu";
  o.config.zero.offload_optimizer.device = "nvme";
  o.config.zero.offload_optimizer.nvme_path = nvme.path();
  testing::CheckTrainerAgainstGpt2Ref(*ref_, o, kCudaBf16, "llama cuda bf16 offloaded", one_step_);
}

}  // namespace
}  // namespace strata
