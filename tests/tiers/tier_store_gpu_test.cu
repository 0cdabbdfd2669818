// SPDX-License-Identifier: Apache-2.0
// GPU tests (label gpu) for the TierStore on a real device: round trips
// through device memory, pinned host and NVMe; Release(stream) ordering the
// write-back after the caller's kernel; reuse of evicted device memory for
// another tensor waiting for a kernel still reading it. Skip without a GPU.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "tests/test_util.h"
#include "tiers/tier_store.h"

namespace strata {
namespace {

using ::strata::testing::RandomBytes;

constexpr TierKind kGpu = TierKind::kGpu, kHost = TierKind::kHost, kNvme = TierKind::kNvme;

// Each block spins ~`cycles`, then out[i] = value + i.
__global__ void SlowFill(uint32_t* out, size_t n, uint32_t value, long long cycles) {
  if (threadIdx.x == 0) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
  }
  __syncthreads();
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = value + static_cast<uint32_t>(i);
}

// Each block spins ~`cycles`, then copies src to dst.
__global__ void SlowCopy(const uint32_t* src, uint32_t* dst, size_t n, long long cycles) {
  if (threadIdx.x == 0) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
  }
  __syncthreads();
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

long long CyclesFor(double seconds) {
  int khz = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  return static_cast<long long>(seconds * khz * 1000.0);
}

class StoreGpu : public ::testing::Test {
 protected:
  testing::TempDir dir;
  std::unique_ptr<TierStore> store;
  cudaStream_t stream = nullptr;

