// SPDX-License-Identifier: Apache-2.0
// GpuTier: device memory, carved by our Arena, within an exact byte budget.
//
// - Memory comes from cudaMalloc in slabs (never managed memory) and is
//   handed out in 256-byte-aligned blocks; no cudaMalloc/cudaFree happens
//   per allocation. The budget caps both the bytes handed out and the device
//   memory the tier takes (`--gpu-memory-limit`); everything the tier hands
//   out counts.
// - Without a usable GPU (no device, no driver, or a build without CUDA), or
//   when `stand_in` is set, the same class is backed by ordinary host memory:
//   a stand-in with the same budget and allocator, so every store path runs
//   in CI. `stand_in()` says which one this is; the copy engine then copies
//   with memcpy on its worker threads.
//
// Ownership: the tier owns its slabs and frees them at destruction; every
// TierBlock it handed out must be gone by then.
//
// Thread-safety: all methods are thread-safe. The tier sets its device as
// current (cudaSetDevice) on the calling thread when it maps a slab.
#pragma once

#include <memory>

#include "base/bytes.h"
#include "tiers/slab_tier.h"

namespace strata {

struct GpuTierOptions {
  int device = 0;
  // Bytes this tier may hand out and take from the device. 0: the device's
  // free memory at Open (the stand-in: 1 GiB).
  uint64_t budget_bytes = 0;
  // Growth step. 0: the whole budget as one slab at the first allocation.
  uint64_t slab_bytes = 512 * kMiB;
  // Map the whole budget at Open instead of on demand.
  bool reserve_all = false;
  // Use the host-memory stand-in even when a GPU is usable (tests, benches).
  bool stand_in = false;
};

class GpuTier final : public SlabTier {
 public:
  // InvalidArgument for a device that does not exist; Unavailable never (no
  // GPU means the stand-in). With reserve_all, the device's errors
  // (OutOfMemory from cudaMalloc) are returned here.
  static Result<std::unique_ptr<GpuTier>> Open(const GpuTierOptions& options);
  ~GpuTier() override;

  bool device_memory() const override { return !stand_in_; }
  bool pinned() const override { return !stand_in_; }  // device memory is DMA-able
  bool stand_in() const { return stand_in_; }
  int device() const { return device_; }
  // "cuda:0 NVIDIA H200" or "stand-in (host memory; <why there is no GPU>)".
  const std::string& description() const { return description_; }

 protected:
  Result<void*> MapSlab(uint64_t bytes) override;
  void UnmapSlab(void* base, uint64_t bytes) override;

 private:
  GpuTier(SlabTierConfig config, int device, bool stand_in, std::string description);
  int device_;
  bool stand_in_;
  std::string description_;
};

}  // namespace strata
