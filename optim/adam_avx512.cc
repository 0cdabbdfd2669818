// SPDX-License-Identifier: Apache-2.0
// The AVX-512 path of the CPU Adam (Skylake-SP / Zen 4 and later), 16 fp32
// lanes; bf16 outputs rounded with integer instructions. Compiled with
// -mavx512f -mavx512bw -mavx512dq -mavx512vl (optim/CMakeLists.txt, this file
// only) and called only after cpu_features.cc has confirmed support.
#include "optim/simd_avx512.h"
#include "optim/adam_body.h"

namespace strata::optim::internal {

namespace {
constexpr KernelTable kAvx512Table = MakeKernelTable<V>();
}  // namespace

const KernelTable& Avx512Kernels() { return kAvx512Table; }

}  // namespace strata::optim::internal
