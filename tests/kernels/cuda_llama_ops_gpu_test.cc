// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's Llama ops against the CPU backend: RMSNorm, RoPE
// (default, linear, llama3), SwiGLU forward and backward, and grouped-query
// attention (4:2 and multi-query) on the simple path and every flash variant
// that runs here (the wgmma forward falls back to the portable kernel for
// GQA), each flash run twice: bitwise the same.
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/kernels/backend_compare.h"
#include "tests/test_util.h"

namespace strata::kernels {
namespace {

using ::strata::testing::CudaVsCpu;
using ::strata::testing::Mirror;
using ::strata::testing::OpKind;
using ::strata::testing::RandomFloats;
using ::strata::testing::Tolerance;

const DType kF32 = DType::kF32, kBF16 = DType::kBF16, kF16 = DType::kF16;

class CudaLlamaOpsTest : public CudaVsCpu, public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_P(CudaLlamaOpsTest, RmsNormMatchesCpu) {
  const DType dt = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 64}, {127, 96}, {1000, 2048}}) {
    SCOPED_TRACE(std::to_string(N) + " x " + std::to_string(C));
    auto x = mir.MakeFloats(RandomFloats(N * C, seed_, -2.f, 2.f), dt);
    auto w = mir.MakeFloats(RandomFloats(C, seed_ + 1, 0.5f, 1.5f), dt);
    Mirror y = mir.Make(N * C * DTypeSize(dt)), rstd = mir.Make(N * 4);
    const RmsNormArgs a{N, C, dt, 1e-5f};
    ASSERT_OK(cpu_->RmsNormForward(a, y.ref.data(), rstd.ref.as<float>(), x.ref.data(), w.ref.data()));
    ASSERT_OK(gpu_->RmsNormForward(a, y.gpu.data(), rstd.gpu.as<float>(), x.gpu.data(), w.gpu.data()));
    EXPECT_CLOSE(mir, y, dt, Tolerance(dt, OpKind::kReduction), "y");
    EXPECT_CLOSE(mir, rstd, kF32, 2e-5, "rstd");
    mir.Set(rstd, mir.RefBytes(rstd));
    auto dy = mir.MakeFloats(RandomFloats(N * C, seed_ + 2), dt);
    for (bool accumulate : {false, true}) {
      auto dx = mir.MakeFloats(RandomFloats(N * C, seed_ + 3), dt);  // accumulated into
      Mirror dw = accumulate ? mir.MakeFloats(RandomFloats(C, seed_ + 4), kF32) : mir.Make(C * 4);
      ASSERT_OK(cpu_->RmsNormBackward(a, dx.ref.data(), dw.ref.data(), kF32, accumulate, dy.ref.data(), x.ref.data(),
                                      w.ref.data(), rstd.ref.as<float>()));
      ASSERT_OK(gpu_->RmsNormBackward(a, dx.gpu.data(), dw.gpu.data(), kF32, accumulate, dy.gpu.data(), x.gpu.data(),
                                      w.gpu.data(), rstd.gpu.as<float>()));
      EXPECT_CLOSE(mir, dx, dt, Tolerance(dt, OpKind::kReduction), "dx");
      EXPECT_CLOSE(mir, dw, kF32, Tolerance(kF32, OpKind::kReduction), "dweight");
    }
  }
}

