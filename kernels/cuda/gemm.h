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
// Thread-safety: used by one thread at a time (as its Backend).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

#include "kernels/backend.h"
#include "tiers/status.h"

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

 private:
  GemmRunner(cudaStream_t stream, const GemmOptions& opts) : stream_(stream), opts_(opts) {}

  using Key = std::array<int64_t, 20>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool has_algo = false;
    ~Plan();
  };
  // The plan for g with epilogue `epi` (cublasLtEpilogue_t); has_algo false
  // when cuBLASLt offers no algorithm for it.
  Result<Plan*> GetPlan(const GemmArgs& g, int epi);

  cudaStream_t stream_;
  GemmOptions opts_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

// gemm_epilogue.cu: for each of `batch` items (stride_c elements apart) and
// i < m, j < n: v = (c_zero ? 0 : c_scale * C[i, j]) + (bias ? bias[j] : 0);
// aux[i, j] = v when aux; C[i, j] = gelu ? GELU(v) : v. C and aux: (m, ldc) in
// c_dtype; bias: (n) in bias_dtype.
Status GemmEpilogue(cudaStream_t stream, void* c, DType c_dtype, int64_t ldc, int64_t m,
                    int64_t n, int batch, int64_t stride_c, float c_scale, bool c_zero,
                    const void* bias, DType bias_dtype, bool gelu, void* aux);

}  // namespace strata::kernels::cuda
