// SPDX-License-Identifier: Apache-2.0
// CpuAdam: argument checks, the per-step constants, the choice of kernel
// (optim/adam_kernels.h) and the oneTBB tiling; thread pinning with hwloc.
#include "optim/cpu_adam.h"

#include <hwloc.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "optim/adam_kernels.h"

#ifndef STRATA_OPTIM_X86
#define STRATA_OPTIM_X86 1
#endif

namespace strata::optim {

namespace {

std::string Num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

bool Finite(double x) { return std::isfinite(x); }

constexpr size_t kMaxPrefetchBytes = size_t{64} << 10;

// Elements per tile of ComputeGradStats: fixed, so that the sum's rounding
// does not depend on the options or the thread count.
constexpr size_t kStatsTile = size_t{1} << 16;

int GradIndex(DType t) {
  switch (t) {
    case DType::kF32: return internal::kGradF32;
    case DType::kF16: return internal::kGradF16;
    case DType::kBF16: return internal::kGradBF16;
    default: return -1;
  }
}
int StateIndex(DType t) {
  switch (t) {
    case DType::kF32: return internal::kStateF32;
    case DType::kBF16: return internal::kStateBF16;
    default: return -1;
  }
}
int OutIndex(DType t) {
  switch (t) {
    case DType::kF32: return internal::kOutF32;
    case DType::kF16: return internal::kOutF16;
    case DType::kBF16: return internal::kOutBF16;
    default: return -1;
  }
}

const internal::KernelTable& TableFor(Isa isa) {
  switch (isa) {
#if STRATA_OPTIM_X86
    case Isa::kAvx2: return internal::Avx2Kernels();
    case Isa::kAvx512: return internal::Avx512Kernels();
    case Isa::kAvx512Bf16: return internal::Avx512Bf16Kernels();
#endif
    default: return internal::ScalarKernels();
  }
}

Status CheckArray(const char* name, const void* p, DType t, size_t n) {
  if (p == nullptr) return InvalidArgument(std::string("AdamShard.") + name + " is null (n = " + std::to_string(n) + ")");
  size_t align = DTypeSize(t);
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    return InvalidArgument(std::string("AdamShard.") + name + " is not aligned to its element size (" +
                           std::to_string(align) + " bytes for " + std::string(DTypeName(t)) + ")");
  return Status::OK();
}

// Binds TBB worker threads of one arena to cores while they work in it, and
// restores their previous binding when they leave (TBB's workers are shared
// between arenas). The calling thread that joins the arena is left alone.
//
// Thread-safety: the callbacks run on the entering/leaving thread; the only
// per-thread data is the thread_local saved binding; the topology is only
// read after construction (hwloc allows concurrent binding calls).
class PinObserver : public tbb::task_scheduler_observer {
 public:
  PinObserver(tbb::task_arena& arena, hwloc_topology_t topo, std::vector<hwloc_bitmap_t> cores)
      : tbb::task_scheduler_observer(arena), topo_(topo), cores_(std::move(cores)) {
    observe(true);
  }
  ~PinObserver() override {
    observe(false);
    for (hwloc_bitmap_t b : cores_) hwloc_bitmap_free(b);
  }

  void on_scheduler_entry(bool is_worker) override {
    if (!is_worker || cores_.empty()) return;
    int slot = tbb::this_task_arena::current_thread_index();
    if (slot < 0) return;
    Saved& s = saved();
    if (s.bitmap == nullptr) s.bitmap = hwloc_bitmap_alloc();
    s.valid = s.bitmap && hwloc_get_cpubind(topo_, s.bitmap, HWLOC_CPUBIND_THREAD) == 0;
    // Slot 0 is the caller's; workers take the cores after it.
    if (hwloc_set_cpubind(topo_, cores_[static_cast<size_t>(slot) % cores_.size()], HWLOC_CPUBIND_THREAD) != 0)
      failures_.fetch_add(1, std::memory_order_relaxed);  // counted only; pinning is a hint
  }
  void on_scheduler_exit(bool is_worker) override {
    if (!is_worker || cores_.empty()) return;
    Saved& s = saved();
    if (s.valid) hwloc_set_cpubind(topo_, s.bitmap, HWLOC_CPUBIND_THREAD);
    s.valid = false;
  }
  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

