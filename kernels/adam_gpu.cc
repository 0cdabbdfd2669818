// The GPU Adam launcher of a build without CUDA (the real one is in
// kernels/cuda/adam.cu).
#include "kernels/adam_gpu.h"

namespace strata::kernels {

#if !STRATA_WITH_CUDA
Status LaunchAdamGpu(const AdamGpuShard&, const AdamCoefficients&, void*) {
  return Unavailable("GPU Adam: strata was built without CUDA (nvcc was not found at configure time)");
}
#endif

}  // namespace strata::kernels
