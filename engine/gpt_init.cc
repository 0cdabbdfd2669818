#include "engine/gpt_init.h"

#include <cmath>
#include <string>

namespace strata {

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

bool EndsWith(const std::string& s, const char* suffix) {
  std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

}  // namespace

Result<std::vector<float>> InitShard(const kernels::GptConfig& config, kernels::GptBuffer kind, int layer,
                                     int64_t numel, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(numel), 0.f);
  const double std_w = 0.02;
  const double std_proj = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (const auto& t : kernels::HfTensors(config)) {
    if (t.buffer != kind || (kind == kernels::GptBuffer::kBlock && t.layer != layer)) continue;
    if (t.offset + t.numel > numel)
      return Internal("init: tensor " + t.name + " does not fit its buffer of " + std::to_string(numel));
    float* p = out.data() + t.offset;
    const bool is_ln = t.name.find(".ln_") != std::string::npos || t.name.find("ln_f") != std::string::npos;
    if (EndsWith(t.name, ".bias")) continue;  // zeros
    if (is_ln) {
      for (int64_t i = 0; i < t.numel; ++i) p[i] = 1.f;
      continue;
    }
    double sd = (EndsWith(t.name, "attn.c_proj.weight") || EndsWith(t.name, "mlp.c_proj.weight")) ? std_proj : std_w;
    Rng rng(Fnv1a(t.name, seed * 0x9e3779b97f4a7c15ull + 1));
    for (int64_t i = 0; i < t.numel; ++i) p[i] = static_cast<float>(sd * rng.Normal());
  }
  return out;
}

}  // namespace strata
