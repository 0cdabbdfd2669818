// SPDX-License-Identifier: Apache-2.0
#include "engine/shard_update.h"

#include <algorithm>

#include "base/bytes.h"
#include "optim/gpu_adam.h"

namespace strata {

namespace {

// The Adam view of a shard's buffers (m and v of the layout's moment dtype).
optim::AdamShard AdamView(const ModelState::Layout& lay, uint64_t n, float* master, void* m, void* v,
                          const void* grad, void* param_out) {
  const DType grad_dtype = lay.grad_dtype, dtype = lay.dtype;
  optim::AdamShard a;
  a.n = n;
  a.master = master;
  a.exp_avg = m;
  a.exp_avg_sq = v;
  a.state_dtype = lay.moment_dtype;
  a.grad = grad;
  a.grad_dtype = grad_dtype;
  a.param_out = param_out;
  a.param_out_dtype = dtype;
  return a;
}

}  // namespace

// ---- HostShardUpdate ---------------------------------------------------------------

Result<std::unique_ptr<HostShardUpdate>> HostShardUpdate::Create(const ShardUpdateContext& ctx,
                                                                 const OffloadConfig& offload_optimizer,
                                                                 uint64_t piece_params) {
  std::unique_ptr<HostShardUpdate> u(
      new HostShardUpdate(ctx, offload_optimizer, piece_params ? piece_params : kDefaultPieceParams));
  const ModelState& st = *ctx.state;
  const uint64_t numel = st.MaxOffloadedNumel();
  if (numel > 0) {
    HostTier* ht = ctx.store->host_tier();
    if (st.OffloadedGradsOnGpu()) {
      ASSIGN_OR_RETURN(u->grad_staging_,
                       ht->Allocate(numel * DTypeSize(st.layout().grad_dtype), "gradient staging"));
    }
    if (st.OffloadedParamsOnGpu())
      for (TierBlock& b : u->param_staging_) {
        ASSIGN_OR_RETURN(b, ht->Allocate(numel * DTypeSize(st.layout().dtype), "parameter staging"));
      }
  }
  return u;
}

void HostShardUpdate::ReadAhead(size_t s, const OptJob&) {
  const Shard& sh = ctx_.state->shard(s);
  if (!offload_.pipeline_read || sh.opt_home != TierKind::kNvme) return;
  for (TensorId id : {sh.w, sh.m, sh.v}) (void)ctx_.store->Prefetch(id, TierKind::kHost);
}

// Everything of this shard is on the GPU (or its stand-in): the fused GPU
// Adam on the compute stream, waited for.
Result<CopyTicket> HostShardUpdate::UpdateOnGpu(Shard& sh, const OptJob& j, const ShardHow& how) {
  TierStore* store = ctx_.store;
  const ModelState::Layout& lay = ctx_.state->layout();
  ASSIGN_OR_RETURN(TensorView w, store->Acquire(sh.w, TierKind::kGpu, Access::kReadWrite));
  ASSIGN_OR_RETURN(TensorView m, store->Acquire(sh.m, TierKind::kGpu, Access::kReadWrite));
  ASSIGN_OR_RETURN(TensorView v, store->Acquire(sh.v, TierKind::kGpu, Access::kReadWrite));
  ASSIGN_OR_RETURN(TensorView g, store->Acquire(sh.g, TierKind::kGpu, Access::kRead));
  // Partitioned: the slice's parameters go to `ps` (homed on the host; on
  // the CUDA backend the kernel writes a GPU copy of it, which the gathers
  // read from the host once the store has brought it down).
  const TensorId pid = sh.partitioned ? sh.ps : sh.p;
  const TierKind ptier = sh.partitioned && !ctx_.cuda() ? TierKind::kHost : TierKind::kGpu;
  ASSIGN_OR_RETURN(TensorView p, store->Acquire(pid, ptier, Access::kWriteDiscard));
  const void* grad = static_cast<const char*>(g.data) + sh.g_off() * DTypeSize(lay.grad_dtype);
  const optim::AdamShard a =
      AdamView(lay, static_cast<uint64_t>(sh.slice_len), static_cast<float*>(w.data), m.data, v.data, grad, p.data);
  void* s = nullptr;
  if (ctx_.cuda()) {
    s = ctx_.backend->native_stream();
    RETURN_IF_ERROR(optim::GpuAdamStep(a, j.hyper, how.multiplier, s));
    RETURN_IF_ERROR(ctx_.backend->Synchronize());
  } else {
    RETURN_IF_ERROR(ctx_.adam->Step(a, j.hyper, {how.multiplier, false}).status());
  }
  RETURN_IF_ERROR(store->Release(sh.g, TierKind::kGpu, false, s));
  RETURN_IF_ERROR(store->Release(sh.w, TierKind::kGpu, true, s));
  RETURN_IF_ERROR(store->Release(sh.m, TierKind::kGpu, true, s));
  RETURN_IF_ERROR(store->Release(sh.v, TierKind::kGpu, true, s));
  RETURN_IF_ERROR(store->Release(pid, ptier, true, ptier == TierKind::kHost ? nullptr : s));
  return CopyTicket{};
}

Result<CopyTicket> HostShardUpdate::Update(size_t s, const OptJob& j, const ShardHow& how, const CopyTicket&) {
  Shard& sh = ctx_.state->shard(s);
  TierStore* store = ctx_.store;
  if (how.speculative && sh.opt_home != TierKind::kHost)
    return Internal("a speculative update of " + sh.name + ", whose optimizer state is not on the host");
  if (sh.opt_home == TierKind::kGpu) return UpdateOnGpu(sh, j, how);

  // Host optimizer (state on the host or streamed from NVMe through it).
  // The gradient starts coming down first: its pieces land while the state
  // is pinned (or read from NVMe) and while the pieces before them update.
  HostGrad g;
  Status st = StartGradient(sh, j.step, &g);
  const bool spec = how.speculative;
  const Access state_access = spec ? Access::kRead : Access::kReadWrite;
  struct Pin {
    TensorId id;
    bool out;  // written by the update: dirty if it succeeded
  };
  std::vector<Pin> pins;
  auto pin = [&](TensorId id, Access access, bool out) -> char* {
    if (!st.ok()) return nullptr;
    Result<TensorView> r = store->Acquire(id, TierKind::kHost, access);
    if (!r.ok()) {
      st = r.status();
      return nullptr;
    }
    pins.push_back({id, out});
    return static_cast<char*>(r->data);
  };
  char* w = pin(sh.w, state_access, !spec);
  char* m = pin(sh.m, state_access, !spec);
  char* v = pin(sh.v, state_access, !spec);
  // Speculative: where the new state goes.
  char* w2 = spec ? pin(sh.w2, Access::kWriteDiscard, true) : nullptr;
  char* m2 = spec ? pin(sh.m2, Access::kWriteDiscard, true) : nullptr;
  char* v2 = spec ? pin(sh.v2, Access::kWriteDiscard, true) : nullptr;
  ParamsOut out;
  if (st.ok()) st = StartParams(sh, &out);
  if (st.ok())
    st = UpdatePieces(sh, j, how, g, reinterpret_cast<float*>(w), m, v, reinterpret_cast<float*>(w2), m2, v2, &out);
  // Every pin is released whatever failed; the first error is reported.
  Status gs = FinishGradient(sh, &g);
  if (st.ok()) st = gs;
  const bool written = st.ok();
  for (const Pin& pn : pins) {
    Status r = store->Release(pn.id, TierKind::kHost, pn.out && written);
    if (st.ok()) st = r;
  }
  Result<CopyTicket> up = FinishParams(sh, &out, st);
  if (st.ok() && !up.ok()) st = up.status();
  RETURN_IF_ERROR(st);
  if (sh.opt_home == TierKind::kNvme) {
    // Write-behind: the state goes home while the next shard updates (or
    // before it, without pipeline_write). A failed write keeps the data in
    // host memory and surfaces at the next call on the tensor.
    for (TensorId id : {sh.w, sh.m, sh.v}) {
      ASSIGN_OR_RETURN(Ticket t, store->Evict(id, TierKind::kHost));
      if (!offload_.pipeline_write) RETURN_IF_ERROR(t.Wait());
    }
  }
  return up;
}

// The shard's gradient in host memory: its host home, pinned, or, homed on
// the GPU, coming down into the staging buffer, every piece's download
// issued now (they land in order on the D2H stream).
Status HostShardUpdate::StartGradient(Shard& sh, int64_t job_step, HostGrad* g) {
  TierStore* store = ctx_.store;
  const uint64_t gs = DTypeSize(ctx_.state->layout().grad_dtype);
  const uint64_t first = static_cast<uint64_t>(sh.g_off()) * gs;  // the slice's first value, in bytes
  g->pinned = sh.g_home != TierKind::kGpu ? TierKind::kHost : TierKind::kGpu;
  ASSIGN_OR_RETURN(TensorView v, store->Acquire(sh.g, g->pinned, Access::kRead));
  g->held = true;
  if (g->pinned == TierKind::kHost) {
    g->data = static_cast<const char*>(v.data) + first;
    return Status::OK();
  }
  char* staging = static_cast<char*>(grad_staging_.data()) + first;
  const char* src = static_cast<const char*>(v.data) + first;
  g->data = staging;
  const uint64_t n = static_cast<uint64_t>(sh.slice_len);
  for (uint64_t off = 0; off < n; off += piece_) {
    const uint64_t bytes = std::min(piece_, n - off) * gs;
    ASSIGN_OR_RETURN(CopyTicket t, ctx_.copies->Copy(job_step, CopyDirection::kDeviceToHost, staging + off * gs,
                                                     src + off * gs, bytes));
    g->pieces.push_back(t);
  }
  return Status::OK();
}

// Every download issued has landed (the GPU memory stays pinned until then)
// and the gradient's pin is released.
Status HostShardUpdate::FinishGradient(Shard& sh, HostGrad* g) {
  Status st;
  for (const CopyTicket& t : g->pieces) {
    Status ws = t.Wait();
    if (st.ok()) st = ws;
  }
  g->pieces.clear();
  if (g->held) {
    Status rs = ctx_.store->Release(sh.g, g->pinned, false, nullptr);
    if (st.ok()) st = rs;
    g->held = false;
  }
  return st;
}

// Where the update writes the new parameters: their host home (and, with
// the state partitioned, the slice's `ps`), or, homed on the GPU, the
// staging slot whose upload (two shards ago) has landed, and their GPU home
// to upload each piece into.
Status HostShardUpdate::StartParams(Shard& sh, ParamsOut* out) {
  TierStore* store = ctx_.store;
  out->upload = !sh.partitioned && sh.p_home == TierKind::kGpu;
  out->id = sh.partitioned ? sh.ps : sh.p;
  if (!out->upload) {
    ASSIGN_OR_RETURN(TensorView p, store->Acquire(out->id, TierKind::kHost, Access::kWriteDiscard));
    out->held = true;
    out->data = static_cast<char*>(p.data);
    return Status::OK();
  }
  RETURN_IF_ERROR(param_upload_[param_slot_].Wait());
  out->data = static_cast<char*>(param_staging_[param_slot_].data());
  ASSIGN_OR_RETURN(TensorView p, store->Acquire(out->id, TierKind::kGpu, Access::kWriteDiscard));
  out->held = true;
  out->gpu = static_cast<char*>(p.data);
  return Status::OK();
}

// The CPU Adam, piece by piece, each once its gradient is on the host; an
// updated piece's parameters go up at once (homed on the GPU).
Status HostShardUpdate::UpdatePieces(Shard& sh, const OptJob& j, const ShardHow& how, const HostGrad& g, float* w,
                                     void* m, void* v, float* w2, void* m2, void* v2, ParamsOut* out) {
  const ModelState::Layout& lay = ctx_.state->layout();
  const uint64_t gs = DTypeSize(lay.grad_dtype), ms = DTypeSize(lay.moment_dtype), ps = DTypeSize(lay.dtype);
  const uint64_t n = static_cast<uint64_t>(sh.slice_len);  // (unpartitioned: numel)
  auto at = [](void* base, uint64_t bytes) { return static_cast<char*>(base) + bytes; };
  size_t k = 0;
  for (uint64_t off = 0; off < n; off += piece_, ++k) {
    const uint64_t c = std::min(piece_, n - off);
    if (k < g.pieces.size()) RETURN_IF_ERROR(g.pieces[k].Wait());
    optim::AdamShard a = AdamView(lay, c, w + off, at(m, off * ms), at(v, off * ms), g.data + off * gs,
                                  out->data + off * ps);
    if (how.speculative) {
      a.master_out = w2 + off;
      a.exp_avg_out = at(m2, off * ms);
      a.exp_avg_sq_out = at(v2, off * ms);
    }
    RETURN_IF_ERROR(ctx_.adam->Step(a, j.hyper, {how.multiplier, false}).status());
    if (!out->upload) continue;
    ASSIGN_OR_RETURN(out->last, ctx_.copies->Copy(j.step, CopyDirection::kHostToDevice, out->gpu + off * ps,
                                                  out->data + off * ps, c * ps));
  }
  return Status::OK();
}

// The parameters' pin is released (their GPU home after the uploads on the
// H2D stream, which orders any later use after them) and, on the GPU, the
// staging slot's uploads are what the next forward waits for.
Result<CopyTicket> HostShardUpdate::FinishParams(Shard& sh, ParamsOut* out, const Status& updated) {
  TierStore* store = ctx_.store;
  if (!out->held) return CopyTicket{};
  out->held = false;
  if (!out->upload) {
    RETURN_IF_ERROR(store->Release(out->id, TierKind::kHost, updated.ok()));
    if (updated.ok() && !sh.partitioned && sh.p_home == TierKind::kNvme)
      RETURN_IF_ERROR(store->Evict(sh.p, TierKind::kHost).status());
    return CopyTicket{};
  }
  void* cstream = ctx_.cuda() ? store->copy_engine()->stream(CopyDirection::kHostToDevice) : nullptr;
  // (The stand-in has no stream to order on: its uploads are waited for.)
  const bool uploaded = out->last.valid();  // (some piece went up)
  Status ws = uploaded && !ctx_.cuda() ? out->last.Wait() : Status::OK();
  RETURN_IF_ERROR(
      store->Release(out->id, TierKind::kGpu, uploaded && ws.ok(), uploaded && ws.ok() ? cstream : nullptr));
  RETURN_IF_ERROR(ws);
  param_upload_[param_slot_] = out->last;
  param_slot_ ^= 1;
  return out->last;
}

// ---- AssistShardUpdate ----------------------------------------------------------

std::string AssistShardUpdate::Ineligible(const ModelState& state) {
  if (state.layout().partitioned())
    return "the state is partitioned across the ranks (ZeRO stage >= 1): the CPU worker updates each slice";
  for (const Shard& sh : state.shards())
    if (sh.opt_home != TierKind::kGpu && (sh.opt_home != TierKind::kHost || sh.p_home != TierKind::kGpu))
      return "it needs the optimizer state on the host and the parameters resident on the GPU";
  if (state.MaxOffloadedNumel() == 0) return "every shard's optimizer state is on the GPU";
  return "";
}

Result<std::unique_ptr<AssistShardUpdate>> AssistShardUpdate::Create(const ShardUpdateContext& ctx,
                                                                     uint64_t chunk_params, uint64_t keep_free,
                                                                     std::string* why) {
  std::unique_ptr<AssistShardUpdate> u(new AssistShardUpdate(ctx));
  GpuTier* gt = ctx.store->gpu_tier();
  u->chunk_ = std::min<uint64_t>(4ull << 20, ctx.state->MaxOffloadedNumel());
  if (chunk_params) u->chunk_ = std::min<uint64_t>(chunk_params, u->chunk_);
  const ModelState::Layout& lay = ctx.state->layout();
  const uint64_t per = u->chunk_ * (4 + 2 * DTypeSize(lay.moment_dtype) + DTypeSize(lay.grad_dtype));
  const TierUsage use = gt->usage();
  const uint64_t need = 3 * AlignUp(per, gt->alignment()) + keep_free;
  if (use.budget < use.used + need) {
    *why = FormatBytes(3 * per) + " of chunk buffers do not fit in the GPU budget";
    return std::unique_ptr<AssistShardUpdate>{};
  }
  for (Slot& sl : u->slots_) {
    ASSIGN_OR_RETURN(sl.buf, gt->Allocate(per, "gpu-assisted optimizer chunk"));
  }
  return u;
}

Result<CopyTicket> AssistShardUpdate::Update(size_t si, const OptJob& j, const ShardHow& how,
                                             const CopyTicket& last_upload) {
  Shard& sh = ctx_.state->shard(si);
  TierStore* store = ctx_.store;
  const ModelState::Layout& lay = ctx_.state->layout();
  const uint64_t n = static_cast<uint64_t>(sh.numel);
  CopyEngine* ce = store->copy_engine();
  void* s = ctx_.cuda() ? ce->stream(CopyDirection::kDeviceToHost) : nullptr;
  const uint64_t gs = DTypeSize(lay.grad_dtype), ps = DTypeSize(lay.dtype), ms = DTypeSize(lay.moment_dtype);
  const bool host_grad = sh.g_home != TierKind::kGpu;
  const TierKind gtier = host_grad ? TierKind::kHost : TierKind::kGpu;
  const bool spec = how.speculative;
  // The pins taken, each released at the end whatever failed (`out`: written
  // by the update, dirty if it succeeded).
  struct Pin {
    TensorId id;
    TierKind tier;
    bool out;
  };
  std::vector<Pin> pins;
  Status st;
  auto pin = [&](TensorId id, TierKind tier, Access access, bool out) -> char* {
    if (!st.ok()) return nullptr;
    Result<TensorView> r = store->Acquire(id, tier, access);
    if (!r.ok()) {
      st = r.status();
      return nullptr;
    }
    pins.push_back({id, tier, out});
    return static_cast<char*>(r->data);
  };
  // A miss has this worker redo a shard the CPU worker may have speculated
  // on: the new parameters are written on this stream only after that upload
  // of the speculated ones (almost always landed long ago).
  st = last_upload.StreamWait(s);  // (the stand-in: waits)
  const Access state_access = spec ? Access::kRead : Access::kReadWrite;
  const char* g = pin(sh.g, gtier, Access::kRead, false);
  char* hw = pin(sh.w, TierKind::kHost, state_access, !spec);
  char* hm = pin(sh.m, TierKind::kHost, state_access, !spec);
  char* hv = pin(sh.v, TierKind::kHost, state_access, !spec);
  char* ow = spec ? pin(sh.w2, TierKind::kHost, Access::kWriteDiscard, true) : hw;
  char* om = spec ? pin(sh.m2, TierKind::kHost, Access::kWriteDiscard, true) : hm;
  char* ov = spec ? pin(sh.v2, TierKind::kHost, Access::kWriteDiscard, true) : hv;
  char* p = pin(sh.p, TierKind::kGpu, Access::kWriteDiscard, true);
  for (uint64_t off = 0; off < n && st.ok(); off += chunk_) {
    const uint64_t c = std::min(chunk_, n - off);
    Slot& sl = slots_[next_];
    next_ = (next_ + 1) % 3;
    for (const CopyTicket& t : sl.down)
      if (st.ok()) st = t.Wait();  // the buffer's last chunk is home
    sl.down.clear();
    if (!st.ok()) break;
    // The slot: master (f32), m, v (moment dtype), gradient, chunk_ each.
    float* dw = static_cast<float*>(sl.buf.data());
    char* dm = reinterpret_cast<char*>(dw + chunk_);
    char* dv = dm + chunk_ * ms;
    char* dg = dv + chunk_ * ms;
    std::vector<CopyTicket> up;
    auto h2d = [&](void* dst, const void* src, uint64_t bytes) {
      if (!st.ok()) return;
      auto t = ctx_.copies->Copy(j.step, CopyDirection::kHostToDevice, dst, src, bytes);
      if (t.ok()) up.push_back(*t);
      else st = t.status();
    };
    h2d(dw, hw + off * 4, c * 4);
    h2d(dm, hm + off * ms, c * ms);
    h2d(dv, hv + off * ms, c * ms);
    if (host_grad) h2d(dg, g + off * gs, c * gs);
    const optim::AdamShard a =
        AdamView(lay, c, dw, dm, dv, host_grad ? static_cast<const void*>(dg) : g + off * gs, p + off * ps);
    if (ctx_.cuda()) {
      for (const CopyTicket& t : up)
        if (st.ok()) st = t.StreamWait(s);
      if (st.ok()) st = optim::GpuAdamStep(a, j.hyper, how.multiplier, s);
    } else {
      for (const CopyTicket& t : up)
        if (st.ok()) st = t.Wait();
      if (st.ok()) st = ctx_.adam->Step(a, j.hyper, {how.multiplier, false}).status();
    }
    CopyAfter after;
    after.stream = s;
    auto d2h = [&](void* dst, const void* src, uint64_t bytes) {
      if (!st.ok()) return;
      auto t = ctx_.copies->Copy(j.step, CopyDirection::kDeviceToHost, dst, src, bytes, after);
      if (t.ok()) sl.down.push_back(*t);
      else st = t.status();
    };
    d2h(ow + off * 4, dw, c * 4);
    d2h(om + off * ms, dm, c * ms);
    d2h(ov + off * ms, dv, c * ms);
  }
  // The shard's state is home (each download follows its chunk's update, so
  // the parameters are written too) before anyone else may touch it.
  for (Slot& sl : slots_) {
    for (const CopyTicket& t : sl.down) {
      Status ws = t.Wait();
      if (st.ok()) st = ws;
    }
    sl.down.clear();
  }
  // Every pin is released whatever failed; the first error is reported.
  const bool written = st.ok();
  for (const Pin& pn : pins) {
    Status r = store->Release(pn.id, pn.tier, pn.out && written, nullptr);
    if (st.ok()) st = r;
  }
  RETURN_IF_ERROR(st);
  return CopyTicket{};
}

}  // namespace strata
