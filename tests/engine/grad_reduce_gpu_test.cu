// SPDX-License-Identifier: Apache-2.0
// GradReduce (engine/grad_reduce.h) on the CUDA backend (label gpu): a sum
// runs on the reductions' stream after the compute stream's work that wrote
// the accumulator, and the compute stream's work after Await sees the sum.
// The "sum" here is a kernel that waits, then adds one, so either order
// broken shows in the values. Skips without a GPU.
#include <cuda_runtime.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "engine/grad_reduce.h"
#include "kernels/backend.h"
#include "tests/test_util.h"

namespace strata {
namespace {

// Thread 0 of each block spins for about `cycles` clock cycles; then out[i] = value (set) or += value.
__global__ void DelayThen(float* out, size_t n, float value, bool add, long long cycles) {
  if (threadIdx.x == 0) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
  }
  __syncthreads();
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = add ? out[i] + value : value;
}

constexpr long long kDelay = 40'000'000;  // (about 20 ms at 2 GHz)

TEST(GradReduceGpu, SumRunsAfterTheGradientAndBeforeWhatAwaitsIt) {
  STRATA_SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(auto backend, kernels::MakeCudaBackend(0));
  constexpr int64_t kNumel = 1000, kPadded = 1024;
  ASSERT_OK_AND_ASSIGN(kernels::DeviceBuffer acc, backend->Allocate(kPadded * 4));
  ASSERT_OK_AND_ASSIGN(kernels::DeviceBuffer out, backend->Allocate(kPadded * 4));
  auto sum = [](size_t, float* a, int64_t, int64_t padded, void* stream) -> Status {
    DelayThen<<<4, 128, 0, static_cast<cudaStream_t>(stream)>>>(a, static_cast<size_t>(padded), 1.0f, true, kDelay);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? Status::OK() : Internal(cudaGetErrorString(e));
  };
  ASSERT_OK_AND_ASSIGN(auto g, GradReduce::Create(backend.get(), 0, sum));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // The "backward": late, on the compute stream, every value (padding too) 5.
    auto* compute = static_cast<cudaStream_t>(backend->native_stream());
    DelayThen<<<4, 128, 0, compute>>>(acc.as<float>(), kPadded, 5.0f, false, kDelay);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_OK(g->Submit(9, acc.as<float>(), kNumel, kPadded));
    ASSERT_OK(g->Await(9));
    ASSERT_OK(backend->CopyDeviceToDevice(out.data(), acc.data(), kPadded * 4));
    ASSERT_OK(backend->Synchronize());
    std::vector<float> host(kPadded);
    ASSERT_OK(backend->CopyToHost(host.data(), out.data(), kPadded * 4));
    // The gradient's values summed (5 + 1), the padding zeroed first (0 + 1).
    for (int64_t i = 0; i < kPadded; ++i) ASSERT_EQ(host[i], i < kNumel ? 6.0f : 1.0f) << "element " << i;
  }
  EXPECT_EQ(g->in_flight(), 0u);
}

}  // namespace
}  // namespace strata
