// SPDX-License-Identifier: Apache-2.0
// One shard's host buffers for the CPU Adam benchmarks: master, m, v, the
// gradient and the parameter copy (and, out of place, a second master/m/v)
// in the dtypes of an AdamDTypes, plus two fp32 STREAM arrays; and the roof
// pass over them (bench/adam_roof.h) on a CpuAdam's threads and tiles.
// strata-bench adam measures the CPU Adam against that roof; strata-bench
// train --workload measures the host memory's rate for the Adam's bytes
// with it, beside the offloaded step.
//
// Ownership: a ShardBuffers owns its mappings (move-only, as HostMapping).
// Thread-safety: MakeShard and RoofPass run their passes on the given
// arena or CpuAdam's threads; a shard is used by one pass at a time.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "bench/adam_roof.h"
#include "optim/cpu_adam.h"
#include "tiers/host_tier.h"

namespace strata::bench {

// The dtypes of one Adam configuration: gradient, state (m and v) and the
// parameter copy the pass writes (has_out false: none).
struct AdamDTypes {
  DType grad = DType::kF16;
  DType state = DType::kF32;
  bool has_out = true;
  DType out = DType::kF16;
  std::string name() const {
    return std::string(DTypeName(grad)) + ":" + std::string(DTypeName(state)) + ":" +
           (has_out ? std::string(DTypeName(out)) : "none");
  }
};

// Host memory: 2 MiB-aligned anonymous mappings with the huge-page advice of
// the variant (tiers/host_tier.h), first touched by the worker threads.
// Buffer k of a shard starts k x `stagger` bytes into its mapping: arrays
// spaced by an exact power of two (what back-to-back 2 MiB-aligned mmaps of
// 2^k-byte arrays give) can alias in the TLB, caches and DRAM banks, which
// costs this pass up to 2-3x on some machines; glibc's aligned_alloc
// staggers by 2 MiB + a page per array, which --stagger 2M reproduces.
struct HostBuf {
  HostMapping map;
  uint8_t* p = nullptr;
  void* data() const { return p; }
};

HostBuf AllocHostBuf(size_t bytes, HostHugePages hp, size_t offset);

template <class T = uint8_t>
T* Ptr(const HostBuf& b) {
  return reinterpret_cast<T*>(b.p);
}

struct ShardBuffers {
  size_t n = 0;
  AdamDTypes cfg;
  HostBuf master, m, v, grad, out;
  HostBuf sa, sb;  // (n) fp32 each: the STREAM arrays
  // --out-of-place: the second master/m/v. Each pass reads set `cur` and
  // writes the other; Flip() then makes the other current.
  bool oop = false;
  HostBuf master2, m2, v2;
  int cur = 0;

  uint8_t* W(int set) const { return Ptr(set ? master2 : master); }
  uint8_t* M(int set) const { return Ptr(set ? m2 : m); }
  uint8_t* V(int set) const { return Ptr(set ? v2 : v); }
  void Flip() { cur ^= oop ? 1 : 0; }

  optim::AdamShard View() const {
    optim::AdamShard s;
    s.n = n;
    s.master = reinterpret_cast<float*>(W(cur));
    s.exp_avg = M(cur);
    s.exp_avg_sq = V(cur);
    s.state_dtype = cfg.state;
    s.grad = grad.data();
    s.grad_dtype = cfg.grad;
    s.param_out = cfg.has_out ? out.data() : nullptr;
    s.param_out_dtype = cfg.out;
    if (oop) {
      s.master_out = reinterpret_cast<float*>(W(cur ^ 1));
      s.exp_avg_out = M(cur ^ 1);
      s.exp_avg_sq_out = V(cur ^ 1);
    }
    return s;
  }
};

// The host memory available now (/proc/meminfo's MemAvailable; SIZE_MAX when
// it cannot be read), to size a shard against.
size_t AvailableHostBytes();

// Bytes a shard maps (both sets out of place), the STREAM arrays included.
size_t ShardBytes(size_t n, const AdamDTypes& cfg, bool oop);

// Allocates and fills the shard with plausible values (first touch by the
// threads of `arena`, in the tiles the passes will use).
ShardBuffers MakeShard(size_t n, const AdamDTypes& cfg, bool oop, HostHugePages hp, size_t stagger,
                       tbb::task_arena& arena, size_t tile);

// The roof pass over the shard's arrays (out of place: from the current set
// into the other, like the Adam pass), on the Adam engine's threads and
// tiles, with its prefetch settings; returns the folded reads (a sink).
uint64_t RoofPass(ShardBuffers& s, const optim::CpuAdam& adam, RoofKernel kernel);

}  // namespace strata::bench
