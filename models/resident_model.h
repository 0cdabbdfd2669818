// SPDX-License-Identifier: Apache-2.0
// ResidentModel: a whole model resident in backend memory — every unit's
// parameters and gradients, every layer's input as the checkpoint — running
// the passes of models/passes.h (per-layer recompute in the backward). For
// tests, small training runs on the CPU and the resident benchmark.
//
// Parameters are addressed by their Hugging Face names (models/model_spec.h),
// from and to host memory in any float dtype.
//
// Ownership: owns its buffers; borrows the backend, which must outlive it.
// Thread-safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "models/model_program.h"
#include "models/model_spec.h"

namespace strata::models {

class ResidentModel {
 public:
  struct Options {
    DType dtype = DType::kF32;       // parameters and activations
    DType grad_dtype = DType::kF32;  // gradients (f32 for fp32 accumulation, or dtype)
    int64_t batch = 1;
    int64_t seq = 0;              // tokens per sequence; 0 = the spec's max_seq
    int64_t head_chunk_rows = 0;  // 0 = HeadProgram::DefaultChunkRows
    bool fused_epilogues = true;  // ModelProgram::Options::fused_epilogues
    bool fused_dgelu = false;     // ModelProgram::Options::fused_dgelu
    // The last block's internals stay in the block scratch from its forward
    // to its backward (the head gets a scratch of its own), so that block is
    // not recomputed: one block's forward less per step for the head's
    // scratch in memory. Same results, bit for bit.
    bool keep_last_block = true;
  };
  // Allocates everything (parameters zero; call InitRandom or import).
  static Result<std::unique_ptr<ResidentModel>> Create(kernels::Backend* backend, const ModelSpec& spec,
                                                       const Options& options);
  ~ResidentModel();
  ResidentModel(const ResidentModel&) = delete;
  ResidentModel& operator=(const ResidentModel&) = delete;

  // The family's initialization (models/init.h), deterministic in `seed`.
  Status InitRandom(uint64_t seed);

  // One forward+backward on host tokens/targets [B,T] (targets < 0 ignored).
  // Returns the mean loss over the non-ignored targets; gradients are
  // overwritten (or added to when `accumulate`).
  Result<double> ForwardBackward(const int32_t* tokens, const int32_t* targets, bool accumulate = false);
  // Forward only: the mean loss.
  Result<double> Evaluate(const int32_t* tokens, const int32_t* targets);

  // HF-named access, from/to host memory in any float dtype (the copy is
  // converted). numel must equal the HF tensor's (wte: V*C).
  Status SetParameter(const std::string& hf_name, const void* data, DType dtype, int64_t numel);
  Result<std::vector<double>> GetParameter(const std::string& hf_name) const;
  Result<std::vector<double>> GetGradient(const std::string& hf_name) const;
  // Host copies of every parameter (or gradient) in HF order and shapes,
  // converted to `dtype`, for export (e.g. to a safetensors file).
  struct HostTensor {
    ParamSpec info;
    DType dtype;
    std::vector<uint8_t> bytes;
  };
  Result<std::vector<HostTensor>> Export(DType dtype, bool gradients = false) const;

  const ModelSpec& spec() const { return program_.spec(); }
  const Options& options() const { return options_; }
  const ModelProgram& program() const { return program_; }
  kernels::Backend* backend() const { return backend_; }
  // Unit u's parameter / gradient buffer (0: embedding, 1..n_layer: blocks, last: final).
  kernels::DeviceBuffer& unit_params(int u) { return params_[static_cast<size_t>(u)]; }
  kernels::DeviceBuffer& unit_grads(int u) { return grads_[static_cast<size_t>(u)]; }
  // Every parameter buffer / its gradient buffer, in unit order (for optimizers).
  std::vector<kernels::DeviceBuffer*> ParameterBuffers();
  std::vector<kernels::DeviceBuffer*> GradientBuffers();

 private:
  class Env;
  ResidentModel(kernels::Backend* backend, const Options& options, ModelProgram program);
  Result<std::vector<double>> Read(const ParamSpec& t, bool grads) const;
  Status UploadTokens(const int32_t* tokens, const int32_t* targets, int64_t* valid);
  Result<double> MeanLoss(int64_t valid) const;

  kernels::Backend* backend_;
  Options options_;
  ModelProgram program_;
  std::vector<kernels::DeviceBuffer> params_, grads_;  // per unit
  std::vector<kernels::DeviceBuffer> acts_;            // n_layer + 1 checkpoints [B,T,C]
  kernels::DeviceBuffer dx_, scratch_, tokens_, targets_, losses_;
  kernels::DeviceBuffer head_scratch_;  // with keep_last_block: the head's own scratch
};

}  // namespace strata::models
