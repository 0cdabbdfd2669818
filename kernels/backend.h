// SPDX-License-Identifier: Apache-2.0
// The compute backend interface: every op the model families need (GPT-2's
// LayerNorm/GELU/attention, Llama's RMSNorm/RoPE/SwiGLU/grouped-query
// attention), implemented
// twice — CUDA (kernels/cuda/, fast) and CPU (kernels/cpu/, the reference for
// tests and the backend on machines without a GPU).
//
// Conventions (both backends, every op):
// - Row-major tensors. Shapes are given per op and commented per buffer.
// - Storage dtypes for activations/params: f32, f16 or bf16 (`dtype`); all
//   arithmetic in fp32; LayerNorm statistics, softmax and the loss in fp32.
// - f64 (CPU backend only, for gradient checks against finite differences):
//   with dtype kF64 all arithmetic is fp64 and every buffer typed float*
//   below (LayerNorm mean/rstd, attention lse, cross-entropy losses,
//   GradStats sumsq) holds doubles: 8 bytes per element, passed through the
//   float* parameter. Other backends return InvalidArgument for kF64.
// - Pointers are backend memory: device memory for CUDA, host memory for the
//   CPU backend. Ops never allocate; scratch is passed in by the caller.
// - CUDA ops are asynchronous on the backend's compute stream; CPU ops run to
//   completion (parallel with oneTBB) before returning. Results that the host
//   needs (loss, norms, flags) are written to backend memory and read back with
//   CopyToHost after Synchronize().
// - Every error is a Status (bad arguments: InvalidArgument naming the
//   argument; CUDA failures: CudaError). No op aborts.
// - Deterministic: the same inputs give bitwise the same outputs run to run
//   (no atomics on floats where order varies).
//
// Thread-safety: a Backend is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/rope_params.h"

namespace strata::kernels {

enum class BackendKind : uint8_t { kCpu, kCuda };

class Backend;

// Memory owned by a backend (cudaMalloc'd for CUDA, 64-byte aligned host
// memory for CPU). Move-only; freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* owner, void* data, size_t bytes) : owner_(owner), data_(data), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }
  void Reset();
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C_in  (+ bias[n] per row)
//          (then GELU when `gelu`, or times GELU'(gelu_aux) when `dgelu`),
//          batched over `batch` with the strides.
// Row-major: op(A) = A (m x k, lda >= k) or A^T when trans_a (A is k x m,
// lda >= m); likewise B. `ab_dtype` is A's and B's dtype (and bias'),
// `c_dtype` is C's (f32 C lets gradients accumulate in fp32 with beta = 1).
// C_in is `c_in` (same layout and dtype as C: ldc, stride_c) or C itself when
// null; it is read only when beta != 0, and must be C or not overlap it.
//
// The GELU backward (the MLP's fc layer): with `dgelu`, gelu_aux is an input,
// the pre-activation the forward saved ([m, n], ldc, c_dtype), and
//   C = (alpha op(A) op(B) + beta C_in) * gelu'(gelu_aux)   (tanh-GELU)
// elementwise; with `bias_grad` also
//   bias_grad[j] (bias_grad_dtype) = sum over the m rows i of C[i, j]
// (overwritten, or added to when bias_grad_accumulate), the sum taken over
// C's values in fp32 before they are rounded to c_dtype. bias_grad works with
// or without dgelu (then it sums alpha op(A) op(B) + beta C_in (+ bias));
// batch must be 1. gelu and dgelu are exclusive, and dgelu takes no bias.
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  DType ab_dtype = DType::kBF16;
  DType c_dtype = DType::kBF16;
  float alpha = 1.f, beta = 0.f;
  const void* bias = nullptr;  // [n], ab_dtype; nullptr for none
  bool gelu = false;           // tanh-GELU applied after the bias
  void* gelu_aux = nullptr;    // with gelu: pre-GELU values [m, n] (ldc, c_dtype); may be null
                               // with dgelu: the input pre-activation (required)
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch items
  const void* c_in = nullptr;  // beta's matrix when not C itself (see above)
  bool dgelu = false;          // multiply by the tanh-GELU derivative at gelu_aux
  void* bias_grad = nullptr;   // [n] column sums of the result; nullptr for none
  DType bias_grad_dtype = DType::kF32;
  bool bias_grad_accumulate = false;
};

struct LayerNormArgs {
  int64_t rows = 0, cols = 0;  // N, C
  DType dtype = DType::kBF16;  // of x, y, weight, bias, dx
  float eps = 1e-5f;
};

struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;  // B, T, H, D; C = H * D
  DType dtype = DType::kBF16;
  // Softmax scale; 0 means 1/sqrt(head_dim).
  float scale = 0.f;
  // Key/value heads (grouped-query attention): 0 means `heads`; else a
  // divisor of `heads`, query head h reading key/value head h / (H / KV).
  int64_t kv_heads = 0;
  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  // Columns of a qkv row: (H + 2 KV) D.
  int64_t qkv_width() const { return (heads + 2 * kv()) * head_dim; }
};

