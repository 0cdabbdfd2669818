// SPDX-License-Identifier: Apache-2.0
// The head's forward and backward (HeadSpec, models/model_spec.h): the final
// norm (LayerNorm or RMSNorm), logits = norm(x) @ W^T (W: wte when tied, else
// the final unit's LM head) chunk by chunk of token rows (the [B*T, Vp]
// logits never exist at once unless one chunk covers them), the fused
// softmax cross-entropy, and the backward of all three.
//
// Scratch: the final norm's output (then its gradient, chunk by chunk) [N, C],
// its statistics [N], one chunk of logits [chunk, Vp].
//
// Thread-safety: immutable; its calls use the backend, which one thread uses
// at a time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "models/model_spec.h"

namespace strata::models {

struct HeadArgs {
  const void* final_params = nullptr;      // the final unit (its norm)
  const void* embedding_params = nullptr;  // the embedding unit (wte is the tied LM head)
  const void* x = nullptr;                 // [B,T,C] output of the last block
  const int32_t* targets = nullptr;        // [B,T] in [0, V), or < 0 to ignore the position
  // Per-token losses [B,T] (f32; f64 in fp64 mode), 0 for ignored positions.
  // The caller reduces them (mean over non-ignored: dloss = 1/count).
  float* losses = nullptr;
  float dloss = 1.f;                 // d loss / d losses[i], the same for every position
  void* dx = nullptr;                // [B,T,C] overwritten with d loss / d x
  void* final_grads = nullptr;       // the final unit's layout, grad_dtype
  void* embedding_grads = nullptr;   // the embedding unit's layout, grad_dtype: only wte is written (tied only)
  DType grad_dtype = DType::kF32;
  bool accumulate = false;  // add to the final norm's and wte's gradients instead of overwriting
  int64_t chunk_rows = 0;   // token rows per logits chunk; 0 = DefaultChunkRows
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

class HeadProgram {
 public:
  HeadProgram() = default;
  HeadProgram(kernels::Backend* backend, const ModelSpec& spec, int64_t batch, int64_t seq, DType dtype);

  // Token rows per chunk when not given: all B*T rows when their logits fit
  // in 256 MiB, else as many as fit (a multiple of 64 when possible).
  static int64_t DefaultChunkRows(const ModelSpec& spec, int64_t batch, int64_t seq, DType dtype);
  // Scratch of both calls; chunk_rows 0 = DefaultChunkRows.
  static size_t ScratchBytes(const ModelSpec& spec, int64_t batch, int64_t seq, DType dtype, int64_t chunk_rows = 0);

  // Forward and backward: losses, dx, the norm's and wte's gradients.
  Status ForwardBackward(const HeadArgs& a) const;
  // Forward only (evaluation): losses, nothing else written (grad fields unused).
  Status Forward(const HeadArgs& a) const;

 private:
  // What one call works on: its rows per logits chunk, its scratch's slots
  // and the LM head's weights (wte in the embedding unit).
  struct Frame {
    int64_t chunk = 0;
    char* norm = nullptr;    // [N, C]: norm(x), then d norm(x) chunk by chunk
    float* mean = nullptr;   // [N] (f64 in fp64 mode)
    float* rstd = nullptr;   // [N]
    char* logits = nullptr;  // [chunk, Vp]
    const char* wte = nullptr;
  };
  // Checks `a` (its gradient fields too when `backward`) and lays out its frame.
  Result<Frame> Prepare(const HeadArgs& a, bool backward) const;
  // norm(x) and its statistics into the frame.
  Status NormForward(const HeadArgs& a, const Frame& f) const;
  // logits [rows, Vp] = norm_rows [rows, C] @ wte^T.
  Status Logits(const Frame& f, const char* norm_rows, int64_t rows) const;

  kernels::Backend* backend_ = nullptr;
  HeadSpec spec_;
  int64_t token_offset_ = 0;  // wte in the embedding unit
  int64_t C_ = 0, V_ = 0, Vp_ = 0, B_ = 0, T_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace strata::models
