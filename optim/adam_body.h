// SPDX-License-Identifier: Apache-2.0
// Internal: the one definition of the Adam tile and of the gradient scan,
// written once over a vector type V and instantiated by each ISA's
// translation unit (adam_scalar.cc, adam_avx2.cc, adam_avx512.cc,
// adam_avx512bf16.cc), which defines V and then includes this file. Writing
// the arithmetic once is what makes every path execute the same operations in
// the same order (bitwise identical results, optim/cpu_adam.h).
//
// V provides, for kLanes fp32 lanes in V::F:
//   Set1, LoadF32/LoadF16/LoadBF16 (exact widening), StoreF32/StoreF16/StoreBF16
//   (round to nearest even), StreamF32/StreamF16/StreamBF16 (non-temporal when
//   the address is aligned to the vector's width), Mul, Fma(a,b,c) = a*b+c with
//   one rounding, Sqrt, Div (IEEE), CountNonFinite, StoreFence; and for the
//   gradient scan an accumulator Acc of 16 fp64 lanes: AccZero,
//   AccSquares(acc, j, x) (adds x[l]^2 to lane j*kLanes + l), AccStore.
//
// Everything here has internal linkage (anonymous namespace) and the file
// includes no standard library header with inline functions: each ISA unit
// must get its own copies, compiled with its own flags.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "optim/adam_kernels.h"

