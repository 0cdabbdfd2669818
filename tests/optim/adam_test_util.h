// SPDX-License-Identifier: Apache-2.0
// Shared by the CPU and GPU Adam tests: random shards of every dtype
// combination, a float64 reference of the update, and the tolerance checks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/dtype.h"
#include "base/half.h"
#include "optim/cpu_adam.h"

namespace strata::optim::testing {

// One dtype combination of a shard.
struct AdamConfig {
  DType grad = DType::kF32;
  DType state = DType::kF32;
  bool has_out = false;
  DType out = DType::kF16;
};

inline std::string ConfigName(const AdamConfig& c) {
  return "grad_" + std::string(DTypeName(c.grad)) + "_state_" + std::string(DTypeName(c.state)) + "_out_" +
         (c.has_out ? std::string(DTypeName(c.out)) : std::string("none"));
}

// Every combination the kernels implement (3 x 2 x 4).
inline std::vector<AdamConfig> AllConfigs() {
  std::vector<AdamConfig> v;
  for (DType g : {DType::kF32, DType::kF16, DType::kBF16})
    for (DType s : {DType::kF32, DType::kBF16}) {
      v.push_back({g, s, false, DType::kF16});
      for (DType o : {DType::kF32, DType::kF16, DType::kBF16}) v.push_back({g, s, true, o});
    }
  return v;
}

inline float Decode(DType t, const uint8_t* base, size_t i) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, base + 4 * i, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, base + 2 * i, 2);
      return HalfToFloat(h);
    }
    default: {
      uint16_t h;
      std::memcpy(&h, base + 2 * i, 2);
      return BF16ToFloat(h);
    }
  }
}

inline void Encode(DType t, uint8_t* base, size_t i, float x) {
  if (t == DType::kF32) {
    std::memcpy(base + 4 * i, &x, 4);
  } else {
    uint16_t h = t == DType::kF16 ? FloatToHalf(x) : FloatToBF16(x);
    std::memcpy(base + 2 * i, &h, 2);
  }
}

inline uint16_t Bits16(const uint8_t* base, size_t i) {
  uint16_t h;
  std::memcpy(&h, base + 2 * i, 2);
  return h;
}

// Host arrays of a shard, with the parameter copy starting `out_offset`
// elements past a 64-byte boundary (to exercise the alignment peel).
struct ShardData {
  AdamConfig cfg;
  size_t n = 0;
  std::vector<float> master;
  std::vector<uint8_t> m, v, grad;
  std::vector<uint8_t> out_storage;
  size_t out_offset = 0;

  ShardData() = default;
  // Copies keep the copy's contents at the same alignment offset.
  ShardData(const ShardData& o)
      : cfg(o.cfg), n(o.n), master(o.master), m(o.m), v(o.v), grad(o.grad), out_offset(o.out_offset) {
    if (cfg.has_out) {
      out_storage.assign(o.out_storage.size(), 0);
      std::memcpy(AlignedOut(), o.out(), n * DTypeSize(cfg.out));
    }
  }
  ShardData& operator=(const ShardData& o) {
    if (this != &o) {
      ShardData c(o);
      *this = std::move(c);
    }
    return *this;
  }
  ShardData(ShardData&&) = default;
  ShardData& operator=(ShardData&&) = default;

  uint8_t* out() { return cfg.has_out ? AlignedOut() : nullptr; }
  const uint8_t* out() const { return cfg.has_out ? const_cast<ShardData*>(this)->AlignedOut() : nullptr; }

  AdamShard Shard() {
    AdamShard s;
    s.n = n;
    s.master = master.data();
    s.exp_avg = m.data();
    s.exp_avg_sq = v.data();
    s.state_dtype = cfg.state;
    s.grad = grad.data();
    s.grad_dtype = cfg.grad;
    s.param_out = out();
    s.param_out_dtype = cfg.out;
    return s;
  }

