// SPDX-License-Identifier: Apache-2.0
// Generic builds of the float row helpers and the run-time choice.
#include "kernels/cpu/avx2.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/isa.h"

namespace strata::kernels::cpu {
namespace {
void GeluGeneric(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = Gelu(v[i]);
}
void GeluGradGeneric(const float* x, float* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] *= GeluGrad(x[i]);
}
void ExpShiftGeneric(float* v, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) v[i] = ExpF(v[i] - shift);
}
}  // namespace

void GeluRowsF32(float* v, int64_t n) {
  static const auto fn = ActiveIsa() == Isa::kAvx2 ? GeluRowsF32Avx2 : GeluGeneric;
  fn(v, n);
}
void GeluGradRowsF32(const float* x, float* g, int64_t n) {
  static const auto fn = ActiveIsa() == Isa::kAvx2 ? GeluGradRowsF32Avx2 : GeluGradGeneric;
  fn(x, g, n);
}
void ExpShiftRowsF32(float* v, int64_t n, float shift) {
  static const auto fn = ActiveIsa() == Isa::kAvx2 ? ExpShiftRowsF32Avx2 : ExpShiftGeneric;
  fn(v, n, shift);
}

}  // namespace strata::kernels::cpu
