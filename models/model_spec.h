// SPDX-License-Identifier: Apache-2.0
// What a model is, independent of its family: a ModelSpec says which units
// the model is made of, which parameters each unit holds (with their Hugging
// Face names, shapes, places in the unit's buffer and initialization rule),
// and what a transformer block computes, as a list of ops over named tensors
// (BlockSpec). A family (models/gpt2.h) builds a ModelSpec from its config;
// everything above it — the executors (models/block_program.h, head.h,
// embedding.h), the passes (models/passes.h), the resident model, the
// trainer, checkpoints, the planner — reads the spec and names no family.
//
// Units. The offload engine moves state a unit at a time (one contiguous
// buffer of parameters, and one each of gradients, master weights and
// moments): unit 0 is the embedding, units 1..n_layer the blocks, the last
// unit the final norm (and, untied, the LM head). Every parameter starts at a
// multiple of kSliceAlign elements of its unit's buffer (128 bytes in
// f16/bf16), so layouts do not depend on the dtype, except the members of a
// group a family lays out back to back to run as one GEMM (Llama's q | k | v
// and gate | up: the group starts there); the padding between parameters is
// zero (never written; it counts in norms, as zeros).
//
// Thread-safety: a ModelSpec is a value; const access from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "kernels/rope_params.h"

namespace strata::models {

inline constexpr int64_t kSliceAlign = 64;  // elements: 128 B for f16/bf16, 256 B for f32
constexpr int64_t AlignSlice(int64_t n) { return (n + kSliceAlign - 1) / kSliceAlign * kSliceAlign; }

enum class UnitKind : uint8_t { kEmbedding, kBlock, kFinal };

// How a parameter is initialized from scratch (models/init.h).
struct ParamInit {
  enum Kind : uint8_t { kZeros, kOnes, kNormal } kind = kZeros;
  double std = 0;  // kNormal
};

// One named parameter tensor of a unit.
struct ParamSpec {
  std::string name;            // Hugging Face name: "transformer.h.3.attn.c_attn.weight"
  int unit = 0;                // index into ModelSpec::units
  int64_t offset = 0;          // elements into the unit's buffer
  std::vector<int64_t> shape;  // Hugging Face shape (row-major, as stored; wte without padding rows)
  int64_t numel = 0;
  ParamInit init;
  // A file may hold more rows than the run uses (a position table longer
  // than the sequence length): the first are taken.
  bool extra_rows_ok = false;
};

struct UnitSpec {
  std::string name;  // "emb", "blk3", "lnf": names of the unit's tensors in the store, checkpoints, tests
  UnitKind kind = UnitKind::kBlock;
  int layer = -1;     // kBlock: the block's index; else -1
  int64_t numel = 0;  // the whole buffer, padding included
};

// ---- the block as a list of ops --------------------------------------------

// A block computes y from x (both [B*T, d_model]) through ops over named
// activations. Names: "x" is the block's input, "y" its output; every other
// activation is made by exactly one op. Parameters are named as in the
// block's unit without the block's prefix ("attn.c_attn.weight").
enum class OpKind : uint8_t {
  // out[N, C] = LayerNorm(in) * weight + bias (statistics kept for the backward).
  kLayerNorm,
  // out[N, n] = in[N, k] @ weight[k, n] (+ bias[n]) (+ residual[N, n]),
  // then tanh-GELU when `gelu` (its pre-activation kept for the backward).
  // `transposed`: the weight is in nn.Linear's layout [n, k] (out = in @
  // weight^T), and `concat` may name further weights [n_i, k] (and
  // `concat_bias` their biases) whose outputs follow the first's columns:
  // q | k | v, gate | up. Weights adjacent in the unit's buffer (and their
  // biases) run as one GEMM.
  kLinear,
  // out[N, H D] = causal self-attention of in = qkv[N, (H + 2 KV) D] (q | k | v
  // columns; n_head query heads of head_dim, n_kv_head key/value heads, each
  // read by n_head / n_kv_head query heads; log-sum-exp kept for the backward).
  kAttention,
  // out[N, C] = RMSNorm(in) * weight (rstd kept for the backward; norm_eps).
  kRmsNorm,
  // out = in with rotary position embeddings applied to its first
  // n_head + n_kv_head heads (q and k of a qkv row; BlockSpec::rope).
  kRope,
  // out[N, F] = silu(in[:, :F]) * in[:, F:] (in = gate | up, [N, 2F]).
  kSwiGlu,
};

struct BlockOp {
  OpKind kind = OpKind::kLinear;
  std::string in, out;
  std::string weight, bias;  // parameters; bias "" = none
  std::string residual;      // kLinear: an activation added to the result ("" = none)
  bool gelu = false;         // kLinear
  bool transposed = false;   // kLinear: weights [n, k] (nn.Linear), not [k, n] (Conv1D)
  std::vector<std::string> concat, concat_bias;  // kLinear, transposed: further weights (biases: all or none)
};

// A parameter of every block (offsets are the same in each block's unit).
struct BlockParam {
  std::string name;  // "attn.c_attn.weight"
  int64_t offset = 0;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  ParamInit init;
};

struct BlockSpec {
  std::vector<BlockParam> params;
  std::vector<BlockOp> ops;
  float norm_eps = 1e-5f;       // LayerNorm and RMSNorm
  kernels::RopeParams rope;     // kRope
  const BlockParam* Find(const std::string& name) const;
};

// The embedding unit: token table [Vp, C] (rows >= vocab_size are padding:
// zero, never exported) and a learned position table [max_seq, C], or none.
struct EmbeddingSpec {
  int64_t token_offset = 0;
  int64_t position_offset = -1;  // -1: no position table
};

// The head: the final norm (its weight and bias in the final unit), the LM
// head (tied: the embedding's token table; untied: a [Vp, C] table in the
// final unit, rows >= vocab_size padding), softmax cross-entropy.
struct HeadSpec {
  enum class Norm : uint8_t { kLayerNorm, kRmsNorm } norm = Norm::kLayerNorm;
  int64_t norm_weight_offset = 0;
  int64_t norm_bias_offset = 0;  // kLayerNorm
  float norm_eps = 1e-5f;
  bool tied = true;
  int64_t lm_head_offset = -1;  // untied: the LM head in the final unit
};

struct ModelSpec {
  std::string family;           // "gpt2", "llama" (models/family.h)
  std::string hf_architecture;  // "GPT2LMHeadModel", "LlamaForCausalLM", ...
  // Names in files may lack this prefix (GPT2Model's own files): "transformer.".
  std::string hf_base_prefix;
  int64_t n_layer = 0;
  int64_t d_model = 0;     // C
  int64_t n_head = 0;
  int64_t n_kv_head = 0;   // key/value heads (grouped-query attention); 0 = n_head
  int64_t vocab_size = 0;  // V: real tokens
  int64_t padded_vocab = 0;  // Vp: the token table's rows (a multiple of 128, >= V)
  int64_t max_seq = 0;     // the longest sequence (rows of the position table)
  std::vector<UnitSpec> units;    // embedding, blocks 0..n_layer-1, final
  std::vector<ParamSpec> params;  // Hugging Face's named_parameters() order
  BlockSpec block;
  EmbeddingSpec embedding;
  HeadSpec head;