 private:
  struct Saved {
    hwloc_bitmap_t bitmap = nullptr;
    bool valid = false;
    ~Saved() {
      if (bitmap) hwloc_bitmap_free(bitmap);
    }
  };
  static Saved& saved() {
    thread_local Saved s;
    return s;
  }
  hwloc_topology_t topo_;
  std::vector<hwloc_bitmap_t> cores_;  // owned
  std::atomic<uint64_t> failures_{0};  // relaxed: a statistic, orders nothing
};

}  // namespace

// ---- hyperparameters and coefficients ----------------------------------------

Status AdamHyper::Validate() const {
  if (!Finite(lr) || lr < 0) return InvalidArgument("AdamHyper.lr must be finite and >= 0, got " + Num(lr));
  if (!Finite(beta1) || beta1 < 0 || beta1 >= 1)
    return InvalidArgument("AdamHyper.beta1 must be in [0, 1), got " + Num(beta1));
  if (!Finite(beta2) || beta2 < 0 || beta2 >= 1)
    return InvalidArgument("AdamHyper.beta2 must be in [0, 1), got " + Num(beta2));
  if (!Finite(eps) || eps < 0) return InvalidArgument("AdamHyper.eps must be finite and >= 0, got " + Num(eps));
  if (!Finite(weight_decay) || weight_decay < 0)
    return InvalidArgument("AdamHyper.weight_decay must be finite and >= 0, got " + Num(weight_decay));
  if (step < 1) return InvalidArgument("AdamHyper.step counts from 1, got " + std::to_string(step));
  if (decay_mode != WeightDecayMode::kDecoupled && decay_mode != WeightDecayMode::kL2)
    return InvalidArgument("AdamHyper.decay_mode is neither kDecoupled nor kL2");
  return Status::OK();
}

Result<AdamCoefficients> MakeAdamCoefficients(const AdamHyper& h, double grad_scale) {
  RETURN_IF_ERROR(h.Validate());
  if (!Finite(grad_scale) || grad_scale < 0 || !std::isfinite(static_cast<float>(grad_scale)))
    return InvalidArgument("grad_scale (1/loss_scale x clip coefficient) must be >= 0 and finite in fp32, got " +
                           Num(grad_scale));
  double bc1 = 1.0, bc2 = 1.0;
  if (h.bias_correction) {
    bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
    bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  }
  AdamCoefficients c;
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.neg_step_size = static_cast<float>(-h.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.neg_lr_decay = h.decay_mode == WeightDecayMode::kDecoupled ? static_cast<float>(-h.lr * h.weight_decay) : 0.f;
  c.l2_decay = h.decay_mode == WeightDecayMode::kL2 ? static_cast<float>(h.weight_decay) : 0.f;
  c.grad_scale = static_cast<float>(grad_scale);
  return c;
}

// ---- shards -------------------------------------------------------------------

Status AdamShard::Validate() const {
  if (n > SIZE_MAX / 8) return InvalidArgument("AdamShard.n is too large: " + std::to_string(n));
  if (StateIndex(state_dtype) < 0)
    return InvalidArgument("AdamShard.state_dtype must be f32 or bf16, got " + std::string(DTypeName(state_dtype)));
  if (GradIndex(grad_dtype) < 0)
    return InvalidArgument("AdamShard.grad_dtype must be f32, f16 or bf16, got " + std::string(DTypeName(grad_dtype)));
  if (param_out != nullptr && OutIndex(param_out_dtype) < 0)
    return InvalidArgument("AdamShard.param_out_dtype must be f16, bf16 or f32, got " +
                           std::string(DTypeName(param_out_dtype)));
  if (n == 0) return Status::OK();
  RETURN_IF_ERROR(CheckArray("master", master, DType::kF32, n));
  RETURN_IF_ERROR(CheckArray("exp_avg", exp_avg, state_dtype, n));
  RETURN_IF_ERROR(CheckArray("exp_avg_sq", exp_avg_sq, state_dtype, n));
  RETURN_IF_ERROR(CheckArray("grad", grad, grad_dtype, n));
  if (param_out != nullptr) RETURN_IF_ERROR(CheckArray("param_out", param_out, param_out_dtype, n));
  const int outs = (master_out != nullptr) + (exp_avg_out != nullptr) + (exp_avg_sq_out != nullptr);
  if (outs != 0 && outs != 3)
    return InvalidArgument("AdamShard.master_out, exp_avg_out and exp_avg_sq_out are set together (out of place) "
                           "or not at all (in place); got " + std::to_string(outs) + " of them");
  if (outs == 3) {
    RETURN_IF_ERROR(CheckArray("master_out", master_out, DType::kF32, n));
    RETURN_IF_ERROR(CheckArray("exp_avg_out", exp_avg_out, state_dtype, n));
    RETURN_IF_ERROR(CheckArray("exp_avg_sq_out", exp_avg_sq_out, state_dtype, n));
  }
  struct Range {
    const char* name;
    uintptr_t begin, end;
  };
  std::vector<Range> r = {
      {"master", reinterpret_cast<uintptr_t>(master), reinterpret_cast<uintptr_t>(master) + n * 4},
      {"exp_avg", reinterpret_cast<uintptr_t>(exp_avg), reinterpret_cast<uintptr_t>(exp_avg) + n * DTypeSize(state_dtype)},
      {"exp_avg_sq", reinterpret_cast<uintptr_t>(exp_avg_sq),
       reinterpret_cast<uintptr_t>(exp_avg_sq) + n * DTypeSize(state_dtype)},
      {"grad", reinterpret_cast<uintptr_t>(grad), reinterpret_cast<uintptr_t>(grad) + n * DTypeSize(grad_dtype)},
  };
  if (param_out != nullptr)
    r.push_back({"param_out", reinterpret_cast<uintptr_t>(param_out),
                 reinterpret_cast<uintptr_t>(param_out) + n * DTypeSize(param_out_dtype)});
  if (outs == 3) {
    const size_t ss = DTypeSize(state_dtype);
    r.push_back({"master_out", reinterpret_cast<uintptr_t>(master_out), reinterpret_cast<uintptr_t>(master_out) + n * 4});
    r.push_back({"exp_avg_out", reinterpret_cast<uintptr_t>(exp_avg_out),
                 reinterpret_cast<uintptr_t>(exp_avg_out) + n * ss});
    r.push_back({"exp_avg_sq_out", reinterpret_cast<uintptr_t>(exp_avg_sq_out),
                 reinterpret_cast<uintptr_t>(exp_avg_sq_out) + n * ss});
  }
  for (size_t i = 0; i < r.size(); ++i)
    for (size_t j = i + 1; j < r.size(); ++j)
      if (r[i].begin < r[j].end && r[j].begin < r[i].end)
        return InvalidArgument(std::string("AdamShard.") + r[i].name + " and AdamShard." + r[j].name + " overlap");
  return Status::OK();
}

size_t AdamBytesPerParam(DType grad, DType state, bool param_out, DType out, bool prescan) {
  size_t b = 4 + 4 + 4 * DTypeSize(state) + DTypeSize(grad);
  if (param_out) b += DTypeSize(out);
  if (prescan) b += DTypeSize(grad);
  return b;
}

// ---- CpuAdam -----------------------------------------------------------------

struct CpuAdam::Impl {
  // Declaration order is destruction order reversed: the observer goes before
  // the arena it watches, the topology last.
  hwloc_topology_t topo = nullptr;
  std::unique_ptr<tbb::task_arena> arena;
  std::unique_ptr<PinObserver> pin;
  const internal::KernelTable* table = nullptr;

  ~Impl() {
    pin.reset();
    arena.reset();
    if (topo) hwloc_topology_destroy(topo);
  }

  // Runs f(tile) for tile in [0, ntiles) on the arena (or inline when there is
  // one tile or one thread); returns the sum of f's results.
  template <class F>
  uint64_t ForEachTile(size_t ntiles, int threads, F&& f) const {
    if (ntiles <= 1 || threads <= 1) {
      uint64_t s = 0;
      for (size_t t = 0; t < ntiles; ++t) s += f(t);
      return s;
    }
    // Relaxed: the integer sum is order-independent, and parallel_for's join
    // orders every task before the load below.
    std::atomic<uint64_t> total{0};
    arena->execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<size_t>(0, ntiles, 1),
          [&](const tbb::blocked_range<size_t>& r) {
            uint64_t s = 0;
            for (size_t t = r.begin(); t != r.end(); ++t) s += f(t);
            if (s) total.fetch_add(s, std::memory_order_relaxed);
          },
          tbb::static_partitioner());
    });
    return total.load(std::memory_order_relaxed);
  }
};

