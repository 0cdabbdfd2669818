// SPDX-License-Identifier: Apache-2.0
// ParamGather: ZeRO stage 3's parameters across data-parallel ranks
// (engine/data_parallel.h, engine/model_state.h). Each rank keeps only its
// slice of every unit's compute-dtype parameters (Shard::ps, homed on the
// host); no rank holds a unit's whole parameters between uses. When the
// step's passes (or an evaluation) acquire a unit's parameters, the ranks
// all-gather its slices into a buffer in the backend's memory; the buffer
// is released when its last holder releases it and is then reused for
// another unit. A released buffer keeps its unit's parameters until it is
// reused or the parameters change (Invalidate), so a unit used again soon
// (the last block from its forward to its backward, the head's tied
// embedding) is not gathered twice.
//
// A gather: this rank's slice is uploaded into its place in the buffer
// (world × slice_pad elements, DeepSpeed's flat partition) through the
// store's copy engine, and the ranks' slices are all-gathered around it in
// place. On the CUDA backend both are enqueued without the host waiting:
// the upload after the buffer's last readers (an event on the compute
// stream), the collective on the gathers' own stream after the upload
// (`overlap_comm`; else on the compute stream), and the compute stream
// waits on the GPU for the collective before the unit's kernels. On the
// CPU backend (MPI) the same calls complete in turn.
//
// Prefetch (stage3_prefetch_bucket_size, DeepSpeed's "parameter elements
// fetched ahead of use"): the step's passes acquire units in an order known
// before the step (SetStepOrder: recorded with the step's schedule, the
// same on every rank). While acquisitions follow it, each one also starts
// the gathers of the units next in that order, as many as the bucket's
// elements cover — at least the next unit (a unit is the granularity), none
// with a bucket of 0 — so the collective and the upload of the next unit
// run under this unit's compute. Before a unit's slice is read for a
// gather, `before_gather` is called (the trainer waits there for the
// optimizer's update of that unit: never a stale slice). An acquisition
// off the order (an evaluation, a pass that differs) gathers on demand, and
// the step prefetches no more until the next BeginStep: the same on every
// rank, as the collectives must be.
//
// Buffers are made as needed (each of the largest unit's padded size) and
// kept, the one whose unit the order uses again last given up first: at most kMaxHeld units held at once (a block's passes hold one, the
// head two: the final unit and the tied embedding) plus the units fetched
// ahead. The plan counts them as device memory outside the tiers
// (DeviceBytes, engine/budgets.h); a pass that held more at once is an
// Internal error naming the units, not an allocation past the GPU limit.
//
// Collectives: every rank acquires the same units in the same order (the
// passes' order, deterministic), so the gathers match across ranks.
//
// Ownership: borrows the state (and its store) and the backend; owns its
// buffers, events and stream; its destructor waits for the gathers in
// flight. Thread-safety: the step thread's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "engine/model_state.h"
#include "kernels/backend.h"
#include "models/model_spec.h"
#include "tiers/copy_engine.h"
#include "tiers/gpu_event.h"
#include "tiers/gpu_stream.h"

namespace strata {

// `count` elements of `dtype` from every rank gathered in place in `buf`
// (the backend's memory, world × count elements), this rank's already at
// rank × count; enqueued on `stream` (NCCL) or complete on return (MPI,
// where `stream` is null). engine/data_parallel.h AllGatherInPlace.
using GatherInPlaceFn = std::function<Status(void* buf, size_t count, DType dtype, void* stream)>;

class ParamGather {
 public:
  static constexpr size_t kMaxHeld = 2;
  struct Options {
    GatherInPlaceFn gather;
    std::function<Status(size_t unit)> before_gather;  // may be empty
    uint64_t prefetch_elems = 0;  // stage3_prefetch_bucket_size; 0: none
    bool own_stream = true;       // overlap_comm: the collectives on a stream of their own (CUDA)
  };
  // One buffer: `spec`'s largest unit padded to `world` equal slices, in `dtype`.
  static uint64_t BufferBytes(const models::ModelSpec& spec, DType dtype, int world);
  // The units gathered ahead of use (0 without prefetch; at most the units there are).
  static size_t AheadUnits(const models::ModelSpec& spec, uint64_t prefetch_elems);
  // Every buffer the gathers may make.
  static uint64_t DeviceBytes(const models::ModelSpec& spec, DType dtype, int world, uint64_t prefetch_elems);

