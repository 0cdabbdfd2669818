// SPDX-License-Identifier: Apache-2.0
// The embedding unit's forward and backward (EmbeddingSpec,
// models/model_spec.h): x = token table[tokens] (+ position table[0..T)).
//
// Thread-safety: immutable; its calls use the backend, which one thread uses
// at a time.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "models/model_spec.h"

namespace strata::models {

class EmbeddingProgram {
 public:
  EmbeddingProgram() = default;
  EmbeddingProgram(kernels::Backend* backend, const ModelSpec& spec, int64_t batch, int64_t seq, DType dtype);

  // x[B,T,C] = wte[tokens] (+ wpe[0..T)). tokens int32 [B,T] in [0, V).
  Status Forward(const void* params, const int32_t* tokens, void* x) const;
  // d wte += scatter of dx by token (tied: always added, the head writes d wte
  // first in the same backward pass; untied: overwritten unless
  // `accumulate`); d wpe (when there is a position table) overwritten (rows
  // 0..max_seq) or added to when `accumulate`.
  Status Backward(void* grads, DType grad_dtype, bool accumulate, const int32_t* tokens, const void* dx) const;

 private:
  kernels::Backend* backend_ = nullptr;
  EmbeddingSpec spec_;
  bool tied_ = true;
  int64_t C_ = 0, Vp_ = 0, max_seq_ = 0, B_ = 0, T_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace strata::models