CpuAdam::~CpuAdam() = default;

std::string_view PrefetchHintName(PrefetchHint h) {
  switch (h) {
    case PrefetchHint::kL1: return "l1";
    case PrefetchHint::kL2: return "l2";
  }
  return "?";
}

bool CpuAdam::pinned() const { return impl_ && impl_->pin != nullptr; }

Result<std::unique_ptr<CpuAdam>> CpuAdam::Create(const Options& o) {
  if (o.threads < 0) return InvalidArgument("CpuAdam threads must be >= 0 (0 = all), got " + std::to_string(o.threads));
  if (o.tile_elems < 64 || o.tile_elems > (size_t{1} << 24) || o.tile_elems % 64 != 0)
    return InvalidArgument("CpuAdam tile_elems must be a multiple of 64 in [64, 2^24], got " +
                           std::to_string(o.tile_elems));
  if (o.prefetch_bytes % 64 != 0 || o.prefetch_bytes > kMaxPrefetchBytes)
    return InvalidArgument("CpuAdam prefetch_bytes must be a multiple of 64 in [0, 65536], got " +
                           std::to_string(o.prefetch_bytes));
  if (o.prefetch_hint != PrefetchHint::kL1 && o.prefetch_hint != PrefetchHint::kL2)
    return InvalidArgument("CpuAdam prefetch_hint is neither kL1 nor kL2");
  ASSIGN_OR_RETURN(Isa isa, ResolveIsa(o.isa));
  std::unique_ptr<CpuAdam> a(new CpuAdam());
  a->isa_ = isa;
  a->tile_elems_ = o.tile_elems;
  a->prefetch_bytes_ = o.prefetch_bytes;
  a->prefetch_hint_ = o.prefetch_hint;
  a->threads_ = o.threads > 0 ? o.threads : tbb::info::default_concurrency();
  a->impl_ = std::make_unique<Impl>();
  a->impl_->table = &TableFor(isa);
  a->impl_->arena = std::make_unique<tbb::task_arena>(a->threads_);
  if (!o.pin_threads) {
    if (o.numa_node >= 0) return InvalidArgument("CpuAdam numa_node is only used with pin_threads");
    return a;
  }
  Impl& im = *a->impl_;
  if (hwloc_topology_init(&im.topo) != 0 || hwloc_topology_load(im.topo) != 0)
    return Unavailable("CpuAdam pin_threads: hwloc cannot load the machine topology");
  const hwloc_topology_support* sup = hwloc_topology_get_support(im.topo);
  if (!sup || !sup->cpubind || !sup->cpubind->set_thisthread_cpubind)
    return Unavailable("CpuAdam pin_threads: hwloc cannot bind threads on this system");
  hwloc_obj_t node = nullptr;
  if (o.numa_node >= 0) {
    node = hwloc_get_numanode_obj_by_os_index(im.topo, static_cast<unsigned>(o.numa_node));
    if (node == nullptr)
      return InvalidArgument("CpuAdam numa_node " + std::to_string(o.numa_node) + " does not exist on this machine");
  }
  std::vector<hwloc_bitmap_t> cores;
  int ncores = hwloc_get_nbobjs_by_type(im.topo, HWLOC_OBJ_CORE);
  for (int i = 0; i < ncores; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(im.topo, HWLOC_OBJ_CORE, static_cast<unsigned>(i));
    if (!core || !core->cpuset) continue;
    if (node && !hwloc_bitmap_intersects(core->cpuset, node->cpuset)) continue;
    cores.push_back(hwloc_bitmap_dup(core->cpuset));
  }
  if (cores.empty()) return Unavailable("CpuAdam pin_threads: hwloc found no cores to bind to");
  im.pin = std::make_unique<PinObserver>(*im.arena, im.topo, std::move(cores));
  return a;
}