  // With the CUDA backend, the gathers' stream and events on the store's
  // GPU (an error when they cannot be made).
  static Result<std::unique_ptr<ParamGather>> Create(ModelState* state, kernels::Backend* backend, Options options);
  ~ParamGather();
  ParamGather(const ParamGather&) = delete;
  ParamGather& operator=(const ParamGather&) = delete;

  // The order in which a step's passes acquire units (unit indices).
  void SetStepOrder(std::vector<size_t> order) { order_ = std::move(order); }
  // A step's passes begin: acquisitions follow the order from its start.
  void BeginStep();
  // They ended: the slices of gathers started but not used are let go, and
  // acquisitions gather on demand until the next BeginStep.
  Status EndStep();

  // Unit u's whole parameters (the backend's memory, ready for the compute
  // stream's next kernels), gathered from the ranks unless a buffer holds
  // them since the last Invalidate.
  Result<void*> Acquire(size_t unit);
  Status Release(size_t unit);
  // The parameters changed (an optimizer step): no buffer is current.
  Status Invalidate();

  size_t buffers() const { return buffers_.size(); }
  size_t max_buffers() const { return max_buffers_; }
  // Bytes this rank received from the other ranks in gathers so far, and
  // the gathers (all of them; those started ahead of use).
  uint64_t gathered_bytes() const { return gathered_bytes_; }
  uint64_t gathers() const { return gathers_; }
  uint64_t prefetched() const { return prefetched_; }

 private:
  struct Buffer {
    kernels::DeviceBuffer mem;
    int64_t unit = -1;  // whose parameters it holds or is gathering (-1: none)
    int holders = 0;
    uint64_t last_use = 0;
    GpuEvent ready;     // CUDA: the gather's end (its stream)
    GpuEvent free;      // CUDA: its last readers' end (the compute stream)
    bool gathered = false, freed = false;  // whether `ready` / `free` were recorded
    CopyTicket upload;  // this rank's slice into its place
    bool slice_held = false;  // the slice is acquired on the host until the upload landed
  };
  ParamGather(ModelState* state, kernels::Backend* backend, Options options);
  Buffer* Find(size_t unit);
  // A buffer for a gather, never one held or holding a unit of the order's
  // window [cursor_, window_end): an empty one, else a new one while fewer
  // than max_buffers_ exist, else the free one whose unit the step's order
  // uses again last (off the order: the least recently used); null when none.
  Result<Buffer*> Take(size_t window_end);
  // Where unit `unit` is next in the order from `from` on (order_.size():
  // not again; 0 off the order).
  size_t NextUse(int64_t unit, size_t from) const;
  Status Start(size_t unit, Buffer* b);
  // The upload landed: the host slice is let go.
  Status LetGoOfSlice(Buffer* b);
  Status PrefetchAhead();
  bool InWindow(int64_t unit, size_t window_end) const;
  void* gather_stream() const;

  ModelState* state_;
  kernels::Backend* backend_;
  Options options_;
  bool on_gpu_ = false;  // the CUDA backend: streams and events
  int device_ = 0;
  GpuStream stream_;
  size_t buffer_bytes_ = 0, max_buffers_ = kMaxHeld, ahead_ = 0;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<size_t> order_;
  size_t cursor_ = 0;      // the next acquisition's place in order_
  bool in_order_ = false;  // acquisitions follow order_ (prefetching)
  uint64_t clock_ = 0, gathered_bytes_ = 0, gathers_ = 0, prefetched_ = 0;
};

}  // namespace strata
