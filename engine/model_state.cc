// SPDX-License-Identifier: Apache-2.0
#include "engine/model_state.h"


#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <tuple>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "base/half.h"
#include "engine/hf_import.h"
#include "engine/hf_weights.h"
#include "models/init.h"

namespace strata {

using models::UnitKind;

ModelState::ModelState(TierStore* store, models::ModelSpec spec, Layout layout)
    : store_(store), spec_(std::move(spec)), layout_(layout) {}

Result<std::unique_ptr<ModelState>> ModelState::Create(TierStore* store, const models::ModelSpec& spec,
                                                       const Plan& plan, const Layout& layout, bool speculative) {
  std::unique_ptr<ModelState> m(new ModelState(store, spec, layout));
  RETURN_IF_ERROR(m->CreateShards(plan));
  RETURN_IF_ERROR(m->CreateCheckpoints(plan));
  if (speculative) RETURN_IF_ERROR(m->CreateSpeculativeSets());
  return m;
}

Status ModelState::CreateShards(const Plan& plan) {
  const bool accum_across = !layout_.layer_major && layout_.micro_batches > 1;
  for (const models::UnitSpec& u : spec_.units) {
    Shard s;
    s.name = u.name;
    s.kind = u.kind;
    s.layer = u.layer;
    s.numel = u.numel;
    s.slice_len = s.slice_pad = u.numel;
    if (layout_.partitioned()) {
      const int64_t W = layout_.world;
      s.partitioned = true;
      s.slice_pad = (u.numel + W - 1) / W;
      const FlatSlice own = FlatSliceOf(u.numel, static_cast<int>(W), layout_.rank);
      s.slice_off = own.off;
      s.slice_len = own.len;
      s.grad_slice = layout_.partitions_grads();
    }
    // offload_optimizer.ratio < 1: the first plan.optimizer_gpu_shards shards
    // (forward order) keep optimizer state, gradients and parameters on the GPU.
    const bool gpu_state = static_cast<int64_t>(shards_.size()) < plan.optimizer_gpu_shards;
    const bool host_opt = !gpu_state && plan.optimizer != TierKind::kGpu;
    s.opt_home = host_opt ? plan.optimizer : TierKind::kGpu;
    s.g_home = gpu_state ? TierKind::kGpu : plan.grads;
    if (!host_opt) s.p_home = TierKind::kGpu;
    else if (u.kind == UnitKind::kBlock && !plan.params_resident) s.p_home = plan.params;
    else s.p_home = TierKind::kGpu;
    const Shape shape{u.numel}, opt_shape{s.opt_numel()};
    if (layout_.gathers_params()) {
      s.p_home = TierKind::kHost;  // (its slice, `ps`)
    } else {
      ASSIGN_OR_RETURN(s.p, store_->Create(s.name + ".p", layout_.dtype, shape, s.p_home));
      param_shard_[s.p.value] = shards_.size();
    }
    ASSIGN_OR_RETURN(s.g, store_->Create(s.name + ".g", layout_.grad_dtype, Shape{s.g_numel()}, s.g_home));
    ASSIGN_OR_RETURN(s.w, store_->Create(s.name + ".w", DType::kF32, opt_shape, s.opt_home));
    ASSIGN_OR_RETURN(s.m, store_->Create(s.name + ".m", layout_.moment_dtype, opt_shape, s.opt_home));
    ASSIGN_OR_RETURN(s.v, store_->Create(s.name + ".v", layout_.moment_dtype, opt_shape, s.opt_home));
    if (s.partitioned) {
      ASSIGN_OR_RETURN(s.ps, store_->Create(s.name + ".ps", layout_.dtype, opt_shape, TierKind::kHost));
    }
    if (accum_across && u.kind == UnitKind::kBlock && !layout_.grad_is_accumulator()) {
      ASSIGN_OR_RETURN(s.gacc, store_->Create(s.name + ".gacc", DType::kF32, shape, s.g_home));
    }
    shards_.push_back(std::move(s));
  }
  if (plan.optimizer != TierKind::kGpu)
    gpu_prefix_ = static_cast<size_t>(
        std::clamp<int64_t>(plan.optimizer_gpu_shards, 0, static_cast<int64_t>(shards_.size())));
  return Status::OK();
}

Status ModelState::CreateCheckpoints(const Plan& plan) {
  const int64_t L = spec_.n_layer;
  const int64_t sets = layout_.layer_major ? layout_.micro_batches : 1;
  std::vector<TierKind> home(static_cast<size_t>(L + 1), plan.checkpoints);
  if (plan.checkpoints != TierKind::kGpu)
    for (int64_t l = L + 1 - plan.checkpoint_gpu_layers; l <= L; ++l) home[static_cast<size_t>(l)] = TierKind::kGpu;
  checkpoints_.assign(static_cast<size_t>(L + 1), {});
  for (int64_t l = 0; l <= L; ++l)
    for (int64_t a = 0; a < sets; ++a) {
      const std::string name = std::to_string(l).insert(0, 1, 'x') + "." + std::to_string(a);  // (GCC 12's -Wrestrict on "x" + ...)
      ASSIGN_OR_RETURN(TensorId id, store_->Create(name, layout_.dtype,
                                                   Shape{layout_.batch, layout_.seq, spec_.d_model},
                                                   home[static_cast<size_t>(l)]));
      checkpoints_[static_cast<size_t>(l)].push_back(id);
    }
  return Status::OK();
}

// The plan counted the second sets (PlanInputs::speculative_state): a failure
// here means the host tier holds something the plan does not know of.
Status ModelState::CreateSpeculativeSets() {
  for (Shard& sh : shards_) {
    if (sh.opt_home != TierKind::kHost) continue;
    const DType md = layout_.moment_dtype;
    for (auto [suffix, id, dt] : {std::tuple{".w2", &sh.w2, DType::kF32}, {".m2", &sh.m2, md}, {".v2", &sh.v2, md}}) {
      Result<TensorId> r = store_->Create(sh.name + suffix, dt, Shape{sh.opt_numel()}, TierKind::kHost);
      if (!r.ok())
        return r.status().WithContext("the speculative update's second master/m/v, which the plan counted");
      *id = *r;
    }
  }
  speculative_ = true;
  return Status::OK();
}

std::optional<size_t> ModelState::ShardOfParams(TensorId id) const {
  auto it = param_shard_.find(id.value);
  if (it == param_shard_.end()) return std::nullopt;
  return it->second;
}

uint64_t ModelState::MaxOffloadedNumel() const {
  int64_t n = 0;
  for (const Shard& sh : shards_)
    if (sh.opt_home != TierKind::kGpu) n = std::max(n, sh.numel);
  return static_cast<uint64_t>(n);
}

bool ModelState::OffloadedGradsOnGpu() const {
  for (const Shard& sh : shards_)
    if (sh.opt_home != TierKind::kGpu && sh.g_home == TierKind::kGpu) return true;
  return false;
}

bool ModelState::OffloadedParamsOnGpu() const {
  for (const Shard& sh : shards_)
    if (sh.opt_home != TierKind::kGpu && sh.p_home == TierKind::kGpu) return true;
  return false;
}

// ---- initialization ------------------------------------------------------------

// Shards are initialized in parallel (a few at a time: each holds a few
// copies of its size in host memory); the values do not depend on the order.
Status ModelState::InitRandom(uint64_t seed) {
  std::mutex err_mu;
  Status first;
  tbb::task_arena arena(std::max(1, std::min<int>(6, static_cast<int>(std::thread::hardware_concurrency()))));
  arena.execute([&] {
    tbb::parallel_for(size_t{0}, shards_.size(), [&](size_t i) {
      auto master = models::InitUnit(spec_, static_cast<int>(i), seed);
      Status st = master.ok() ? WriteShardState(i, master->data(), nullptr, nullptr) : master.status();
      if (!st.ok()) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (first.ok()) first = st.WithContext("initializing " + shards_[i].name);
      }
    });
  });
  return first;
}

