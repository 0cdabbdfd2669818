// SPDX-License-Identifier: Apache-2.0
// The passes strata-bench adam (bench/adam.cc) measures the CPU Adam
// against, over the same arrays and on the same threads and tiles:
//   the roof    one tile of the Adam pass's byte pattern (master, m and v
//               read and written, the gradient read, the parameter copy
//               streamed out; out of place when asked) with trivial integer
//               arithmetic, in SSE2, AVX2 and AVX-512 forms;
//   STREAM      read, copy (non-temporal stores) and update in place over
//               one tile of fp32 elements, the machine's raw bandwidth.
// Each returns the bytes it read folded into a value that the caller sinks,
// so the loads cannot be optimized away.
//
// Thread-safety: pure functions of their tile; tiles may run in parallel.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::bench {

struct RoofTile {
  uint8_t* p;       // (n) 4 B, read+written
  uint8_t* m;       // (n) ss B, read+written
  uint8_t* v;       // (n) ss B, read+written
  const uint8_t* g; // (n) gs B, read
  uint8_t* out;     // (n) os B, written non-temporally (16-byte aligned), or null
  size_t n, ss, gs, os;
  // Out of place: p, m and v are only read, and what would be written back
  // goes to these instead, non-temporally (64-byte aligned). Null: in place.
  uint8_t* po = nullptr;
  uint8_t* mo = nullptr;
  uint8_t* vo = nullptr;
  // Software prefetch like CpuAdam's: every read stream pf bytes ahead, one
  // prefetch per line, groups below pf_stop only (inside the shard); pf 0: none.
  size_t pf = 0;
  size_t pf_stop = 0;
  int hint = 1;
};

// The first group index (exclusive) whose prefetches stay inside the shard,
// for a tile whose first element is `rest` elements from the shard's end.
size_t PrefetchStop(size_t rest, size_t pf, size_t min_es, size_t group);

// One roof tile. RoofTileAvx2 needs AVX2, RoofTileAvx512 AVX-512 F and BW.
uint64_t RoofTileSse(const RoofTile& t);
__attribute__((target("avx2"))) uint64_t RoofTileAvx2(const RoofTile& t);
uint64_t RoofTileAvx512(const RoofTile& t);

enum class RoofKernel { kSse2, kAvx2, kAvx512 };
const char* RoofKernelName(RoofKernel k);
// The widest form this CPU runs: AVX-512, else AVX2, else SSE2.
RoofKernel BestRoofKernel();

enum class StreamKind { kRead, kCopy, kUpdate };

// One tile of n fp32 elements (n a multiple of 16 except in the last tile;
// the tail goes element by element). pf / pf_stop / hint as in RoofTile.
uint64_t StreamTile(StreamKind k, uint8_t* a, uint8_t* b, size_t n, size_t pf, size_t pf_stop, int hint);

}  // namespace strata::bench
