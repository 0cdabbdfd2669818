// SPDX-License-Identifier: Apache-2.0
// GPU tests (label gpu) for the real device tier and pinned host tier:
// device memory from cudaMalloc (never managed), exact budget, and
// cudaHostRegister pinning. Skip without a GPU.
#include "tests/test_util.h"
#include "tiers/gpu_tier.h"
#include "tiers/host_tier.h"

#if STRATA_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include <vector>

namespace strata {
namespace {

using ::strata::testing::RandomBytes;
using ::strata::testing::StatusIs;

#if STRATA_WITH_CUDA

TEST(GpuTierGpu, DeviceMemoryWithinExactBudget) {
  STRATA_SKIP_WITHOUT_GPU();
  GpuTierOptions o;
  o.budget_bytes = 64 * kMiB;
  o.slab_bytes = 16 * kMiB;
  ASSERT_OK_AND_ASSIGN(auto tier, GpuTier::Open(o));
  ASSERT_FALSE(tier->stand_in());
  EXPECT_TRUE(tier->device_memory());
  std::vector<TierBlock> blocks;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(TierBlock b, tier->Allocate(16 * kMiB));
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, b.data()), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);  // not managed, not host
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 256, 0u);
    blocks.push_back(std::move(b));
  }
  auto over = tier->Allocate(1, "one byte too many");
  ASSERT_THAT(over, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_EQ(over.status().tier(), TierKind::kGpu);
  EXPECT_EQ(over.status().bytes_available(), 0u);
  // The memory works.
  auto src = RandomBytes(16 * kMiB, 1);
  std::vector<uint8_t> back(src.size());
  ASSERT_EQ(cudaMemcpy(blocks[2].data(), src.data(), src.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), blocks[2].data(), src.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, src);
}

TEST(GpuTierGpu, ReserveAllTakesTheBudgetFromTheDevice) {
  STRATA_SKIP_WITHOUT_GPU();
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  GpuTierOptions o;
  o.budget_bytes = 256 * kMiB;
  o.slab_bytes = 0;
  o.reserve_all = true;
  ASSERT_OK_AND_ASSIGN(auto tier, GpuTier::Open(o));
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_GE(free0 - free1, 256 * kMiB);
  EXPECT_LE(free0 - free1, 256 * kMiB + 64 * kMiB);  // allocation granularity only
  EXPECT_EQ(tier->usage().reserved, 256 * kMiB);
}

TEST(GpuTierGpu, BudgetBeyondTheCardIsRefused) {
  STRATA_SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(GpuInfo info, QueryGpu(0));
  GpuTierOptions o;
  o.budget_bytes = info.total_bytes + kGiB;
  EXPECT_THAT(GpuTier::Open(o), StatusIs(StatusCode::kInvalidArgument));
  o.budget_bytes = 0;  // default: the free memory now
  ASSERT_OK_AND_ASSIGN(auto tier, GpuTier::Open(o));
  EXPECT_GT(tier->budget(), 0u);
  EXPECT_LE(tier->budget(), info.total_bytes);
}

TEST(GpuTierGpu, HostTierPinsWithCudaHostRegister) {
  STRATA_SKIP_WITHOUT_GPU();
  HostTierOptions o;
  o.budget_bytes = 32 * kMiB;
  o.slab_bytes = 16 * kMiB;
  ASSERT_OK_AND_ASSIGN(auto tier, HostTier::Open(o));
  EXPECT_EQ(tier->pin_method(), "cudaHostRegister");
  ASSERT_OK_AND_ASSIGN(TierBlock b, tier->Allocate(kMiB));
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, b.data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);  // registered (page-locked)
}

#else

TEST(GpuTierGpu, NeedsCuda) { GTEST_SKIP() << "strata was built without CUDA"; }

#endif

}  // namespace
}  // namespace strata
