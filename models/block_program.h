// SPDX-License-Identifier: Apache-2.0
// BlockProgram: runs a block described as ops over named tensors (BlockSpec,
// models/model_spec.h) forward and backward on a kernels::Backend, for one
// micro-batch shape (B sequences of T tokens) and one activation dtype.
//
// Make() compiles the spec once:
// - the scratch layout: every activation an op makes, the statistics its
//   backward needs (LayerNorm mean/rstd, RMSNorm rstd, attention
//   log-sum-exp), the GELU
//   pre-activations and the attention workspace, one 256-byte aligned slot
//   each, in op order;
// - the backward: ops in reverse, each the backward of its forward (GELU
//   backward, weight gradient, bias gradient, input gradient, residual), with
//   each activation's gradient placed in a slot whose forward contents are
//   dead by then (its own when possible), so the backward needs no memory
//   beyond the forward's. The residual stream's gradient flows in place in
//   the caller's d_in: the block's output must reach its input through
//   residuals (every transformer block does), and each residual makes its
//   input's gradient the same buffer as its output's. An activation used by
//   several ops gets the first contribution written and the others added.
// - the lowering choices: with fused epilogues (Backend::
//   GemmHasBackwardEpilogues) a residual is read by its GEMM (c_in) rather
//   than copied first; with fused_dgelu, the GELU backward and the bias
//   gradient of a GELU Linear go into the epilogue of the GEMM that makes its
//   output's gradient.
// The results do not depend on where slots lie (every kernel is
// deterministic), so a spec's ops run exactly the backend calls a
// hand-written block would make.
//
// Thread-safety: immutable after Make; its calls use the backend, which one
// thread uses at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "models/model_spec.h"

namespace strata::models {

// Bytes of each f32 side buffer (LayerNorm statistics, attention lse,
// per-token losses): 4, or 8 for f64 (the CPU backend's fp64 mode).
constexpr size_t StatBytes(DType dtype) { return dtype == DType::kF64 ? 8 : 4; }

// Whether the scratch holds the block's internals between a Forward and the
// Backward of the same block.
enum class Internals {
  kNotKept,  // forward: computes only what the output needs (no GELU
             // pre-activation is written); backward: recomputes them from x_in
  kKept,     // forward: leaves them in the scratch; backward: they are there
             // (a Forward(kKept) with the same params, x_in and scratch, the
             // scratch untouched since), so the recompute is skipped
};

struct BlockShape {
  int64_t d_model = 0, n_head = 0;  // C, H
  int64_t batch = 0, seq = 0;       // B, T
  DType dtype = DType::kF32;
  int64_t n_kv_head = 0;            // KV (grouped-query attention); 0 = n_head
  int64_t kv() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_dim() const { return n_head > 0 ? d_model / n_head : 0; }
};

class BlockProgram {
 public:
  BlockProgram() = default;  // empty; Make gives a usable one
  struct Options {
    bool fused_epilogues = true;  // used when the backend has them
    bool fused_dgelu = false;     // (of those) GELU backward + bias gradient in a GEMM epilogue
  };
  // InvalidArgument naming the op for a spec it cannot run (an unknown
  // tensor, a parameter of the wrong shape, an activation made twice, an
  // output that does not reach the input through residuals).
  static Result<BlockProgram> Make(kernels::Backend* backend, const BlockSpec& spec, const BlockShape& shape,
                                   const Options& options);
  // The scratch Make would lay out (the same with and without fused epilogues).
  static Result<size_t> ScratchBytes(const kernels::Backend& backend, const BlockSpec& spec,
                                     const BlockShape& shape);

  size_t scratch_bytes() const { return scratch_bytes_; }
  bool fused_epilogues() const { return fused_; }
  bool fused_dgelu() const { return fused_dgelu_; }

  // x_out[B,T,C] = block(x_in). x_out must not alias x_in.
  Status Forward(const void* params, const void* x_in, void* x_out, void* scratch, size_t scratch_bytes,
                 Internals internals = Internals::kNotKept) const;
  // Recomputes the internals from x_in (unless kKept), then backpropagates
  // d_out: d_in[B,T,C] (may alias d_out, must not alias x_in) and the block's
  // parameter gradients (its unit's layout, in grad_dtype: overwritten, or
  // added to when `accumulate`). Either way the result is the same, bit for bit.
  Status Backward(const void* params, const void* x_in, const void* d_out, void* d_in, void* grads,
                  DType grad_dtype, bool accumulate, void* scratch, size_t scratch_bytes,
                  Internals internals = Internals::kNotKept) const;

