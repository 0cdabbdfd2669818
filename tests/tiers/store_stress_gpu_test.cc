// SPDX-License-Identifier: Apache-2.0
// The randomized TierStore stress test (store_stress.h) on a real device:
// gpu views are device memory (checked through cudaMemcpy), host memory is
// pinned with cudaHostRegister and the copy engine runs on CUDA streams.
// Skips without a GPU.
#include "tests/tiers/store_stress.h"

#if STRATA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace strata::stress {
namespace {

#if STRATA_WITH_CUDA

StressMemory DeviceMemory() {
  StressMemory m;
  m.device_views = true;
  m.to_host = [](void* host, const void* device, size_t n) {
    ASSERT_EQ(cudaMemcpy(host, device, n, cudaMemcpyDeviceToHost), cudaSuccess);
  };
  m.to_device = [](void* device, const void* host, size_t n) {
    ASSERT_EQ(cudaMemcpy(device, host, n, cudaMemcpyHostToDevice), cudaSuccess);
  };
  return m;
}

TEST(StoreStressGpu, EveryByteMatchesTheReferenceLru) {
  STRATA_SKIP_WITHOUT_GPU();
  StressParams p;
  p.stand_in = false;
  p.pin_host = true;
  RunStoreStress(p, DeviceMemory());
}

TEST(StoreStressGpu, EveryByteMatchesTheReferenceNextUse) {
  STRATA_SKIP_WITHOUT_GPU();
  StressParams p;
  p.stand_in = false;
  p.pin_host = true;
  p.policy = EvictionPolicy::kNextUse;
  p.threads = 6;
  p.workers = 4;
  RunStoreStress(p, DeviceMemory());
}

#else

TEST(StoreStressGpu, NeedsCuda) { GTEST_SKIP() << "strata was built without CUDA"; }

#endif

}  // namespace
}  // namespace strata::stress
