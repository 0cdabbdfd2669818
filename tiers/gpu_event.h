// SPDX-License-Identifier: Apache-2.0
// GpuEvent: a CUDA event, owned (RAII, move-only), and a pool of them.
//
// Streams and events cross this API as `void*` (cudaStream_t / cudaEvent_t)
// so that callers need no CUDA headers. An empty GpuEvent (default
// constructed; all events in a build without CUDA or on the stand-in) is
// always complete: Synchronize and Query succeed at once and StreamWait does
// nothing.
//
// Events are created with cudaEventDisableTiming, and with
// cudaEventBlockingSync when `blocking` so that a host thread waiting on one
// sleeps instead of spinning (the CPU has Adam and I/O to run).
//
// Thread-safety: a GpuEvent is used by one thread at a time; EventPool is
// thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/thread_annotations.h"

namespace strata {

class GpuEvent {
 public:
  GpuEvent() = default;
  // An event on `device` (made current on the calling thread).
  static Result<GpuEvent> Create(int device, bool blocking = true);
  GpuEvent(GpuEvent&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  GpuEvent& operator=(GpuEvent&& o) noexcept {
    if (this != &o) {
      Destroy();
      event_ = std::exchange(o.event_, nullptr);
    }
    return *this;
  }
  GpuEvent(const GpuEvent&) = delete;
  GpuEvent& operator=(const GpuEvent&) = delete;
  ~GpuEvent() { Destroy(); }

  bool empty() const { return event_ == nullptr; }
  void* native() const { return event_; }  // cudaEvent_t

  // Captures the work queued on `stream` so far.
  Status Record(void* stream);
  // Host waits until the recorded work is done.
  Status Synchronize() const;
  // True when the recorded work is done (or nothing was recorded).
  Result<bool> Query() const;
  // Makes `stream` wait (on the GPU, without blocking the host) for the
  // recorded work.
  Status StreamWait(void* stream) const;

 private:
  void Destroy();
  void* event_ = nullptr;
};

// Reuses events instead of creating one per copy or per Release.
class EventPool {
 public:
  EventPool(int device, bool blocking) : device_(device), blocking_(blocking) {}
  Result<GpuEvent> Get();
  void Put(GpuEvent e);

 private:
  const int device_;
  const bool blocking_;
  std::mutex mu_;
  std::vector<GpuEvent> free_ GUARDED_BY(mu_);
};

// Static helpers over raw handles (for events the caller owns).
Status StreamWaitEvent(void* stream, void* event);
Status SynchronizeEvent(void* event);

}  // namespace strata
