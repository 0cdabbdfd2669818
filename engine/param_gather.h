// SPDX-License-Identifier: Apache-2.0
// ParamGather: ZeRO stage 3's parameters across data-parallel ranks
// (engine/data_parallel.h, engine/model_state.h). Each rank keeps only its
// slice of every unit's compute-dtype parameters (Shard::ps, homed on the
// host); no rank holds a unit's whole parameters between uses. When the
// step's passes (or an evaluation) first acquire a unit's parameters, the
// ranks all-gather its slices into a transient full buffer in the
// backend's memory; the buffer is released when its last holder releases
// it and is then reused for another unit. A released buffer keeps its
// unit's parameters until it is reused or the parameters change
// (Invalidate), so a unit used again soon (the last block from its forward
// to its backward, the head's tied embedding) is not gathered twice.
//
// Buffers are made as the passes need them (each of the largest unit's
// size), and then kept, at most kMaxBuffers: a block's passes hold one
// unit, the head two (the final unit and the tied embedding), and a
// released buffer is reused before another is made. The plan counts them
// as device memory outside the tiers (engine/budgets.h); a pass that held
// more at once is an Internal error naming the units, not an allocation
// past the GPU limit. No prefetch ahead: each gather waits
// for its result on the step thread (engine/staged_collectives.h), so an
// early gather would move the same bytes at the same cost without
// overlapping anything.
//
// Collectives: every rank acquires the same units in the same order (the
// passes' order, deterministic), so the gathers match across ranks.
//
// Ownership: borrows the state (and its store) and the backend; owns its
// buffers. Thread-safety: the step thread's.
#pragma once

#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "engine/model_state.h"
#include "kernels/backend.h"
#include "models/model_spec.h"

namespace strata {

class ParamGather {
 public:
  static constexpr size_t kMaxBuffers = 2;
  // One buffer (`spec`'s largest unit in `dtype`), and kMaxBuffers of them.
  static uint64_t BufferBytes(const models::ModelSpec& spec, DType dtype);
  static uint64_t DeviceBytes(const models::ModelSpec& spec, DType dtype);

  ParamGather(ModelState* state, kernels::Backend* backend, GatherFn gather);

  // Unit u's whole parameters (the backend's memory), gathered from the
  // ranks unless a buffer holds them since the last Invalidate.
  Result<void*> Acquire(size_t unit);
  Status Release(size_t unit);
  // The parameters changed (an optimizer step): no buffer is current.
  void Invalidate();

  size_t buffers() const { return buffers_.size(); }
  // Bytes this rank received in gathers so far (for reports and tests).
  uint64_t gathered_bytes() const { return gathered_bytes_; }
  uint64_t gathers() const { return gathers_; }

 private:
  struct Buffer {
    kernels::DeviceBuffer mem;
    int64_t unit = -1;  // whose parameters it holds (-1: none)
    int holders = 0;
    uint64_t last_use = 0;
  };
  Status Gather(size_t unit, Buffer* into);

  ModelState* state_;
  kernels::Backend* backend_;
  GatherFn gather_;
  size_t buffer_bytes_ = 0;  // the largest unit's parameters
  std::vector<Buffer> buffers_;
  uint64_t clock_ = 0, gathered_bytes_ = 0, gathers_ = 0;
};

}  // namespace strata
