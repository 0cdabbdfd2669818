// SPDX-License-Identifier: Apache-2.0
#include "tiers/gpu_tier.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "base/cuda_check.h"
#include "base/device.h"

namespace strata {

GpuTier::GpuTier(SlabTierConfig config, int device, bool stand_in, std::string description)
    : SlabTier(config), device_(device), stand_in_(stand_in), description_(std::move(description)) {}

GpuTier::~GpuTier() { ReleaseSlabs(); }

Result<std::unique_ptr<GpuTier>> GpuTier::Open(const GpuTierOptions& options) {
  if (options.device < 0) return InvalidArgument("GPU device " + std::to_string(options.device));
  bool stand_in = options.stand_in;
  std::string description;
  uint64_t budget = options.budget_bytes;
  if (!stand_in) {
    std::string why;
    int n = CudaDeviceCount(&why);
    if (n == 0) {
      stand_in = true;
      description = "stand-in (host memory; " + why + ")";
    } else {
      ASSIGN_OR_RETURN(GpuInfo info, QueryGpu(options.device));
      description = "cuda:" + std::to_string(options.device) + " " + info.name;
      if (budget == 0) budget = info.free_bytes;
      if (budget > info.total_bytes)
        return InvalidArgument("GPU budget " + FormatBytes(budget) + " exceeds the memory of " +
                               description + " (" + FormatBytes(info.total_bytes) + ")");
    }
  } else {
    description = "stand-in (host memory; requested)";
  }
  if (stand_in && budget == 0) budget = kGiB;
  SlabTierConfig config;
  config.kind = TierKind::kGpu;
  config.budget = budget;
  config.slab_bytes = options.slab_bytes;
  config.alignment = 256;
  std::unique_ptr<GpuTier> tier(new GpuTier(config, options.device, stand_in, description));
  if (options.reserve_all) RETURN_IF_ERROR(tier->ReserveAll());
  return tier;
}

Result<void*> GpuTier::MapSlab(uint64_t bytes) {
  if (stand_in_) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      return OutOfMemory(TierKind::kGpu, bytes, 0,
                         "mmap of a " + FormatBytes(bytes) + " stand-in slab failed: " +
                             std::string(strerrorname_np(err) ? strerrorname_np(err) : "?"));
    }
    return p;
  }
#if STRATA_WITH_CUDA
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  return p;
#else
  return Internal("GpuTier without CUDA must be a stand-in");
#endif
}

void GpuTier::UnmapSlab(void* base, uint64_t bytes) {
  if (stand_in_) {
    munmap(base, bytes);
    return;
  }
#if STRATA_WITH_CUDA
  int prev = 0;
  (void)cudaGetDevice(&prev);
  (void)cudaSetDevice(device_);
  (void)cudaFree(base);  // synchronizes with the device; errors here leave nothing to do
  (void)cudaGetLastError();
  (void)cudaSetDevice(prev);
#endif
}

}  // namespace strata
