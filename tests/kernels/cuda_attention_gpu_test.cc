// SPDX-License-Identifier: Apache-2.0
// Causal attention on the CUDA backend, both paths (flash and simple),
// against the CPU backend and against each other: T = 1, 127, 1000 and tiles
// cut mid-way; head counts 1, 3, 5, 6, 12, 16; head dims 16..128 including
// ones the flash kernels pad (16, 40, 96) and one they do not take (20).
// Every flash kernel variant (kFlashVariants) is checked against the CPU and
// for bitwise run-to-run determinism.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/kernels/backend_compare.h"
#include "tests/test_util.h"

namespace strata::kernels {
namespace {

using ::strata::testing::CudaVsCpu;
using ::strata::testing::Mirror;
using ::strata::testing::Mirrors;
using ::strata::testing::OpKind;
using ::strata::testing::RandomFloats;
using ::strata::testing::RelErr;
using ::strata::testing::StatusIs;
using ::strata::testing::ToDoubles;
using ::strata::testing::Tolerance;

struct AttnCase {
  std::string name;
  DType dt;
  int64_t B, T, H, D;
  float scale = 0.f;  // 0: 1/sqrt(D)
};

// Would the flash kernels take this case (on sm_80+)?
bool FlashShape(const AttnCase& c) {
  return (c.dt == DType::kBF16 || c.dt == DType::kF16) && c.D % 8 == 0 && c.D <= 128;
}

class CudaAttentionTest : public CudaVsCpu, public ::testing::TestWithParam<AttnCase> {
 protected:
  void SetUp() override {
    STRATA_SETUP_CUDA_VS_CPU();
    CudaBackendOptions o;
    o.attention = AttentionImpl::kSimple;
    ASSERT_OK_AND_ASSIGN(simple_, ::strata::testing::MakeBackendUnderTest(o));
    sm80_ = ::strata::testing::GpuCcMajor() >= 8;
    const AttnCase& c = GetParam();
    shape_ = AttentionShape{c.B, c.T, c.H, c.D, c.dt, c.scale};
    C_ = c.H * c.D;
  }

  // Workspace for `be` (may be 0 bytes).
  DeviceBuffer Workspace(Backend* be) {
    auto r = be->Allocate(be->AttentionWorkspaceBytes(shape_));
    EXPECT_OK(r.status());
    return r.ok() ? std::move(r).value() : DeviceBuffer();
  }
  double OutTol() const { return Tolerance(GetParam().dt, OpKind::kReduction); }

