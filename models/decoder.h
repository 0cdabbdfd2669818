// SPDX-License-Identifier: Apache-2.0
// Decoder: runs a model (ModelSpec) for generation, one sequence, with a
// key/value cache: a prefill runs the prompt's tokens in one pass, each
// decode step runs one new token against the cache, so the prefix is never
// recomputed. Family-blind: the block is interpreted from its BlockSpec ops
// (models/model_spec.h), one case per op kind, as BlockProgram does for
// training; the attention op reads and extends its layer's cache through
// Backend::AttentionDecode (n_kv_head key/value heads: grouped-query
// attention caches only those), RoPE rotates the new rows at positions
// position() + row. GPT-2's ops (LayerNorm, Conv1D-layout Linear, a learned
// position table, a tied head) and Llama's (RMSNorm, RoPE, SwiGLU,
// nn.Linear-layout Linear with fused q | k | v and gate | up, no position
// table, an RMSNorm final norm, a tied or untied LM head).
//
// Memory, in backend memory beside the borrowed parameters: per attention
// op and layer a K and a V cache of capacity x d_model; one buffer per
// activation of the block of max_rows x its width; the logits of max_rows rows.
// (With grouped-query attention the caches are capacity x n_kv_head head_dim.)
//
// Ownership: borrows the backend and the parameters (one buffer per unit,
// the spec's layout, in `dtype`), which must outlive it.
// Thread-safety: one thread at a time (the backend's rule).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "models/model_spec.h"

namespace strata::models {

class Decoder {
 public:
  struct Options {
    int64_t capacity = 0;  // positions the cache holds; 0 = the spec's max_seq
    int64_t max_rows = 0;  // tokens one Step may take (the prompt's in a prefill); 0 = capacity
  };
  // Which rows' logits a Step returns.
  enum class Logits : uint8_t { kLast, kAll };

  // InvalidArgument naming the op for a block it cannot run (an op kind it
  // has no case for, an unknown tensor, a parameter of the wrong shape).
  static Result<std::unique_ptr<Decoder>> Create(kernels::Backend* backend, const ModelSpec& spec, DType dtype,
                                                 std::vector<const void*> unit_params, const Options& options);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Runs tokens[0..n) (host int32 ids in [0, vocab_size)) at positions
  // position() .. position()+n-1, extending the cache, and writes their
  // logits to `logits` as host floats: [vocab_size] of the last token, or
  // [n, vocab_size] with kAll. InvalidArgument naming the token or the
  // count when n is 0, above max_rows, past the capacity, or an id is out of range.
  Status Step(const int32_t* tokens, int64_t n, Logits which, std::vector<float>* logits);
  // Forgets the cache: the next Step starts at position 0.
  void Reset() { position_ = 0; }

  int64_t position() const { return position_; }
  int64_t capacity() const { return capacity_; }
  int64_t max_rows() const { return max_rows_; }
  const ModelSpec& spec() const { return spec_; }
  DType dtype() const { return dtype_; }

 private:
  // A transposed Linear's weight (and bias) writing output columns [n0, n0 + n):
  // one part when the concatenated weights lie adjacent in the unit.
  struct Part {
    int64_t weight = -1, bias = -1, n0 = 0, n = 0;
  };
  // One op of the block, compiled: which activation buffers it reads and writes.
  struct Op {
    OpKind kind = OpKind::kLinear;
    std::string name;              // "op 3 (Linear att -> x1)", for messages
    int in = -1, out = -1, residual = -1;  // activation indices (0: the block's input, 1: its output)
    int64_t in_width = 0, width = 0;       // columns of in and out
    int64_t weight = -1, bias = -1;        // offsets in the block's unit (elements)
    bool gelu = false;
    bool transposed = false;  // kLinear: nn.Linear layout, `parts`
    std::vector<Part> parts;
    int cache = -1;  // kAttention: its cache slot (per layer)
  };
  Decoder(kernels::Backend* backend, const ModelSpec& spec, DType dtype, std::vector<const void*> params);
  Status Compile();
  Status CompileLinear(const BlockOp& bop, Op* op) const;
  Status RunLinear(const Op& op, const char* params, int64_t rows);
  Status Allocate(const std::vector<int64_t>& width);
  Status RunOp(const Op& op, const char* params, int layer, int64_t rows);
  Status Embed(const int32_t* tokens, int64_t n);
  Status Head(int64_t first_row, int64_t rows, std::vector<float>* logits);
  void* act(int i) const { return acts_[static_cast<size_t>(i)].data(); }

  kernels::Backend* backend_;
  ModelSpec spec_;
  DType dtype_;
  std::vector<const void*> params_;  // per unit
  int64_t capacity_ = 0, max_rows_ = 0, position_ = 0;
  std::vector<Op> ops_;
  int caches_per_layer_ = 0;
  std::vector<kernels::DeviceBuffer> acts_;                // per activation: [max_rows, width]
  std::vector<kernels::DeviceBuffer> k_cache_, v_cache_;   // [layer * caches_per_layer + slot]: [capacity, C]
  kernels::DeviceBuffer tokens_, mean_, rstd_, norm_, logits_, logits_f32_;
};

}  // namespace strata::models
