// SPDX-License-Identifier: Apache-2.0
// CpuAdam with bf16 moments (bf16.bf16_optimizer_states) over many steps,
// on every ISA path this machine has, against a float64 reference that
// keeps m and v as the trainer does: the update computed from the stored
// (bf16) moments, the master updated from the unrounded new moments, then m
// and v rounded to bf16 (nearest even) for storage. A one-step check of
// every dtype is cpu_adam_test.cc's; this one follows the moments through
// the rounding that happens after each step.
//
// The fp32 evaluation and the float64 one round m and v to the same bf16
// value except when the exact value lies within an fp32 rounding of a bf16
// midpoint; from then on that element's moments may differ by one bf16 step
// (the difference decays by beta each step and is rounded again). So the
// test tracks, per element, whether its stored m or v ever differed from the
// reference's: those that never did must have the reference's master within
// the fp32 error bound; those that did (measured: 7% to 41% of them over 40
// steps, see below) must stay within two bf16 steps of the largest value
// they held and their master within the effect of such a moment difference
// on the updates.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/half.h"
#include "optim/cpu_adam.h"
#include "optim/cpu_features.h"
#include "tests/optim/adam_test_util.h"
#include "tests/test_util.h"

namespace strata::optim {
namespace {

using ::strata::optim::testing::SplitMix;

// `x` rounded once to bf16, nearest, ties to the even mantissa (the fp32
// conversion's neighbours, chosen by distance in double).
uint16_t RoundToBF16(double x) {
  const uint16_t c = FloatToBF16(static_cast<float>(x));
  uint16_t best = c;
  double best_d = std::fabs(static_cast<double>(BF16ToFloat(c)) - x);
  for (int d : {-1, 1}) {
    const uint16_t n = static_cast<uint16_t>(c + d);
    if ((n & 0x7f80u) == 0x7f80u || ((n ^ c) & 0x8000u)) continue;  // no Inf/NaN, no sign change
    const double nd = std::fabs(static_cast<double>(BF16ToFloat(n)) - x);
    if (nd < best_d || (nd == best_d && (n & 1u) == 0)) best = n, best_d = nd;
  }
  return best;
}

struct RefStepResult {
  double p, m, v, p_scale;
};

// One step in float64 with the step's constants as the kernels receive them
// (AdamCoefficients: each rounded once to fp32, optim/adam_coefficients.h).
// The constants must be the kernels': with bf16 moments, beta2 x v of a bf16
// v often lands next to a bf16 midpoint, where the 1e-8 between 0.95 and
// its fp32 value decides the rounding. `p_scale` is the magnitude of the
// terms the master sums (the fp32 error bound is relative to it).
RefStepResult RefStep(double p, double m, double v, double g, const AdamCoefficients& c) {
  double g_scale = std::fabs(g);
  if (c.l2_decay != 0.f) {
    g += static_cast<double>(c.l2_decay) * p;
    g_scale += static_cast<double>(c.l2_decay) * std::fabs(p);
  }
  RefStepResult r;
  r.m = static_cast<double>(c.beta1) * m + static_cast<double>(c.one_minus_beta1) * g;
  const double m_scale = static_cast<double>(c.beta1) * std::fabs(m) + static_cast<double>(c.one_minus_beta1) * g_scale;
  r.v = static_cast<double>(c.beta2) * v + static_cast<double>(c.one_minus_beta2) * g * g;
  const double v_scale = static_cast<double>(c.beta2) * v + static_cast<double>(c.one_minus_beta2) * g_scale * g_scale;
  const double d = std::sqrt(r.v) * static_cast<double>(c.inv_sqrt_bc2) + static_cast<double>(c.eps);
  double pn = p + static_cast<double>(c.neg_lr_decay) * p;
  const double step = -static_cast<double>(c.neg_step_size);
  r.p = pn - step * r.m / d;
  const double v_sensitivity = r.v > 0 ? v_scale / r.v : 0.0;
  r.p_scale = std::fabs(p) * (1 + std::fabs(static_cast<double>(c.neg_lr_decay))) +
              step * (m_scale + std::fabs(r.m) * v_sensitivity) / d;
  return r;
}

struct Run {
  std::vector<float> master;
  std::vector<uint16_t> m, v;  // bf16
};

struct RefRun {
  std::vector<double> master;
  std::vector<uint16_t> m, v;  // bf16, as the reference stores them
  std::vector<double> p_scale;  // the magnitude of the terms the master summed, over all steps
};

void RunCase(const CpuAdam& adam, const AdamHyper& base, DType grad_dtype, size_t n, int steps, uint64_t seed) {
  SplitMix rng{seed};
  Run cpu;
  RefRun ref;
  cpu.master.resize(n);
  cpu.m.assign(n, 0);
  cpu.v.assign(n, 0);
  ref.master.resize(n);
  ref.m.assign(n, 0);
  ref.v.assign(n, 0);
  ref.p_scale.assign(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    cpu.master[i] = rng.Signed();
    ref.master[i] = cpu.master[i];
  }
  std::vector<uint8_t> grad(n * DTypeSize(grad_dtype));
  std::vector<uint16_t> out(n);
  std::vector<bool> diverged(n, false);
  std::vector<double> m_max(n, 0.0), v_max(n, 0.0);  // each element's largest |m|, v so far (the reference's)
  double max_step = 0;  // the largest lr / bc1 of the steps
  for (int t = 1; t <= steps; ++t) {
    AdamHyper h = base;
    h.step = t;
    // Gradients of magnitudes 1e-4..1 with a per-element bias, so that m
    // and v build up as they do in training.
    for (size_t i = 0; i < n; ++i) {
      const float g = (0.3f * static_cast<float>((i % 7)) / 7.f - 0.15f + rng.Signed()) *
                      std::pow(10.f, -4.f + 4.f * rng.Unit());
      testing::Encode(grad_dtype, grad.data(), i, g);
    }
    AdamShard s;
    s.n = n;
    s.master = cpu.master.data();
    s.exp_avg = cpu.m.data();
    s.exp_avg_sq = cpu.v.data();
    s.state_dtype = DType::kBF16;
    s.grad = grad.data();
    s.grad_dtype = grad_dtype;
    s.param_out = out.data();
    s.param_out_dtype = DType::kBF16;
    ASSERT_OK(adam.Step(s, h).status());

    ASSERT_OK_AND_ASSIGN(const AdamCoefficients c, MakeAdamCoefficients(h, 1.0));
    max_step = std::max(max_step, -static_cast<double>(c.neg_step_size));
    for (size_t i = 0; i < n; ++i) {
      const double g = testing::Decode(grad_dtype, grad.data(), i);
      const RefStepResult r = RefStep(ref.master[i], BF16ToFloat(ref.m[i]), BF16ToFloat(ref.v[i]), g, c);
      ref.master[i] = r.p;
      ref.p_scale[i] += r.p_scale;
      ref.m[i] = RoundToBF16(r.m);
      ref.v[i] = RoundToBF16(r.v);
      m_max[i] = std::max(m_max[i], std::fabs(r.m));
      v_max[i] = std::max(v_max[i], r.v);
      if (cpu.m[i] != ref.m[i] || cpu.v[i] != ref.v[i]) diverged[i] = true;
    }
  }
  int failures = 0;
  size_t n_diverged = 0;
  for (size_t i = 0; i < n && failures < 8; ++i) {
    n_diverged += diverged[i];
    const double dp = std::fabs(static_cast<double>(cpu.master[i]) - ref.master[i]);
    if (!diverged[i]) {
      // The fp32 bound of each step's update (cpu_adam_test's), summed.
      const double tol = 1e-6 * ref.p_scale[i] + 1e-37;
      if (dp > tol) {
        ++failures;
        ADD_FAILURE() << "element " << i << ": master " << cpu.master[i] << ", reference " << ref.master[i]
                      << " (error " << dp << " > " << tol << "), m and v equal to the reference's at every step";
      }
    } else {
      // One bf16 step (2^-8 relative) of m, or of sqrt(v) through v, moves
      // an update of at most step_size x |m| / sqrt(v) ~ step_size / sqrt(1 - beta2)
      // by under 1%; bounded over all steps by 0.01 x steps x that.
      const double tol = 1e-6 * ref.p_scale[i] + 0.01 * steps * max_step / std::sqrt(1.0 - base.beta2);
      // The moments: within two bf16 steps of the largest value they held
      // (a difference made then decays with beta while the value may shrink).
      const double dm = std::fabs(static_cast<double>(BF16ToFloat(cpu.m[i])) - BF16ToFloat(ref.m[i]));
      const double dv = std::fabs(static_cast<double>(BF16ToFloat(cpu.v[i])) - BF16ToFloat(ref.v[i]));
      if (dp > tol || dm > 0x1p-7 * m_max[i] || dv > 0x1p-7 * v_max[i]) {
        ++failures;
        ADD_FAILURE() << "element " << i << " (its moments differed from the reference's after some step): master "
                      << cpu.master[i] << " vs " << ref.master[i] << " (tolerance " << tol << "), m 0x" << std::hex
                      << cpu.m[i] << " vs 0x" << ref.m[i] << ", v 0x" << cpu.v[i] << " vs 0x" << ref.v[i] << std::dec;
      }
    }
  }
  // Differing moments need an exact value within an fp32 rounding of a bf16
  // midpoint, which is commoner than it sounds: beta x m for a bf16 m is
  // often exactly a bf16 midpoint (0.95 x 130 = 123.5), where fp32 ties to
  // even and float64, seeing beta's fp32 value just below 0.95, rounds
  // down. Measured with these settings: 7% (fp32 gradients) to 41% (bf16
  // gradients, themselves few-bit) of the elements over 40 steps. Their
  // bound above is what catches a rounding that is not to nearest: a
  // truncation's one-step bias adds up to about 1 / (1 - beta) steps.
  ::testing::Test::RecordProperty("moments_differed", static_cast<int>(n_diverged));
  // The parameter copy is the master rounded to bf16.
  for (size_t i = 0; i < n; ++i)
    if (out[i] != FloatToBF16(cpu.master[i])) {
      ADD_FAILURE() << "param_out[" << i << "] is not the master rounded to bf16";
      break;
    }
}

TEST(CpuAdamBf16Moments, ManyStepsMatchFloat64WithMomentsRoundedEveryStep) {
  const uint64_t seed = ::strata::testing::TestSeed(29);
  SCOPED_TRACE(::strata::testing::SeedNote(seed));
  for (Isa isa : SupportedIsas()) {
    CpuAdam::Options o;
    o.isa = isa;
    o.threads = 2;
    o.tile_elems = 1024;
    ASSERT_OK_AND_ASSIGN(auto adam, CpuAdam::Create(o));
    for (DType g : {DType::kF32, DType::kBF16}) {
      for (WeightDecayMode mode : {WeightDecayMode::kDecoupled, WeightDecayMode::kL2}) {
        SCOPED_TRACE(std::string(IsaName(isa)) + ", grad " + std::string(DTypeName(g)) +
                     (mode == WeightDecayMode::kL2 ? ", L2" : ", decoupled"));
        AdamHyper h;
        h.lr = 1e-3;
        h.beta1 = 0.9;
        h.beta2 = 0.95;
        h.eps = 1e-8;
        h.weight_decay = 0.1;
        h.decay_mode = mode;
        RunCase(*adam, h, g, 4099, 40, seed);
      }
    }
  }
}

// The moments' rounding on store is the only difference from fp32 moments:
// one step from the same (bf16-representable) state gives the same master
// bit for bit, and moments that are the fp32 ones rounded to nearest even.
TEST(CpuAdamBf16Moments, OneStepIsTheFp32StepWithMomentsRounded) {
  ASSERT_OK_AND_ASSIGN(auto adam, CpuAdam::Create());
  const size_t n = 1027;
  SplitMix rng{7};
  std::vector<float> master(n), m32(n), v32(n), grad(n);
  std::vector<uint16_t> m16(n), v16(n);
  for (size_t i = 0; i < n; ++i) {
    master[i] = rng.Signed();
    m16[i] = FloatToBF16(1e-2f * rng.Signed());
    v16[i] = FloatToBF16(1e-3f * rng.Unit());
    m32[i] = BF16ToFloat(m16[i]);
    v32[i] = BF16ToFloat(v16[i]);
    grad[i] = 0.1f * rng.Signed();
  }
  std::vector<float> master16 = master;
  AdamShard a;
  a.n = n;
  a.master = master.data();
  a.exp_avg = m32.data();
  a.exp_avg_sq = v32.data();
  a.grad = grad.data();
  a.param_out = nullptr;
  AdamShard b = a;
  b.master = master16.data();
  b.exp_avg = m16.data();
  b.exp_avg_sq = v16.data();
  b.state_dtype = DType::kBF16;
  AdamHyper h;
  h.step = 5;
  ASSERT_OK(adam->Step(a, h).status());
  ASSERT_OK(adam->Step(b, h).status());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::memcmp(&master[i], &master16[i], 4), 0) << i;
    ASSERT_EQ(m16[i], FloatToBF16(m32[i])) << i;
    ASSERT_EQ(v16[i], FloatToBF16(v32[i])) << i;
  }
}

}  // namespace
}  // namespace strata::optim
