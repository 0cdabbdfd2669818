// SPDX-License-Identifier: Apache-2.0
#include "engine/param_gather.h"

#include <algorithm>
#include <string>

#include "base/trace.h"

namespace strata {

namespace {

int64_t SlicePad(int64_t numel, int world) { return (numel + world - 1) / world; }

}  // namespace

uint64_t ParamGather::BufferBytes(const models::ModelSpec& spec, DType dtype, int world) {
  int64_t largest = 0;
  for (const auto& u : spec.units) largest = std::max(largest, SlicePad(u.numel, world) * world);
  return static_cast<uint64_t>(largest) * DTypeSize(dtype);
}

size_t ParamGather::AheadUnits(const models::ModelSpec& spec, uint64_t prefetch_elems) {
  if (prefetch_elems == 0 || spec.units.empty()) return 0;
  int64_t largest = 1;
  for (const auto& u : spec.units) largest = std::max(largest, u.numel);
  const uint64_t n = std::max<uint64_t>(1, prefetch_elems / static_cast<uint64_t>(largest));
  return static_cast<size_t>(std::min<uint64_t>(n, spec.units.size()));
}

uint64_t ParamGather::DeviceBytes(const models::ModelSpec& spec, DType dtype, int world, uint64_t prefetch_elems) {
  return (kMaxHeld + AheadUnits(spec, prefetch_elems)) * BufferBytes(spec, dtype, world);
}

ParamGather::ParamGather(ModelState* state, kernels::Backend* backend, Options options)
    : state_(state), backend_(backend), options_(std::move(options)) {
  const ModelState::Layout& lay = state->layout();
  buffer_bytes_ = BufferBytes(state->spec(), lay.dtype, lay.world);
  ahead_ = AheadUnits(state->spec(), options_.prefetch_elems);
  max_buffers_ = kMaxHeld + ahead_;
}

Result<std::unique_ptr<ParamGather>> ParamGather::Create(ModelState* state, kernels::Backend* backend,
                                                         Options options) {
  if (!options.gather) return InvalidArgument("ParamGather: no gather function");
  std::unique_ptr<ParamGather> g(new ParamGather(state, backend, std::move(options)));
  g->on_gpu_ = backend->kind() == kernels::BackendKind::kCuda;
  if (g->on_gpu_) {
    GpuTier* gt = state->store()->gpu_tier();
    if (gt == nullptr || state->store()->copy_engine() == nullptr)
      return InvalidArgument("ParamGather: the CUDA backend's gathers need the store's GPU tier and copy engine");
    g->device_ = gt->device();
    if (g->options_.own_stream) {
      ASSIGN_OR_RETURN(g->stream_, GpuStream::Create(g->device_));
    }
  }
  return g;
}

ParamGather::~ParamGather() {
  // Nothing may still write a buffer or read a slice when they go.
  for (auto& b : buffers_) (void)LetGoOfSlice(b.get());
  if (on_gpu_) {
    (void)stream_.Synchronize();
    for (auto& b : buffers_)
      if (b->gathered) (void)b->ready.Synchronize();
  }
}

void* ParamGather::gather_stream() const {
  if (!on_gpu_) return nullptr;
  return options_.own_stream ? stream_.native() : backend_->native_stream();
}

void ParamGather::BeginStep() {
  cursor_ = 0;
  in_order_ = ahead_ > 0 && !order_.empty();
}

Status ParamGather::EndStep() {
  in_order_ = false;
  for (auto& b : buffers_)
    if (b->holders == 0) RETURN_IF_ERROR(LetGoOfSlice(b.get()));
  return Status::OK();
}

ParamGather::Buffer* ParamGather::Find(size_t u) {
  for (auto& b : buffers_)
    if (b->unit == static_cast<int64_t>(u)) return b.get();
  return nullptr;
}

bool ParamGather::InWindow(int64_t unit, size_t window_end) const {
  if (!in_order_ || unit < 0) return false;
  for (size_t i = cursor_; i < window_end && i < order_.size(); ++i)
    if (static_cast<int64_t>(order_[i]) == unit) return true;
  return false;
}

size_t ParamGather::NextUse(int64_t unit, size_t from) const {
  if (!in_order_ || unit < 0) return 0;
  for (size_t i = from; i < order_.size(); ++i)
    if (static_cast<int64_t>(order_[i]) == unit) return i;
  return order_.size();  // not again in this step
}

Result<ParamGather::Buffer*> ParamGather::Take(size_t window_end) {
  Buffer* pick = nullptr;
  size_t pick_next = 0;
  for (auto& b : buffers_) {
    if (b->holders > 0 || InWindow(b->unit, window_end)) continue;
    if (b->unit < 0) return b.get();  // an empty one first
    // In the step's order, the unit used again last (or never) goes; off
    // it, the least recently used.
    const size_t next = NextUse(b->unit, window_end);
    if (!pick || next > pick_next || (next == pick_next && b->last_use < pick->last_use)) {
      pick = b.get();
      pick_next = next;
    }
  }
  // Another buffer while the plan's count allows, before a current one is given up.
  if (buffers_.size() >= max_buffers_) return pick;
  auto b = std::make_unique<Buffer>();
  ASSIGN_OR_RETURN(b->mem, backend_->Allocate(buffer_bytes_));
  if (on_gpu_) {
    ASSIGN_OR_RETURN(b->ready, GpuEvent::Create(device_, false));
    ASSIGN_OR_RETURN(b->free, GpuEvent::Create(device_, false));
  }
  buffers_.push_back(std::move(b));
  return buffers_.back().get();
}

// The upload waits for the buffer's last readers and its last gather (one
// started ahead and never used); the collective for the upload.
Status ParamGather::Start(size_t u, Buffer* b) {
  RETURN_IF_ERROR(LetGoOfSlice(b));
  b->unit = -1;
  if (options_.before_gather) RETURN_IF_ERROR(options_.before_gather(u));
  const Shard& sh = state_->shard(u);
  const ModelState::Layout& lay = state_->layout();
  const size_t es = DTypeSize(lay.dtype), pad = static_cast<size_t>(sh.slice_pad);
  TierStore* store = state_->store();
  ASSIGN_OR_RETURN(TensorView own, store->Acquire(sh.ps, TierKind::kHost, Access::kRead));
  b->slice_held = true;
  b->unit = static_cast<int64_t>(u);
  uint8_t* mine = static_cast<uint8_t*>(b->mem.data()) + static_cast<size_t>(lay.rank) * pad * es;
  const std::string what = "gathering " + sh.name + "'s parameters from the ranks (ZeRO stage 3)";
  if (on_gpu_) {
    void* after[2] = {b->freed ? b->free.native() : nullptr, b->gathered ? b->ready.native() : nullptr};
    CopyAfter ca;
    ca.events = after;
    ASSIGN_OR_RETURN(b->upload, store->copy_engine()->HostToDevice(mine, own.data, pad * es, ca));
    RETURN_IF_ERROR(b->upload.StreamWait(gather_stream()).WithContext(what));
  } else {
    std::copy_n(static_cast<const uint8_t*>(own.data), pad * es, mine);
    RETURN_IF_ERROR(LetGoOfSlice(b));
  }
  RETURN_IF_ERROR(options_.gather(b->mem.data(), pad, lay.dtype, gather_stream()).WithContext(what));
  if (on_gpu_) {
    RETURN_IF_ERROR(b->ready.Record(gather_stream()));
    b->gathered = true;
  }
  gathered_bytes_ += static_cast<uint64_t>(lay.world - 1) * pad * es;
  ++gathers_;
  return Status::OK();
}

Status ParamGather::LetGoOfSlice(Buffer* b) {
  if (!b->slice_held) return Status::OK();
  Status up = b->upload.Wait();
  b->upload = CopyTicket{};
  b->slice_held = false;
  Status rel = state_->store()->Release(state_->shard(static_cast<size_t>(b->unit)).ps, TierKind::kHost, false);
  return up.ok() ? rel : up;
}

// Gathers of the units next in the order, within the prefetch bucket.
Status ParamGather::PrefetchAhead() {
  size_t started = 0;
  uint64_t elems = 0;
  for (size_t pos = cursor_; pos < order_.size() && started < ahead_; ++pos) {
    const size_t v = order_[pos];
    const uint64_t n = static_cast<uint64_t>(state_->shard(v).numel);
    if (Find(v)) {  // held, current or on its way: ahead already
      ++started;
      elems += n;
      continue;
    }
    if (started > 0 && elems + n > options_.prefetch_elems) break;
    ASSIGN_OR_RETURN(Buffer* b, Take(pos + 1));
    if (!b) break;
    RETURN_IF_ERROR(Start(v, b));
    b->last_use = clock_;
    ++prefetched_;
    ++started;
    elems += n;
  }
  return Status::OK();
}

Result<void*> ParamGather::Acquire(size_t u) {
  ++clock_;
  if (in_order_) {
    if (cursor_ < order_.size() && order_[cursor_] == u) {
      ++cursor_;
    } else {
      in_order_ = false;  // (until the next BeginStep, on every rank alike)
    }
  }
  Buffer* b = Find(u);
  if (!b) {
    // Not one fetched ahead for later, unless no other buffer is free.
    ASSIGN_OR_RETURN(b, Take(std::min(cursor_ + ahead_, order_.size())));
    if (!b) {
      ASSIGN_OR_RETURN(b, Take(cursor_));
    }
    if (!b) {
      std::string held;
      for (const auto& x : buffers_)
        if (x->holders > 0) held += (held.empty() ? "" : ", ") + state_->shard(static_cast<size_t>(x->unit)).name;
      return Internal("ParamGather: " + state_->shard(u).name + "'s parameters asked for while " + held +
                      " are held: the passes hold more than the " + std::to_string(kMaxHeld) +
                      " gathered units the plan counts (ZeRO stage 3)");
    }
    RETURN_IF_ERROR(Start(u, b));
  }
  ++b->holders;
  b->last_use = clock_;
  if (in_order_) RETURN_IF_ERROR(PrefetchAhead());
  // The compute stream waits on the GPU; the host goes on to queue the
  // unit's kernels (its slice is let go once they are queued: Release).
  if (on_gpu_ && b->gathered) RETURN_IF_ERROR(b->ready.StreamWait(backend_->native_stream()));
  return b->mem.data();
}

Status ParamGather::Release(size_t u) {
  for (auto& b : buffers_)
    if (b->unit == static_cast<int64_t>(u) && b->holders > 0) {
      if (--b->holders > 0) return Status::OK();
      if (on_gpu_) {
        RETURN_IF_ERROR(b->free.Record(backend_->native_stream()));
        b->freed = true;
      }
      // Before the unit's gradient is final, and so before its update writes the slice.
      return LetGoOfSlice(b.get());
    }
  return Internal("ParamGather: release of " + state_->shard(u).name + "'s parameters, which are not held");
}

Status ParamGather::Invalidate() {
  for (auto& b : buffers_)
    if (b->holders == 0) {
      RETURN_IF_ERROR(LetGoOfSlice(b.get()));
      b->unit = -1;
    }
  return Status::OK();
}

}  // namespace strata
