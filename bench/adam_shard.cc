// SPDX-License-Identifier: Apache-2.0
// The CPU Adam benchmarks' shard buffers and the roof pass over them
// (bench/adam_shard.h).
#include "bench/adam_shard.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "base/half.h"
#include "base/host_memory.h"
#include "bench/bench.h"

namespace strata::bench {

HostBuf AllocHostBuf(size_t bytes, HostHugePages hp, size_t offset) {
  HostBuf b;
  b.map = BENCH_VALUE(MapHostMemory(std::max<size_t>(bytes, 1) + offset, hp, /*prefault=*/false));
  b.p = static_cast<uint8_t*>(b.map.data()) + offset;
  return b;
}

size_t AvailableHostBytes() {
  Result<HostMemoryInfo> m = QueryHostMemory();
  return m.ok() ? static_cast<size_t>(m->available_bytes) : SIZE_MAX;
}

size_t ShardBytes(size_t n, const AdamDTypes& cfg, bool oop) {
  const size_t state = 4 + 2 * DTypeSize(cfg.state);
  return n * (state * (oop ? 2 : 1) + DTypeSize(cfg.grad) + (cfg.has_out ? DTypeSize(cfg.out) : 0) + 8);
}

ShardBuffers MakeShard(size_t n, const AdamDTypes& cfg, bool oop, HostHugePages hp, size_t stagger,
                       tbb::task_arena& arena, size_t tile) {
  ShardBuffers s;
  s.n = n;
  s.cfg = cfg;
  s.oop = oop;
  const size_t ss = DTypeSize(cfg.state), gs = DTypeSize(cfg.grad), os = DTypeSize(cfg.out);
  s.master = AllocHostBuf(n * 4, hp, 0 * stagger);
  s.m = AllocHostBuf(n * ss, hp, 1 * stagger);
  s.v = AllocHostBuf(n * ss, hp, 2 * stagger);
  s.grad = AllocHostBuf(n * gs, hp, 3 * stagger);
  if (cfg.has_out) s.out = AllocHostBuf(n * os, hp, 4 * stagger);
  s.sa = AllocHostBuf(n * 4, hp, 5 * stagger);
  s.sb = AllocHostBuf(n * 4, hp, 6 * stagger);
  if (oop) {
    s.master2 = AllocHostBuf(n * 4, hp, 7 * stagger);
    s.m2 = AllocHostBuf(n * ss, hp, 8 * stagger);
    s.v2 = AllocHostBuf(n * ss, hp, 9 * stagger);
  }
  const size_t ntiles = (n + tile - 1) / tile;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, ntiles, 1), [&](const tbb::blocked_range<size_t>& r) {
      for (size_t t = r.begin(); t != r.end(); ++t) {
        size_t b = t * tile, e = std::min(n, b + tile);
        for (size_t i = b; i < e; ++i) {
          uint32_t h = static_cast<uint32_t>(i * 2654435761u);
          float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f);  // [0, 1)
          Ptr<float>(s.master)[i] = 2.f * u - 1.f;
          auto put = [&](uint8_t* base, DType t, float x) {
            if (t == DType::kF32) std::memcpy(base + 4 * i, &x, 4);
            else {
              uint16_t b16 = t == DType::kF16 ? FloatToHalf(x) : FloatToBF16(x);
              std::memcpy(base + 2 * i, &b16, 2);
            }
          };
          put(Ptr(s.m), cfg.state, 1e-3f * (u - 0.5f));
          put(Ptr(s.v), cfg.state, 1e-5f * u);
          put(Ptr(s.grad), cfg.grad, 0.01f * (0.5f - u));
        }
        if (cfg.has_out) std::memset(Ptr(s.out) + b * os, 0, (e - b) * os);
        if (oop) {  // (overwritten by the first pass; touched here for placement)
          std::memset(Ptr(s.master2) + b * 4, 0, (e - b) * 4);
          std::memset(Ptr(s.m2) + b * ss, 0, (e - b) * ss);
          std::memset(Ptr(s.v2) + b * ss, 0, (e - b) * ss);
        }
        std::memset(Ptr(s.sa) + b * 4, 1, (e - b) * 4);
        std::memset(Ptr(s.sb) + b * 4, 0, (e - b) * 4);
      }
    }, tbb::static_partitioner());
  });
  return s;
}

uint64_t RoofPass(ShardBuffers& s, const optim::CpuAdam& adam, RoofKernel kernel) {
  const size_t ss = DTypeSize(s.cfg.state), gs = DTypeSize(s.cfg.grad), os = DTypeSize(s.cfg.out);
  const size_t tile = adam.tile_elems(), ntiles = (s.n + tile - 1) / tile;
  const size_t pf = adam.prefetch_bytes();
  const int hint = adam.prefetch_hint() == optim::PrefetchHint::kL1 ? 0 : 1;
  std::atomic<uint64_t> sink{0};
  adam.RunTiles(ntiles, [&](size_t t) {
    size_t b = t * tile, len = std::min(s.n, b + tile) - b;
    RoofTile rt{s.W(s.cur) + b * 4, s.M(s.cur) + b * ss, s.V(s.cur) + b * ss, Ptr(s.grad) + b * gs,
                s.cfg.has_out ? Ptr(s.out) + b * os : nullptr, len, ss, gs, os};
    if (s.oop) {
      rt.po = s.W(s.cur ^ 1) + b * 4;
      rt.mo = s.M(s.cur ^ 1) + b * ss;
      rt.vo = s.V(s.cur ^ 1) + b * ss;
    }
    rt.pf = pf;
    rt.pf_stop = pf ? PrefetchStop(s.n - b, pf, std::min(ss, gs), 32) : 0;  // a line of 16-bit = 32
    rt.hint = hint;
    // Relaxed: a sink that keeps the reads alive; RunTiles' join orders it.
    const uint64_t x = kernel == RoofKernel::kAvx512 ? RoofTileAvx512(rt)
                       : kernel == RoofKernel::kAvx2 ? RoofTileAvx2(rt)
                                                     : RoofTileSse(rt);
    sink.fetch_xor(x, std::memory_order_relaxed);
  });
  return sink.load(std::memory_order_relaxed);
}

}  // namespace strata::bench
