// SPDX-License-Identifier: Apache-2.0
// CudaStatus: the one boundary where CUDA runtime errors become Status values.
#include "base/cuda_check.h"

#if STRATA_WITH_CUDA

#include <string>

namespace strata {

Status CudaStatus(cudaError_t err, const char* expr, const char* file, int line) {
  // Clear the non-sticky error so it is reported once. For a sticky error the
  // context is unusable; cudaGetLastError() keeps returning it.
  cudaError_t last = cudaGetLastError();
  bool sticky = (last == err && cudaPeekAtLastError() == err);
  Status::Rep rep;
  rep.code = (err == cudaErrorMemoryAllocation) ? StatusCode::kOutOfMemory
             : (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
                 ? StatusCode::kUnavailable
                 : StatusCode::kCudaError;
  if (rep.code == StatusCode::kOutOfMemory) rep.tier = TierKind::kGpu;
  rep.message = std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ") in " +
                expr + " at " + file + ":" + std::to_string(line);
  if (sticky) rep.message += "; the error is sticky: the CUDA context is unusable";
  return Status(std::move(rep));
}

}  // namespace strata

#endif  // STRATA_WITH_CUDA
