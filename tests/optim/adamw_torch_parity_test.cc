// SPDX-License-Identifier: Apache-2.0
// Reproduces torch.optim.AdamW's first step on a real model: the fixture
// (tests/data/gpt2_tiny_ref.safetensors, or the file named by
// STRATA_GPT2_REF) holds every parameter of a tiny GPT-2, its gradient and
// the parameter after one AdamW step computed in float64 by PyTorch, with the
// hyperparameters in the metadata key "adamw".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/safetensors.h"
#include "optim/cpu_adam.h"
#include "tests/test_util.h"

namespace strata::optim {
namespace {

std::string FixturePath() {
  const char* env = std::getenv("STRATA_GPT2_REF");
  return env && *env ? std::string(env) : strata::testing::SourcePath("tests/data/gpt2_tiny_ref.safetensors");
}

// One unit in the last place of x in fp32.
double Ulp(float x) {
  float a = std::fabs(x);
  return std::nextafter(a, std::numeric_limits<float>::infinity()) - a;
}

TEST(AdamWTorchParity, ReproducesTheUpdatedParameters) {
  ASSERT_OK_AND_ASSIGN(SafetensorsFile f, SafetensorsFile::Open(FixturePath()));
  auto meta = f.metadata().find("adamw");
  ASSERT_NE(meta, f.metadata().end()) << "no 'adamw' metadata in " << f.path();
  nlohmann::json j = nlohmann::json::parse(meta->second);
  AdamHyper h;
  h.lr = j.at("lr").get<double>();
  h.beta1 = j.at("betas").at(0).get<double>();
  h.beta2 = j.at("betas").at(1).get<double>();
  h.eps = j.at("eps").get<double>();
  h.weight_decay = j.at("weight_decay").get<double>();
  h.decay_mode = WeightDecayMode::kDecoupled;
  h.bias_correction = true;
  h.step = 1;

  ASSERT_OK_AND_ASSIGN(auto adam, CpuAdam::Create());
  size_t tensors = 0, elements = 0;
  double worst_ulps = 0;
  for (const SafetensorsEntry& e : f.entries()) {
    if (e.name.rfind("param.", 0) != 0) continue;
    const std::string name = e.name.substr(6);
    SCOPED_TRACE(name);
    ASSERT_OK_AND_ASSIGN(std::vector<float> p, f.ReadF32("param." + name));
    ASSERT_OK_AND_ASSIGN(std::vector<float> g, f.ReadF32("grad." + name));
    ASSERT_OK_AND_ASSIGN(std::vector<float> want, f.ReadF32("updated." + name));
    ASSERT_EQ(g.size(), p.size());
    ASSERT_EQ(want.size(), p.size());
    const std::vector<float> p0 = p;
    std::vector<float> m(p.size(), 0.f), v(p.size(), 0.f);
    std::vector<uint16_t> out(p.size());
    AdamShard s;
    s.n = p.size();
    s.master = p.data();
    s.exp_avg = m.data();
    s.exp_avg_sq = v.data();
    s.grad = g.data();
    s.grad_dtype = DType::kF32;
    s.param_out = out.data();
    s.param_out_dtype = DType::kBF16;
    ASSERT_OK_AND_ASSIGN(AdamStepResult r, adam->Step(s, h));
    EXPECT_EQ(r.nonfinite_grads, 0u);
    // Errors are counted in ulps of the terms summed, |p| + lr (the first
    // step moves p by about lr, often past zero, so the result's own ulp can
    // be far smaller than the rounding of the sum). Budget: the inputs are
    // float64 values rounded to fp32 (0.5), the reference is rounded once
    // (0.5), our two fmas on p (0.5 each) and the update term's few-ulp
    // relative error, which counts in full when |p| << lr: 4 ulps.
    int bad = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      const float before = p0[i];
      double ulps = std::fabs(static_cast<double>(p[i]) - want[i]) /
                    Ulp(static_cast<float>(std::fabs(before) + h.lr));
      worst_ulps = std::max(worst_ulps, ulps);
      if (ulps > 4.0 && ++bad <= 3)
        ADD_FAILURE() << name << "[" << i << "]: " << p[i] << " vs torch " << want[i] << " (" << ulps << " ulp)";
    }
    tensors++;
    elements += p.size();
  }
  EXPECT_GT(tensors, 10u);
  RecordProperty("worst_ulps", std::to_string(worst_ulps));
  std::printf("AdamW parity: %zu tensors, %zu elements, worst %.3f ulp of |p| + lr\n", tensors, elements, worst_ulps);
}

}  // namespace
}  // namespace strata::optim