Result<AdamStepResult> CpuAdam::Step(const AdamShard& s, const AdamHyper& hyper,
                                     const AdamStepOptions& options) const {
  RETURN_IF_ERROR(s.Validate());
  ASSIGN_OR_RETURN(const AdamCoefficients c, MakeAdamCoefficients(hyper, options.grad_scale));
  AdamStepResult result;
  if (s.n == 0) return result;
  if (options.skip_on_nonfinite) {
    ASSIGN_OR_RETURN(GradStats st, ComputeGradStats(s.grad, s.grad_dtype, s.n));
    if (st.nonfinite != 0) {
      result.nonfinite_grads = st.nonfinite;
      result.skipped = true;
      return result;
    }
  }
  const internal::AdamTileFn fn = impl_->table->adam[GradIndex(s.grad_dtype)][StateIndex(s.state_dtype)]
                                                    [s.param_out ? OutIndex(s.param_out_dtype) : internal::kOutNone];
  const size_t ss = DTypeSize(s.state_dtype), gs = DTypeSize(s.grad_dtype);
  const size_t os = s.param_out ? DTypeSize(s.param_out_dtype) : 0;
  // In place the results go back where they were read.
  const bool oop = s.out_of_place();
  float* const master_out = oop ? s.master_out : s.master;
  void* const m_out = oop ? s.exp_avg_out : s.exp_avg;
  void* const v_out = oop ? s.exp_avg_sq_out : s.exp_avg_sq;
  auto tile = [&](size_t begin, size_t len, bool stream_out, bool stream_state) {
    internal::AdamTile t;
    t.c = &c;
    t.master = s.master + begin;
    t.exp_avg = static_cast<const unsigned char*>(s.exp_avg) + begin * ss;
    t.exp_avg_sq = static_cast<const unsigned char*>(s.exp_avg_sq) + begin * ss;
    t.grad = static_cast<const unsigned char*>(s.grad) + begin * gs;
    t.out = s.param_out ? static_cast<unsigned char*>(s.param_out) + begin * os : nullptr;
    t.master_out = master_out + begin;
    t.exp_avg_out = static_cast<unsigned char*>(m_out) + begin * ss;
    t.exp_avg_sq_out = static_cast<unsigned char*>(v_out) + begin * ss;
    t.n = len;
    t.stream_out = stream_out;
    t.stream_state = stream_state;
    t.prefetch_bytes = prefetch_bytes_;
    t.prefetch_n = s.n - begin;
    t.prefetch_hint = prefetch_hint_ == PrefetchHint::kL1 ? internal::kPrefetchL1 : internal::kPrefetchL2;
    return fn(t);
  };
  // Elements before the first 64-byte boundary of the leading output (out of
  // place the new master, else the copy) go through a plain-store tile; from
  // there on every tile starts 64-byte aligned in each output that was
  // aligned like the leader (tiles are multiples of 64 elements), whose
  // vector stores may then be non-temporal. Outputs aligned otherwise get
  // plain stores. (Elementwise: where the tiles start changes no result.)
  size_t head = 0;
  const void* lead = oop ? static_cast<const void*>(s.master_out) : s.param_out;
  if (lead) {
    const size_t les = oop ? 4 : os;
    size_t mis = reinterpret_cast<uintptr_t>(lead) % 64;
    head = mis ? (64 - mis) / les : 0;
    if (head > s.n) head = s.n;
  }
  auto aligned_after_head = [&](const void* p, size_t es) {
    return (reinterpret_cast<uintptr_t>(p) + head * es) % 64 == 0;
  };
  const bool stream_out = s.param_out != nullptr && aligned_after_head(s.param_out, os);
  const bool stream_state = oop && aligned_after_head(s.master_out, 4) && aligned_after_head(s.exp_avg_out, ss) &&
                            aligned_after_head(s.exp_avg_sq_out, ss);
  uint64_t nonfinite = head ? tile(0, head, false, false) : 0;
  const size_t body = s.n - head, T = tile_elems_;
  const size_t ntiles = (body + T - 1) / T;
  nonfinite += impl_->ForEachTile(ntiles, threads_, [&](size_t t) {
    size_t begin = head + t * T;
    size_t len = t + 1 == ntiles ? s.n - begin : T;
    return tile(begin, len, stream_out, stream_state);
  });
  result.nonfinite_grads = nonfinite;
  return result;
}