TEST_P(CudaLlamaOpsTest, RopeMatchesCpu) {
  const DType dt = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  for (RopeParams::Type type : {RopeParams::kDefault, RopeParams::kLinear, RopeParams::kLlama3}) {
    SCOPED_TRACE(static_cast<int>(type));
    RopeParams p;
    p.type = type, p.theta = 500000.f, p.factor = 8.f, p.original_max_positions = 64;
    const int64_t B = 2, T = 300, H = 6, KV = 2, D = 128, W = (H + 2 * KV) * D;
    const RopeArgs a{B, T, W, H + KV, D, dt, p};
    auto x = mir.MakeFloats(RandomFloats(B * T * W, seed_, -2.f, 2.f), dt);
    Mirror y = mir.Make(B * T * W * DTypeSize(dt));
    ASSERT_OK(cpu_->RopeForward(a, y.ref.data(), x.ref.data()));
    ASSERT_OK(gpu_->RopeForward(a, y.gpu.data(), x.gpu.data()));
    // Angles up to 300 rad: sincosf's and the CPU's cos/sin of the same fp32
    // angle differ by an ulp or so of the result.
    EXPECT_CLOSE(mir, y, dt, Tolerance(dt, OpKind::kReduction), "y");
    ASSERT_OK(cpu_->RopeBackward(a, x.ref.data(), x.ref.data()));  // in place
    ASSERT_OK(gpu_->RopeBackward(a, x.gpu.data(), x.gpu.data()));
    EXPECT_CLOSE(mir, x, dt, Tolerance(dt, OpKind::kReduction), "dx (in place)");
  }
  // A decoder's rows: positions 2000.. (RopeArgs::position_offset).
  const int64_t R = 5, H = 4, KV = 2, D = 64, W = (H + 2 * KV) * D;
  RopeArgs a{1, R, W, H + KV, D, dt, RopeParams{}};
  a.position_offset = 2000;
  auto x = mir.MakeFloats(RandomFloats(R * W, seed_ + 2, -2.f, 2.f), dt);
  Mirror y = mir.Make(R * W * DTypeSize(dt));
  ASSERT_OK(cpu_->RopeForward(a, y.ref.data(), x.ref.data()));
  ASSERT_OK(gpu_->RopeForward(a, y.gpu.data(), x.gpu.data()));
  EXPECT_CLOSE(mir, y, dt, Tolerance(dt, OpKind::kReduction), "y at position_offset 2000");
}

TEST_P(CudaLlamaOpsTest, SwiGluMatchesCpu) {
  const DType dt = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const int64_t rows = 257, F = 1000;
  auto in = mir.MakeFloats(RandomFloats(rows * 2 * F, seed_, -4.f, 4.f), dt);
  Mirror out = mir.Make(rows * F * DTypeSize(dt));
  ASSERT_OK(cpu_->SwiGluForward(out.ref.data(), in.ref.data(), rows, F, dt));
  ASSERT_OK(gpu_->SwiGluForward(out.gpu.data(), in.gpu.data(), rows, F, dt));
  EXPECT_CLOSE(mir, out, dt, Tolerance(dt, OpKind::kElementwise), "out");
  auto dout = mir.MakeFloats(RandomFloats(rows * F, seed_ + 1), dt);
  Mirror din = mir.Make(rows * 2 * F * DTypeSize(dt));
  ASSERT_OK(cpu_->SwiGluBackward(din.ref.data(), dout.ref.data(), in.ref.data(), rows, F, dt));
  ASSERT_OK(gpu_->SwiGluBackward(din.gpu.data(), dout.gpu.data(), in.gpu.data(), rows, F, dt));
  EXPECT_CLOSE(mir, din, dt, Tolerance(dt, OpKind::kElementwise), "din");
  // In place over the input: the same bits as out of place.
  const std::vector<uint8_t> apart = mir.GpuBytes(din);
  ASSERT_OK(gpu_->SwiGluBackward(in.gpu.data(), dout.gpu.data(), in.gpu.data(), rows, F, dt));
  ASSERT_OK(gpu_->Synchronize());
  EXPECT_EQ(mir.GpuBytes(in), apart) << "in place differs from out of place";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaLlamaOpsTest, ::testing::Values(kF32, kBF16, kF16),
                         [](const auto& i) { return std::string(DTypeName(i.param)); });

// ---- grouped-query attention ---------------------------------------------------

using GqaParam = std::tuple<DType, int64_t /*T*/, int64_t /*KV*/, int64_t /*D*/>;