// Tensor by tensor into one unit's fp32 master at a time, converted from the
// file's dtype on the way; the run's dtypes are made from the master by
// WriteShardState. Extra host memory: the unit's buffers and the one
// weights file mapped (engine/hf_weights.h).
Status ModelState::InitFromHf(const std::string& from, const std::string& prefix) {
  ASSIGN_OR_RETURN(HfWeights weights, HfWeights::Open(from));
  ASSIGN_OR_RETURN(const std::vector<HfParamSource> sources, MatchHfTensors(weights, spec_, prefix));
  for (size_t si = 0; si < shards_.size(); ++si) {
    std::vector<float> master(static_cast<size_t>(shards_[si].numel), 0.f);
    for (const HfParamSource& src : sources) {
      if (src.param->unit != static_cast<int>(si)) continue;
      std::span<float> dst(master.data() + src.param->offset, static_cast<size_t>(src.param->numel));
      RETURN_IF_ERROR(weights.ReadF32Into(*src.tensor, dst));
    }
    RETURN_IF_ERROR(WriteShardState(si, master.data(), nullptr, nullptr).WithContext("initializing " +
                                                                                       shards_[si].name));
  }
  return Status::OK();
}

// ---- state I/O -------------------------------------------------------------------

namespace {

// The compute-dtype rounding of `n` fp32 masters (what the Adam writes).
std::vector<uint8_t> RoundParams(const float* master, size_t n, DType dtype) {
  std::vector<uint8_t> p(n * DTypeSize(dtype));
  if (dtype == DType::kF32) {
    std::memcpy(p.data(), master, n * 4);
  } else {
    uint16_t* h = reinterpret_cast<uint16_t*>(p.data());
    for (size_t i = 0; i < n; ++i) h[i] = dtype == DType::kBF16 ? FloatToBF16(master[i]) : FloatToHalf(master[i]);
  }
  return p;
}

// This rank's slice of a whole-unit array, zero-padded to slice_pad.
std::vector<float> SliceOf(const Shard& s, const float* whole) {
  std::vector<float> out(static_cast<size_t>(s.slice_pad), 0.f);
  if (whole) std::copy(whole + s.slice_off, whole + s.slice_off + s.slice_len, out.begin());
  return out;
}

// A moment tensor from n fp32 values (null: zeros), in its dtype (bf16:
// rounded to nearest even, as the Adam stores them).
Status WriteMoment(TierStore* store, TensorId id, DType dtype, const float* x, size_t n) {
  if (dtype == DType::kF32) {
    if (x) return store->Write(id, x, n * 4);
    const std::vector<float> zeros(n, 0.f);
    return store->Write(id, zeros.data(), n * 4);
  }
  std::vector<uint16_t> h(n, 0);  // bf16 zero
  if (x)
    for (size_t i = 0; i < n; ++i) h[i] = FloatToBF16(x[i]);
  return store->Write(id, h.data(), n * 2);
}

// n fp32 values of a moment tensor (bf16 widened: exact).
Status ReadMoment(TierStore* store, TensorId id, DType dtype, float* x, size_t n) {
  if (dtype == DType::kF32) return store->Read(id, x, n * 4);
  std::vector<uint16_t> h(n);
  RETURN_IF_ERROR(store->Read(id, h.data(), n * 2));
  for (size_t i = 0; i < n; ++i) x[i] = BF16ToFloat(h[i]);
  return Status::OK();
}

}  // namespace

