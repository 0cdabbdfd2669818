// SPDX-License-Identifier: Apache-2.0
// The generic build of GemmKernel and the run-time choice of build.
#include "kernels/cpu/gemm_kernel.h"

#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Core>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/isa.h"

namespace strata::kernels::cpu {

#include "kernels/cpu/gemm_eigen.inc"

void GemmKernel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c,
                int64_t ldc) {
  if (ActiveIsa() == Isa::kAvx2) {
    GemmKernelF32Avx2(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
  } else {
    EigenGemm<float>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
  }
}

void GemmKernel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                const double* a, int64_t lda, const double* b, int64_t ldb, bool accumulate,
                double* c, int64_t ldc) {
  if (ActiveIsa() == Isa::kAvx2) {
    GemmKernelF64Avx2(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
  } else {
    EigenGemm<double>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
  }
}

}  // namespace strata::kernels::cpu
