// SPDX-License-Identifier: Apache-2.0
// GEMMs through cuBLASLt with the row-major semantics of GemmArgs
// (kernels/backend.h).
//
// Row-major C[m,n] = op(A)[m,k] op(B)[k,n] is, read column-major, the
// product C^T[n,m] = op(B)^T op(A)^T: cuBLASLt is called with A and B
// swapped, M' = n, N' = m, and every matrix's column-major "rows" being its
// row-major row length. The per-row bias[n] is then a per-column-major-row
// bias, which is exactly what CUBLASLT_EPILOGUE_BIAS broadcasts.
//
// Epilogues (bias, GELU, GELU with the pre-activation saved) are fused into
// cuBLASLt when it supports the case (bias type = C type, one batch item, aux
// leading dimension a multiple of 8); otherwise the GEMM runs plain and
// gemm_epilogue.cu applies them. Plans (descriptors + the heuristic's best
// algorithm) are cached per shape, dtypes, epilogue and pointer alignment.
//
// The GELU backward (GemmArgs::dgelu, bias_grad) maps to
// CUBLASLT_EPILOGUE_DGELU_BGRAD / DGELU: cuBLASLt reads the pre-activation
// through EPILOGUE_AUX_POINTER (same type as D, leading dimension AUX_LD =
// ldc, a multiple of 8), multiplies the product by GELU'(aux) (the tanh
// approximation, like its GELU epilogue, which PyTorch's _addmm_activation
// relies on: pytorch/pytorch#104061; cuda_gemm_gpu_test.cc's GeluFlavour
// test tells the tanh derivative from the erf one on the GPU), and writes the
// bias gradient — the sums over cuBLAS's columns of D, i.e. over our m rows,
// one value per our column j, of the dGELU'd result — to BIAS_POINTER. That
// vector is written (never accumulated) in BIAS_DATA_TYPE (f32 tried first,
// then C's type) into this runner's scratch, then cast or added into the
// caller's bias_grad by a small kernel. Fused only with beta = 0 and one batch
// item; otherwise the GEMM runs plain, gemm_epilogue.cu applies GELU' and
// bias_backward.cu sums the columns.
//
// c_in (beta's matrix when it is not C) is cuBLASLt's C with D = our C, when
// the chosen algorithm computes out of place; otherwise C_in is copied to C
// first.
//
// Thread-safety: used by one thread at a time (as its Backend).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>
#include <memory>

#include "base/status.h"
#include "kernels/backend.h"

namespace strata::kernels::cuda {

// The one boundary where cuBLAS status codes become Status values.
Status CublasStatus(cublasStatus_t st, const char* expr, const char* file, int line);

#define CUBLAS_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                 \
    cublasStatus_t strata_cublas_st_ = (expr);                                         \
    if (strata_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                    \
      return ::strata::kernels::cuda::CublasStatus(strata_cublas_st_, #expr, __FILE__, \
                                                   __LINE__);                          \
  } while (0)

struct GemmOptions {
  bool tf32 = false;       // f32 GEMMs in TF32 (CUBLAS_COMPUTE_32F_FAST_TF32)
  bool epilogues = true;   // fuse bias/GELU into cuBLASLt when supported
  size_t workspace_bytes = 32u << 20;
  // Tuning: at the first call of a plan of at least tune_min_flops, time up
  // to 8 of cuBLASLt's candidate algorithms on the call's own operands (5
  // runs each) and keep the fastest of those whose result is bitwise the
  // heuristic choice's, if it is more than 3% faster; so the choice never
  // changes the numbers (gemm_cuda.cc, Tune). Costs a few tens of ms per
  // large plan, once; uses no GPU memory beyond the call's. With
  // STRATA_GEMM_TUNE_LOG=1 each search prints what it saw to stderr.
  bool tune = true;
  double tune_min_flops = 1e11;
};

class GemmRunner {
 public:
  // Owns a cuBLASLt handle and a device workspace; GEMMs run on `stream`.
  static Result<std::unique_ptr<GemmRunner>> Make(cudaStream_t stream, const GemmOptions& opts);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Checks g (InvalidArgument naming the field) and runs it on the stream.
  Status Run(const GemmArgs& g);

