// GPT-2 initialization of the fp32 master weights, one shard at a time, as
// Hugging Face's GPT2PreTrainedModel._init_weights does it: linear and
// embedding weights N(0, 0.02), the residual projections (attn.c_proj,
// mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weights 1 and
// biases 0; wte's padding rows and the layout padding 0.
//
// Deterministic: each HF tensor draws from its own stream seeded by (seed,
// tensor name), so the values do not depend on the placement, the backend or
// the order shards are initialized in.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "kernels/gpt.h"

namespace strata {

Result<std::vector<float>> InitShard(const kernels::GptConfig& config, kernels::GptBuffer kind, int layer,
                                     int64_t numel, uint64_t seed);

}  // namespace strata
