// SPDX-License-Identifier: Apache-2.0
#include "models/embedding.h"

namespace strata::models {

EmbeddingProgram::EmbeddingProgram(kernels::Backend* backend, const ModelSpec& spec, int64_t batch, int64_t seq,
                                   DType dtype)
    : backend_(backend),
      spec_(spec.embedding),
      tied_(spec.head.tied),
      C_(spec.d_model),
      Vp_(spec.padded_vocab),
      max_seq_(spec.max_seq),
      B_(batch),
      T_(seq),
      dtype_(dtype) {}

Status EmbeddingProgram::Forward(const void* params, const int32_t* tokens, void* x) const {
  const char* p = static_cast<const char*>(params);
  const size_t es = DTypeSize(dtype_);
  const char* wpe = spec_.position_offset >= 0 ? p + spec_.position_offset * es : nullptr;
  return backend_->EmbeddingForward(x, tokens, p + spec_.token_offset * es, wpe, B_, T_, C_, dtype_);
}

Status EmbeddingProgram::Backward(void* grads, DType grad_dtype, bool accumulate, const int32_t* tokens,
                                  const void* dx) const {
  char* g = static_cast<char*>(grads);
  const size_t gs = DTypeSize(grad_dtype);
  // Untied, no head wrote d wte before: it starts from zero here.
  if (!accumulate && !tied_)
    RETURN_IF_ERROR(backend_->Memset(g + spec_.token_offset * gs, 0, static_cast<size_t>(Vp_ * C_) * gs));
  char* dwpe = spec_.position_offset >= 0 ? g + spec_.position_offset * gs : nullptr;
  if (!accumulate && dwpe) RETURN_IF_ERROR(backend_->Memset(dwpe, 0, static_cast<size_t>(max_seq_ * C_) * gs));
  return backend_->EmbeddingBackward(g + spec_.token_offset * gs, dwpe, grad_dtype, dx, tokens, B_, T_, C_, Vp_,
                                     dtype_);
}

}  // namespace strata::models