Status ModelState::WriteShardState(size_t si, const float* master, const float* m, const float* v,
                                   bool gather_params) {
  Shard& s = shards_[si];
  const size_t n = static_cast<size_t>(s.numel);
  const uint64_t fbytes = static_cast<uint64_t>(s.opt_numel()) * 4;
  if (s.partitioned) {
    // This rank's slice, padded: read in place unless it runs past the
    // unit's end (the last rank's), so that a unit's state is not copied
    // whole once more while the shards initialize in parallel. Null
    // moments stay null (zeros, written without a slice-sized copy).
    const size_t pad = static_cast<size_t>(s.slice_pad);
    const bool inside = s.slice_off + s.slice_pad <= s.numel;
    std::vector<float> w_copy, m_copy, v_copy;
    auto own = [&](const float* whole, std::vector<float>* copy) -> const float* {
      if (!whole) return nullptr;
      if (inside) return whole + s.slice_off;
      *copy = SliceOf(s, whole);
      return copy->data();
    };
    const float* w_own = own(master, &w_copy);
    RETURN_IF_ERROR(store_->Write(s.w, w_own, fbytes));
    RETURN_IF_ERROR(WriteMoment(store_, s.m, layout_.moment_dtype, own(m, &m_copy), pad));
    RETURN_IF_ERROR(WriteMoment(store_, s.v, layout_.moment_dtype, own(v, &v_copy), pad));
    const std::vector<uint8_t> ps = RoundParams(w_own, pad, layout_.dtype);
    RETURN_IF_ERROR(store_->Write(s.ps, ps.data(), ps.size()));
  } else {
    RETURN_IF_ERROR(store_->Write(s.w, master, fbytes));
    RETURN_IF_ERROR(WriteMoment(store_, s.m, layout_.moment_dtype, m, n));
    RETURN_IF_ERROR(WriteMoment(store_, s.v, layout_.moment_dtype, v, n));
  }
  if (s.partitioned && gather_params) {
    RETURN_IF_ERROR(GatherParams(si));
  } else {
    RETURN_IF_ERROR(WriteParamsFromMaster(si, master));
  }
  // Gradients start as zeros so that padding never holds garbage (as many
  // as the gradient holds: a slice's, partitioned at stage >= 2).
  const size_t gbytes = static_cast<size_t>(s.g_numel()) * DTypeSize(layout_.grad_dtype);
  const std::vector<float> zeros((gbytes + 3) / 4, 0.f);
  RETURN_IF_ERROR(store_->Write(s.g, zeros.data(), gbytes));
  // Write-through to the homes that are not the copy written (NVMe state).
  for (TensorId id : {s.g, s.w, s.m, s.v}) {
    ASSIGN_OR_RETURN(TensorInfo info, store_->Info(id));
    if (info.home == TierKind::kNvme) {
      ASSIGN_OR_RETURN(Ticket t, store_->Evict(id, TierKind::kHost));
      RETURN_IF_ERROR(t.Wait());
    }
  }
  return Status::OK();
}

