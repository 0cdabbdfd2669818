// SPDX-License-Identifier: Apache-2.0
#include "engine/grad_reduce.h"

namespace strata {

Result<std::unique_ptr<GradReduce>> GradReduce::Create(kernels::Backend* backend, int device, SumFn sum) {
  if (!sum) return InvalidArgument("GradReduce: no sum function");
  std::unique_ptr<GradReduce> g(new GradReduce(backend, device, std::move(sum)));
  if (g->on_gpu()) {
    ASSIGN_OR_RETURN(g->stream_, GpuStream::Create(device));
    ASSIGN_OR_RETURN(g->ready_, GpuEvent::Create(device, false));
  }
  return g;
}

GradReduce::~GradReduce() {
  // No sum may still write an accumulator when the step's buffers go.
  if (on_gpu()) (void)stream_.Synchronize();
}

Status GradReduce::Submit(size_t unit, float* acc, int64_t numel, int64_t padded) {
  if (padded < numel)
    return InvalidArgument("GradReduce: unit " + std::to_string(unit) + " of " + std::to_string(numel) +
                           " elements in an accumulator padded to " + std::to_string(padded));
  // (Another unit of the same accumulator may have left values there.)
  if (padded > numel)
    RETURN_IF_ERROR(backend_->Memset(acc + numel, 0, static_cast<size_t>(padded - numel) * 4));
  InFlight f;
  f.unit = unit;
  if (!on_gpu()) {
    RETURN_IF_ERROR(sum_(unit, acc, numel, padded, nullptr));
    in_flight_.push_back(std::move(f));
    return Status::OK();
  }
  RETURN_IF_ERROR(ready_.Record(backend_->native_stream()));
  RETURN_IF_ERROR(ready_.StreamWait(stream_.native()));
  RETURN_IF_ERROR(sum_(unit, acc, numel, padded, stream_.native()));
  ASSIGN_OR_RETURN(f.done, events_.Get());
  RETURN_IF_ERROR(f.done.Record(stream_.native()));
  in_flight_.push_back(std::move(f));
  return Status::OK();
}

Status GradReduce::Await(size_t unit) {
  if (in_flight_.empty() || in_flight_.front().unit != unit)
    return Internal("GradReduce: unit " + std::to_string(unit) + "'s sum awaited, but " +
                    (in_flight_.empty() ? std::string("none is in flight")
                                        : "unit " + std::to_string(in_flight_.front().unit) + "'s is the oldest"));
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (f.done.empty()) return Status::OK();
  Status s = f.done.StreamWait(backend_->native_stream());
  events_.Put(std::move(f.done));  // (re-recording it later leaves this wait as it is)
  return s;
}

Status GradReduce::Drain() {
  if (in_flight_.empty()) return Status::OK();
  Status s = on_gpu() ? stream_.Synchronize() : Status::OK();
  for (InFlight& f : in_flight_)
    if (!f.done.empty()) events_.Put(std::move(f.done));
  in_flight_.clear();
  return s;
}

}  // namespace strata
