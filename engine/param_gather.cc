// SPDX-License-Identifier: Apache-2.0
#include "engine/param_gather.h"

#include <algorithm>
#include <string>

namespace strata {

uint64_t ParamGather::BufferBytes(const models::ModelSpec& spec, DType dtype) {
  int64_t largest = 0;
  for (const auto& u : spec.units) largest = std::max(largest, u.numel);
  return static_cast<uint64_t>(largest) * DTypeSize(dtype);
}

uint64_t ParamGather::DeviceBytes(const models::ModelSpec& spec, DType dtype) {
  return kMaxBuffers * BufferBytes(spec, dtype);
}

ParamGather::ParamGather(ModelState* state, kernels::Backend* backend, GatherFn gather)
    : state_(state),
      backend_(backend),
      gather_(std::move(gather)),
      buffer_bytes_(BufferBytes(state->spec(), state->layout().dtype)) {}

Result<void*> ParamGather::Acquire(size_t u) {
  ++clock_;
  Buffer* free = nullptr;
  for (Buffer& b : buffers_) {
    if (b.unit == static_cast<int64_t>(u)) {
      ++b.holders;
      b.last_use = clock_;
      return b.mem.data();
    }
    // The least recently used of the free ones, empty ones first.
    if (b.holders == 0 && (!free || (b.unit < 0 && free->unit >= 0) ||
                           ((b.unit < 0) == (free->unit < 0) && b.last_use < free->last_use)))
      free = &b;
  }
  if (!free && buffers_.size() >= kMaxBuffers) {
    std::string held;
    for (const Buffer& b : buffers_) held += (held.empty() ? "" : ", ") + state_->shard(static_cast<size_t>(b.unit)).name;
    return Internal("ParamGather: " + state_->shard(u).name + "'s parameters asked for while " + held +
                    " are held: the passes hold more than the " + std::to_string(kMaxBuffers) +
                    " gathered units the plan counts (ZeRO stage 3)");
  }
  if (!free) {
    ASSIGN_OR_RETURN(kernels::DeviceBuffer mem, backend_->Allocate(buffer_bytes_));
    buffers_.push_back(Buffer{std::move(mem)});
    free = &buffers_.back();
  }
  free->unit = -1;
  RETURN_IF_ERROR(Gather(u, free));
  free->unit = static_cast<int64_t>(u);
  free->holders = 1;
  free->last_use = clock_;
  return free->mem.data();
}

Status ParamGather::Release(size_t u) {
  for (Buffer& b : buffers_)
    if (b.unit == static_cast<int64_t>(u) && b.holders > 0) {
      --b.holders;
      return Status::OK();
    }
  return Internal("ParamGather: release of " + state_->shard(u).name + "'s parameters, which are not held");
}

void ParamGather::Invalidate() {
  for (Buffer& b : buffers_)
    if (b.holders == 0) b.unit = -1;
}

Status ParamGather::Gather(size_t u, Buffer* into) {
  const Shard& sh = state_->shard(u);
  TierStore* store = state_->store();
  const size_t es = DTypeSize(state_->layout().dtype), pad = static_cast<size_t>(sh.slice_pad);
  const size_t W = static_cast<size_t>(state_->layout().world);
  ASSIGN_OR_RETURN(TensorView own, store->Acquire(sh.ps, TierKind::kHost, Access::kRead));
  // Straight into the buffer (the backend's memory): the unit's numel of the
  // world × slice_pad gathered, never its padding.
  Status g = gather_(own.data, pad, state_->layout().dtype, into->mem.data(), static_cast<size_t>(sh.numel), true);
  RETURN_IF_ERROR(store->Release(sh.ps, TierKind::kHost, false));
  RETURN_IF_ERROR(g.WithContext("gathering " + sh.name + "'s parameters from the ranks (ZeRO stage 3)"));
  gathered_bytes_ += (W - 1) * pad * es;
  ++gathers_;
  return Status::OK();
}

}  // namespace strata
