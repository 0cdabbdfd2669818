// SPDX-License-Identifier: Apache-2.0
#include "tiers/gpu_stream.h"

#include "base/cuda_check.h"

namespace strata {

#if STRATA_WITH_CUDA

Result<GpuStream> GpuStream::Create(int device) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  GpuStream out;
  out.stream_ = s;
  return out;
}

void GpuStream::Destroy() {
  if (stream_ != nullptr) {
    // Destroying a stream with work on it is allowed: CUDA releases it once
    // the work is done.
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    stream_ = nullptr;
  }
}

Status GpuStream::Synchronize() const {
  if (stream_ == nullptr) return Status::OK();
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  return Status::OK();
}

#else  // !STRATA_WITH_CUDA

Result<GpuStream> GpuStream::Create(int) { return Unavailable("CUDA streams: strata was built without CUDA"); }
void GpuStream::Destroy() { stream_ = nullptr; }
Status GpuStream::Synchronize() const { return Status::OK(); }

#endif

}  // namespace strata
