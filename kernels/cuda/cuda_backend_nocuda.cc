// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's extra entry points in a build without CUDA.
#include "kernels/cuda/cuda_backend.h"

#if !STRATA_WITH_CUDA
namespace strata::kernels {

Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions&) {
  return Unavailable("strata was built without CUDA (nvcc was not found at configure time)");
}

bool FlashVariantRuns(const FlashVariant&, int, int) { return false; }

Status SetFlashVariant(Backend*, std::string_view) {
  return FailedPrecondition("flash attention variants need the CUDA backend; this build has no CUDA");
}

Status SetOpTiming(Backend*, bool) {
  return FailedPrecondition("per-op timing needs the CUDA backend; this build has no CUDA");
}

Result<std::vector<OpTiming>> TakeOpTimings(Backend*) {
  return FailedPrecondition("per-op timing needs the CUDA backend; this build has no CUDA");
}

}  // namespace strata::kernels
#endif
