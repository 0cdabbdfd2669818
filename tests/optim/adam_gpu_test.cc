// SPDX-License-Identifier: Apache-2.0
// GPU Adam (optim/cuda/adam.cu through optim::GpuAdamStep) against the CPU
// Adam, on random inputs and hyperparameters, every dtype combination, sizes
// 1..10^6+3, aligned (16-byte vector accesses) and misaligned (scalar path)
// arrays.
//
// Stated tolerance: none. Both sides execute the same IEEE fp32 operations in
// the same order (explicitly rounded CUDA intrinsics, no -use_fast_math,
// subnormals kept; conversions round to nearest even), so the results must be
// bitwise equal, except that NaN payloads may differ (the GPU produces
// canonical NaNs). When they are not, the test also reports whether the GPU
// result is still within the float64 reference's tolerance, to tell a
// rounding difference from a bug.
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "optim/cpu_adam.h"
#include "optim/gpu_adam.h"
#include "tests/optim/adam_test_util.h"
#include "tests/test_util.h"

#if STRATA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace strata::optim {
namespace {

using ::strata::optim::testing::AdamConfig;
using ::strata::optim::testing::AllConfigs;
using ::strata::optim::testing::ConfigName;
using ::strata::optim::testing::Encode;
using ::strata::optim::testing::ExpectMatchesReference;
using ::strata::optim::testing::RandomHyper;
using ::strata::optim::testing::RandomShard;
using ::strata::optim::testing::ShardData;
using ::strata::testing::StatusIs;

#if STRATA_WITH_CUDA

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

// Device memory for one array; `offset` bytes past a 256-byte aligned base.
struct DevBuf {
  void* base = nullptr;
  size_t offset = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (base) cudaFree(base);
  }
  uint8_t* ptr() const { return static_cast<uint8_t*>(base) + offset; }
};