// Written through to an NVMe home (a host copy would be dropped unwritten otherwise).
Status ModelState::WriteThrough(TensorId id, TierKind home) {
  if (home != TierKind::kNvme) return Status::OK();
  ASSIGN_OR_RETURN(Ticket t, store_->Evict(id, TierKind::kHost));
  return t.Wait();
}

Status ModelState::WriteParamsFromMaster(size_t si, const float* master) {
  Shard& s = shards_[si];
  if (!s.p.valid()) return Status::OK();  // stage 3: the slice's `ps` alone
  const std::vector<uint8_t> p = RoundParams(master, static_cast<size_t>(s.numel), layout_.dtype);
  RETURN_IF_ERROR(store_->Write(s.p, p.data(), p.size()));
  return WriteThrough(s.p, s.p_home);
}

Status ModelState::ReadOwnState(size_t si, float* master, float* m, float* v) {
  const Shard& s = shards_[si];
  const size_t n = static_cast<size_t>(s.opt_numel());
  if (master) RETURN_IF_ERROR(store_->Read(s.w, master, n * 4));
  if (m) RETURN_IF_ERROR(ReadMoment(store_, s.m, layout_.moment_dtype, m, n));
  if (v) RETURN_IF_ERROR(ReadMoment(store_, s.v, layout_.moment_dtype, v, n));
  return Status::OK();
}

Status ModelState::ReadOwnSlice(size_t si, float* master, float* m, float* v) {
  const Shard& s = shards_[si];
  const size_t pad = static_cast<size_t>(s.opt_numel());
  const auto len = static_cast<std::ptrdiff_t>(s.slice_len);
  std::vector<float> w_own(master ? pad : 0), m_own(m ? pad : 0), v_own(v ? pad : 0);
  RETURN_IF_ERROR(ReadOwnState(si, master ? w_own.data() : nullptr, m ? m_own.data() : nullptr,
                               v ? v_own.data() : nullptr));
  if (master) std::copy(w_own.begin(), w_own.begin() + len, master);
  if (m) std::copy(m_own.begin(), m_own.begin() + len, m);
  if (v) std::copy(v_own.begin(), v_own.begin() + len, v);
  return Status::OK();
}

