// SPDX-License-Identifier: Apache-2.0
// bf16 Adam moments (bf16.bf16_optimizer_states) on the CUDA backend: the
// fused GPU Adam on bf16 m/v (resident state, and the GPU-state prefix of
// offload_optimizer.ratio 0.5) and the GPU-assisted worker streaming bf16
// m/v chunks give the CPU Adam's bits: the same losses and parameters.
#include <sstream>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/device.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

TrainOptions TinyGpu() {
  TrainOptions o = testing::TinyTrainer(3, 128, 64);
  o.config.bf16 = true;
  o.config.bf16_optimizer_states = true;
  o.config.optimizer.weight_decay = 0.1;
  o.steps = 4;
  o.backend = "cuda";
  // (The limit covers the CUDA context and libraries too: about 0.6 GiB.)
  o.gpu_memory_limit = 1536 * kMiB;
  o.host_memory_limit = 1 * kGiB;
  return o;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
  std::string log;
};

const std::vector<std::string> kNames = {"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
                                         "transformer.h.2.mlp.c_fc.weight", "transformer.ln_f.weight"};

// One trainer on the device at a time: each counts the other's memory against its limit.
Outcome Train(const TrainOptions& o) {
  Outcome r;
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return r;
  for (int i = 0; i < 4; ++i) {
    auto s = (*t)->Step();
    EXPECT_OK(s.status());
    if (!s.ok()) return r;
    r.losses.push_back(s->loss);
  }
  for (const std::string& n : kNames) {
    auto p = (*t)->Parameter(n);
    EXPECT_OK(p.status());
    r.params.push_back(p.ok() ? *p : std::vector<float>{});
  }
  r.log = log.str();
  return r;
}

TEST(TrainerBf16MomentsGpu, GpuAdamAndGpuAssistedGiveTheCpuAdamsBits) {
  STRATA_SKIP_WITHOUT_GPU();
  TrainOptions cpu = TinyGpu();
  cpu.config.zero.offload_optimizer.device = "cpu";
  cpu.config.trainer.gpu_assisted_optimizer = "off";
  const Outcome want = Train(cpu);
  ASSERT_EQ(want.losses.size(), 4u);
  struct Variant {
    const char* what;
    TrainOptions o;
  };
  std::vector<Variant> variants;
  variants.push_back({"resident (GPU Adam)", TinyGpu()});
  TrainOptions assist = cpu;
  assist.config.trainer.gpu_assisted_optimizer = "auto";
  assist.assist_chunk_params = 100003;  // a ragged last chunk
  assist.assist_takes_all = true;
  variants.push_back({"gpu-assisted", assist});
  TrainOptions ratio = cpu;
  ratio.config.zero.offload_optimizer.ratio = 0.5;
  variants.push_back({"ratio 0.5 (GPU Adam prefix)", ratio});
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.what);
    const Outcome got = Train(v.o);
    if (std::string(v.what) == "gpu-assisted") {
      EXPECT_NE(got.log.find("GPU-assisted streaming"), std::string::npos);
    }
    EXPECT_EQ(got.losses, want.losses);
    ASSERT_EQ(got.params.size(), want.params.size());
    for (size_t k = 0; k < kNames.size(); ++k) EXPECT_EQ(got.params[k], want.params[k]) << kNames[k];
  }
}

}  // namespace
}  // namespace strata
