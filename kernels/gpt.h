// The GPT-2 model (Hugging Face GPT2LMHeadModel exactly: learned positions,
// pre-LayerNorm blocks, causal attention, tanh-GELU MLP of width 4C, final
// LayerNorm, LM head tied to the token embedding, eps 1e-5), written once
// against kernels/backend.h so it runs on the CUDA and the CPU backend.
//
// The unit is the layer: the offload engine moves one layer's parameters (one
// contiguous buffer) at a time, runs it, and keeps only its input as the
// checkpoint; backward recomputes the layer's internals from that checkpoint.
//
//   tokens [B,T] -> EmbeddingForward -> x_0 [B,T,C]
//   x_l -> BlockForward(block l) -> x_{l+1}            (checkpoint: x_l)
//   x_L -> HeadForwardBackward -> loss, d x_L, d ln_f, d wte (tied head)
//   d x_{l+1} -> BlockBackward(block l, x_l) -> d x_l, d block l
//   d x_0 -> EmbeddingBackward -> d wte (+=), d wpe
//
// Buffers: three kinds, each one contiguous tensor with a documented layout
// (BlockLayout, EmbeddingLayout, LnFLayout below), params and grads alike.
// Every slice starts at a multiple of kSliceAlign elements (128 bytes for
// f16/bf16), so layouts do not depend on the dtype; the padding between
// slices must be zero (it is never written, and counts in norms).
//
// Thread-safety: GptLayers is immutable after Make (its calls use the backend,
// which is used by one thread at a time). GptModel is used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/backend.h"

namespace strata::kernels {

// ---- configuration -----------------------------------------------------------

struct GptConfig {
  int64_t n_layer = 0;
  int64_t n_embd = 0;             // C
  int64_t n_head = 0;             // H; C % H == 0
  int64_t vocab_size = 0;         // V: real tokens
  int64_t padded_vocab_size = 0;  // Vp: multiple of 128, >= V; 0 = V rounded up to 128
  int64_t seq_len = 0;            // maximum T: rows of wpe (HF n_positions)
  float ln_eps = 1e-5f;

  // Vp: padded_vocab_size, or V rounded up to a multiple of 128 when 0.
  int64_t Vp() const;
  int64_t head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }
  // InvalidArgument naming the field and its value when something is off.
  Status Validate() const;
  // Trainable parameters, HF's count (tied head once, no vocab padding).
  int64_t NumParameters() const;
};

// ---- buffer layouts (element offsets; params and grads alike) ----------------