  // Equality of everything a step writes, bit for bit except that any two
  // NaNs of a format are equal: NaN payloads are not part of the contract
  // (the GPU produces canonical NaNs, x86 propagates an input's payload).
  bool SameValues(const ShardData& o, std::string* where) const {
    auto nan32 = [](const uint8_t* b, size_t i) {
      uint32_t u;
      std::memcpy(&u, b + 4 * i, 4);
      return (u & 0x7fffffffu) > 0x7f800000u;
    };
    auto nan16 = [](DType t, const uint8_t* b, size_t i) {
      uint16_t h = Bits16(b, i);
      return t == DType::kF16 ? (h & 0x7fffu) > 0x7c00u : (h & 0x7fffu) > 0x7f80u;
    };
    auto cmp = [&](DType t, const uint8_t* a, const uint8_t* b, const char* name) {
      size_t es = DTypeSize(t);
      for (size_t i = 0; i < n; ++i) {
        if (std::memcmp(a + i * es, b + i * es, es) == 0) continue;
        bool both_nan = es == 4 ? nan32(a, i) && nan32(b, i) : nan16(t, a, i) && nan16(t, b, i);
        if (both_nan) continue;
        *where = std::string(name) + " differs at element " + std::to_string(i);
        return false;
      }
      return true;
    };
    return cmp(DType::kF32, reinterpret_cast<const uint8_t*>(master.data()),
               reinterpret_cast<const uint8_t*>(o.master.data()), "master") &&
           cmp(cfg.state, m.data(), o.m.data(), "exp_avg") && cmp(cfg.state, v.data(), o.v.data(), "exp_avg_sq") &&
           (!cfg.has_out || cmp(cfg.out, out(), o.out(), "param_out"));
  }

  // Byte-wise equality of everything a step writes.
  bool SameState(const ShardData& o, std::string* where) const {
    auto cmp = [&](const void* a, const void* b, size_t bytes, const char* name) {
      if (std::memcmp(a, b, bytes) == 0) return true;
      const uint8_t* x = static_cast<const uint8_t*>(a);
      const uint8_t* y = static_cast<const uint8_t*>(b);
      size_t i = 0;
      while (x[i] == y[i]) ++i;
      *where = std::string(name) + " differs at byte " + std::to_string(i);
      return false;
    };
    size_t ss = DTypeSize(cfg.state);
    return cmp(master.data(), o.master.data(), n * 4, "master") && cmp(m.data(), o.m.data(), n * ss, "exp_avg") &&
           cmp(v.data(), o.v.data(), n * ss, "exp_avg_sq") &&
           (!cfg.has_out || cmp(out(), o.out(), n * DTypeSize(cfg.out), "param_out"));
  }

 private:
  uint8_t* AlignedOut() {
    uintptr_t base = reinterpret_cast<uintptr_t>(out_storage.data());
    uintptr_t aligned = (base + 63) & ~uintptr_t{63};
    return reinterpret_cast<uint8_t*>(aligned) + out_offset * DTypeSize(cfg.out);
  }
};

// A fast deterministic generator for test data (splitmix64).
struct SplitMix {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  float Unit() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }
  float Signed() { return 2.f * Unit() - 1.f; }
};

// Random shard: master in (-1, 1), m in (-1e-2, 1e-2), v in [0, 1e-3),
// gradients of magnitudes 1e-3..3 (representable in the gradient dtype).
inline ShardData RandomShard(const AdamConfig& cfg, size_t n, uint64_t seed, size_t out_offset = 0) {
  ShardData d;
  d.cfg = cfg;
  d.n = n;
  d.out_offset = out_offset;
  SplitMix rng{seed};
  float mags[64];
  for (int k = 0; k < 64; ++k) mags[k] = std::pow(10.f, -3.f + 3.5f * static_cast<float>(k) / 63.f);
  d.master.resize(n);
  d.m.resize(n * DTypeSize(cfg.state));
  d.v.resize(n * DTypeSize(cfg.state));
  d.grad.resize(n * DTypeSize(cfg.grad));
  for (size_t i = 0; i < n; ++i) {
    d.master[i] = rng.Signed();
    Encode(cfg.state, d.m.data(), i, 1e-2f * rng.Signed());
    Encode(cfg.state, d.v.data(), i, 1e-3f * rng.Unit());
    Encode(cfg.grad, d.grad.data(), i, rng.Signed() * mags[rng.Next() & 63]);
  }
  if (cfg.has_out) {
    d.out_storage.assign((n + out_offset) * DTypeSize(cfg.out) + 64, 0xA5);  // a sentinel pattern
  }
  return d;
}