  std::unique_ptr<Backend> simple_;
  bool sm80_ = false;
  AttentionShape shape_;
  int64_t C_ = 0;
};

// dq, dk and dv of a dqkv [B, T, 3C] against the reference, each on its own
// (to say which is off). At T = 1 the softmax is the constant 1, so dq and dk
// are exactly zero and both backends return rounding noise (dP - D of a
// rounded O): a relative error of noise against noise says nothing; they
// must be noise at the scale of dv, the gradient that is not zero.
void ExpectPartsClose(const std::vector<double>& g, const std::vector<double>& r, const AttnCase& c,
                      int64_t C, double tol, const std::string& path) {
  const char* part[] = {"dq", "dk", "dv"};
  std::vector<double> gp[3], rp[3];
  for (int p = 0; p < 3; ++p)
    for (int64_t row = 0; row < c.B * c.T; ++row)
      for (int64_t j = 0; j < C; ++j) {
        gp[p].push_back(g[row * 3 * C + p * C + j]);
        rp[p].push_back(r[row * 3 * C + p * C + j]);
      }
  auto norm = [](const std::vector<double>& v) { return std::sqrt(std::inner_product(v.begin(), v.end(), v.begin(), 0.0)); };
  for (int p = 0; p < 3; ++p) {
    if (c.T == 1 && p < 2) {
      EXPECT_LE(norm(gp[p]), tol * norm(rp[2])) << part[p] << " (" << path << ") is not ~0 at T = 1";
      continue;
    }
    EXPECT_LE(RelErr(gp[p], rp[p]), tol) << part[p] << " (" << path << ")";
  }
}

TEST_P(CudaAttentionTest, ForwardMatchesCpu) {
  const AttnCase c = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const DType dt = c.dt;
  const size_t es = DTypeSize(dt);
  auto qkv = mir.MakeFloats(RandomFloats(c.B * c.T * 3 * C_, seed_, -1.5f, 1.5f), dt);
  Mirror out = mir.Make(c.B * c.T * C_ * es);
  Mirror lse = mir.Make(c.B * c.H * c.T * 4);
  ASSERT_OK(cpu_->AttentionForward(shape_, out.ref.data(), lse.ref.as<float>(), qkv.ref.data(), nullptr));
  // Default path (flash where it applies).
  DeviceBuffer ws = Workspace(gpu_.get());
  ASSERT_OK(gpu_->AttentionForward(shape_, out.gpu.data(), lse.gpu.as<float>(), qkv.gpu.data(), ws.data()));
  const std::string path = (FlashShape(c) && sm80_) ? "flash" : "simple";
  EXPECT_CLOSE(mir, out, dt, OutTol(), "out (" + path + ")");
  EXPECT_CLOSE(mir, lse, DType::kF32, 5e-5, "lse (" + path + ")");

  // Simple path, always.
  mir.PoisonGpu(out);
  mir.PoisonGpu(lse);
  DeviceBuffer ws2 = Workspace(simple_.get());
  ASSERT_OK(simple_->AttentionForward(shape_, out.gpu.data(), lse.gpu.as<float>(), qkv.gpu.data(), ws2.data()));
  ASSERT_OK(simple_->Synchronize());
  EXPECT_CLOSE(mir, out, dt, OutTol(), "out (simple)");
  EXPECT_CLOSE(mir, lse, DType::kF32, 5e-5, "lse (simple)");
}

TEST_P(CudaAttentionTest, BackwardMatchesCpu) {
  const AttnCase c = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const DType dt = c.dt;
  const size_t es = DTypeSize(dt);
  auto qkv = mir.MakeFloats(RandomFloats(c.B * c.T * 3 * C_, seed_, -1.5f, 1.5f), dt);
  auto dout = mir.MakeFloats(RandomFloats(c.B * c.T * C_, seed_ + 1), dt);
  Mirror out = mir.Make(c.B * c.T * C_ * es);
  Mirror lse = mir.Make(c.B * c.H * c.T * 4);
  ASSERT_OK(cpu_->AttentionForward(shape_, out.ref.data(), lse.ref.as<float>(), qkv.ref.data(), nullptr));
  // Both backward passes start from the CPU's forward results.
  mir.Set(out, mir.RefBytes(out));
  mir.Set(lse, mir.RefBytes(lse));
  Mirror dqkv = mir.Make(c.B * c.T * 3 * C_ * es);
  ASSERT_OK(cpu_->AttentionBackward(shape_, dqkv.ref.data(), dout.ref.data(), qkv.ref.data(),
                                    out.ref.data(), lse.ref.as<float>(), nullptr));
  DeviceBuffer ws = Workspace(gpu_.get());
  ASSERT_OK(gpu_->AttentionBackward(shape_, dqkv.gpu.data(), dout.gpu.data(), qkv.gpu.data(),
                                    out.gpu.data(), lse.gpu.as<float>(), ws.data()));
  const std::string path = (FlashShape(c) && sm80_) ? "flash" : "simple";
  EXPECT_CLOSE(mir, dqkv, dt, OutTol(), "dqkv (" + path + ")");
  // Per part, to say which of dq, dk, dv is off.
  {
    ExpectPartsClose(mir.Gpu(dqkv, dt), mir.Ref(dqkv, dt), c, C_, OutTol(), path);
  }

  mir.PoisonGpu(dqkv);
  DeviceBuffer ws2 = Workspace(simple_.get());
  ASSERT_OK(simple_->AttentionBackward(shape_, dqkv.gpu.data(), dout.gpu.data(), qkv.gpu.data(),
                                       out.gpu.data(), lse.gpu.as<float>(), ws2.data()));
  ASSERT_OK(simple_->Synchronize());
  EXPECT_CLOSE(mir, dqkv, dt, OutTol(), "dqkv (simple)");
}

// The flash kernels against the simple path on the GPU (same inputs, the
// simple path's forward results feeding both backward passes), and the flash
// backward twice: bitwise the same.
TEST_P(CudaAttentionTest, FlashMatchesSimpleAndIsDeterministic) {
  const AttnCase c = GetParam();
  if (!FlashShape(c) || !sm80_) GTEST_SKIP() << "the flash kernels do not take this case";
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  CudaBackendOptions o;
  o.attention = AttentionImpl::kFlash;
  ASSERT_OK_AND_ASSIGN(auto flash, ::strata::testing::MakeBackendUnderTest(o));
  const DType dt = c.dt;
  const size_t es = DTypeSize(dt);
  // Here the "reference" side of the mirrors is the simple CUDA path.
  Mirrors mir(flash.get(), simple_.get());
  auto qkv = mir.MakeFloats(RandomFloats(c.B * c.T * 3 * C_, seed_, -2.f, 2.f), dt);
  auto dout = mir.MakeFloats(RandomFloats(c.B * c.T * C_, seed_ + 1), dt);
  Mirror out = mir.Make(c.B * c.T * C_ * es);
  Mirror lse = mir.Make(c.B * c.H * c.T * 4);
  DeviceBuffer wf = Workspace(flash.get()), wsim = Workspace(simple_.get());
  ASSERT_OK(simple_->AttentionForward(shape_, out.ref.data(), lse.ref.as<float>(), qkv.ref.data(), wsim.data()));
  ASSERT_OK(flash->AttentionForward(shape_, out.gpu.data(), lse.gpu.as<float>(), qkv.gpu.data(), wf.data()));
  EXPECT_CLOSE(mir, out, dt, OutTol(), "out flash vs simple");
  EXPECT_CLOSE(mir, lse, DType::kF32, 5e-5, "lse flash vs simple");
  std::vector<uint8_t> out_first = mir.GpuBytes(out), lse_first = mir.GpuBytes(lse);
  mir.PoisonGpu(out);
  mir.PoisonGpu(lse);
  ASSERT_OK(flash->AttentionForward(shape_, out.gpu.data(), lse.gpu.as<float>(), qkv.gpu.data(), wf.data()));
  EXPECT_TRUE(mir.GpuBytes(out) == out_first) << "flash forward out differs run to run";
  EXPECT_TRUE(mir.GpuBytes(lse) == lse_first) << "flash forward lse differs run to run";

  mir.Set(out, mir.RefBytes(out));
  mir.Set(lse, mir.RefBytes(lse));
  Mirror dqkv = mir.Make(c.B * c.T * 3 * C_ * es);
  ASSERT_OK(simple_->AttentionBackward(shape_, dqkv.ref.data(), dout.ref.data(), qkv.ref.data(), out.ref.data(), lse.ref.as<float>(), wsim.data()));
  ASSERT_OK(flash->AttentionBackward(shape_, dqkv.gpu.data(), dout.gpu.data(), qkv.gpu.data(), out.gpu.data(), lse.gpu.as<float>(), wf.data()));
  EXPECT_CLOSE(mir, dqkv, dt, OutTol(), "dqkv flash vs simple");
  std::vector<uint8_t> first = mir.GpuBytes(dqkv);
  mir.PoisonGpu(dqkv);
  ASSERT_OK(flash->AttentionBackward(shape_, dqkv.gpu.data(), dout.gpu.data(), qkv.gpu.data(), out.gpu.data(), lse.gpu.as<float>(), wf.data()));
  EXPECT_TRUE(mir.GpuBytes(dqkv) == first) << "flash backward differs run to run";
}

// Every flash kernel variant against the CPU backend: forward (out, lse) and
// backward (dq, dk, dv, from the CPU's forward results), and each run twice:
// bitwise the same.
TEST_P(CudaAttentionTest, EveryFlashVariantMatchesCpuAndIsDeterministic) {
  const AttnCase c = GetParam();
  if (!FlashShape(c) || !sm80_) GTEST_SKIP() << "the flash kernels do not take this case";
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const DType dt = c.dt;
  const size_t es = DTypeSize(dt);
  auto qkv = mir.MakeFloats(RandomFloats(c.B * c.T * 3 * C_, seed_, -2.f, 2.f), dt);
  auto dout = mir.MakeFloats(RandomFloats(c.B * c.T * C_, seed_ + 1), dt);
  Mirror out = mir.Make(c.B * c.T * C_ * es);
  Mirror lse = mir.Make(c.B * c.H * c.T * 4);
  Mirror dqkv = mir.Make(c.B * c.T * 3 * C_ * es);
  ASSERT_OK(cpu_->AttentionForward(shape_, out.ref.data(), lse.ref.as<float>(), qkv.ref.data(), nullptr));
  ASSERT_OK(cpu_->AttentionBackward(shape_, dqkv.ref.data(), dout.ref.data(), qkv.ref.data(),
                                    out.ref.data(), lse.ref.as<float>(), nullptr));
  CudaBackendOptions o;
  o.attention = AttentionImpl::kFlash;
  ASSERT_OK_AND_ASSIGN(auto flash, MakeCudaBackend(o));
  for (const FlashVariant& v : kFlashVariants) {
    SCOPED_TRACE(std::string("variant ") + v.name);
    if (!::strata::testing::FlashVariantRunsHere(v)) {
      // Refused up front (the wgmma kernels off Hopper), never launched.
      EXPECT_THAT(SetFlashVariant(flash.get(), v.name), StatusIs(StatusCode::kFailedPrecondition));
      continue;
    }
    ASSERT_OK(SetFlashVariant(flash.get(), v.name));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer ws, flash->Allocate(std::max<size_t>(16, flash->AttentionWorkspaceBytes(shape_))));
    // Forward vs the CPU, then again: bitwise the same.
    mir.PoisonGpu(out);
    mir.PoisonGpu(lse);
    ASSERT_OK(flash->AttentionForward(shape_, out.gpu.data(), lse.gpu.as<float>(), qkv.gpu.data(), ws.data()));
    ASSERT_OK(flash->Synchronize());
    EXPECT_CLOSE(mir, out, dt, OutTol(), std::string("out (") + v.name + ")");
    EXPECT_CLOSE(mir, lse, DType::kF32, 5e-5, std::string("lse (") + v.name + ")");
    const std::vector<uint8_t> out1 = mir.GpuBytes(out), lse1 = mir.GpuBytes(lse);
    mir.PoisonGpu(out);
    mir.PoisonGpu(lse);
    ASSERT_OK(flash->AttentionForward(shape_, out.gpu.data(), lse.gpu.as<float>(), qkv.gpu.data(), ws.data()));
    ASSERT_OK(flash->Synchronize());
    EXPECT_TRUE(mir.GpuBytes(out) == out1) << v.name << ": forward out differs run to run";
    EXPECT_TRUE(mir.GpuBytes(lse) == lse1) << v.name << ": forward lse differs run to run";

    // Backward from the CPU's forward results, vs the CPU, per part.
    mir.Set(out, mir.RefBytes(out));
    mir.Set(lse, mir.RefBytes(lse));
    mir.PoisonGpu(dqkv);
    ASSERT_OK(flash->AttentionBackward(shape_, dqkv.gpu.data(), dout.gpu.data(), qkv.gpu.data(),
                                       out.gpu.data(), lse.gpu.as<float>(), ws.data()));
    ASSERT_OK(flash->Synchronize());
    EXPECT_CLOSE(mir, dqkv, dt, OutTol(), std::string("dqkv (") + v.name + ")");
    ExpectPartsClose(mir.Gpu(dqkv, dt), mir.Ref(dqkv, dt), c, C_, OutTol(), v.name);
    const std::vector<uint8_t> d1 = mir.GpuBytes(dqkv);
    mir.PoisonGpu(dqkv);
    ASSERT_OK(flash->AttentionBackward(shape_, dqkv.gpu.data(), dout.gpu.data(), qkv.gpu.data(),
                                       out.gpu.data(), lse.gpu.as<float>(), ws.data()));
    ASSERT_OK(flash->Synchronize());
    EXPECT_TRUE(mir.GpuBytes(dqkv) == d1) << v.name << ": backward differs run to run";
  }
}

// The TMA-fed forwards (v5, v5pp) run v3's products in v3's order: the same
// bits, so a pipeline slip (a stage read before it landed or after it was
// refilled) shows even where it would stay inside the CPU tolerance.
TEST_P(CudaAttentionTest, TmaForwardHasTheWgmmaForwardsBits) {
  const AttnCase c = GetParam();
  if (!FlashShape(c) || !sm80_) GTEST_SKIP() << "the flash kernels do not take this case";
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  const FlashVariant* v3 = FindFlashVariant("v3");
  ASSERT_NE(v3, nullptr);
  if (!::strata::testing::FlashVariantRunsHere(*v3)) GTEST_SKIP() << "the wgmma kernels need an sm_90a build on a 9.0 GPU";
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const size_t es = DTypeSize(c.dt);
  auto qkv = mir.MakeFloats(RandomFloats(c.B * c.T * 3 * C_, seed_, -2.f, 2.f), c.dt);
  Mirror out = mir.Make(c.B * c.T * C_ * es);
  Mirror lse = mir.Make(c.B * c.H * c.T * 4);
  CudaBackendOptions o;
  o.attention = AttentionImpl::kFlash;
  ASSERT_OK_AND_ASSIGN(auto flash, MakeCudaBackend(o));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer ws, flash->Allocate(std::max<size_t>(16, flash->AttentionWorkspaceBytes(shape_))));
  auto forward = [&](const char* name, std::vector<uint8_t>* o_bytes, std::vector<uint8_t>* l_bytes) {
    ASSERT_OK(SetFlashVariant(flash.get(), name));
    mir.PoisonGpu(out);
    mir.PoisonGpu(lse);
    ASSERT_OK(flash->AttentionForward(shape_, out.gpu.data(), lse.gpu.as<float>(), qkv.gpu.data(), ws.data()));
    ASSERT_OK(flash->Synchronize());
    *o_bytes = mir.GpuBytes(out);
    *l_bytes = mir.GpuBytes(lse);
  };
  std::vector<uint8_t> out3, lse3;
  forward("v3", &out3, &lse3);
  for (const char* name : {"v5", "v5pp"}) {
    std::vector<uint8_t> o5, l5;
    forward(name, &o5, &l5);
    EXPECT_TRUE(o5 == out3) << name << ": out differs from v3's";
    EXPECT_TRUE(l5 == lse3) << name << ": lse differs from v3's";
  }
}