void CpuAdam::RunTiles(size_t ntiles, const std::function<void(size_t tile)>& f) const {
  impl_->ForEachTile(ntiles, threads_, [&](size_t t) -> uint64_t {
    f(t);
    return 0;
  });
}

Result<GradStats> CpuAdam::ComputeGradStats(const void* grad, DType dtype, size_t n) const {
  int gi = GradIndex(dtype);
  if (gi < 0)
    return InvalidArgument("ComputeGradStats: gradient dtype must be f32, f16 or bf16, got " +
                           std::string(DTypeName(dtype)));
  GradStats st;
  st.count = n;
  if (n == 0) return st;
  if (grad == nullptr) return InvalidArgument("ComputeGradStats: grad is null (n = " + std::to_string(n) + ")");
  if (reinterpret_cast<uintptr_t>(grad) % DTypeSize(dtype) != 0)
    return InvalidArgument("ComputeGradStats: grad is not aligned to its element size");
  const internal::SumSqTileFn fn = impl_->table->sum_sq[gi];
  const size_t es = DTypeSize(dtype);
  const size_t ntiles = (n + kStatsTile - 1) / kStatsTile;
  auto len_of = [&](size_t t) { return t + 1 == ntiles ? n - t * kStatsTile : kStatsTile; };
  const unsigned char* g = static_cast<const unsigned char*>(grad);
  if (ntiles == 1) {
    fn(g, n, &st.sum_sq, &st.nonfinite);
    return st;
  }
  std::vector<double> sums(ntiles);
  st.nonfinite = impl_->ForEachTile(ntiles, threads_, [&](size_t t) {
    uint64_t bad = 0;
    fn(g + t * kStatsTile * es, len_of(t), &sums[t], &bad);
    return bad;
  });
  double s = 0.0;
  for (double x : sums) s += x;  // tile order: fixed whatever the thread count
  st.sum_sq = s;
  return st;
}

}  // namespace strata::optim