// Random hyperparameters over the ranges real runs use, each drawn
// log-uniformly where it spans decades (lr, eps, 1 - beta1, 1 - beta2, the
// weight decay, the step), so that the small steps, where the bias
// corrections are far from 1, come up as often as the large ones; both decay
// modes, with and without bias correction.
inline AdamHyper RandomHyper(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto log_uniform = [&](double lo, double hi) { return lo * std::pow(hi / lo, u(rng)); };
  AdamHyper h;
  h.lr = log_uniform(1e-5, 1e-2);
  h.beta1 = 1.0 - log_uniform(1e-2, 0.5);
  h.beta2 = 1.0 - log_uniform(1e-4, 0.1);
  h.eps = log_uniform(1e-10, 1e-6);
  h.weight_decay = u(rng) < 0.25 ? 0.0 : log_uniform(1e-4, 0.3);
  h.decay_mode = u(rng) < 0.5 ? WeightDecayMode::kDecoupled : WeightDecayMode::kL2;
  h.bias_correction = u(rng) < 0.8;
  h.step = std::min<int64_t>(10000, static_cast<int64_t>(log_uniform(1.0, 10001.0)));
  return h;
}

// The update in float64 from the (decoded) inputs, with the magnitude of the
// terms each result sums: an fp32 evaluation's error is measured relative to
// that, since a sum that cancels has no relative accuracy to speak of.
struct RefResult {
  double p, m, v;
  double p_scale, m_scale, v_scale;
};

// Bias corrections of a step: 1 - beta^t, or 1 without correction.
struct RefBias {
  double bc1 = 1.0, bc2 = 1.0;
  explicit RefBias(const AdamHyper& h) {
    if (h.bias_correction) {
      bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
      bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
    }
  }
};

inline RefResult RefAdam(double p, double m, double v, double g_stored, const AdamHyper& h, double grad_scale,
                         const RefBias& bias) {
  const double b1 = h.beta1, b2 = h.beta2;
  const double bc1 = bias.bc1, bc2 = bias.bc2;
  double g = g_stored * grad_scale;
  double g_scale = std::fabs(g);
  if (h.decay_mode == WeightDecayMode::kL2 && h.weight_decay != 0.0) {
    g += h.weight_decay * p;
    g_scale += h.weight_decay * std::fabs(p);
  }
  RefResult r;
  r.m = b1 * m + (1.0 - b1) * g;
  r.m_scale = b1 * std::fabs(m) + (1.0 - b1) * g_scale;
  r.v = b2 * v + (1.0 - b2) * g * g;
  // g may itself be the rounded result of a cancelling sum (L2 mode).
  r.v_scale = b2 * v + (1.0 - b2) * g_scale * g_scale;
  const double denom = std::sqrt(r.v) / std::sqrt(bc2) + h.eps;
  double pn = p;
  double p_scale = std::fabs(p);
  if (h.decay_mode == WeightDecayMode::kDecoupled && h.weight_decay != 0.0) {
    pn = p - h.lr * h.weight_decay * p;
    p_scale += h.lr * h.weight_decay * std::fabs(p);
  }
  const double step = h.lr / bc1;
  r.p = pn - step * r.m / denom;
  // First-order error propagation: m's error, and sqrt(v)'s relative error
  // (half of v's) carried through the division.
  const double v_sensitivity = r.v > 0 ? r.v_scale / r.v : 0.0;
  r.p_scale = p_scale + step * (r.m_scale + std::fabs(r.m) * v_sensitivity) / denom;
  return r;
}

