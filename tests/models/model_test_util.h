// SPDX-License-Identifier: Apache-2.0
// Helpers for the model tests: the GPT-2 spec of a config.
#pragma once

#include "models/gpt2.h"
#include "models/model_spec.h"
#include "tests/test_util.h"

namespace strata::models::testing {

// The GPT-2 spec of `c`; a failure fails the calling test and gives an empty spec.
inline ModelSpec Spec(const GptConfig& c) {
  Result<ModelSpec> s = Gpt2Spec(c);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : ModelSpec{};
}

}  // namespace strata::models::testing
