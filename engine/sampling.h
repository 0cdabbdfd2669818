// SPDX-License-Identifier: Apache-2.0
// Choosing the next token from a row of logits: greedy at temperature 0,
// else a draw from softmax(logits / temperature) cut to the top_k most
// likely tokens and then to the smallest set whose probability reaches
// top_p (Hugging Face's order: temperature, top-k, top-p), renormalized.
//
// Deterministic: the draws come from a std::mt19937_64 seeded with `seed`
// (the standard fixes its sequence) mapped to [0, 1) by its top 53 bits, and
// ties between equal logits go to the lower id, so a seed gives the same
// tokens on every machine for the same logits.
//
// Thread-safety: a Sampler is used by one thread at a time.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: all tokens
  double top_p = 1.0;        // (0, 1]; 1: no cut
  uint64_t seed = 0;
};

// InvalidArgument naming the option ("--temperature", "--top-k", "--top-p") when one is out of range.
Status CheckSamplingOptions(const SamplingOptions& o);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o) : o_(o), rng_(o.seed) {}
  // The next token of `logits` (one per token id). InvalidArgument for an
  // empty row; a row with NaN picks among the finite logits, none finite is
  // InvalidArgument.
  Result<int32_t> Next(std::span<const float> logits);

 private:
  double Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  SamplingOptions o_;
  std::mt19937_64 rng_;
  std::vector<std::pair<double, int32_t>> work_;  // (probability or logit, id)
};

}  // namespace strata