// Distance in representable steps between two 16-bit floats of one format.
inline int64_t Steps16(uint16_t a, uint16_t b) {
  auto ord = [](uint16_t x) -> int64_t { return (x & 0x8000) ? -static_cast<int64_t>(x & 0x7fff) : x; };
  return std::llabs(ord(a) - ord(b));
}

// fp32 result vs the float64 reference: within 1e-6 of the terms' magnitude.
inline ::testing::AssertionResult Near32(float got, double ref, double scale, const char* what, size_t i) {
  double tol = 1e-6 * scale + 1e-37;
  if (std::fabs(static_cast<double>(got) - ref) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << "[" << i << "] = " << got << ", float64 reference " << ref
                                       << " (error " << std::fabs(got - ref) << " > " << tol << ")";
}

// 16-bit result vs the reference rounded once to that format: at most one
// rounding step apart (or, where the fp32 sum cancelled, within the fp32
// error bound plus one step).
inline ::testing::AssertionResult Near16(DType t, uint16_t got, double ref, double scale, const char* what,
                                         size_t i) {
  float rf = static_cast<float>(ref);
  uint16_t want = t == DType::kF16 ? FloatToHalf(rf) : FloatToBF16(rf);
  if (Steps16(got, want) <= 1) return ::testing::AssertionSuccess();
  float gf = t == DType::kF16 ? HalfToFloat(got) : BF16ToFloat(got);
  int e = 0;
  std::frexp(ref, &e);
  double step = std::ldexp(1.0, e - (t == DType::kF16 ? 11 : 8));
  if (std::fabs(gf - ref) <= 1e-6 * scale + step) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << "[" << i << "] = 0x" << std::hex << got << " ("
                                       << std::dec << gf << "), reference " << ref << " rounds to 0x" << std::hex
                                       << want << std::dec;
}

// Checks every output of `after` (the step applied to `before`) against the
// float64 reference. Stops at the first few failures.
inline void ExpectMatchesReference(const ShardData& before, const ShardData& after, const AdamHyper& h,
                                   double grad_scale) {
  const AdamConfig& c = before.cfg;
  const RefBias bias(h);
  int failures = 0;
  for (size_t i = 0; i < before.n && failures < 5; ++i) {
    RefResult r = RefAdam(before.master[i], Decode(c.state, before.m.data(), i), Decode(c.state, before.v.data(), i),
                          Decode(c.grad, before.grad.data(), i), h, grad_scale, bias);
    auto check = [&](::testing::AssertionResult ok) {
      if (!ok) {
        ++failures;
        ADD_FAILURE() << ConfigName(c) << " n=" << before.n << ": " << ok.message();
      }
    };
    check(Near32(after.master[i], r.p, r.p_scale, "master", i));
    if (c.state == DType::kF32) {
      check(Near32(Decode(DType::kF32, after.m.data(), i), r.m, r.m_scale, "exp_avg", i));
      check(Near32(Decode(DType::kF32, after.v.data(), i), r.v, r.v_scale, "exp_avg_sq", i));
    } else {
      check(Near16(c.state, Bits16(after.m.data(), i), r.m, r.m_scale, "exp_avg", i));
      check(Near16(c.state, Bits16(after.v.data(), i), r.v, r.v_scale, "exp_avg_sq", i));
    }
    if (c.has_out) {
      if (c.out == DType::kF32)
        check(Near32(Decode(DType::kF32, after.out(), i), r.p, r.p_scale, "param_out", i));
      else
        check(Near16(c.out, Bits16(after.out(), i), r.p, r.p_scale, "param_out", i));
    }
  }
}

}  // namespace strata::optim::testing
