// SPDX-License-Identifier: Apache-2.0
// The AVX2+FMA build of GemmKernel (compiled with -mavx2 -mfma -mf16c, see
// kernels/CMakeLists.txt). Eigen is renamed into its own namespace here so its
// AVX2 template instances never merge with the generic ones of
// gemm_kernel.cc; nothing else with inline linkage is shared (see avx2.h).
#include "kernels/cpu/avx2.h"

#if defined(__AVX2__) && defined(__FMA__)

#define Eigen strata_eigen_avx2
#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Core>

namespace strata::kernels::cpu {

#include "kernels/cpu/gemm_eigen.inc"

bool Avx2KernelsCompiled() { return true; }

void GemmKernelF32Avx2(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate,
                       float* c, int64_t ldc) {
  EigenGemm<float>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

void GemmKernelF64Avx2(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                       const double* a, int64_t lda, const double* b, int64_t ldb, bool accumulate,
                       double* c, int64_t ldc) {
  EigenGemm<double>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

}  // namespace strata::kernels::cpu

#else  // not built for AVX2: never called

namespace strata::kernels::cpu {
bool Avx2KernelsCompiled() { return false; }
void GemmKernelF32Avx2(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                       const float*, int64_t, bool, float*, int64_t) {}
void GemmKernelF64Avx2(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                       const double*, int64_t, bool, double*, int64_t) {}
}  // namespace strata::kernels::cpu

#endif
