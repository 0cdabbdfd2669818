// SPDX-License-Identifier: Apache-2.0
// The Llama model on the CUDA backend against the float64 transformers
// reference (tests/models/llama_reference.h; STRATA_LLAMA_REF names another
// file): the loss and every gradient, fp32 and bf16.
#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "tests/kernels/backend_compare.h"
#include "tests/models/llama_reference.h"
#include "tests/test_util.h"

namespace strata::models {
namespace {

class CudaLlamaReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!::strata::testing::GpuTestsOnCpu()) STRATA_SKIP_WITHOUT_GPU();
    ASSERT_OK_AND_ASSIGN(gpu_, ::strata::testing::MakeBackendUnderTest());
  }
  std::unique_ptr<kernels::Backend> gpu_;
};

// The CPU backend's bounds (llama_test.cc: fp32 loss 1e-6, gradients 1e-5,
// seen 4.2e-9 and 1.2e-6) with the GPU's other summation orders and sincosf.
TEST_F(CudaLlamaReferenceTest, Fp32MatchesTransformers) {
  testing::CheckLlamaAgainstReference(gpu_.get(), DType::kF32, DType::kF32, 1e-6, 2e-5);
}

// bf16 (the flash kernels with GQA, P and dS rounded to bf16 too): the CPU's
// bounds (loss 5e-4, gradients 4e-2; seen 6.6e-5, 2.1e-2) with a margin.
TEST_F(CudaLlamaReferenceTest, Bf16TracksTransformers) {
  testing::CheckLlamaAgainstReference(gpu_.get(), DType::kBF16, DType::kF32, 1e-3, 6e-2);
}

}  // namespace
}  // namespace strata::models