  // How many distinct plans were made (for tests of the cache).
  size_t plan_count() const { return plans_.size(); }
  // Calls whose epilogue cuBLASLt ran (bias/GELU/dGELU), and of those, calls
  // whose bias gradient it computed (for tests that must know the fused path
  // ran, not the kernel fallback).
  int64_t fused_epilogue_calls() const { return fused_epilogue_calls_; }
  int64_t fused_bias_grad_calls() const { return fused_bias_grad_calls_; }
  // Plans tuned, and of those, plans that left the heuristic's algorithm.
  int64_t tuned_plans() const { return tuned_plans_; }
  int64_t retuned_plans() const { return retuned_plans_; }

 private:
  GemmRunner(cudaStream_t stream, const GemmOptions& opts) : stream_(stream), opts_(opts) {}

  using Key = std::array<int64_t, 22>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool has_algo = false;
    bool out_of_place = false;  // the algorithm may read C from another buffer than D
    std::vector<cublasLtMatmulAlgo_t> candidates;  // tuning: the heuristic's list, best first
    bool tuned = false;
    ~Plan();
  };
  // The plan for g with epilogue `epi` (cublasLtEpilogue_t) and, for the
  // bias-gradient epilogues, the bias vector's cudaDataType_t `bias_type`
  // (-1 otherwise); has_algo false when cuBLASLt offers no algorithm for it.
  Result<Plan*> GetPlan(const GemmArgs& g, int epi, int bias_type);
  // C_in -> C for each batch item (when the algorithm cannot read C_in itself).
  Status CopyCIn(const GemmArgs& g);
  // One cublasLtMatmul of g with `algo` (c_read: the C it reads).
  Status Matmul(const Plan& plan, const GemmArgs& g, const void* c_read, const cublasLtMatmulAlgo_t& algo);
  // Tuning at the plan's first call (GemmOptions::tune); c_read is the C the
  // call reads. Leaves C as it found it, on success and on error.
  Status Tune(Plan* plan, const GemmArgs& g, const void* c_read, const std::string& name);

  cudaStream_t stream_;
  GemmOptions opts_;
  int num_sms_ = 0;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  // kScratchBytes: cuBLASLt's bias-gradient output, or the fp32 partials of
  // the fallback column sums (bias_backward.cu). Used in stream order.
  void* scratch_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  int64_t fused_epilogue_calls_ = 0, fused_bias_grad_calls_ = 0;
  int64_t tuned_plans_ = 0, retuned_plans_ = 0;
};

// gemm_epilogue.cu: for each of `batch` items (stride_c elements apart) and
// i < m, j < n: v = (c_zero ? 0 : c_scale * C_in[i, j]) + (bias ? bias[j] : 0);
// with dgelu v *= GELU'(aux[i, j]) (aux is read); otherwise aux[i, j] = v
// when aux is given; C[i, j] = gelu ? GELU(v) : v. C, C_in and aux: (m, ldc)
// in c_dtype (c_in may be c); bias: (n) in bias_dtype.
Status GemmEpilogue(cudaStream_t stream, void* c, const void* c_in, DType c_dtype, int64_t ldc,
                    int64_t m, int64_t n, int batch, int64_t stride_c, float c_scale, bool c_zero,
                    const void* bias, DType bias_dtype, bool gelu, bool dgelu, void* aux);

// gemm_epilogue.cu: dst[j] (dst_dtype) = (accumulate ? dst[j] : 0) + src[j]
// (src_dtype), j < n: a bias gradient from cuBLASLt's vector into the caller's.
Status BiasGradFinish(cudaStream_t stream, void* dst, DType dst_dtype, bool accumulate,
                      const void* src, DType src_dtype, int64_t n);

// bias_backward.cu: BiasBackward (ops.h) over the rows of dy[m, n] stored
// with leading dimension ld >= n.
Status BiasBackwardLd(cudaStream_t stream, int num_sms, void* dbias, DType grad_dtype,
                      bool accumulate, const void* dy, int64_t m, int64_t n, int64_t ld,
                      DType dtype, float* scratch, size_t scratch_bytes);

}  // namespace strata::kernels::cuda
