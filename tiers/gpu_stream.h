// SPDX-License-Identifier: Apache-2.0
// GpuStream: a non-blocking CUDA stream, owned (RAII, move-only).
//
// For work that runs beside the compute stream and is ordered with it by
// events (tiers/gpu_event.h): the collectives of ZeRO stage 3's parameter
// gathers (engine/param_gather.h). The stream crosses this API as `void*`
// (a cudaStream_t). An empty GpuStream (default constructed) has a null
// handle; callers that run without a GPU (the CPU backend, the stand-in)
// never enqueue on one.
//
// Thread-safety: a GpuStream is used by one thread at a time.
#pragma once

#include <utility>

#include "base/status.h"

namespace strata {

class GpuStream {
 public:
  GpuStream() = default;
  // A non-blocking stream on `device` (made current on the calling thread).
  // Unavailable in a build without CUDA.
  static Result<GpuStream> Create(int device);
  GpuStream(GpuStream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  GpuStream& operator=(GpuStream&& o) noexcept {
    if (this != &o) {
      Destroy();
      stream_ = std::exchange(o.stream_, nullptr);
    }
    return *this;
  }
  GpuStream(const GpuStream&) = delete;
  GpuStream& operator=(const GpuStream&) = delete;
  ~GpuStream() { Destroy(); }

  bool empty() const { return stream_ == nullptr; }
  void* native() const { return stream_; }  // cudaStream_t
  // Host waits until everything queued on it is done.
  Status Synchronize() const;

 private:
  void Destroy();
  void* stream_ = nullptr;
};

}  // namespace strata
