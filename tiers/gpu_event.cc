// SPDX-License-Identifier: Apache-2.0
#include "tiers/gpu_event.h"

#include "base/cuda_check.h"

namespace strata {

#if STRATA_WITH_CUDA

Result<GpuEvent> GpuEvent::Create(int device, bool blocking) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaEvent_t e = nullptr;
  unsigned flags = cudaEventDisableTiming | (blocking ? cudaEventBlockingSync : 0);
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, flags));
  GpuEvent out;
  out.event_ = e;
  return out;
}

void GpuEvent::Destroy() {
  if (event_ != nullptr) {
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
    event_ = nullptr;
  }
}

Status GpuEvent::Record(void* stream) {
  if (event_ == nullptr) return FailedPrecondition("recording an empty GpuEvent");
  CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)));
  return Status::OK();
}

Status GpuEvent::Synchronize() const { return SynchronizeEvent(event_); }

Result<bool> GpuEvent::Query() const {
  if (event_ == nullptr) return true;
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  return CudaStatus(err, "cudaEventQuery", __FILE__, __LINE__);
}

Status GpuEvent::StreamWait(void* stream) const { return StreamWaitEvent(stream, event_); }

Status StreamWaitEvent(void* stream, void* event) {
  if (event == nullptr) return Status::OK();
  CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
  return Status::OK();
}

Status SynchronizeEvent(void* event) {
  if (event == nullptr) return Status::OK();
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  return Status::OK();
}

#else  // !STRATA_WITH_CUDA

Result<GpuEvent> GpuEvent::Create(int, bool) {
  return Unavailable("CUDA events: strata was built without CUDA");
}
void GpuEvent::Destroy() { event_ = nullptr; }
Status GpuEvent::Record(void*) { return Unavailable("CUDA events: strata was built without CUDA"); }
Status GpuEvent::Synchronize() const { return Status::OK(); }
Result<bool> GpuEvent::Query() const { return true; }
Status GpuEvent::StreamWait(void*) const { return Status::OK(); }
Status StreamWaitEvent(void*, void* event) {
  return event == nullptr ? Status::OK() : Unavailable("CUDA events: strata was built without CUDA");
}
Status SynchronizeEvent(void* event) {
  return event == nullptr ? Status::OK() : Unavailable("CUDA events: strata was built without CUDA");
}

#endif

Result<GpuEvent> EventPool::Get() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      GpuEvent e = std::move(free_.back());
      free_.pop_back();
      return e;
    }
  }
  return GpuEvent::Create(device_, blocking_);
}

void EventPool::Put(GpuEvent e) {
  if (e.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(std::move(e));
}

}  // namespace strata
