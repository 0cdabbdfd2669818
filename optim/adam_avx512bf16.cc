// SPDX-License-Identifier: Apache-2.0
// The AVX-512 path with AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4):
// bf16 outputs (parameter copy, bf16 moments) converted with vcvtneps2bf16.
// Compiled with the AVX-512 flags plus -mavx512bf16 (optim/CMakeLists.txt).
#define STRATA_AVX512_NATIVE_BF16 1
#include "optim/simd_avx512.h"
#include "optim/adam_body.h"

namespace strata::optim::internal {

namespace {
constexpr KernelTable kAvx512Bf16Table = MakeKernelTable<V>();
}  // namespace

const KernelTable& Avx512Bf16Kernels() { return kAvx512Bf16Table; }

}  // namespace strata::optim::internal