 private:
  // Where a tensor of the block lives at run time.
  struct Loc {
    enum Kind : uint8_t {
      kNone,
      kScratch,  // at `offset` in the scratch
      kInput,    // the caller's x_in
      kOutput,   // the caller's x_out (forward)
      kGradIn,   // the caller's d_in (backward: the residual stream's gradient)
    } kind = kNone;
    size_t offset = 0;
  };
  // One GEMM's share of a Linear op: output columns [n0, n0 + n) from the
  // weight at `weight` (and bias), all parts of the op in one GEMM when their
  // weights (and biases) are adjacent.
  struct Part {
    int64_t weight = -1, bias = -1;  // parameter offsets (elements); bias -1: none
    int64_t n0 = 0, n = 0;
  };
  // One op, compiled: its forward operands and the placement of its backward.
  struct Step {
    OpKind kind = OpKind::kLinear;
    std::string name;               // for messages: "op 3 (Linear att -> x1)"
    bool makes_output = false;      // writes the block's output (skipped by the recompute)
    Loc in, out, residual;          // residual: kLinear, kind kNone for none
    int64_t k = 0, n = 0;           // kLinear: in [N, k] @ W [k, n]
    int64_t weight = -1, bias = -1;  // parameter offsets (elements); -1: none
    bool gelu = false;
    bool transposed = false;        // kLinear: weights [n, k]
    std::vector<Part> parts;        // kLinear, transposed: one per GEMM
    size_t rope_heads = 0;          // kRope: heads rotated (H + KV)
    size_t pre = 0;                 // the GELU pre-activation's slot
    size_t mean = 0, rstd = 0;      // kLayerNorm: statistics (kRmsNorm: rstd)
    size_t lse = 0;                 // kAttention: log-sum-exp
    // Backward.
    Loc d_out;                      // the gradient of `out`
    Loc d_in;                       // where the gradient of `in` goes (kNone: not needed)
    bool d_in_add = false;          // a contribution is there already: add to it
    bool d_in_zero = false;         // kLayerNorm, first contribution: zero it first (the op adds)
    bool d_residual_add = false;    // the residual's gradient exists already (else it is d_out's buffer)
    Loc d_residual;                 // then: where it is
    // fused_dgelu: this op's input-gradient GEMM also applies the GELU
    // backward of the op that made its input and writes that op's bias
    // gradient (its offset, and the pre-activation's slot) ...
    bool dgelu_epilogue = false;
    int64_t dgelu_bias = -1;
    size_t dgelu_pre = 0;
    // ... and that op then skips both.
    bool gelu_done_by_consumer = false;
  };

  // A transposed Linear's weights (and biases) into s->parts, s->n; one part
  // when they are adjacent in the unit.
  static Status CompileParts(const BlockSpec& spec, const BlockOp& op, Step* s);
  static Result<BlockProgram> Compile(const kernels::Backend& backend, const BlockSpec& spec,
                                      const BlockShape& shape, const Options& options, bool fused);
  void* Ptr(const Loc& l, const void* x_in, void* x_out, void* d_in, char* scratch) const;
  Status Run(const Step& s, const char* params, const void* x_in, void* x_out, char* scratch,
             bool keep_pre) const;
  kernels::RopeArgs RopeOf(const Step& s) const;
  Status RunLinear(const Step& s, const char* params, void* in, void* out, const void* residual, char* scratch,
                   bool keep_pre) const;
  Status LinearBackward(const Step& s, const char* params, void* in, void* dout, void* d_in, char* grads, DType gd,
                        bool accumulate, char* scratch) const;
  Status RunBackward(const Step& s, const char* params, const void* x_in, void* d_in, char* grads, DType gd,
                     bool accumulate, char* scratch) const;
  Status CheckScratch(const char* op, const void* scratch, size_t bytes) const;

  kernels::Backend* backend_ = nullptr;
  BlockShape shape_;
  float eps_ = 1e-5f;
  kernels::RopeParams rope_;
  bool fused_ = false, fused_dgelu_ = false;
  size_t scratch_bytes_ = 0;
  size_t attention_ws_ = 0;  // the attention workspace's slot
  std::vector<Step> steps_;
};

}  // namespace strata::models