// dqkv's bytes after `variant`'s backward on `flash`, run from a workspace
// and a dqkv filled with 0xFF (NaN): a dS tile read before it is written,
// or an element never stored, shows in the bits.
std::vector<uint8_t> PoisonedBackwardBytes(Mirrors& mir, Backend* flash, const char* variant,
                                           const AttentionShape& s, Mirror& dqkv, const Mirror& dout,
                                           const Mirror& qkv, const Mirror& out, const Mirror& lse) {
  EXPECT_OK(SetFlashVariant(flash, variant));
  const size_t ws_bytes = std::max<size_t>(16, flash->AttentionWorkspaceBytes(s));
  auto ws = flash->Allocate(ws_bytes);
  EXPECT_OK(ws.status());
  if (!ws.ok()) return {};
  EXPECT_OK(flash->Memset(ws->data(), 0xFF, ws_bytes));
  mir.PoisonGpu(dqkv);
  EXPECT_OK(flash->AttentionBackward(s, dqkv.gpu.data(), dout.gpu.data(), qkv.gpu.data(), out.gpu.data(),
                                     lse.gpu.as<float>(), ws->data()));
  EXPECT_OK(flash->Synchronize());
  return mir.GpuBytes(dqkv);
}

// The TMA-fed backward (v6) runs v4's products in v4's order: the same dqkv
// bits, so a pipeline slip (a Q/dO stage refilled early, a dS staging buffer
// overwritten before its bulk store read it, a dS tile image the dQ pass
// reads before it is written) shows even inside the CPU tolerance.
TEST_P(CudaAttentionTest, TmaBackwardHasTheWgmmaBackwardsBits) {
  const AttnCase c = GetParam();
  if (!FlashShape(c) || !sm80_) GTEST_SKIP() << "the flash kernels do not take this case";
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  const FlashVariant* v4 = FindFlashVariant("v4");
  ASSERT_NE(v4, nullptr);
  if (!::strata::testing::FlashVariantRunsHere(*v4)) GTEST_SKIP() << "the wgmma kernels need an sm_90a build on a 9.0 GPU";
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const size_t es = DTypeSize(c.dt);
  auto qkv = mir.MakeFloats(RandomFloats(c.B * c.T * 3 * C_, seed_, -2.f, 2.f), c.dt);
  auto dout = mir.MakeFloats(RandomFloats(c.B * c.T * C_, seed_ + 1), c.dt);
  Mirror out = mir.Make(c.B * c.T * C_ * es);
  Mirror lse = mir.Make(c.B * c.H * c.T * 4);
  Mirror dqkv = mir.Make(c.B * c.T * 3 * C_ * es);
  ASSERT_OK(cpu_->AttentionForward(shape_, out.ref.data(), lse.ref.as<float>(), qkv.ref.data(), nullptr));
  mir.Set(out, mir.RefBytes(out));
  mir.Set(lse, mir.RefBytes(lse));
  CudaBackendOptions o;
  o.attention = AttentionImpl::kFlash;
  ASSERT_OK_AND_ASSIGN(auto flash, MakeCudaBackend(o));
  const std::vector<uint8_t> d4 = PoisonedBackwardBytes(mir, flash.get(), "v4", shape_, dqkv, dout, qkv, out, lse);
  const std::vector<uint8_t> d6 = PoisonedBackwardBytes(mir, flash.get(), "v6", shape_, dqkv, dout, qkv, out, lse);
  EXPECT_TRUE(d6 == d4) << "v6: dqkv differs from v4's";
}

