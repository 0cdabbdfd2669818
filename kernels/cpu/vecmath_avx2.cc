// SPDX-License-Identifier: Apache-2.0
// AVX2+FMA builds of the float row helpers (compiled with -mavx2 -mfma, see
// kernels/CMakeLists.txt; called only when isa.h says the CPU has them). The
// math comes from vecmath.inc inside an anonymous namespace: nothing here
// has linkage the generic files could pick up (see avx2.h).
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cpu/avx2.h"

namespace strata::kernels::cpu {
namespace {
#include "kernels/cpu/vecmath.inc"
}  // namespace

void GeluRowsF32Avx2(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = Gelu(v[i]);
}
void GeluGradRowsF32Avx2(const float* x, float* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] *= GeluGrad(x[i]);
}
void ExpShiftRowsF32Avx2(float* v, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) v[i] = ExpF(v[i] - shift);
}

}  // namespace strata::kernels::cpu
