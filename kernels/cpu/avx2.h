// SPDX-License-Identifier: Apache-2.0
// Entry points of the files built for AVX2+FMA+F16C (*_avx2.cc).
//
// Those files see only this header, standard headers, <immintrin.h>, Eigen
// renamed into its own namespace (the GEMM) and vecmath.inc inside an
// anonymous namespace (the row helpers): any inline function they shared with
// the generic files would be emitted with AVX2 instructions and could be
// picked by the linker for the generic callers too (an ODR trap that crashes
// CPUs without AVX2). Call these only when Avx2Usable() (isa.h).
#pragma once

#include <cstdint>

namespace strata::kernels::cpu {

// True when the *_avx2.cc files were built with AVX2 (false off x86-64).
bool Avx2KernelsCompiled();

namespace convert_impl {
void Bf16ToF32Avx2(const uint16_t* src, float* dst, int64_t n);
void F32ToBf16Avx2(const float* src, uint16_t* dst, int64_t n);
void F16ToF32Avx2(const uint16_t* src, float* dst, int64_t n);
void F32ToF16Avx2(const float* src, uint16_t* dst, int64_t n);
// The generic builds (convert.cc), used for the tails.
void Bf16ToF32Generic(const uint16_t* src, float* dst, int64_t n);
void F32ToBf16Generic(const float* src, uint16_t* dst, int64_t n);
void F16ToF32Generic(const uint16_t* src, float* dst, int64_t n);
void F32ToF16Generic(const float* src, uint16_t* dst, int64_t n);
}  // namespace convert_impl

// See common.h (GeluRows, GeluGradRows, ExpShiftRows).
void GeluRowsF32Avx2(float* v, int64_t n);
void GeluGradRowsF32Avx2(const float* x, float* g, int64_t n);
void ExpShiftRowsF32Avx2(float* v, int64_t n, float shift);

// See gemm_kernel.h for the contract.
void GemmKernelF32Avx2(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate,
                       float* c, int64_t ldc);
void GemmKernelF64Avx2(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                       const double* a, int64_t lda, const double* b, int64_t ldb, bool accumulate,
                       double* c, int64_t ldc);

}  // namespace strata::kernels::cpu