class CudaGqaTest : public CudaVsCpu, public ::testing::TestWithParam<GqaParam> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_P(CudaGqaTest, SimpleAndEveryFlashVariantMatchCpu) {
  auto [dt, T, KV, D] = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const int64_t B = 2, H = 8, C = H * D;
  const AttentionShape s{B, T, H, D, dt, 0.f, KV};
  const size_t es = DTypeSize(dt);
  const double tol = Tolerance(dt, OpKind::kReduction);
  auto qkv = mir.MakeFloats(RandomFloats(B * T * s.qkv_width(), seed_, -1.5f, 1.5f), dt);
  auto dout = mir.MakeFloats(RandomFloats(B * T * C, seed_ + 1), dt);
  Mirror out = mir.Make(B * T * C * es), lse = mir.Make(B * H * T * 4), dqkv = mir.Make(B * T * s.qkv_width() * es);
  ASSERT_OK(cpu_->AttentionForward(s, out.ref.data(), lse.ref.as<float>(), qkv.ref.data(), nullptr));
  ASSERT_OK(cpu_->AttentionBackward(s, dqkv.ref.data(), dout.ref.data(), qkv.ref.data(), out.ref.data(),
                                    lse.ref.as<float>(), nullptr));
  auto run = [&](Backend* be, const std::string& path) {
    SCOPED_TRACE(path);
    ASSERT_OK_AND_ASSIGN(DeviceBuffer ws, be->Allocate(std::max<size_t>(16, be->AttentionWorkspaceBytes(s))));
    mir.PoisonGpu(out), mir.PoisonGpu(lse), mir.PoisonGpu(dqkv);
    ASSERT_OK(be->AttentionForward(s, out.gpu.data(), lse.gpu.as<float>(), qkv.gpu.data(), ws.data()));
    ASSERT_OK(be->Synchronize());
    EXPECT_CLOSE(mir, out, dt, tol, "out");
    EXPECT_CLOSE(mir, lse, kF32, 5e-5, "lse");
    // The backward from the CPU's forward results.
    mir.Set(out, mir.RefBytes(out));
    mir.Set(lse, mir.RefBytes(lse));
    ASSERT_OK(be->AttentionBackward(s, dqkv.gpu.data(), dout.gpu.data(), qkv.gpu.data(), out.gpu.data(),
                                    lse.gpu.as<float>(), ws.data()));
    ASSERT_OK(be->Synchronize());
    EXPECT_CLOSE(mir, dqkv, dt, tol, "dqkv");
    const std::vector<uint8_t> first = mir.GpuBytes(dqkv);
    mir.PoisonGpu(dqkv);
    ASSERT_OK(be->AttentionBackward(s, dqkv.gpu.data(), dout.gpu.data(), qkv.gpu.data(), out.gpu.data(),
                                    lse.gpu.as<float>(), ws.data()));
    // `be` runs on its own stream: wait for it before reading its result.
    ASSERT_OK(be->Synchronize());
    EXPECT_EQ(mir.GpuBytes(dqkv), first) << "the backward is not deterministic";
  };
  CudaBackendOptions o;
  o.attention = AttentionImpl::kSimple;
  ASSERT_OK_AND_ASSIGN(auto simple, ::strata::testing::MakeBackendUnderTest(o));
  run(simple.get(), "simple");
  if (::strata::testing::GpuTestsOnCpu() || dt == kF32 || ::strata::testing::GpuCcMajor() < 8) return;
  o.attention = AttentionImpl::kFlash;
  ASSERT_OK_AND_ASSIGN(auto flash, MakeCudaBackend(o));
  for (const FlashVariant& v : kFlashVariants) {
    if (!::strata::testing::FlashVariantRunsHere(v)) continue;
    ASSERT_OK(SetFlashVariant(flash.get(), v.name));
    run(flash.get(), std::string("flash ") + v.name);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGqaTest,
                         ::testing::Values(GqaParam{kBF16, 1, 2, 64}, GqaParam{kBF16, 300, 2, 64},
                                           GqaParam{kBF16, 513, 1, 128}, GqaParam{kF16, 200, 4, 128},
                                           GqaParam{kF32, 77, 2, 32}));

}  // namespace
}  // namespace strata::kernels