Status ModelState::ReadShardState(size_t si, float* master, float* m, float* v) {
  const Shard& s = shards_[si];
  if (!s.partitioned) return ReadOwnState(si, master, m, v);
  if (!gather_) return Internal("ModelState: " + s.name + " is partitioned but no gather is set");
  const size_t pad = static_cast<size_t>(s.slice_pad);
  std::vector<float> own(pad);
  // Every rank asks for the same arrays (the same calls in the same order).
  for (auto [id, out, dt] : {std::tuple{s.w, master, DType::kF32}, {s.m, m, layout_.moment_dtype},
                             {s.v, v, layout_.moment_dtype}}) {
    if (!out) continue;
    RETURN_IF_ERROR(ReadMoment(store_, id, dt, own.data(), pad));  // (f32: the master too)
    RETURN_IF_ERROR(gather_(own.data(), pad, DType::kF32, out, static_cast<size_t>(s.numel), false)
                        .WithContext("gathering " + s.name + "'s state from the ranks"));
  }
  return Status::OK();
}

Status ModelState::RestoreParams(size_t si) {
  Shard& s = shards_[si];
  std::vector<float> master(static_cast<size_t>(s.opt_numel()));
  RETURN_IF_ERROR(ReadOwnState(si, master.data(), nullptr, nullptr));
  if (!s.partitioned) return WriteParamsFromMaster(si, master.data());
  const std::vector<uint8_t> ps = RoundParams(master.data(), master.size(), layout_.dtype);
  return store_->Write(s.ps, ps.data(), ps.size());
}

Status ModelState::GatherParams(size_t si) {
  Shard& s = shards_[si];
  if (!s.partitioned || !s.p.valid()) return Status::OK();  // (stage 3: gathered at each use)
  if (!gather_) return Internal("ModelState: " + s.name + " is partitioned but no gather is set");
  const size_t pad = static_cast<size_t>(s.slice_pad);
  // Into the home copy (the host for an NVMe home, written through; the
  // device for a GPU home, straight from the collective's buffer): a copy
  // cached elsewhere becomes stale and is loaded again at its next use.
  const TierKind at = s.p_home == TierKind::kNvme ? TierKind::kHost : s.p_home;
  ASSIGN_OR_RETURN(TensorView own, store_->Acquire(s.ps, TierKind::kHost, Access::kRead));
  auto p = store_->Acquire(s.p, at, Access::kWriteDiscard);
  Status g = p.status();
  if (g.ok()) g = gather_(own.data, pad, layout_.dtype, p->data, static_cast<size_t>(s.numel), at == TierKind::kGpu);
  RETURN_IF_ERROR(store_->Release(s.ps, TierKind::kHost, false));
  if (p.ok()) RETURN_IF_ERROR(store_->Release(s.p, at, g.ok()));
  RETURN_IF_ERROR(g.WithContext("gathering " + s.name + "'s parameters from the ranks"));
  return WriteThrough(s.p, s.p_home);
}

std::vector<CheckpointShard> ModelState::CheckpointShards() {
  std::vector<CheckpointShard> out;
  for (size_t i = 0; i < shards_.size(); ++i) {
    CheckpointShard c;
    c.numel = shards_[i].numel;
    c.moment_dtype = layout_.moment_dtype;
    c.read = [this, i](float* w, float* m, float* v) { return ReadShardState(i, w, m, v); };
    const Shard& s = shards_[i];
    // Partitioned, a resume fills this rank's slice alone; the full
    // parameters of stages 1-2 are gathered from the ranks' slices.
    c.write = [this, i, gather = s.partitioned](const float* w, const float* m, const float* v) {
      return WriteShardState(i, w, m, v, gather);
    };
    if (s.partitioned) {
      c.slice_off = s.slice_off;
      c.slice_len = s.slice_len;
      c.read_own = [this, i](float* w, float* m, float* v) { return ReadOwnSlice(i, w, m, v); };
    }
    out.push_back(std::move(c));
  }
  return out;
}

Result<std::vector<float>> ModelState::Parameter(const std::string& hf_name) {
  Result<const models::ParamSpec*> t = spec_.Find(hf_name);
  if (!t.ok()) return NotFound("no parameter named '" + hf_name + "'");
  const size_t si = static_cast<size_t>((*t)->unit);
  std::vector<float> all(static_cast<size_t>(shards_[si].numel));
  RETURN_IF_ERROR(ReadShardState(si, all.data(), nullptr, nullptr));  // (partitioned: a collective)
  return std::vector<float>(all.begin() + (*t)->offset, all.begin() + (*t)->offset + (*t)->numel);
}

}  // namespace strata