// Copies the shard to the GPU (each array `elem_offset` elements past an
// aligned base), runs GpuAdamStep, copies the results back into `d`.
void RunOnGpu(ShardData& d, const AdamHyper& h, double gs, size_t elem_offset, uint64_t* nonfinite) {
  const AdamConfig& c = d.cfg;
  const size_t n = d.n;
  const size_t ss = DTypeSize(c.state), gsz = DTypeSize(c.grad), os = DTypeSize(c.out);
  DevBuf master, m, v, grad, out, count;
  auto alloc = [&](DevBuf& b, size_t elem, size_t bytes) {
    b.offset = elem_offset * elem;
    ASSERT_CUDA(cudaMalloc(&b.base, bytes + b.offset + 16));
  };
  alloc(master, 4, n * 4);
  alloc(m, ss, n * ss);
  alloc(v, ss, n * ss);
  alloc(grad, gsz, n * gsz);
  if (c.has_out) {
    alloc(out, os, n * os);
  }
  alloc(count, 0, sizeof(uint64_t));
  ASSERT_CUDA(cudaMemcpy(master.ptr(), d.master.data(), n * 4, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(m.ptr(), d.m.data(), n * ss, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(v.ptr(), d.v.data(), n * ss, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(grad.ptr(), d.grad.data(), n * gsz, cudaMemcpyHostToDevice));
  if (c.has_out) {
    ASSERT_CUDA(cudaMemcpy(out.ptr(), d.out(), n * os, cudaMemcpyHostToDevice));
  }
  ASSERT_CUDA(cudaMemset(count.ptr(), 0, sizeof(uint64_t)));
  AdamShard s;
  s.n = n;
  s.master = reinterpret_cast<float*>(master.ptr());
  s.exp_avg = m.ptr();
  s.exp_avg_sq = v.ptr();
  s.state_dtype = c.state;
  s.grad = grad.ptr();
  s.grad_dtype = c.grad;
  s.param_out = c.has_out ? out.ptr() : nullptr;
  s.param_out_dtype = c.out;
  ASSERT_OK(GpuAdamStep(s, h, gs, nullptr, reinterpret_cast<uint64_t*>(count.ptr())));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(cudaMemcpy(d.master.data(), master.ptr(), n * 4, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(d.m.data(), m.ptr(), n * ss, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(d.v.data(), v.ptr(), n * ss, cudaMemcpyDeviceToHost));
  if (c.has_out) {
    ASSERT_CUDA(cudaMemcpy(d.out(), out.ptr(), n * os, cudaMemcpyDeviceToHost));
  }
  ASSERT_CUDA(cudaMemcpy(nonfinite, count.ptr(), sizeof(uint64_t), cudaMemcpyDeviceToHost));
}

TEST(GpuAdam, BitwiseEqualToCpuAdam) {
  STRATA_SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(auto cpu, CpuAdam::Create());
  const uint64_t rng_seed = ::strata::testing::TestSeed(17);
  SCOPED_TRACE(::strata::testing::SeedNote(rng_seed));
  std::mt19937_64 rng(rng_seed);
  const size_t sizes[] = {1, 15, 17, 1023, 1000003};
  for (const AdamConfig& c : AllConfigs()) {
    for (size_t n : sizes) {
      for (size_t offset : {size_t{0}, size_t{1}}) {  // 1: misaligned for vector access
        SCOPED_TRACE(ConfigName(c) + " n=" + std::to_string(n) + " offset=" + std::to_string(offset));
        AdamHyper h = RandomHyper(rng);
        double gs = rng() % 3 == 0 ? 1.0 : 1.0 / 4096.0 * 0.37;
        ShardData before = RandomShard(c, n, n * 7 + offset);
        ShardData want = before;
        ASSERT_OK_AND_ASSIGN(AdamStepResult r, cpu->Step(want.Shard(), h, {.grad_scale = gs}));
        ShardData got = before;
        uint64_t nonfinite = ~uint64_t{0};
        ASSERT_NO_FATAL_FAILURE(RunOnGpu(got, h, gs, offset, &nonfinite));
        EXPECT_EQ(nonfinite, r.nonfinite_grads);
        std::string where;
        if (!got.SameValues(want, &where)) {
          ADD_FAILURE() << "GPU result differs from the CPU Adam: " << where
                        << " (checking the GPU result against the float64 reference next)";
          ExpectMatchesReference(before, got, h, gs);
        }
      }
    }
  }
}

TEST(GpuAdam, CountsNonFiniteGradients) {
  STRATA_SKIP_WITHOUT_GPU();
  for (DType g : {DType::kF32, DType::kF16, DType::kBF16}) {
    AdamConfig c{g, DType::kF32, true, DType::kBF16};
    SCOPED_TRACE(ConfigName(c));
    const size_t n = 100003;
    ShardData d = RandomShard(c, n, 5);
    Encode(g, d.grad.data(), 0, std::numeric_limits<float>::quiet_NaN());
    Encode(g, d.grad.data(), n / 2, std::numeric_limits<float>::infinity());
    Encode(g, d.grad.data(), n - 1, -std::numeric_limits<float>::infinity());
    ShardData want = d;
    ASSERT_OK_AND_ASSIGN(auto cpu, CpuAdam::Create());
    ASSERT_OK_AND_ASSIGN(AdamStepResult r, cpu->Step(want.Shard(), AdamHyper{}));
    EXPECT_EQ(r.nonfinite_grads, 3u);
    uint64_t nonfinite = 0;
    ASSERT_NO_FATAL_FAILURE(RunOnGpu(d, AdamHyper{}, 1.0, 0, &nonfinite));
    EXPECT_EQ(nonfinite, 3u);
    std::string where;
    EXPECT_TRUE(d.SameValues(want, &where)) << where;  // NaN payloads may differ
  }
}

TEST(GpuAdam, RejectsBadShardsBeforeLaunching) {
  STRATA_SKIP_WITHOUT_GPU();
  AdamShard s;
  s.n = 16;  // null pointers
  EXPECT_THAT(GpuAdamStep(s, AdamHyper{}, 1.0, nullptr), StatusIs(StatusCode::kInvalidArgument));
}

#else  // !STRATA_WITH_CUDA

TEST(GpuAdam, NeedsACudaBuild) {
  STRATA_SKIP_WITHOUT_GPU();  // skips: a build without CUDA reports no GPU
}

#endif

}  // namespace
}  // namespace strata::optim
