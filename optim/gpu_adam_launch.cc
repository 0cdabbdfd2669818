// SPDX-License-Identifier: Apache-2.0
// The GPU Adam launcher of a build without CUDA (the real one is in
// optim/cuda/adam.cu).
#include "optim/gpu_adam_launch.h"

namespace strata::optim {

#if !STRATA_WITH_CUDA
Status LaunchAdamGpu(const AdamGpuShard&, const AdamCoefficients&, void*) {
  return Unavailable("GPU Adam: strata was built without CUDA (nvcc was not found at configure time)");
}
#endif

}  // namespace strata::optim
