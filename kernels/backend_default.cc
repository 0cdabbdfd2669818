// SPDX-License-Identifier: Apache-2.0
// MakeDefaultBackend: the CUDA backend when it can be made (built with CUDA,
// a usable GPU), else the CPU backend on all cores.
#include "kernels/backend.h"

namespace strata::kernels {

Result<std::unique_ptr<Backend>> MakeDefaultBackend() {
  Result<std::unique_ptr<Backend>> cuda = MakeCudaBackend(0);
  if (cuda.ok()) return std::move(cuda).value();
  return MakeCpuBackend(0);
}

}  // namespace strata::kernels
