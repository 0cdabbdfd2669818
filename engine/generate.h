// SPDX-License-Identifier: Apache-2.0
// Generation: a prompt's tokens prefilled into the decoder (models/decoder.h)
// in one step, then one token per step against the cache, each chosen by
// the sampler (engine/sampling.h) and handed to `emit` as soon as it is
// chosen (the caller streams it). Stops after max_new_tokens, at the cache's
// capacity, or after emitting stop_token.
//
// Thread-safety: the caller's thread; the decoder's rule.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "base/status.h"
#include "engine/sampling.h"
#include "models/decoder.h"

namespace strata {

struct GenerateRequest {
  std::vector<int32_t> prompt;  // at least one token
  int64_t max_new_tokens = 0;
  SamplingOptions sampling;
  int64_t stop_token = -1;  // -1: none
};

struct GenerateStats {
  int64_t prompt_tokens = 0, new_tokens = 0;
  double prefill_seconds = 0;  // the prompt's step
  double decode_seconds = 0;   // from there to the last token chosen (its steps, sampling, emit)
  bool stopped = false;  // at stop_token
};

// Runs `r` from an empty cache (the decoder is Reset first).
Result<GenerateStats> Generate(models::Decoder& decoder, const GenerateRequest& r,
                               const std::function<Status(int32_t)>& emit);

}  // namespace strata