  int64_t head_dim() const { return n_head > 0 ? d_model / n_head : 0; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int num_units() const { return static_cast<int>(units.size()); }
  int final_unit() const { return num_units() - 1; }
  static int block_unit(int64_t layer) { return static_cast<int>(layer) + 1; }
  // The most elements of any unit (0 without units).
  int64_t largest_unit() const {
    int64_t n = 0;
    for (const UnitSpec& u : units) n = u.numel > n ? u.numel : n;
    return n;
  }
  // Trainable parameters as Hugging Face counts them (the tied head once, no padding).
  int64_t NumParameters() const;
  // The parameter named `name`; NotFound naming it otherwise.
  Result<const ParamSpec*> Find(const std::string& name) const;
  // Parameters of unit `u`, in order.
  std::vector<const ParamSpec*> ParamsOf(int u) const;
};

// A unit's buffer as a family lays it out: parameters one after another,
// each at a multiple of kSliceAlign.
class SliceLayout {
 public:
  int64_t Take(int64_t numel) {
    const int64_t at = end_;
    end_ = AlignSlice(end_ + numel);
    return at;
  }
  int64_t numel() const { return end_; }

 private:
  int64_t end_ = 0;
};

// The elements of a tensor of `shape`.
inline int64_t ShapeNumel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The shape every family's config has, and the checks they share.
struct TransformerShape {
  int64_t n_layer = 0, n_embd = 0, n_head = 0;
  int64_t vocab_size = 0, padded_vocab_size = 0;  // padded 0: automatic
  int64_t seq_len = 0;
};
// The token table's rows: padded_vocab_size when given, else vocab_size
// rounded up to a multiple of 128.
int64_t PaddedVocab(int64_t vocab_size, int64_t padded_vocab_size);
// InvalidArgument "<who>: <field> = <value> ..." for the first of: n_layer,
// n_embd, n_head, vocab_size, seq_len below 1; n_embd not a multiple of
// n_head; padded_vocab_size neither 0 nor a multiple of 128 >= vocab_size.
Status CheckTransformerShape(const std::string& who, const TransformerShape& s);

}  // namespace strata::models