inline constexpr int64_t kSliceAlign = 64;  // elements: 128 B for f16/bf16, 256 B for f32
constexpr int64_t AlignSlice(int64_t n) {
  return (n + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
}

// One transformer block, in HF order (prefix transformer.h.<l>.).
struct BlockLayout {
  int64_t ln1_w = 0;     // [C]       ln_1.weight
  int64_t ln1_b = 0;     // [C]       ln_1.bias
  int64_t attn_w = 0;    // [C, 3C]   attn.c_attn.weight (Conv1D: y = x W + b; q|k|v columns)
  int64_t attn_b = 0;    // [3C]      attn.c_attn.bias
  int64_t proj_w = 0;    // [C, C]    attn.c_proj.weight
  int64_t proj_b = 0;    // [C]       attn.c_proj.bias
  int64_t ln2_w = 0;     // [C]       ln_2.weight
  int64_t ln2_b = 0;     // [C]       ln_2.bias
  int64_t fc_w = 0;      // [C, 4C]   mlp.c_fc.weight
  int64_t fc_b = 0;      // [4C]      mlp.c_fc.bias
  int64_t fcproj_w = 0;  // [4C, C]   mlp.c_proj.weight
  int64_t fcproj_b = 0;  // [C]       mlp.c_proj.bias
  int64_t numel = 0;     // whole buffer, padding included

  static constexpr BlockLayout For(int64_t C) {
    BlockLayout l;
    int64_t o = 0;
    auto take = [&o](int64_t n) {
      int64_t at = o;
      o = AlignSlice(o + n);
      return at;
    };
    l.ln1_w = take(C);
    l.ln1_b = take(C);
    l.attn_w = take(C * 3 * C);
    l.attn_b = take(3 * C);
    l.proj_w = take(C * C);
    l.proj_b = take(C);
    l.ln2_w = take(C);
    l.ln2_b = take(C);
    l.fc_w = take(C * 4 * C);
    l.fc_b = take(4 * C);
    l.fcproj_w = take(4 * C * C);
    l.fcproj_b = take(C);
    l.numel = o;
    return l;
  }
};
// GPT-2 small (C = 768): 12 C^2 + 13 C parameters, no padding.
static_assert(BlockLayout::For(768).numel == 12 * 768 * 768 + 13 * 768);
static_assert(BlockLayout::For(768).fcproj_b == 12 * 768 * 768 + 12 * 768);
// C = 96: each [C] slice padded to 128 elements.
static_assert(BlockLayout::For(96).ln1_b == 128 && BlockLayout::For(96).attn_w == 256);
static_assert(BlockLayout::For(96).numel % kSliceAlign == 0);

// Token and position embeddings (transformer.wte / transformer.wpe).
struct EmbeddingLayout {
  int64_t wte = 0;  // [Vp, C]  rows >= V are padding: zero, never exported
  int64_t wpe = 0;  // [seq_len, C]
  int64_t numel = 0;
  static constexpr EmbeddingLayout For(int64_t Vp, int64_t seq_len, int64_t C) {
    EmbeddingLayout l;
    l.wte = 0;
    l.wpe = AlignSlice(Vp * C);
    l.numel = AlignSlice(l.wpe + seq_len * C);
    return l;
  }
};
static_assert(EmbeddingLayout::For(50304, 1024, 768).wpe == 50304 * 768);

// Final LayerNorm (transformer.ln_f).
struct LnFLayout {
  int64_t w = 0;  // [C]
  int64_t b = 0;  // [C]
  int64_t numel = 0;
  static constexpr LnFLayout For(int64_t C) {
    LnFLayout l;
    l.b = AlignSlice(C);
    l.numel = AlignSlice(l.b + C);
    return l;
  }
};
static_assert(LnFLayout::For(96).b == 128 && LnFLayout::For(96).numel == 256);

enum class GptBuffer : uint8_t { kEmbedding, kBlock, kLnF };

// One HF-named parameter tensor and where it lives.
struct HfTensorInfo {
  std::string name;  // "transformer.h.3.attn.c_attn.weight"
  GptBuffer buffer = GptBuffer::kBlock;
  int layer = -1;              // block index for kBlock, else -1
  int64_t offset = 0;          // elements into the buffer
  std::vector<int64_t> shape;  // HF shape (wte: [V, C], without the padding rows)
  int64_t numel = 0;
};
// All parameter tensors in HF's named_parameters() order: wte, wpe, the
// blocks, ln_f. (lm_head.weight is tied to transformer.wte.weight.)
std::vector<HfTensorInfo> HfTensors(const GptConfig& config);

// Bytes of each of the f32 side buffers (LayerNorm statistics, attention lse,
// per-token losses): 4, or 8 for f64 (the CPU backend's fp64 mode).
constexpr size_t StatBytes(DType dtype) { return dtype == DType::kF64 ? 8 : 4; }

// ---- per-layer compute -------------------------------------------------------

// The layer calls for one micro-batch shape (B sequences of T tokens, T <=
// seq_len) in one activation/parameter dtype. All pointers are backend memory.
// Scratch is passed in (the engine carves it from the GPU tier), 256-byte
// aligned like any backend allocation; its size comes from the *ScratchBytes
// functions, which also work without a GptLayers. Calls check the scratch
// size (InvalidArgument), not the sizes behind the other pointers.
class GptLayers {
 public:
  struct Options {
    // Fold memory-bound passes into the GEMMs when the backend's Gemm has the
    // backward epilogues (Backend::GemmHasBackwardEpilogues): the GELU
    // backward and the fc bias gradient into the fc input-gradient GEMM
    // (GemmArgs::dgelu, bias_grad), the residual copies into the projection
    // GEMMs (GemmArgs::c_in). false keeps the separate ops (GeluBackward,
    // BiasBackward, CopyDeviceToDevice): the reference the tests compare with.
    bool fused_epilogues = true;
    // Of those, the GELU backward + fc bias gradient in the fc input-gradient
    // GEMM (cuBLASLt DGELU_BGRAD): off by default — on the H200 that GEMM ran
    // at 277 TFLOP/s with the epilogue against ~730 without (+29 ms per 1.3B
    // step for ~8 ms of memory passes saved). The residual copies stay fused.
    bool fused_dgelu = false;
  };
  static Result<GptLayers> Make(Backend* backend, const GptConfig& config, int64_t batch,
                                int64_t seq, DType dtype, const Options& options);
  static Result<GptLayers> Make(Backend* backend, const GptConfig& config, int64_t batch,
                                int64_t seq, DType dtype) {
    return Make(backend, config, batch, seq, dtype, Options{});
  }

  // Scratch of BlockForward and BlockBackward (the same region serves both;
  // the same size with and without fused epilogues).
  static size_t BlockScratchBytes(const Backend& backend, const GptConfig& config, int64_t batch,
                                  int64_t seq, DType dtype);
  // Scratch of the head calls; chunk_rows 0 = DefaultHeadChunkRows.
  static size_t HeadScratchBytes(const GptConfig& config, int64_t batch, int64_t seq, DType dtype,
                                 int64_t chunk_rows = 0);
  // Token rows per head chunk when not given: all B*T rows when their logits
  // fit in 256 MiB, else as many as fit (a multiple of 64 when possible).
  static int64_t DefaultHeadChunkRows(const GptConfig& config, int64_t batch, int64_t seq,
                                      DType dtype);

  size_t block_scratch_bytes() const { return block_scratch_bytes_; }
  size_t head_scratch_bytes(int64_t chunk_rows = 0) const;

  // Whether the scratch holds the block's internals (LayerNorm statistics,
  // qkv, attention output and log-sum-exp, x1, the GELU pre-activation and
  // output) between a BlockForward and the BlockBackward of the same block.
  enum class Internals {
    kNotKept,  // forward: computes only what x_out needs (no GELU pre-activation
               // is written); backward: recomputes them from x_in
    kKept,     // forward: leaves them in the scratch; backward: they are there
               // (a BlockForward(kKept) with the same params, x_in and scratch,
               // scratch untouched since), so the recompute is skipped
  };

  // x_out[B,T,C] = block(x_in). x_in is the checkpoint; nothing else needs to
  // be kept. x_out must not alias x_in.
  Status BlockForward(const void* params, const void* x_in, void* x_out, void* scratch,
                      size_t scratch_bytes, Internals internals = Internals::kNotKept) const;
  // Recomputes the block's internals from x_in (unless kKept), then
  // backpropagates d_out: d_in[B,T,C] (may alias d_out) and the block's
  // gradients (BlockLayout, in grad_dtype: overwritten, or added to when
  // `accumulate`). Either way the result is the same, bit for bit.
  Status BlockBackward(const void* params, const void* x_in, const void* d_out, void* d_in,
                       void* grads, DType grad_dtype, bool accumulate, void* scratch,
                       size_t scratch_bytes, Internals internals = Internals::kNotKept) const;

  // x[B,T,C] = wte[tokens] + wpe[0..T). tokens int32 [B,T] in [0, V).
  Status EmbeddingForward(const void* emb_params, const int32_t* tokens, void* x) const;
  // d wte += scatter of dx by token (always added: the tied head writes d wte
  // first in the same backward pass); d wpe overwritten (rows 0..seq_len) or
  // added to when `accumulate`.
  Status EmbeddingBackward(void* emb_grads, DType grad_dtype, bool accumulate,
                           const int32_t* tokens, const void* dx) const;

  struct HeadArgs {
    const void* lnf_params = nullptr;  // LnFLayout
    const void* emb_params = nullptr;  // EmbeddingLayout (wte is the tied LM head)
    const void* x = nullptr;           // [B,T,C] output of the last block
    const int32_t* targets = nullptr;  // [B,T] in [0, V), or < 0 to ignore the position
    // Per-token losses [B,T] (f32; f64 in fp64 mode), 0 for ignored positions.
    // The caller reduces them (mean over non-ignored: dloss = 1/count).
    float* losses = nullptr;
    float dloss = 1.f;          // d loss / d losses[i], the same for every position
    void* dx = nullptr;         // [B,T,C] overwritten with d loss / d x
    void* lnf_grads = nullptr;  // LnFLayout, grad_dtype
    void* emb_grads = nullptr;  // EmbeddingLayout, grad_dtype: only wte is written
    DType grad_dtype = DType::kF32;
    bool accumulate = false;  // add to lnf_grads / d wte instead of overwriting
    int64_t chunk_rows = 0;   // token rows per logits chunk; 0 = DefaultHeadChunkRows
    void* scratch = nullptr;
    size_t scratch_bytes = 0;
  };
  // Final LayerNorm, logits = ln_f(x) wte^T per chunk of rows (the [B*T, Vp]
  // logits never exist at once unless one chunk covers them), fused softmax
  // cross-entropy, and the backward of all three.
  Status HeadForwardBackward(const HeadArgs& a) const;
  // Forward only (evaluation): losses, nothing else written (grad fields unused).
  Status HeadForward(const HeadArgs& a) const;

  const GptConfig& config() const { return config_; }
  int64_t batch() const { return B_; }
  int64_t seq() const { return T_; }
  DType dtype() const { return dtype_; }
  Backend* backend() const { return backend_; }
  // Whether the fused epilogues are in use (asked for and the backend has them).
  bool fused_epilogues() const { return fused_; }
  bool fused_dgelu() const { return fused_dgelu_; }

 private:
  GptLayers() = default;
  // gelu_aux: also write the GELU pre-activation (the backward needs it).
  Status Recompute(const void* params, const void* x_in, char* scratch, bool gelu_aux) const;
  Status CheckScratch(const char* op, const void* scratch, size_t bytes, size_t need) const;

  Backend* backend_ = nullptr;
  GptConfig config_;
  int64_t B_ = 0, T_ = 0;
  DType dtype_ = DType::kF32;
  size_t block_scratch_bytes_ = 0;
  bool fused_ = false;
  bool fused_dgelu_ = false;
};

// ---- the whole model, resident in backend memory -----------------------------

// All parameters and gradients in backend memory, checkpointing each layer's
// input in forward and recomputing per layer in backward. For tests, small
// training runs on the CPU and the resident benchmark.
class GptModel {
 public:
  struct Options {
    DType dtype = DType::kF32;       // parameters and activations
    DType grad_dtype = DType::kF32;  // gradients (f32 for fp32 accumulation, or dtype)
    int64_t batch = 1;
    int64_t seq = 0;              // tokens per sequence; 0 = config.seq_len
    int64_t head_chunk_rows = 0;  // 0 = GptLayers::DefaultHeadChunkRows
    bool fused_epilogues = true;  // GptLayers::Options::fused_epilogues
    bool fused_dgelu = false;     // GptLayers::Options::fused_dgelu
    // The last block's internals stay in the block scratch from its forward
    // to its backward (the head gets a scratch of its own), so that block is
    // not recomputed: one block's forward less per step for the head's
    // scratch in memory. Same results, bit for bit.
    bool keep_last_block = true;
  };
  // Allocates everything (parameters zero; call InitRandom or import).
  static Result<std::unique_ptr<GptModel>> Create(Backend* backend, const GptConfig& config,
                                                  const Options& options);

  // GPT-2 initialization: weights N(0, 0.02), the two residual projections
  // (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2 n_layer)), biases 0, LayerNorm
  // weights 1; wte's padding rows 0. Deterministic in `seed`.
  Status InitRandom(uint64_t seed);

  // One forward+backward on host tokens/targets [B,T] (targets < 0 ignored).
  // Returns the mean loss over the non-ignored targets; gradients are
  // overwritten (or added to when `accumulate`) in the grad buffers.
  Result<double> ForwardBackward(const int32_t* tokens, const int32_t* targets,
                                 bool accumulate = false);
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
    HfTensorInfo info;
    DType dtype;
    std::vector<uint8_t> bytes;
  };
  Result<std::vector<HostTensor>> Export(DType dtype, bool gradients = false) const;

  const GptConfig& config() const { return config_; }
  const Options& options() const { return options_; }
  const GptLayers& layers() const { return layers_; }
  Backend* backend() const { return backend_; }
  DeviceBuffer& block_params(int l) { return blocks_[l]; }
  DeviceBuffer& block_grads(int l) { return block_grads_[l]; }
  DeviceBuffer& embedding_params() { return emb_; }
  DeviceBuffer& embedding_grads() { return emb_grads_; }
  DeviceBuffer& lnf_params() { return lnf_; }
  DeviceBuffer& lnf_grads() { return lnf_grads_; }
  // Every parameter buffer / its gradient buffer, in the order embedding,
  // blocks 0..L-1, ln_f (for optimizers).
  std::vector<DeviceBuffer*> ParameterBuffers();
  std::vector<DeviceBuffer*> GradientBuffers();

 private:
  GptModel(Backend* backend, const GptConfig& config, const Options& options, GptLayers layers)
      : backend_(backend), config_(config), options_(options), layers_(std::move(layers)) {}
  Result<const HfTensorInfo*> Find(const std::string& hf_name) const;
  const DeviceBuffer& BufferOf(const HfTensorInfo& t, bool grads) const;
  Result<std::vector<double>> Read(const HfTensorInfo& t, bool grads) const;
  Status UploadTokens(const int32_t* tokens, const int32_t* targets, int64_t* valid);

  Backend* backend_;
  GptConfig config_;
  Options options_;
  GptLayers layers_;
  std::vector<HfTensorInfo> tensors_;
  std::vector<DeviceBuffer> blocks_, block_grads_;
  DeviceBuffer emb_, emb_grads_, lnf_, lnf_grads_;
  std::vector<DeviceBuffer> acts_;  // L+1 checkpoints [B,T,C]
  DeviceBuffer dx_, scratch_, tokens_, targets_, losses_;
  DeviceBuffer head_scratch_;  // with keep_last_block: the head's own scratch
};

}  // namespace strata::kernels
