// SPDX-License-Identifier: Apache-2.0
// Which tensor of a Hugging Face model's weights (engine/hf_weights.h) is
// which parameter of a ModelSpec, checked before anything is loaded: every
// parameter is there (under its Hugging Face name, or without the family's
// base prefix, after the caller's prefix), of its shape (a position table
// may have more rows), in a floating dtype (bf16, fp16, fp32, fp64); and no
// tensor under the prefix is left over, but for the buffers transformers
// saved beside the parameters in some versions (GPT-2's attn.bias and
// attn.masked_bias masks, rotary inv_freq tables) and a tied model's
// lm_head.weight (the token table again). Errors name the file and the tensor.
//
// Thread-safety: free function.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "engine/hf_weights.h"
#include "models/model_spec.h"

namespace strata {

struct HfParamSource {
  const models::ParamSpec* param = nullptr;
  const HfTensor* tensor = nullptr;
};

// One per parameter of `spec`, in spec.params order.
Result<std::vector<HfParamSource>> MatchHfTensors(const HfWeights& weights, const models::ModelSpec& spec,
                                                  const std::string& prefix);

}  // namespace strata