namespace strata::optim::internal {
namespace {

enum class Kind { kF32, kF16, kBF16, kNone };

constexpr size_t SizeOf(Kind k) { return k == Kind::kF32 ? 4 : k == Kind::kNone ? 0 : 2; }

template <class V, Kind k>
inline typename V::F LoadAs(const void* base, size_t i) {
  if constexpr (k == Kind::kF32) {
    return V::LoadF32(static_cast<const float*>(base) + i);
  } else if constexpr (k == Kind::kF16) {
    return V::LoadF16(static_cast<const uint16_t*>(base) + i);
  } else {
    static_assert(k == Kind::kBF16);
    return V::LoadBF16(static_cast<const uint16_t*>(base) + i);
  }
}

template <class V, Kind k, bool kStream>
inline void StoreAs(void* base, size_t i, typename V::F x) {
  if constexpr (k == Kind::kF32) {
    float* p = static_cast<float*>(base) + i;
    if constexpr (kStream) V::StreamF32(p, x); else V::StoreF32(p, x);
  } else if constexpr (k == Kind::kF16) {
    uint16_t* p = static_cast<uint16_t*>(base) + i;
    if constexpr (kStream) V::StreamF16(p, x); else V::StoreF16(p, x);
  } else {
    static_assert(k == Kind::kBF16);
    uint16_t* p = static_cast<uint16_t*>(base) + i;
    if constexpr (kStream) V::StreamBF16(p, x); else V::StoreBF16(p, x);
  }
}

// The step's constants, broadcast once per tile.
template <class V>
struct Consts {
  using F = typename V::F;
  F beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size, inv_sqrt_bc2,
      neg_lr_decay, l2_decay, grad_scale;
  bool has_l2, has_decay;
  explicit Consts(const AdamCoefficients& c)
      : beta1(V::Set1(c.beta1)),
        one_minus_beta1(V::Set1(c.one_minus_beta1)),
        beta2(V::Set1(c.beta2)),
        one_minus_beta2(V::Set1(c.one_minus_beta2)),
        eps(V::Set1(c.eps)),
        neg_step_size(V::Set1(c.neg_step_size)),
        inv_sqrt_bc2(V::Set1(c.inv_sqrt_bc2)),
        neg_lr_decay(V::Set1(c.neg_lr_decay)),
        l2_decay(V::Set1(c.l2_decay)),
        grad_scale(V::Set1(c.grad_scale)),
        has_l2(c.l2_decay != 0.f),
        has_decay(c.neg_lr_decay != 0.f) {}
};

// Where one vector's operands live: the state read (master, m, v, grad) and
// where the results go (the same arrays in place, others out of place).
struct AdamPtrs {
  const float* master;
  const void* exp_avg;
  const void* exp_avg_sq;
  const void* grad;
  float* master_out;
  void* exp_avg_out;
  void* exp_avg_sq_out;
  void* out;
};

inline AdamPtrs PtrsOf(const AdamTile& t) {
  return {t.master, t.exp_avg, t.exp_avg_sq, t.grad, t.master_out, t.exp_avg_out, t.exp_avg_sq_out, t.out};
}

// One vector of kLanes elements starting at index i. The operation sequence is
// the contract of optim/adam_coefficients.h (AdamCoefficients); the GPU kernel
// (optim/cuda/adam.cu) repeats it with __fmaf_rn & co. kStream: the copy
// goes out with non-temporal stores; kStreamState: the new master, m and v
// too (out of place).
template <class V, Kind G, Kind S, Kind O, bool kStream, bool kStreamState>
inline uint64_t AdamVector(const Consts<V>& k, const AdamPtrs& a, size_t i) {
  using F = typename V::F;
  F g = LoadAs<V, G>(a.grad, i);
  uint64_t nonfinite = V::CountNonFinite(g);
  F p = V::LoadF32(a.master + i);
  F m = LoadAs<V, S>(a.exp_avg, i);
  F v = LoadAs<V, S>(a.exp_avg_sq, i);
  g = V::Mul(g, k.grad_scale);
  if (k.has_l2) g = V::Fma(p, k.l2_decay, g);
  m = V::Fma(g, k.one_minus_beta1, V::Mul(m, k.beta1));
  v = V::Fma(V::Mul(g, g), k.one_minus_beta2, V::Mul(v, k.beta2));
  F d = V::Fma(V::Sqrt(v), k.inv_sqrt_bc2, k.eps);
  F u = V::Div(m, d);
  if (k.has_decay) p = V::Fma(p, k.neg_lr_decay, p);
  p = V::Fma(u, k.neg_step_size, p);
  StoreAs<V, Kind::kF32, kStreamState>(a.master_out, i, p);
  StoreAs<V, S, kStreamState>(a.exp_avg_out, i, m);
  StoreAs<V, S, kStreamState>(a.exp_avg_sq_out, i, v);
  if constexpr (O != Kind::kNone) StoreAs<V, O, kStream>(a.out, i, p);
  return nonfinite;
}

// Prefetches the cache lines [p + d, p + d + bytes) (bytes a multiple of 64
// or less than 64: one line). kLocality is __builtin_prefetch's: 3 =
// prefetcht0 (into L1), 1 = prefetcht2 (into L2). A hint only: it changes
// no result.
template <int kLocality, size_t kBytes>
inline void PrefetchLines(const void* p, size_t d) {
  const unsigned char* b = static_cast<const unsigned char*>(p) + d;
  for (size_t o = 0; o < kBytes; o += 64) __builtin_prefetch(b + o, 0, kLocality);
}

// kLocality < 0: no software prefetch (the hardware prefetchers only).
// Otherwise the loop goes in groups of 32 elements (128 bytes of an fp32
// stream, 64 of a 16-bit one) and, before each group, prefetches the lines
// of every read stream t.prefetch_bytes ahead; the copy (written, never
// read) is not prefetched. The order of the arithmetic is the same either
// way: element by element, kLanes at a time.
template <class V, Kind G, Kind S, Kind O, bool kStream, bool kStreamState, int kLocality>
inline uint64_t AdamLoop(const Consts<V>& k, const AdamTile& t, size_t end) {
  const AdamPtrs a = PtrsOf(t);
  uint64_t nonfinite = 0;
  size_t i = 0;
  if constexpr (kLocality >= 0) {
    constexpr size_t kGroup = 32;
    static_assert(kGroup % V::kLanes == 0, "a group must hold whole vectors");
    constexpr size_t ss = SizeOf(S), gs = SizeOf(G);
    constexpr size_t min_es = ss < gs ? ss : gs;  // <= 4, the master's
    const size_t d = t.prefetch_bytes;
    // Groups whose prefetches all stay inside the shard: for every stream of
    // element size es, (i + kGroup) * es + d <= prefetch_n * es.
    const size_t ahead = kGroup + (d + min_es - 1) / min_es;
    const size_t stop = t.prefetch_n >= ahead ? t.prefetch_n - ahead + 1 : 0;  // exclusive
    for (; i + kGroup <= end && i < stop; i += kGroup) {
      PrefetchLines<kLocality, kGroup * 4>(t.master + i, d);
      PrefetchLines<kLocality, kGroup * ss>(static_cast<const unsigned char*>(t.exp_avg) + i * ss, d);
      PrefetchLines<kLocality, kGroup * ss>(static_cast<const unsigned char*>(t.exp_avg_sq) + i * ss, d);
      PrefetchLines<kLocality, kGroup * gs>(static_cast<const unsigned char*>(t.grad) + i * gs, d);
      for (size_t j = i; j < i + kGroup; j += V::kLanes)
        nonfinite += AdamVector<V, G, S, O, kStream, kStreamState>(k, a, j);
    }
  }
  for (; i < end; i += V::kLanes) nonfinite += AdamVector<V, G, S, O, kStream, kStreamState>(k, a, i);
  return nonfinite;
}

template <class V, Kind G, Kind S, Kind O, bool kStream, bool kStreamState>
inline uint64_t AdamLoopPrefetch(const Consts<V>& k, const AdamTile& t, size_t end) {
  if (t.prefetch_bytes == 0) return AdamLoop<V, G, S, O, kStream, kStreamState, -1>(k, t, end);
  if (t.prefetch_hint == kPrefetchL1) return AdamLoop<V, G, S, O, kStream, kStreamState, 3>(k, t, end);
  return AdamLoop<V, G, S, O, kStream, kStreamState, 1>(k, t, end);
}

template <class V, Kind G, Kind S, Kind O, bool kStreamState>
inline uint64_t AdamLoopStream(const Consts<V>& k, const AdamTile& t, size_t end) {
  if (O != Kind::kNone && t.stream_out) return AdamLoopPrefetch<V, G, S, O, true, kStreamState>(k, t, end);
  return AdamLoopPrefetch<V, G, S, O, false, kStreamState>(k, t, end);
}

template <class V, Kind G, Kind S, Kind O>
uint64_t AdamTileImpl(const AdamTile& t) {
  constexpr size_t L = V::kLanes;
  const Consts<V> k(*t.c);
  const size_t full = t.n - t.n % L;
  uint64_t nonfinite = 0;
  if (t.stream_state)
    nonfinite += AdamLoopStream<V, G, S, O, true>(k, t, full);
  else
    nonfinite += AdamLoopStream<V, G, S, O, false>(k, t, full);
  if constexpr (L > 1) {
    // The last n % L elements: copied into zero-padded vectors, run through the
    // same vector code, copied back (padding lanes are finite and discarded).
    const size_t rem = t.n - full;
    if (rem != 0) {
      alignas(64) float p[L];
      alignas(64) unsigned char m[L * 4], v[L * 4], g[L * 4], o[L * 4];
      std::memset(p, 0, sizeof p);
      std::memset(m, 0, sizeof m);
      std::memset(v, 0, sizeof v);
      std::memset(g, 0, sizeof g);
      std::memset(o, 0, sizeof o);
      constexpr size_t ss = SizeOf(S), gs = SizeOf(G), os = SizeOf(O);
      std::memcpy(p, t.master + full, rem * 4);
      std::memcpy(m, static_cast<const unsigned char*>(t.exp_avg) + full * ss, rem * ss);
      std::memcpy(v, static_cast<const unsigned char*>(t.exp_avg_sq) + full * ss, rem * ss);
      std::memcpy(g, static_cast<const unsigned char*>(t.grad) + full * gs, rem * gs);
      const AdamPtrs tmp{p, m, v, g, p, m, v, o};  // in place on the copies
      nonfinite += AdamVector<V, G, S, O, false, false>(k, tmp, 0);
      std::memcpy(t.master_out + full, p, rem * 4);
      std::memcpy(static_cast<unsigned char*>(t.exp_avg_out) + full * ss, m, rem * ss);
      std::memcpy(static_cast<unsigned char*>(t.exp_avg_sq_out) + full * ss, v, rem * ss);
      if constexpr (O != Kind::kNone)
        std::memcpy(static_cast<unsigned char*>(t.out) + full * os, o, rem * os);
    }
  }
  // Non-temporal stores are weakly ordered: fence before the tile is reported
  // done, so whoever learns of the completion (through the task join) sees them.
  if ((O != Kind::kNone && t.stream_out) || t.stream_state) V::StoreFence();
  return nonfinite;
}

// ---- gradient scan: fp64 sum of squares in a fixed order -------------------

// 16 consecutive elements at i: element i + l goes to accumulator lane l.
template <class V, Kind G>
inline uint64_t SumSq16(typename V::Acc& acc, const void* grad, size_t i) {
  static_assert(16 % V::kLanes == 0, "16 must be a multiple of the vector width");
  uint64_t nonfinite = 0;
  for (size_t j = 0; j < 16 / V::kLanes; ++j) {
    typename V::F x = LoadAs<V, G>(grad, i + j * V::kLanes);
    nonfinite += V::CountNonFinite(x);
    V::AccSquares(acc, j, x);
  }
  return nonfinite;
}

template <class V, Kind G>
void SumSqTileImpl(const void* grad, size_t n, double* sum_sq, uint64_t* nonfinite_out) {
  typename V::Acc acc = V::AccZero();
  uint64_t nonfinite = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) nonfinite += SumSq16<V, G>(acc, grad, i);
  if (i < n) {
    constexpr size_t gs = SizeOf(G);
    alignas(64) unsigned char g[16 * 4];
    std::memset(g, 0, sizeof g);  // zeros add nothing to any lane
    std::memcpy(g, static_cast<const unsigned char*>(grad) + i * gs, (n - i) * gs);
    nonfinite += SumSq16<V, G>(acc, g, 0);
  }
  double lanes[16];
  V::AccStore(acc, lanes);
  double s = 0.0;
  for (int l = 0; l < 16; ++l) s += lanes[l];
  *sum_sq = s;
  *nonfinite_out = nonfinite;
}

// ---- the table -------------------------------------------------------------

template <class V, Kind G, Kind S>
constexpr void FillOut(AdamTileFn (&row)[4]) {
  row[kOutNone] = &AdamTileImpl<V, G, S, Kind::kNone>;
  row[kOutF32] = &AdamTileImpl<V, G, S, Kind::kF32>;
  row[kOutF16] = &AdamTileImpl<V, G, S, Kind::kF16>;
  row[kOutBF16] = &AdamTileImpl<V, G, S, Kind::kBF16>;
}

template <class V, Kind G>
constexpr void FillState(AdamTileFn (&rows)[2][4]) {
  FillOut<V, G, Kind::kF32>(rows[kStateF32]);
  FillOut<V, G, Kind::kBF16>(rows[kStateBF16]);
}

template <class V>
constexpr KernelTable MakeKernelTable() {
  KernelTable t{};
  FillState<V, Kind::kF32>(t.adam[kGradF32]);
  FillState<V, Kind::kF16>(t.adam[kGradF16]);
  FillState<V, Kind::kBF16>(t.adam[kGradBF16]);
  t.sum_sq[kGradF32] = &SumSqTileImpl<V, Kind::kF32>;
  t.sum_sq[kGradF16] = &SumSqTileImpl<V, Kind::kF16>;
  t.sum_sq[kGradBF16] = &SumSqTileImpl<V, Kind::kBF16>;
  return t;
}

}  // namespace
}  // namespace strata::optim::internal