  void Open(uint64_t gpu_budget) {
    TierStoreOptions o;
    o.gpu_tier.budget_bytes = gpu_budget;
    o.gpu_tier.slab_bytes = 0;
    o.host_tier.budget_bytes = 256 * kMiB;
    o.staging_chunk_bytes = kMiB;
    NvmeOptions n;
    n.dirs = {dir.path()};
    n.buffered_fallback = true;  // where /var/tmp refuses O_DIRECT: same store paths
    o.nvme = n;
    auto r = TierStore::Open(o);
    ASSERT_OK(r.status());
    store = std::move(r).value();
    ASSERT_FALSE(store->gpu_tier()->stand_in());
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream) cudaStreamDestroy(stream);
  }
  std::vector<uint8_t> DeviceBytes(const void* p, size_t n) {
    std::vector<uint8_t> out(n);
    EXPECT_EQ(cudaMemcpy(out.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

TEST_F(StoreGpu, RoundTripsThroughDeviceHostAndNvme) {
  STRATA_SKIP_WITHOUT_GPU();
  Open(64 * kMiB);
  const uint64_t n = 9 * kMiB + 4097;
  ASSERT_OK_AND_ASSIGN(TensorId id, store->Create("w", DType::kU8, Shape{int64_t(n)}, kNvme));
  auto data = RandomBytes(n, 1);
  ASSERT_OK(store->Write(id, data.data(), n));
  ASSERT_OK(store->FlushAll());
  ASSERT_OK(store->Evict(id, kHost)->Wait());
  ASSERT_OK_AND_ASSIGN(TensorView v, store->Acquire(id, kGpu, Access::kRead));  // nvme -> staging -> gpu
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, v.data), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(DeviceBytes(v.data, n), data);
  ASSERT_OK(store->Release(id, kGpu, false));
  // Dirty on the device, then home through staging.
  ASSERT_OK_AND_ASSIGN(TensorView w, store->Acquire(id, kGpu, Access::kReadWrite));
  ASSERT_EQ(cudaMemset(w.data, 0x3c, 4096), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_OK(store->Release(id, kGpu, true));
  ASSERT_OK(store->Evict(id, kGpu)->Wait());
  std::memset(data.data(), 0x3c, 4096);
  std::vector<uint8_t> back(n);
  ASSERT_OK(store->Read(id, back.data(), n));
  EXPECT_EQ(back, data);
}

TEST_F(StoreGpu, WriteBackWaitsForTheKernelGivenAtRelease) {
  STRATA_SKIP_WITHOUT_GPU();
  Open(64 * kMiB);
  const size_t n = 1 << 20;  // uint32 elements
  ASSERT_OK_AND_ASSIGN(TensorId id, store->Create("act", DType::kI32, Shape{int64_t(n)}, kHost));
  ASSERT_OK_AND_ASSIGN(TensorView v, store->Acquire(id, kGpu, Access::kWriteDiscard));
  ASSERT_EQ(cudaMemset(v.data, 0, n * 4), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The kernel writes only after ~200 ms; the release returns at once.
  SlowFill<<<8, 256, 0, stream>>>(static_cast<uint32_t*>(v.data), n, 500, CyclesFor(0.2));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_OK(store->Release(id, kGpu, true, stream));
  ASSERT_OK(store->Evict(id, kGpu)->Wait());  // D2H write-back ordered after the kernel
  std::vector<uint32_t> back(n);
  ASSERT_OK(store->Read(id, back.data(), n * 4));
  EXPECT_EQ(back[0], 500u);
  EXPECT_EQ(back[n - 1], 500u + n - 1);
}

TEST_F(StoreGpu, ReusedMemoryWaitsForAKernelStillReadingIt) {
  STRATA_SKIP_WITHOUT_GPU();
  const size_t n = 1 << 20;  // uint32 elements: 4 MiB per tensor
  Open(4 * kMiB);            // room for one tensor on the device
  ASSERT_OK_AND_ASSIGN(TensorId a, store->Create("a", DType::kI32, Shape{int64_t(n)}, kHost));
  ASSERT_OK_AND_ASSIGN(TensorId b, store->Create("b", DType::kI32, Shape{int64_t(n)}, kHost));
  std::vector<uint32_t> da(n, 0xaaaaaaaa), db(n, 0xbbbbbbbb);
  ASSERT_OK(store->Write(a, da.data(), n * 4));
  ASSERT_OK(store->Write(b, db.data(), n * 4));
  uint32_t* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, n * 4), cudaSuccess);
  ASSERT_OK_AND_ASSIGN(TensorView va, store->Acquire(a, kGpu, Access::kRead));
  SlowCopy<<<8, 256, 0, stream>>>(static_cast<const uint32_t*>(va.data), out, n, CyclesFor(0.2));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_OK(store->Release(a, kGpu, false, stream));
  // b needs a's device memory: the store must not overwrite it before the kernel is done.
  ASSERT_OK_AND_ASSIGN(TensorView vb, store->Acquire(b, kGpu, Access::kRead));
  EXPECT_EQ(vb.data, va.data);  // the same memory, reused
  ASSERT_OK(store->Release(b, kGpu, false));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<uint32_t> got(n);
  ASSERT_EQ(cudaMemcpy(got.data(), out, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, da);  // the kernel saw a's data, not b's
  cudaFree(out);
}

TEST_F(StoreGpu, BudgetIsEnforcedOnTheDevice) {
  STRATA_SKIP_WITHOUT_GPU();
  Open(8 * kMiB);
  ASSERT_OK_AND_ASSIGN(TensorId a, store->Create("a", DType::kU8, Shape{6 << 20}, kHost));
  ASSERT_OK_AND_ASSIGN(TensorId b, store->Create("b", DType::kU8, Shape{6 << 20}, kHost));
  ASSERT_OK_AND_ASSIGN(TensorView va, store->Acquire(a, kGpu, Access::kRead));
  auto r = store->Acquire(b, kGpu, Access::kRead);
  EXPECT_THAT(r, ::strata::testing::StatusIs(StatusCode::kOutOfMemory));
  EXPECT_EQ(r.status().tier(), kGpu);
  ASSERT_OK(store->Release(a, kGpu, false));
  ASSERT_OK_AND_ASSIGN(TensorView vb, store->Acquire(b, kGpu, Access::kRead));
  EXPECT_LE(store->gpu_tier()->usage().peak_used, 8 * kMiB);
  ASSERT_OK(store->Release(b, kGpu, false));
  (void)va;
}

}  // namespace
}  // namespace strata
