// SPDX-License-Identifier: Apache-2.0
// The CPU backend's one matrix-multiply kernel: Eigen's GEMM on fp32 or fp64
// panels, single-threaded (callers run independent tiles in parallel with
// oneTBB). Every other op that multiplies matrices (Gemm, attention) goes
// through here.
#pragma once

#include <cstdint>

namespace strata::kernels::cpu {

// C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n]  (+ C when `accumulate`).
// Row-major with leading dimensions: op(A) = A [m,k] (lda >= k) or, with
// trans_a, A^T where A is [k,m] (lda >= m); likewise B. Without `accumulate`
// C is never read (it may hold NaN). k = 0 gives 0 (or leaves C).
// The result depends only on the arguments and the CPU (Eigen's blocking reads
// the cache sizes), never on timing: bitwise repeatable.
void GemmKernel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c,
                int64_t ldc);
void GemmKernel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                const double* a, int64_t lda, const double* b, int64_t ldb, bool accumulate,
                double* c, int64_t ldc);

}  // namespace strata::kernels::cpu
