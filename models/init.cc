// SPDX-License-Identifier: Apache-2.0
#include "models/init.h"

#include <cmath>
#include <string>

namespace strata::models {

namespace {

uint64_t Fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// xoshiro256** seeded by splitmix64: fixed across platforms and libraries.
struct Rng {
  uint64_t s[4];
  explicit Rng(uint64_t seed) {
    for (auto& x : s) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      x = z ^ (z >> 31);
    }
  }
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t Next() {
    uint64_t r = Rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = Rotl(s[3], 45);
    return r;
  }
  double Uniform() { return (static_cast<double>(Next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  // Box-Muller; each pair of uniforms gives two values.
  double Normal() {
    if (have_spare) {
      have_spare = false;
      return spare;
    }
    double r = std::sqrt(-2.0 * std::log(Uniform())), t = 6.283185307179586 * Uniform();
    spare = r * std::sin(t);
    have_spare = true;
    return r * std::cos(t);
  }
  double spare = 0;
  bool have_spare = false;
};

}  // namespace

Result<std::vector<float>> InitUnit(const ModelSpec& spec, int unit, uint64_t seed) {
  if (unit < 0 || unit >= spec.num_units())
    return InvalidArgument("init: unit " + std::to_string(unit) + " is not in the model (" +
                           std::to_string(spec.num_units()) + " units)");
  const int64_t numel = spec.units[static_cast<size_t>(unit)].numel;
  std::vector<float> out(static_cast<size_t>(numel), 0.f);
  for (const ParamSpec* t : spec.ParamsOf(unit)) {
    if (t->offset + t->numel > numel)
      return Internal("init: tensor " + t->name + " does not fit its buffer of " + std::to_string(numel));
    float* p = out.data() + t->offset;
    switch (t->init.kind) {
      case ParamInit::kZeros: break;
      case ParamInit::kOnes:
        for (int64_t i = 0; i < t->numel; ++i) p[i] = 1.f;
        break;
      case ParamInit::kNormal: {
        Rng rng(Fnv1a(t->name, seed * 0x9e3779b97f4a7c15ull + 1));
        for (int64_t i = 0; i < t->numel; ++i) p[i] = static_cast<float>(t->init.std * rng.Normal());
        break;
      }
    }
  }
  return out;
}

}  // namespace strata::models
