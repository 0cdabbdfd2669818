// SPDX-License-Identifier: Apache-2.0
#include "models/model_program.h"

#include <string>

namespace strata::models {

namespace {

std::string Str(int64_t v) { return std::to_string(v); }

Status CheckShape(const ModelSpec& spec, int64_t batch, int64_t seq, DType dtype) {
  if (batch < 1) return InvalidArgument("model: batch = " + Str(batch) + " must be >= 1");
  if (seq < 1 || seq > spec.max_seq)
    return InvalidArgument("model: seq = " + Str(seq) + " must be in [1, seq_len = " + Str(spec.max_seq) + "]");
  if (!IsFloating(dtype))
    return InvalidArgument("model: dtype " + std::string(DTypeName(dtype)) + " is not a float type");
  if (!spec.head.tied && spec.head.lm_head_offset < 0)
    return InvalidArgument("model: the " + spec.family + " model's head is untied but has no LM head");
  return Status::OK();
}

BlockShape ShapeOf(const ModelSpec& spec, int64_t batch, int64_t seq, DType dtype) {
  return BlockShape{spec.d_model, spec.n_head, batch, seq, dtype, spec.n_kv_head};
}

}  // namespace

Result<size_t> ModelProgram::BlockScratchBytes(const kernels::Backend& backend, const ModelSpec& spec, int64_t batch,
                                               int64_t seq, DType dtype) {
  RETURN_IF_ERROR(CheckShape(spec, batch, seq, dtype));
  return BlockProgram::ScratchBytes(backend, spec.block, ShapeOf(spec, batch, seq, dtype));
}

Result<ModelProgram> ModelProgram::Make(kernels::Backend* backend, const ModelSpec& spec, int64_t batch, int64_t seq,
                                        DType dtype, const Options& options) {
  if (backend == nullptr) return InvalidArgument("model: backend is null");
  RETURN_IF_ERROR(CheckShape(spec, batch, seq, dtype));
  ModelProgram m;
  m.backend_ = backend;
  m.spec_ = spec;
  m.B_ = batch;
  m.T_ = seq;
  m.dtype_ = dtype;
  BlockProgram::Options bo;
  bo.fused_epilogues = options.fused_epilogues;
  bo.fused_dgelu = options.fused_dgelu;
  ASSIGN_OR_RETURN(m.block_, BlockProgram::Make(backend, spec.block, ShapeOf(spec, batch, seq, dtype), bo));
  m.head_ = HeadProgram(backend, spec, batch, seq, dtype);
  m.embedding_ = EmbeddingProgram(backend, spec, batch, seq, dtype);
  return m;
}

}  // namespace strata::models
