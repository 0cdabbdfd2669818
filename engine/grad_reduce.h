// SPDX-License-Identifier: Apache-2.0
// GradReduce: the sums of the units' final fp32 gradients over the
// data-parallel ranks (engine/data_parallel.h), beside the backward
// (zero_optimization.overlap_comm). Each sum runs in place in the
// backward's accumulator, on a stream of its own, after the compute
// stream's kernels that finished the gradient (an event); the compute
// stream waits for it (another event, on the GPU: the host goes on) only
// when the step takes the result, which StepEnv does one unit later, so a
// unit's reduce-scatter (ZeRO stages >= 1) or all-reduce (stage 0) runs
// under the next unit's backward. The step alternates two block
// accumulators for this (engine/step_buffers.h): the block two back reuses
// one only after its sum was taken.
//
// In place: an accumulator is padded to world × slice_pad (DeepSpeed's
// flat partition) and the padding is zeroed before each sum, so the
// reduce-scatter reads the accumulator itself, rank r's block at r ×
// slice_pad, and leaves rank r's sum there: no staging buffer, no copies.
//
// On the CPU backend (MPI) there is no stream: a sum is complete when
// Submit returns, and Await has nothing to wait for.
//
// Ownership: borrows the backend; owns its stream and events; its
// destructor waits for the sums in flight. Thread-safety: the step
// thread's. Every rank must submit the same units in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "base/status.h"
#include "kernels/backend.h"
#include "tiers/gpu_event.h"
#include "tiers/gpu_stream.h"

namespace strata {

class GradReduce {
 public:
  // The sum over the ranks of `numel` fp32 values in `acc` (the backend's
  // memory, `padded` >= numel of them, the rest zeros), in place, enqueued
  // on `stream` (NCCL) or complete on return (MPI: `stream` null).
  using SumFn = std::function<Status(size_t unit, float* acc, int64_t numel, int64_t padded, void* stream)>;

  // `device`: the GPU of the stream and events (the CUDA backend).
  static Result<std::unique_ptr<GradReduce>> Create(kernels::Backend* backend, int device, SumFn sum);
  ~GradReduce();
  GradReduce(const GradReduce&) = delete;
  GradReduce& operator=(const GradReduce&) = delete;

  // Enqueues `unit`'s sum after the compute stream's work so far (which
  // wrote the gradient), zeroing its padding [numel, padded) first.
  Status Submit(size_t unit, float* acc, int64_t numel, int64_t padded);
  // Makes the compute stream wait for `unit`'s sum, which must be the
  // oldest submitted and not awaited (the units are taken in order).
  Status Await(size_t unit);
  // Waits for every sum in flight and forgets them: a step that failed
  // between a Submit and its Await leaves none for the next step.
  Status Drain();
  size_t in_flight() const { return in_flight_.size(); }

 private:
  GradReduce(kernels::Backend* backend, int device, SumFn sum)
      : backend_(backend), sum_(std::move(sum)), events_(device, false) {}
  bool on_gpu() const { return backend_->kind() == kernels::BackendKind::kCuda; }

  struct InFlight {
    size_t unit = 0;
    GpuEvent done;  // CUDA: recorded on the reductions' stream after the sum
  };
  kernels::Backend* backend_;
  SumFn sum_;
  EventPool events_;
  GpuStream stream_;          // CUDA: the reductions'
  GpuEvent ready_;            // CUDA: the compute stream's work before a sum
  std::deque<InFlight> in_flight_;  // submitted, not awaited, oldest first
};

}  // namespace strata