std::vector<AttnCase> Cases() {
  const DType bf16 = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  return {
      {"bf16_B2_T1_H3_D32", bf16, 2, 1, 3, 32},
      {"bf16_B1_T127_H3_D32", bf16, 1, 127, 3, 32},
      {"bf16_B2_T127_H1_D64", bf16, 2, 127, 1, 64},
      {"bf16_B1_T1000_H16_D128", bf16, 1, 1000, 16, 128},
      {"bf16_B2_T130_H12_D64", bf16, 2, 130, 12, 64},
      {"bf16_B1_T1000_H6_D16", bf16, 1, 1000, 6, 16},
      {"bf16_B2_T200_H3_D40", bf16, 2, 200, 3, 40},
      {"bf16_B1_T64_H2_D96", bf16, 1, 64, 2, 96},
      {"bf16_B1_T127_H5_D20", bf16, 1, 127, 5, 20},
      {"bf16_B1_T256_H2_D128_scale", bf16, 1, 256, 2, 128, 0.2f},
      {"f16_B1_T127_H3_D32", f16, 1, 127, 3, 32},
      {"f16_B1_T1000_H16_D128", f16, 1, 1000, 16, 128},
      {"f32_B1_T127_H3_D32", f32, 1, 127, 3, 32},
      {"f32_B2_T1000_H3_D64", f32, 2, 1000, 3, 64},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

class CudaAttentionErrorTest : public CudaVsCpu, public ::testing::Test {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_F(CudaAttentionErrorTest, FlashForcedOnAShapeItCannotTakeIsInvalidArgument) {
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  CudaBackendOptions o;
  o.attention = AttentionImpl::kFlash;
  ASSERT_OK_AND_ASSIGN(auto flash, MakeCudaBackend(o));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, flash->Allocate(1 << 20));
  AttentionShape f32{1, 16, 2, 32, DType::kF32};
  EXPECT_THAT(flash->AttentionForward(f32, buf.data(), buf.as<float>(), buf.data(), buf.data()),
              StatusIs(StatusCode::kInvalidArgument));
  AttentionShape odd{1, 16, 2, 20, DType::kBF16};
  EXPECT_THAT(flash->AttentionForward(odd, buf.data(), buf.as<float>(), buf.data(), buf.data()),
              StatusIs(StatusCode::kInvalidArgument));
  // Misaligned qkv for the flash kernels.
  AttentionShape ok{1, 16, 2, 32, DType::kBF16};
  EXPECT_THAT(flash->AttentionForward(ok, buf.data(), buf.as<float>(),
                                      static_cast<char*>(buf.data()) + 2, buf.data()),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_OK(flash->Synchronize());
}

TEST_F(CudaAttentionErrorTest, UnknownFlashVariantIsInvalidArgument) {
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  CudaBackendOptions o;
  o.flash_variant = "no-such-variant";
  EXPECT_THAT(MakeCudaBackend(o).status(), StatusIs(StatusCode::kInvalidArgument));
  o.flash_variant = "v2";
  ASSERT_OK_AND_ASSIGN(auto be, MakeCudaBackend(o));
  EXPECT_THAT(SetFlashVariant(be.get(), "no-such-variant"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(SetFlashVariant(cpu_.get(), "v2"), StatusIs(StatusCode::kFailedPrecondition));
  // The dS-buffer backward needs more workspace than the two-pass one.
  if (::strata::testing::GpuCcMajor() >= 8) {
    AttentionShape s{2, 1000, 3, 64, DType::kBF16};
    ASSERT_OK(SetFlashVariant(be.get(), "v1"));
    const size_t two_pass = be->AttentionWorkspaceBytes(s);
    ASSERT_OK(SetFlashVariant(be.get(), "bwdds"));
    const size_t ds = be->AttentionWorkspaceBytes(s);
    EXPECT_EQ(two_pass, size_t{2 * 3 * 1000 * 4});
    EXPECT_GT(ds, two_pass + size_t{2 * 3} * 1000 * 1000 * 2 / 2);
  }
}

// The same at the GPT 1.3B shape (128 heads of 16 key blocks, every dQ
// block streaming its whole dS panels), against a workspace poisoned with
// NaN so that a dS tile read before it is written shows.
TEST_F(CudaAttentionErrorTest, TmaBackwardHasTheWgmmaBackwardsBitsAtTheGptShape) {
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  const FlashVariant* v6 = FindFlashVariant("v6");
  ASSERT_NE(v6, nullptr);
  if (!::strata::testing::FlashVariantRunsHere(*v6)) GTEST_SKIP() << "the wgmma kernels need an sm_90a build on a 9.0 GPU";
  const AttentionShape s{8, 2048, 16, 128, DType::kBF16};
  const int64_t C = s.heads * s.head_dim, rows = s.batch * s.seq;
  auto& mir = *mirrors_;
  auto qkv = mir.MakeFloats(RandomFloats(rows * 3 * C, 11, -2.f, 2.f), s.dtype);
  auto dout = mir.MakeFloats(RandomFloats(rows * C, 12), s.dtype);
  Mirror out = mir.Make(rows * C * 2);
  Mirror lse = mir.Make(s.batch * s.heads * s.seq * 4);
  Mirror dqkv = mir.Make(rows * 3 * C * 2);
  CudaBackendOptions o;
  o.attention = AttentionImpl::kFlash;
  ASSERT_OK_AND_ASSIGN(auto flash, MakeCudaBackend(o));
  ASSERT_OK(SetFlashVariant(flash.get(), "v6"));
  ASSERT_OK(flash->AttentionForward(s, out.gpu.data(), lse.gpu.as<float>(), qkv.gpu.data(), nullptr));
  const std::vector<uint8_t> d4 = PoisonedBackwardBytes(mir, flash.get(), "v4", s, dqkv, dout, qkv, out, lse);
  const std::vector<uint8_t> d6 = PoisonedBackwardBytes(mir, flash.get(), "v6", s, dqkv, dout, qkv, out, lse);
  EXPECT_TRUE(d6 == d4) << "v6: dqkv differs from v4's";
}

// The default is the first variant that runs on this GPU: v4 (wgmma) on a
// compute-capability 9.0 GPU with sm_90a code, else v2; the per-op timing
// names the variant that ran. A variant that cannot run is refused by name.
TEST_F(CudaAttentionErrorTest, DefaultVariantIsTheFirstThatRunsHere) {
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  if (::strata::testing::GpuCcMajor() < 8) GTEST_SKIP() << "the flash kernels need sm_80+";
  const char* expected = nullptr;
  for (const FlashVariant& v : kFlashVariants)
    if (::strata::testing::FlashVariantRunsHere(v)) {
      expected = v.name;
      break;
    }
  ASSERT_NE(expected, nullptr);
  const FlashVariant* hopper = FindFlashVariant("v6");
  ASSERT_NE(hopper, nullptr);
  if (::strata::testing::FlashVariantRunsHere(*hopper)) EXPECT_STREQ(expected, "v6");
  else EXPECT_STREQ(expected, "v2");

  if (const char* e = std::getenv("STRATA_FLASH_VARIANT"); e && *e)
    GTEST_SKIP() << "STRATA_FLASH_VARIANT=" << e << " overrides the default";
  CudaBackendOptions o;
  o.attention = AttentionImpl::kFlash;
  ASSERT_OK_AND_ASSIGN(auto be, MakeCudaBackend(o));
  AttentionShape s{1, 64, 2, 64, DType::kBF16};
  ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, be->Allocate(1 << 20));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer ws, be->Allocate(std::max<size_t>(16, be->AttentionWorkspaceBytes(s))));
  ASSERT_OK(be->Memset(buf.data(), 0, 1 << 20));
  ASSERT_OK(SetOpTiming(be.get(), true));
  ASSERT_OK(be->AttentionForward(s, buf.data(), reinterpret_cast<float*>(buf.as<char>() + (512 << 10)),
                                 buf.as<char>() + (256 << 10), ws.data()));
  ASSERT_OK_AND_ASSIGN(std::vector<OpTiming> t, TakeOpTimings(be.get()));
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].op, std::string("attention_fwd (flash ") + expected + ")");

  if (!::strata::testing::FlashVariantRunsHere(*hopper)) {
    o.flash_variant = "v6";
    EXPECT_THAT(MakeCudaBackend(o).status(), StatusIs(StatusCode::kFailedPrecondition));
    EXPECT_THAT(SetFlashVariant(be.get(), "v6"), StatusIs(StatusCode::kFailedPrecondition));
  }
}

}  // namespace
}  // namespace strata::kernels
