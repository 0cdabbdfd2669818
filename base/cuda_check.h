// SPDX-License-Identifier: Apache-2.0
// The one boundary where CUDA runtime errors become Status values.
//
// CudaStatus() also clears the runtime's last-error slot for non-sticky errors
// (cudaGetLastError), so one failure is reported once and does not leak into an
// unrelated later call (as nccl's checks.h does). Sticky errors (a kernel
// fault) poison the context; the message says so.
//
// Only for code built with CUDA (STRATA_WITH_CUDA=1).
#pragma once

#include "base/status.h"

#if STRATA_WITH_CUDA
#include <cuda_runtime.h>

namespace strata {

Status CudaStatus(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace strata

#define CUDA_RETURN_IF_ERROR(expr)                                              \
  do {                                                                          \
    cudaError_t strata_cuda_err_ = (expr);                                      \
    if (strata_cuda_err_ != cudaSuccess)                                        \
      return ::strata::CudaStatus(strata_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration etc.).
#define CUDA_RETURN_IF_LAUNCH_ERROR(what) CUDA_RETURN_IF_ERROR(cudaGetLastError())

#endif  // STRATA_WITH_CUDA
