// SPDX-License-Identifier: Apache-2.0
// Hopper's tensor memory accelerator (TMA) and the shared-memory barriers
// that track it (sm_90a only, like wgmma.cuh): PTX wrappers for mbarrier,
// cp.async.bulk.tensor and cp.async.bulk, register reallocation between warpgroups and named
// barriers. The tensor map itself is made on the host (tma_map.h).
//
// A TMA load copies one box of a tensor (described by a CUtensorMap made on
// the host) into shared memory, 128-byte swizzled exactly as wgmma.cuh lays
// out its tiles when the box is 64 16-bit columns wide and the destination
// 1024-byte aligned; rows past the tensor's extent arrive as zeros. The copy
// completes on an mbarrier: the issuing thread announces the bytes it
// expects (ArriveExpectTx), and the barrier's phase flips once they have all
// landed. A full/empty pair of barriers per pipeline stage makes a
// producer/consumer ring: the producer waits for "empty" (every consumer
// thread arrived after its last read of the stage) before refilling it, the
// consumers wait for "full". Phases alternate 0, 1, 0, ...: the k-th use of
// a stage waits for parity k & 1 on full and (k & 1) ^ 1 on empty, which a
// fresh barrier passes at once.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/mma.cuh"

namespace strata::kernels::cuda {

__device__ __forceinline__ void MbarrierInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (TMA); follow it
// with a barrier of the whole block before any thread uses them.
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void MbarrierArrive(uint64_t* bar) {
  asm volatile(
      "{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(SmemAddr(bar))
      : "memory");
}
// One arrival that also announces `bytes` of transactions (TMA copies) the
// current phase must see complete.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "{\n .reg .b64 state;\n mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
          SmemAddr(bar)),
      "r"(bytes)
      : "memory");
}
// Blocks until the phase of parity `parity` has completed.
__device__ __forceinline__ void MbarrierWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      " .reg .pred done;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}

// One box of the 3-dimensional tensor `map` at coordinates (c0, c1, c2),
// innermost first, into shared memory at `dst`; completes on `bar`.
__device__ __forceinline__ void TmaLoad3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                          int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(SmemAddr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void TmaPrefetchDescriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Bulk (non-tensor) copies: `bytes` (a multiple of 16) contiguous bytes
// between 16-byte aligned global and shared addresses, byte for byte (no
// swizzle). A load completes on an mbarrier like TmaLoad3d; stores are
// tracked per thread in bulk groups: BulkCommit closes a group, and
// BulkWaitRead<N> returns once at most N of this thread's groups are still
// reading their shared memory (BulkWait<N>: still writing global memory).
// Writes to shared memory that a bulk store reads must be followed by
// FenceProxyAsync (wgmma.cuh) and a barrier before the store is issued.
__device__ __forceinline__ void BulkLoad(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}
__device__ __forceinline__ void BulkStore(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(SmemAddr(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BulkCommit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void BulkWait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Register reallocation between the warpgroups of a warp-specialized block:
// every warp of a warpgroup executes the same one.
template <int kRegs>
__device__ __forceinline__ void RegistersIncrease() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void RegistersDecrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Named barriers (ids 1..15; 0 is __syncthreads): `threads` is the number of
// threads, a multiple of 32, that sync or arrive on it per phase.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace strata::kernels::cuda
