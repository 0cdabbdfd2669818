// SPDX-License-Identifier: Apache-2.0
// Tests for the CPU Adam's C API (optim/c_api.h) through libstrata.so: the
// step is bitwise the C++ CpuAdam::Step on the same inputs (for fp16 and
// bf16 gradients, bf16 state, every copy-out dtype, L2 and decoupled decay,
// with and without bias correction), the gradient statistics and clipping
// helpers equal their C++ counterparts, and every error path returns its
// code and a message naming the field.
#include "optim/c_api.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "optim/cpu_adam.h"
#include "optim/grad_clip.h"
#include "tests/c_api_test_util.h"
#include "tests/optim/adam_test_util.h"
#include "tests/test_util.h"

namespace strata::optim {
namespace {

using ::strata::testing::CError;
using ::strata::testing::CFails;
using ::strata::testing::COk;
using ::strata::testing::RandomFloats;
using ::strata::optim::testing::AdamConfig;
using ::strata::optim::testing::AllConfigs;
using ::strata::optim::testing::ConfigName;
using ::strata::optim::testing::RandomShard;
using ::strata::optim::testing::ShardData;

struct CAdamFixture : ::testing::Test {
  strata_adam* adam = nullptr;
  std::unique_ptr<CpuAdam> cpp;

  void SetUp() override {
    strata_adam_options o;
    strata_adam_options_init(&o);
    o.threads = 2;
    CError err;
    ASSERT_TRUE(COk(strata_adam_create(&o, &adam, err.out()), err));
    CpuAdam::Options c;
    c.threads = 2;
    auto r = CpuAdam::Create(c);
    ASSERT_OK(r.status());
    cpp = std::move(r).value();
  }
  ~CAdamFixture() override { strata_adam_destroy(adam); }
};

// The C shard over a C++ shard's arrays.
strata_adam_shard ToC(const AdamShard& s) {
  strata_adam_shard c{};
  c.n = s.n;
  c.master = s.master;
  c.exp_avg = s.exp_avg;
  c.exp_avg_sq = s.exp_avg_sq;
  c.state_dtype = static_cast<strata_dtype>(s.state_dtype);
  c.grad = s.grad;
  c.grad_dtype = static_cast<strata_dtype>(s.grad_dtype);
  c.param_out = s.param_out;
  c.param_out_dtype = static_cast<strata_dtype>(s.param_out_dtype);
  return c;
}

// An all-fp32 shard over the vectors, without a copy-out.
strata_adam_shard F32Shard(std::vector<float>& master, std::vector<float>& m, std::vector<float>& v,
                           const std::vector<float>& g) {
  strata_adam_shard s{};
  s.n = master.size();
  s.master = master.data();
  s.exp_avg = m.data();
  s.exp_avg_sq = v.data();
  s.state_dtype = STRATA_F32;
  s.grad = g.data();
  s.grad_dtype = STRATA_F32;
  return s;
}

TEST(CAdamNames, IsaNames) {
  EXPECT_STREQ(strata_isa_name(STRATA_ISA_SCALAR), "scalar");
  EXPECT_STREQ(strata_isa_name(STRATA_ISA_AVX512), "avx512");
  EXPECT_STREQ(strata_isa_name(17), "?");
  EXPECT_EQ(strata_optim_struct_size("strata_adam_shard"), sizeof(strata_adam_shard));
  EXPECT_EQ(strata_optim_struct_size("strata_store_options"), 0u);
  strata_adam_destroy(nullptr);  // allowed
}

TEST(CAdamOptions, InitIsTheCppDefaults) {
  strata_adam_options o;
  std::memset(&o, 0xff, sizeof o);
  strata_adam_options_init(&o);
  const CpuAdam::Options d;
  EXPECT_EQ(o.threads, d.threads);
  EXPECT_EQ(o.isa, STRATA_ISA_AUTO);
  EXPECT_EQ(o.tile_elems, d.tile_elems);
  EXPECT_EQ(o.pin_threads, 0);
  EXPECT_EQ(o.numa_node, d.numa_node);
  EXPECT_EQ(o.prefetch_bytes, d.prefetch_bytes);
  EXPECT_EQ(o.prefetch_hint, STRATA_PREFETCH_L1);
  strata_adam_hyper h;
  std::memset(&h, 0xff, sizeof h);
  strata_adam_hyper_init(&h);
  const AdamHyper dh;
  EXPECT_EQ(h.lr, dh.lr);
  EXPECT_EQ(h.beta1, dh.beta1);
  EXPECT_EQ(h.beta2, dh.beta2);
  EXPECT_EQ(h.eps, dh.eps);
  EXPECT_EQ(h.weight_decay, 0.0);
  EXPECT_EQ(h.decay_mode, STRATA_DECAY_DECOUPLED);
  EXPECT_EQ(h.bias_correction, 1);
  EXPECT_EQ(h.step, 1);
}

TEST(CAdamCreate, BadOptionsNameTheOption) {
  strata_adam* adam = nullptr;
  CError err;
  strata_adam_options o;
  strata_adam_options_init(&o);
  o.tile_elems = 100;
  EXPECT_TRUE(CFails(strata_adam_create(&o, &adam, err.out()), err, STRATA_INVALID_ARGUMENT, "tile_elems"));
  strata_adam_options_init(&o);
  o.isa = static_cast<strata_isa>(9);
  EXPECT_TRUE(CFails(strata_adam_create(&o, &adam, err.out()), err, STRATA_INVALID_ARGUMENT, "options.isa 9"));
  strata_adam_options_init(&o);
  o.prefetch_hint = static_cast<strata_prefetch_hint>(2);
  EXPECT_TRUE(CFails(strata_adam_create(&o, &adam, err.out()), err, STRATA_INVALID_ARGUMENT, "prefetch_hint 2"));
  strata_adam_options_init(&o);
  o.threads = -1;
  EXPECT_TRUE(CFails(strata_adam_create(&o, &adam, err.out()), err, STRATA_INVALID_ARGUMENT, "threads"));
  EXPECT_TRUE(CFails(strata_adam_create(nullptr, nullptr, err.out()), err, STRATA_INVALID_ARGUMENT, "adam is NULL"));
  EXPECT_EQ(adam, nullptr);
  // NULL options: the defaults.
  ASSERT_TRUE(COk(strata_adam_create(nullptr, &adam, err.out()), err));
  strata_adam_info info;
  ASSERT_TRUE(COk(strata_adam_info_get(adam, &info, err.out()), err));
  EXPECT_NE(info.isa, STRATA_ISA_AUTO);
  EXPECT_GE(info.threads, 1);
  EXPECT_EQ(info.pinned, 0);
  strata_adam_destroy(adam);
}

// Every dtype combination (tests/optim/adam_test_util.h), alternating the
// decay mode and bias correction, three steps each on a copy of the same
// random shard: the C call and CpuAdam::Step write the same bits.
TEST_F(CAdamFixture, StepIsBitwiseTheCppStep) {
  const size_t n = 4099;  // several tiles and a ragged end
  int k = 0;
  for (const AdamConfig& cfg : AllConfigs()) {
    SCOPED_TRACE(ConfigName(cfg));
    const bool l2 = k % 2 == 1, bias_correction = k % 3 != 2;
    ShardData c = RandomShard(cfg, n, 100 + k, /*out_offset=*/k % 5);
    ShardData cpp_data = c;
    const ShardData before = c;
    ++k;
    for (int64_t step = 1; step <= 3; ++step) {
      strata_adam_hyper h;
      strata_adam_hyper_init(&h);
      h.lr = 1e-2;
      h.weight_decay = 0.1;
      h.decay_mode = l2 ? STRATA_DECAY_L2 : STRATA_DECAY_DECOUPLED;
      h.bias_correction = bias_correction ? 1 : 0;
      h.step = step;
      const strata_adam_shard cs = ToC(c.Shard());
      strata_adam_result r{99, 99};
      CError err;
      ASSERT_TRUE(COk(strata_adam_step(adam, &cs, &h, 0.5, 0, &r, err.out()), err));
      EXPECT_EQ(r.nonfinite_grads, 0u);
      EXPECT_EQ(r.skipped, 0);

      AdamHyper ch;
      ch.lr = 1e-2;
      ch.weight_decay = 0.1;
      ch.decay_mode = l2 ? WeightDecayMode::kL2 : WeightDecayMode::kDecoupled;
      ch.bias_correction = bias_correction;
      ch.step = step;
      ASSERT_OK(cpp->Step(cpp_data.Shard(), ch, {.grad_scale = 0.5}).status());
    }
    std::string where;
    EXPECT_TRUE(c.SameValues(cpp_data, &where)) << where;  // no NaNs here: bitwise
    EXPECT_NE(c.master, before.master);                      // it did update
  }
}

TEST_F(CAdamFixture, SkipOnNonfiniteWritesNothing) {
  const size_t n = 1000;
  std::vector<float> master = RandomFloats(n, 1), m(n, 0.f), v(n, 0.f), g = RandomFloats(n, 2);
  g[777] = std::numeric_limits<float>::quiet_NaN();
  g[3] = std::numeric_limits<float>::infinity();
  const std::vector<float> before = master;
  const strata_adam_shard cs = F32Shard(master, m, v, g);
  strata_adam_hyper h;
  strata_adam_hyper_init(&h);
  strata_adam_result r{};
  CError err;
  ASSERT_TRUE(COk(strata_adam_step(adam, &cs, &h, 1.0, 1, &r, err.out()), err));
  EXPECT_EQ(r.skipped, 1);
  EXPECT_EQ(r.nonfinite_grads, 2u);
  EXPECT_EQ(master, before);
  // Without the skip it updates and counts them; result may be NULL.
  ASSERT_TRUE(COk(strata_adam_step(adam, &cs, &h, 1.0, 0, &r, err.out()), err));
  EXPECT_EQ(r.skipped, 0);
  EXPECT_EQ(r.nonfinite_grads, 2u);
  EXPECT_TRUE(std::isnan(master[777]));
  ASSERT_TRUE(COk(strata_adam_step(adam, &cs, &h, 1.0, 0, nullptr, err.out()), err));
}

TEST_F(CAdamFixture, BadHyperparametersAndShardsNameTheField) {
  const size_t n = 64;
  std::vector<float> master(n, 1.f), m(n, 0.f), v(n, 0.f), g(n, 0.5f);
  const strata_adam_shard cs = F32Shard(master, m, v, g);
  CError err;
  auto step = [&](const strata_adam_shard& s, const strata_adam_hyper& h, double scale = 1.0) {
    return strata_adam_step(adam, &s, &h, scale, 0, nullptr, err.out());
  };
  strata_adam_hyper h;
  strata_adam_hyper_init(&h);
  h.lr = -1;
  EXPECT_TRUE(CFails(step(cs, h), err, STRATA_INVALID_ARGUMENT, "AdamHyper.lr must be finite and >= 0"));
  strata_adam_hyper_init(&h);
  h.beta1 = 1.0;
  EXPECT_TRUE(CFails(step(cs, h), err, STRATA_INVALID_ARGUMENT, "AdamHyper.beta1"));
  strata_adam_hyper_init(&h);
  h.beta2 = NAN;
  EXPECT_TRUE(CFails(step(cs, h), err, STRATA_INVALID_ARGUMENT, "AdamHyper.beta2"));
  strata_adam_hyper_init(&h);
  h.eps = -1e-8;
  EXPECT_TRUE(CFails(step(cs, h), err, STRATA_INVALID_ARGUMENT, "AdamHyper.eps"));
  strata_adam_hyper_init(&h);
  h.weight_decay = -0.1;
  EXPECT_TRUE(CFails(step(cs, h), err, STRATA_INVALID_ARGUMENT, "AdamHyper.weight_decay"));
  strata_adam_hyper_init(&h);
  h.step = 0;
  EXPECT_TRUE(CFails(step(cs, h), err, STRATA_INVALID_ARGUMENT, "AdamHyper.step counts from 1"));
  strata_adam_hyper_init(&h);
  h.decay_mode = static_cast<strata_weight_decay>(7);
  EXPECT_TRUE(CFails(step(cs, h), err, STRATA_INVALID_ARGUMENT, "hyper.decay_mode 7"));
  strata_adam_hyper_init(&h);
  EXPECT_TRUE(CFails(step(cs, h, -1.0), err, STRATA_INVALID_ARGUMENT, "grad_scale"));

  strata_adam_shard bad = cs;
  bad.grad_dtype = STRATA_I32;
  EXPECT_TRUE(CFails(step(bad, h), err, STRATA_INVALID_ARGUMENT, "AdamShard.grad_dtype must be f32, f16 or bf16"));
  bad = cs;
  bad.grad_dtype = static_cast<strata_dtype>(42);
  EXPECT_TRUE(CFails(step(bad, h), err, STRATA_INVALID_ARGUMENT, "shard.grad_dtype 42 is not a strata_dtype"));
  bad = cs;
  bad.state_dtype = STRATA_F16;
  EXPECT_TRUE(CFails(step(bad, h), err, STRATA_INVALID_ARGUMENT, "AdamShard.state_dtype"));
  bad = cs;
  bad.master = nullptr;
  EXPECT_TRUE(CFails(step(bad, h), err, STRATA_INVALID_ARGUMENT, "master"));
  EXPECT_TRUE(CFails(strata_adam_step(adam, nullptr, &h, 1.0, 0, nullptr, err.out()), err, STRATA_INVALID_ARGUMENT,
                     "shard is NULL"));
  EXPECT_TRUE(CFails(strata_adam_step(adam, &cs, nullptr, 1.0, 0, nullptr, err.out()), err,
                     STRATA_INVALID_ARGUMENT, "hyper is NULL"));
  EXPECT_EQ(master, std::vector<float>(n, 1.f));  // nothing was written by any of them
}

TEST_F(CAdamFixture, GradStatsAndClippingMatchTheCppHelpers) {
  const size_t n = 70000;  // two stats tiles
  const std::vector<uint8_t> g = RandomShard({DType::kBF16, DType::kF32, false}, n, 5).grad;
  strata_grad_stats st{};
  CError err;
  ASSERT_TRUE(COk(strata_adam_grad_stats(adam, g.data(), STRATA_BF16, n, &st, err.out()), err));
  ASSERT_OK_AND_ASSIGN(const GradStats ref, cpp->ComputeGradStats(g.data(), DType::kBF16, n));
  EXPECT_EQ(st.sum_sq, ref.sum_sq);  // deterministic: bitwise
  EXPECT_EQ(st.nonfinite, 0u);
  EXPECT_EQ(st.count, n);

  strata_grad_stats total{};
  ASSERT_TRUE(COk(strata_grad_stats_merge(&total, &st, err.out()), err));
  ASSERT_TRUE(COk(strata_grad_stats_merge(&total, &st, err.out()), err));
  EXPECT_EQ(total.count, 2 * n);
  EXPECT_EQ(total.sum_sq, 2 * ref.sum_sq);

  double norm = 0, coef = 0, mult = 0;
  ASSERT_TRUE(COk(strata_global_grad_norm(&total, 1024.0, &norm, err.out()), err));
  GradStats t = ref;
  t.Merge(ref);
  EXPECT_EQ(norm, GlobalGradNorm(t, 1024.0));
  ASSERT_TRUE(COk(strata_clip_coefficient(norm, 0.1, &coef, err.out()), err));
  EXPECT_EQ(coef, ClipCoefficient(norm, 0.1));
  EXPECT_LT(coef, 1.0);
  ASSERT_TRUE(COk(strata_grad_multiplier(1024.0, coef, &mult, err.out()), err));
  EXPECT_EQ(mult, GradMultiplier(1024.0, coef));
  ASSERT_TRUE(COk(strata_clip_coefficient(norm, 0.0, &coef, err.out()), err));
  EXPECT_EQ(coef, 1.0);  // no clipping

  // A non-finite gradient: counted, and the norm is +Inf.
  std::vector<float> bad(100, 1.f);
  bad[50] = -std::numeric_limits<float>::infinity();
  ASSERT_TRUE(COk(strata_adam_grad_stats(adam, bad.data(), STRATA_F32, bad.size(), &st, err.out()), err));
  EXPECT_EQ(st.nonfinite, 1u);
  ASSERT_TRUE(COk(strata_global_grad_norm(&st, 1.0, &norm, err.out()), err));
  EXPECT_TRUE(std::isinf(norm));

  EXPECT_TRUE(CFails(strata_adam_grad_stats(adam, g.data(), STRATA_I8, n, &st, err.out()), err,
                     STRATA_INVALID_ARGUMENT, "i8"));
  EXPECT_TRUE(CFails(strata_adam_grad_stats(adam, g.data(), 77, n, &st, err.out()), err, STRATA_INVALID_ARGUMENT,
                     "dtype 77 is not a strata_dtype"));
  EXPECT_TRUE(CFails(strata_global_grad_norm(&st, 0.0, &norm, err.out()), err, STRATA_INVALID_ARGUMENT,
                     "loss_scale must be finite and > 0"));
  EXPECT_TRUE(CFails(strata_clip_coefficient(1.0, NAN, &coef, err.out()), err, STRATA_INVALID_ARGUMENT,
                     "gradient_clipping"));
  EXPECT_TRUE(CFails(strata_grad_multiplier(1.0, -0.5, &mult, err.out()), err, STRATA_INVALID_ARGUMENT,
                     "clip_coef must be finite and >= 0"));
  EXPECT_TRUE(CFails(strata_grad_multiplier(INFINITY, 1.0, &mult, err.out()), err, STRATA_INVALID_ARGUMENT,
                     "loss_scale"));
}

}  // namespace
}  // namespace strata::optim
