// SPDX-License-Identifier: Apache-2.0
// strata eval's and strata generate's library on the CUDA backend against
// the CPU: a checkpoint the trainer saved (on the CPU), evaluated on the same
// windows, gives the CPU's loss within fp32 rounding; greedy generation
// gives the CPU's tokens (but where the CPU's two most likely tokens are
// within rounding of each other); a seeded sample repeats on the GPU.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/data.h"
#include "engine/generate.h"
#include "engine/inference_eval.h"
#include "engine/inference_model.h"
#include "engine/trainer.h"
#include "models/decoder.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/kernels/backend_compare.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::TempDir;

std::vector<int32_t> Prompt() {
  std::vector<int32_t> p;
  for (unsigned char c : std::string("And the earth was")) p.push_back(c);
  return p;
}

std::vector<int32_t> Generated(models::Decoder& d, const SamplingOptions& s, int n) {
  GenerateRequest r;
  r.prompt = Prompt();
  r.max_new_tokens = n;
  r.sampling = s;
  std::vector<int32_t> out;
  EXPECT_OK(Generate(d, r, [&](int32_t t) {
              out.push_back(t);
              return Status::OK();
            }).status());
  return out;
}

TEST(CudaInference, EvalAndGenerationMatchTheCpu) {
  if (!::strata::testing::GpuTestsOnCpu()) STRATA_SKIP_WITHOUT_GPU();
  TempDir tmp;
  const std::string text = ::strata::testing::FileBytes(::strata::testing::SourcePath("data/kjv.txt"));
  std::ofstream(tmp.File("val.txt"), std::ios::binary) << text.substr(60000, 6000);
  TrainOptions o = ::strata::testing::TinyTrainer(2, 64, 64);
  o.backend = "cpu";
  o.steps = 30;
  o.save_dir = tmp.File("save");
  o.config.data.val_path = tmp.File("val.txt");
  {
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    for (int i = 0; i < 30; ++i) ASSERT_OK(t->Step().status());
    ASSERT_OK(t->Save(o.save_dir));
  }
  ASSERT_OK_AND_ASSIGN(auto gpu, ::strata::testing::MakeBackendUnderTest());
  auto cpu = kernels::MakeCpuBackend(0);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(dt)));
    ASSERT_OK_AND_ASSIGN(InferenceModel mc, LoadInferenceModel(o.save_dir, cpu.get(), dt, "--model"));
    ASSERT_OK_AND_ASSIGN(InferenceModel mg, LoadInferenceModel(o.save_dir, gpu.get(), dt, "--model"));
    DataConfig dc;
    dc.path = dc.val_path = tmp.File("val.txt");
    ASSERT_OK_AND_ASSIGN(auto data, DataLoader::Open(dc, "", 256, 4, 64));
    ASSERT_OK_AND_ASSIGN(const double lc, EvaluateModel(mc, cpu.get(), data.get(), 4, 64, 5));
    ASSERT_OK_AND_ASSIGN(const double lg, EvaluateModel(mg, gpu.get(), data.get(), 4, 64, 5));
    EXPECT_NEAR(lg, lc, (dt == DType::kF32 ? 2e-5 : 2e-2) * lc);

    ASSERT_OK_AND_ASSIGN(auto dc_, models::Decoder::Create(cpu.get(), mc.spec, dt, mc.unit_params(), {}));
    ASSERT_OK_AND_ASSIGN(auto dg, models::Decoder::Create(gpu.get(), mg.spec, dt, mg.unit_params(), {}));
    const std::vector<int32_t> want = Generated(*dc_, {0, 0, 1, 0}, 40);
    // The GPU fed the CPU's tokens: each of its greedy choices is the CPU's
    // unless the CPU's two largest logits were within rounding.
    std::vector<int32_t> seq = Prompt();
    std::vector<float> lcpu, lgpu;
    dc_->Reset();
    dg->Reset();
    ASSERT_OK(dc_->Step(seq.data(), static_cast<int64_t>(seq.size()), models::Decoder::Logits::kLast, &lcpu));
    ASSERT_OK(dg->Step(seq.data(), static_cast<int64_t>(seq.size()), models::Decoder::Logits::kLast, &lgpu));
    int differ = 0;
    for (int32_t t : want) {
      const int32_t g = static_cast<int32_t>(std::max_element(lgpu.begin(), lgpu.end()) - lgpu.begin());
      if (g != t) {
        std::vector<float> s = lcpu;
        std::sort(s.begin(), s.end(), std::greater<float>());
        EXPECT_LT(s[0] - s[1], dt == DType::kF32 ? 1e-3 : 0.1) << "the GPU chose " << g << ", the CPU " << t;
        ++differ;
      }
      ASSERT_OK(dc_->Step(&t, 1, models::Decoder::Logits::kLast, &lcpu));
      ASSERT_OK(dg->Step(&t, 1, models::Decoder::Logits::kLast, &lgpu));
    }
    if (dt == DType::kF32) {
      EXPECT_LE(differ, 1);
    }
    // Sampling with a seed repeats on the GPU.
    const SamplingOptions s{0.8, 40, 0.95, 3};
    EXPECT_EQ(Generated(*dg, s, 40), Generated(*dg, s, 40));
  }
}

}  // namespace
}  // namespace strata
