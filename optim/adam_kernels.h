// SPDX-License-Identifier: Apache-2.0
// Internal: the table of per-ISA kernels behind CpuAdam (optim/cpu_adam.cc
// dispatches; adam_<isa>.cc implement them from the one template body in
// optim/adam_body.h).
//
// This header must stay free of inline functions: it is included by
// translation units compiled with different ISA flags, and an inline function
// emitted out of line in the AVX-512 unit could be the copy the linker keeps
// for everyone.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optim/adam_coefficients.h"

namespace strata::optim::internal {

// One tile of an Adam step: pointers already offset to the tile's first
// element, n elements.
struct AdamTile {
  const AdamCoefficients* c;
  const float* master;     // (n) read
  const void* exp_avg;     // (n) state dtype, read
  const void* exp_avg_sq;  // (n) state dtype, read
  const void* grad;        // (n) grad dtype
  void* out;               // (n) out dtype, or nullptr
  // Where the new master, m and v go: the three above (in place) or other
  // arrays of the same dtypes, not overlapping anything (out of place).
  float* master_out;       // (n)
  void* exp_avg_out;       // (n) state dtype
  void* exp_avg_sq_out;    // (n) state dtype
  size_t n;
  // The copy may be written with non-temporal stores: `out` is 64-byte
  // aligned and n is a multiple of 64 or this is the shard's last tile.
  bool stream_out;
  // The same for the three state outputs (out of place only: a line read
  // in place is written back in place).
  bool stream_state;
  // Software prefetch (CpuAdam::Options::prefetch_bytes): every read stream
  // (master, m, v, grad) is prefetched this many bytes ahead of where the
  // loop reads it, one prefetch per cache line; 0: none. A multiple of 64.
  size_t prefetch_bytes;
  // Elements from the tile's first to the shard's end: prefetches run into
  // the next tile (the same thread's, with the static partition) but never
  // past the shard.
  size_t prefetch_n;
  // kPrefetchL1 (prefetcht0) or kPrefetchL2 (prefetcht2).
  int prefetch_hint;
};

enum : int { kPrefetchL1 = 0, kPrefetchL2 = 1 };

// Updates the tile; returns the number of non-finite gradient values.
using AdamTileFn = uint64_t (*)(const AdamTile& tile);

// The fixed-order fp64 sum of squares and non-finite count of n values.
using SumSqTileFn = void (*)(const void* grad, size_t n, double* sum_sq, uint64_t* nonfinite);

// Index order of the tables: grad {f32, f16, bf16}, state {f32, bf16},
// out {none, f32, f16, bf16}.
enum : int { kGradF32 = 0, kGradF16 = 1, kGradBF16 = 2 };
enum : int { kStateF32 = 0, kStateBF16 = 1 };
enum : int { kOutNone = 0, kOutF32 = 1, kOutF16 = 2, kOutBF16 = 3 };

struct KernelTable {
  AdamTileFn adam[3][2][4];
  SumSqTileFn sum_sq[3];
};

// Defined in adam_scalar.cc, adam_avx2.cc, adam_avx512.cc, adam_avx512bf16.cc.
// Call only those the CPU supports (optim/cpu_features.h).
const KernelTable& ScalarKernels();
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();
const KernelTable& Avx512Bf16Kernels();

}  // namespace strata::optim::internal