// RMSNorm (Llama): y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).
struct RmsNormArgs {
  int64_t rows = 0, cols = 0;  // N, C
  DType dtype = DType::kBF16;  // of x, y, weight, dx
  float eps = 1e-6f;
};

// Rotary position embedding over rows of `width` columns, B sequences of T
// rows (row r is position position_offset + r % T; a decoder's new rows
// start at the cache's length): the first `heads` groups of `head_dim`
// columns are rotated (HF rotate_half: pair i is (i, i + D/2), angle
// fp32(t * inv_freq[i]), kernels/rope_params.h); the other columns are copied.
struct RopeArgs {
  int64_t batch = 0, seq = 0, width = 0;
  int64_t heads = 0, head_dim = 0;  // heads * head_dim <= width; head_dim even
  DType dtype = DType::kBF16;
  RopeParams rope;
  int64_t position_offset = 0;  // >= 0: the position of each sequence's first row
};

// Attention of new query rows against a key/value cache (generation): each
// of the B sequences holds `past` positions in the cache and brings `rows`
// new ones (the prompt in a prefill, one token per decode step).
// kv_heads < heads is grouped-query attention: query head h reads key/value
// head h / (heads / kv_heads); 0 means kv_heads = heads.
struct DecodeAttentionShape {
  int64_t batch = 0, rows = 0;  // B, R
  int64_t past = 0;             // P: positions already cached
  int64_t capacity = 0;         // positions the cache holds per sequence (P + R <= capacity)
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // H, Hkv, D
  DType dtype = DType::kBF16;
  float scale = 0.f;  // 0 means 1/sqrt(head_dim)
  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
};
// InvalidArgument naming `op` and the field when `s` is not a shape either
// backend runs (negative sizes, heads not a multiple of kv_heads, P + R
// beyond the capacity, a scale that is not finite and >= 0, a float dtype
// the backend does not take is the backend's own check).
Status CheckDecodeAttentionShape(const DecodeAttentionShape& s, const char* op);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu (16 threads)", "cuda:0 NVIDIA H200"

  // ---- memory and synchronization (for tests, tools and the engine) ------
  virtual Result<DeviceBuffer> Allocate(size_t bytes) = 0;
  virtual void Free(void* p, size_t bytes) = 0;  // used by DeviceBuffer
  virtual Status Memset(void* dst, int value, size_t bytes) = 0;
  // Synchronous copies between host memory and backend memory.
  virtual Status CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes) = 0;
  // Waits for all work queued so far; returns the first asynchronous error.
  virtual Status Synchronize() = 0;
  // cudaStream_t of the compute stream for CUDA; nullptr for the CPU backend.
  virtual void* native_stream() const = 0;

  // ---- ops --------------------------------------------------------------

  virtual Status Gemm(const GemmArgs& g) = 0;
  // True when Gemm implements GemmArgs' dgelu, bias_grad and c_in (models
  // fall back to GeluBackward / BiasBackward / copies when it does not).
  virtual bool GemmHasBackwardEpilogues() const { return false; }

  // y[N,C] = (x - mean) * rstd * weight + bias; mean[N], rstd[N] (f32) saved.
  virtual Status LayerNormForward(const LayerNormArgs& a, void* y, float* mean, float* rstd,
                                  const void* x, const void* weight, const void* bias) = 0;
  // dx[N,C] += d/dx (accumulates: dx is the residual stream's gradient);
  // dweight[C], dbias[C] (dtype `grad_dtype`) are overwritten, or accumulated
  // into when `accumulate`.
  virtual Status LayerNormBackward(const LayerNormArgs& a, void* dx, void* dweight, void* dbias,
                                   DType grad_dtype, bool accumulate, const void* dy,
                                   const void* x, const void* weight, const float* mean,
                                   const float* rstd) = 0;

  // RMSNorm: y[N,C] = x * rstd * weight; rstd[N] (f32) saved (may be null).
  virtual Status RmsNormForward(const RmsNormArgs& a, void* y, float* rstd, const void* x, const void* weight) = 0;
  // dx[N,C] += d/dx (accumulates, as LayerNormBackward); dweight[C]
  // (grad_dtype) overwritten, or accumulated into when `accumulate`.
  virtual Status RmsNormBackward(const RmsNormArgs& a, void* dx, void* dweight, DType grad_dtype, bool accumulate,
                                 const void* dy, const void* x, const void* weight, const float* rstd) = 0;

  // RoPE: out[B*T, width] = rotate(in) (out may alias in).
  virtual Status RopeForward(const RopeArgs& a, void* out, const void* in) = 0;
  // The backward (the inverse rotation): dx = R^T dy (dx may alias dy).
  virtual Status RopeBackward(const RopeArgs& a, void* dx, const void* dy) = 0;

  // SwiGLU: in[rows, 2F] = gate | up, out[rows, F] = silu(gate) * up.
  virtual Status SwiGluForward(void* out, const void* in, int64_t rows, int64_t f, DType dtype) = 0;
  // din[rows, 2F] = (d gate | d up) of dout[rows, F] (din may alias in, not dout).
  virtual Status SwiGluBackward(void* din, const void* dout, const void* in, int64_t rows, int64_t f,
                                DType dtype) = 0;

  // tanh-GELU: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  virtual Status GeluForward(void* y, const void* x, int64_t n, DType dtype) = 0;
  // dx = dy * gelu'(x). dx may alias dy.
  virtual Status GeluBackward(void* dx, const void* x, const void* dy, int64_t n, DType dtype) = 0;

  // out = a + b (out may alias a or b).
  virtual Status Add(void* out, const void* a, const void* b, int64_t n, DType dtype) = 0;

  // dbias[n] (grad_dtype) = sum over the m rows of dy[m,n] (or += when accumulate).
  virtual Status BiasBackward(void* dbias, DType grad_dtype, bool accumulate, const void* dy,
                              int64_t m, int64_t n, DType dtype) = 0;

  // Causal self-attention.
  // qkv: [B, T, (H + 2 KV) D] with q, k, v at column offsets 0, C = H D,
  //      C + KV D (3C columns without GQA); query head h uses columns
  //      h*D .. h*D+D-1 of q, key/value head h / (H / KV) those of k and v.
  // out: [B, T, C] (heads concatenated); lse: [B, H, T] f32 log-sum-exp of
  //      each query row's scaled scores (saved for backward).
  // workspace: scratch of AttentionWorkspaceBytes() bytes (may be 0).
  virtual size_t AttentionWorkspaceBytes(const AttentionShape& s) const = 0;
  virtual Status AttentionForward(const AttentionShape& s, void* out, float* lse, const void* qkv,
                                  void* workspace) = 0;
  // dqkv[B,T,(H + 2 KV) D] is overwritten (d k, d v summed over each group's query heads).
  virtual Status AttentionBackward(const AttentionShape& s, void* dqkv, const void* dout,
                                   const void* qkv, const void* out, const float* lse,
                                   void* workspace) = 0;

  // Causal attention of new rows against a KV cache (DecodeAttentionShape):
  // qkv: [B, R, (H + 2 Hkv) D], q | k | v columns of the new rows;
  // k_cache, v_cache: [B, capacity, Hkv D]. Writes the new rows' k and v to
  // cache positions P .. P+R-1, then out[B, R, H D] = softmax(scale q K^T) V
  // where new row i sees cache positions 0 .. P+i. The same values as
  // AttentionForward over all P+R positions, to rounding.
  virtual Status AttentionDecode(const DecodeAttentionShape& s, void* out, const void* qkv, void* k_cache,
                                 void* v_cache) = 0;

  // out[B,T,C] = wte[tokens[b,t]] + wpe[t]; tokens int32 in [0, V). wpe may
  // be null (no position table: Llama).
  virtual Status EmbeddingForward(void* out, const int32_t* tokens, const void* wte,
                                  const void* wpe, int64_t B, int64_t T, int64_t C,
                                  DType dtype) = 0;
  // dwte[Vp,C] += scatter of dout rows by token; dwpe[T,C] += sum over batch
  // (dwpe null: none).
  // Deterministic (fixed summation order). grad_dtype for dwte/dwpe.
  virtual Status EmbeddingBackward(void* dwte, void* dwpe, DType grad_dtype, const void* dout,
                                   const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                                   int64_t Vp, DType dtype) = 0;

  // Fused softmax + cross-entropy over logits[N, Vp] (dtype) where only the
  // first V columns are real (padding is never counted). For each row i:
  // losses[i] = logsumexp(logits[i, :V]) - logits[i, targets[i]] (f32).
  // Rows with targets[i] < 0 are ignored (loss 0, gradient 0).
  // When dlogits is not null it receives (softmax - onehot) * dloss, padding
  // columns 0; dlogits may alias logits (computed in one pass).
  virtual Status CrossEntropy(float* losses, void* dlogits, const void* logits,
                              const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                              float dloss, DType dtype) = 0;

  // dst[n] (dst_dtype) = src[n] (src_dtype), rounding to nearest even.
  virtual Status Cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) = 0;
  // x *= factor.
  virtual Status Scale(void* x, DType dtype, int64_t n, float factor) = 0;

  // Gradient statistics, accumulated into backend memory (one f32 and one
  // int32, both on the backend): *sumsq += sum of x^2 over the finite
  // elements (fp32 partials summed in a fixed order), *nonfinite += the number
  // of NaN/Inf elements.
  virtual Status GradStats(const void* x, DType dtype, int64_t n, float* sumsq,
                           int32_t* nonfinite) = 0;
};

// The CPU backend; `threads` 0 = all cores (oneTBB).
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0);

// The CUDA backend on `device`; Unavailable when built without CUDA or no GPU.
Result<std::unique_ptr<Backend>> MakeCudaBackend(int device = 0);

// CUDA when a GPU is usable, else CPU.
Result<std::unique_ptr<Backend>> MakeDefaultBackend();

}  // namespace strata::kernels
