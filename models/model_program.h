// SPDX-License-Identifier: Apache-2.0
// ModelProgram: a model's executors — the embedding, the block (one
// BlockProgram serves every block: they differ only in their parameters) and
// the head — bound to a backend, a micro-batch shape (B sequences of T <=
// max_seq tokens) and an activation/parameter dtype. All pointers its calls
// take are backend memory; scratch is passed in (the engine carves it from
// the GPU tier), sized by the *ScratchBytes functions, which work without a
// ModelProgram (for the planner and --dry-run).
//
// Thread-safety: immutable after Make; its calls use the backend, which one
// thread uses at a time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "models/block_program.h"
#include "models/embedding.h"
#include "models/head.h"
#include "models/model_spec.h"

namespace strata::models {

class ModelProgram {
 public:
  struct Options {
    // Fold memory-bound passes into the GEMMs when the backend's Gemm has the
    // backward epilogues (Backend::GemmHasBackwardEpilogues): the residuals
    // read by the projection GEMMs (GemmArgs::c_in). false keeps the separate
    // ops: the reference the tests compare with.
    bool fused_epilogues = true;
    // Of those, the GELU backward + fc bias gradient in the fc input-gradient
    // GEMM (cuBLASLt DGELU_BGRAD): off by default — on the H200 that GEMM ran
    // at 277 TFLOP/s with the epilogue against ~730 without (+29 ms per 1.3B
    // step for ~8 ms of memory passes saved).
    bool fused_dgelu = false;
  };
  static Result<ModelProgram> Make(kernels::Backend* backend, const ModelSpec& spec, int64_t batch, int64_t seq,
                                   DType dtype, const Options& options);
  static Result<ModelProgram> Make(kernels::Backend* backend, const ModelSpec& spec, int64_t batch, int64_t seq,
                                   DType dtype) {
    return Make(backend, spec, batch, seq, dtype, Options{});
  }

  // Scratch of the block's forward and backward (the same region serves both).
  static Result<size_t> BlockScratchBytes(const kernels::Backend& backend, const ModelSpec& spec, int64_t batch,
                                          int64_t seq, DType dtype);
  // Scratch of the head; chunk_rows 0 = HeadProgram::DefaultChunkRows.
  static size_t HeadScratchBytes(const ModelSpec& spec, int64_t batch, int64_t seq, DType dtype,
                                 int64_t chunk_rows = 0) {
    return HeadProgram::ScratchBytes(spec, batch, seq, dtype, chunk_rows);
  }

  const ModelSpec& spec() const { return spec_; }
  const BlockProgram& block() const { return block_; }
  const HeadProgram& head() const { return head_; }
  const EmbeddingProgram& embedding() const { return embedding_; }
  size_t block_scratch_bytes() const { return block_.scratch_bytes(); }
  size_t head_scratch_bytes(int64_t chunk_rows = 0) const {
    return HeadScratchBytes(spec_, B_, T_, dtype_, chunk_rows);
  }
  int64_t batch() const { return B_; }
  int64_t seq() const { return T_; }
  DType dtype() const { return dtype_; }
  kernels::Backend* backend() const { return backend_; }

 private:
  ModelProgram() = default;

  kernels::Backend* backend_ = nullptr;
  ModelSpec spec_;
  int64_t B_ = 0, T_ = 0;
  DType dtype_ = DType::kF32;
  BlockProgram block_;
  HeadProgram head_;
  EmbeddingProgram embedding_;
};

}  // namespace strata::models
