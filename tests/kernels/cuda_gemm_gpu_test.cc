// SPDX-License-Identifier: Apache-2.0
// CUDA backend GEMMs (cuBLASLt) against the CPU backend: every transpose
// combination, awkward sizes, padded leading dimensions, bias / GELU / saved
// pre-activation epilogues (fused and fallback), the GELU backward with the
// bias gradient (DGELU_BGRAD, fused and fallback), beta accumulation from C
// or from another buffer (c_in), batches. Then, on the GemmRunner itself: the
// fused DGELU_BGRAD path runs for bf16/f16 and its GELU derivative is the
// tanh one (not erf), its bias gradient the sums of the dGELU'd output.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/kernels/backend_compare.h"
#include "tests/test_util.h"
#if STRATA_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/gemm.h"
#endif

namespace strata::kernels {
namespace {

using ::strata::testing::CudaVsCpu;
using ::strata::testing::Mirror;
using ::strata::testing::OpKind;
using ::strata::testing::RandomFloats;
using ::strata::testing::StatusIs;
using ::strata::testing::Tolerance;

struct GemmCase {
  std::string name;
  DType ab, c;
  bool ta, tb;
  int64_t m, n, k;
  bool bias = false, gelu = false, aux = false;
  float beta = 0.f;
  int batch = 1;
  int64_t pad = 0;  // extra elements at the end of each row of A, B and C
  float alpha = 1.f;
  // The GELU backward: C *= gelu'(pre) (pre random in [-4, 4], in gelu_aux).
  bool dgelu = false;
  bool bias_grad = false;   // f32 column sums of the result
  bool accumulate = false;  // ... added to random values
  bool c_in = false;        // beta's matrix from another buffer
};

std::string CaseName(const ::testing::TestParamInfo<GemmCase>& info) { return info.param.name; }

class CudaGemmTest : public CudaVsCpu, public ::testing::TestWithParam<GemmCase> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_P(CudaGemmTest, MatchesCpu) {
  const GemmCase p = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  // Stored shapes (row-major): A is m x k (or k x m), B is k x n (or n x k).
  const int64_t a_rows = p.ta ? p.k : p.m, a_cols = p.ta ? p.m : p.k;
  const int64_t b_rows = p.tb ? p.n : p.k, b_cols = p.tb ? p.k : p.n;
  const int64_t lda = std::max<int64_t>(1, a_cols + p.pad), ldb = std::max<int64_t>(1, b_cols + p.pad);
  const int64_t ldc = p.n + p.pad;
  const int64_t sa = a_rows * lda, sb = b_rows * ldb, sc = p.m * ldc;
  auto A = mir.MakeFloats(RandomFloats(sa * p.batch, seed_ + 1), p.ab);
  auto B = mir.MakeFloats(RandomFloats(sb * p.batch, seed_ + 2), p.ab);
  auto bias = mir.MakeFloats(RandomFloats(p.n, seed_ + 3), p.ab);
  Mirror C = p.beta != 0.f ? mir.MakeFloats(RandomFloats(sc * p.batch, seed_ + 4), p.c)
                           : mir.Make(sc * p.batch * DTypeSize(p.c));
  Mirror aux = p.dgelu ? mir.MakeFloats(RandomFloats(sc * p.batch, seed_ + 6, -4.f, 4.f), p.c)
                       : mir.Make(sc * p.batch * DTypeSize(p.c));
  Mirror c_in = mir.MakeFloats(RandomFloats(sc * p.batch, seed_ + 7), p.c);
  Mirror dbias = p.accumulate ? mir.MakeFloats(RandomFloats(p.n, seed_ + 8), DType::kF32)
                              : mir.Make(p.n * 4);
  const std::vector<uint8_t> dbias_start = mir.GpuBytes(dbias);
  if (p.c_in && p.beta != 0.f) {
    // C itself must not be read: poisoned (NaN) on both sides.
    mir.Poison(C);
  }
  if (p.pad > 0 && (p.beta == 0.f || p.c_in)) {
    // The padding columns of C are never written: give both the same bytes.
    std::vector<uint8_t> same = ::strata::testing::ToBytes(RandomFloats(sc * p.batch, seed_ + 5), p.c);
    mir.Set(C, same);
    mir.Set(aux, same);
  }
  auto run = [&](Backend* be, bool gpu) {
    GemmArgs g;
    g.trans_a = p.ta, g.trans_b = p.tb;
    g.m = p.m, g.n = p.n, g.k = p.k;
    g.a = (gpu ? A.gpu : A.ref).data(), g.lda = lda;
    g.b = (gpu ? B.gpu : B.ref).data(), g.ldb = ldb;
    g.c = (gpu ? C.gpu : C.ref).data(), g.ldc = ldc;
    g.ab_dtype = p.ab, g.c_dtype = p.c;
    g.alpha = p.alpha, g.beta = p.beta;
    g.bias = p.bias ? (gpu ? bias.gpu : bias.ref).data() : nullptr;
    g.gelu = p.gelu;
    g.gelu_aux = (p.aux || p.dgelu) ? (gpu ? aux.gpu : aux.ref).data() : nullptr;
    g.batch = p.batch, g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
    g.dgelu = p.dgelu;
    g.c_in = p.c_in ? (gpu ? c_in.gpu : c_in.ref).data() : nullptr;
    g.bias_grad = p.bias_grad ? (gpu ? dbias.gpu : dbias.ref).data() : nullptr;
    g.bias_grad_dtype = DType::kF32, g.bias_grad_accumulate = p.accumulate;
    return be->Gemm(g);
  };
  ASSERT_OK(run(cpu_.get(), false));
  ASSERT_OK(run(gpu_.get(), true));
  // f32 with GELU: tanh implementations differ in the last bits.
  double tol = Tolerance(p.c, OpKind::kReduction);
  if (p.c == DType::kF32 && p.gelu) tol = 1e-4;
  // f32 with GELU': cuBLASLt's derivative may use a faster tanh (the
  // GeluFlavour test below tells tanh from erf; this one checks the plumbing).
  if (p.c == DType::kF32 && p.dgelu) tol = 1e-3;
  EXPECT_CLOSE(mir, C, p.c, tol, p.name + " C");
  if (p.aux) EXPECT_CLOSE(mir, aux, p.c, tol, p.name + " gelu_aux");
  // The bias gradient: fp32 sums of m values (cuBLASLt may round them to C's
  // type first, or the fallback sum C's rounded values); the sums of the
  // product without GELU' or of the wrong axis are off by O(1).
  if (p.bias_grad) EXPECT_CLOSE(mir, dbias, DType::kF32, std::max(tol, 2e-5), p.name + " bias_grad");
  if (p.c_in) {
    EXPECT_EQ(mir.GpuBytes(c_in), mir.RefBytes(c_in)) << "c_in was written";
  }
  if (p.dgelu) {
    EXPECT_EQ(mir.GpuBytes(aux), mir.RefBytes(aux)) << "the pre-activation was written";
  }

  // Run the GPU GEMM again with the same inputs: bitwise the same output
  // (plans are cached; cuBLASLt is deterministic for a fixed algorithm).
  if (p.bias_grad && (p.beta == 0.f || p.c_in)) {  // (C as beta's input was overwritten)
    std::vector<uint8_t> first = mir.GpuBytes(dbias);
    ASSERT_OK(gpu_->CopyToDevice(dbias.gpu.data(), dbias_start.data(), dbias_start.size()));
    ASSERT_OK(run(gpu_.get(), true));
    EXPECT_EQ(mir.GpuBytes(dbias), first) << "second run's bias_grad differs";
  } else if (p.beta == 0.f) {
    std::vector<uint8_t> first = mir.GpuBytes(C);
    mir.PoisonGpu(C);
    if (p.pad > 0) {
      // Restore the unwritten padding so the comparison covers only outputs.
      std::vector<uint8_t> same = first;
      ASSERT_OK(gpu_->CopyToDevice(C.gpu.data(), same.data(), same.size()));
    }
    ASSERT_OK(run(gpu_.get(), true));
    EXPECT_EQ(mir.GpuBytes(C), first) << "second run differs";
  }
}

std::vector<GemmCase> Cases() {
  std::vector<GemmCase> v;
  const DType f32 = DType::kF32, bf16 = DType::kBF16, f16 = DType::kF16;
  struct DT {
    const char* name;
    DType ab, c;
  };
  for (DT d : {DT{"f32", f32, f32}, DT{"bf16", bf16, bf16}, DT{"bf16_f32", bf16, f32},
               DT{"f16", f16, f16}}) {
    std::string n = d.name;
    v.push_back({n + "_NN_127x96x1000", d.ab, d.c, false, false, 127, 96, 1000});
    v.push_back({n + "_NT_127x96x1000", d.ab, d.c, false, true, 127, 96, 1000});
    v.push_back({n + "_TN_1000x64x127", d.ab, d.c, true, false, 1000, 64, 127});
    v.push_back({n + "_TT_96x127x64", d.ab, d.c, true, true, 96, 127, 64});
    v.push_back({n + "_NN_1x1x1", d.ab, d.c, false, false, 1, 1, 1});
    v.push_back({n + "_NT_1x2048x96", d.ab, d.c, false, true, 1, 2048, 96});
    v.push_back({n + "_NN_pad", d.ab, d.c, false, false, 127, 96, 100, false, false, false, 0.f, 1, 5});
    v.push_back({n + "_TN_beta1", d.ab, d.c, true, false, 96, 64, 1000, false, false, false, 1.f});
    v.push_back({n + "_NN_alpha_beta", d.ab, d.c, false, false, 64, 96, 127, false, false, false, 0.5f, 1, 0, 0.25f});
    v.push_back({n + "_NN_batch3", d.ab, d.c, false, true, 127, 96, 64, false, false, false, 0.f, 3});
    v.push_back({n + "_NN_bias", d.ab, d.c, false, false, 1000, 96, 64, true});
    v.push_back({n + "_NN_bias_gelu", d.ab, d.c, false, false, 127, 384, 96, true, true});
    v.push_back({n + "_NN_bias_gelu_aux", d.ab, d.c, false, false, 127, 384, 96, true, true, true});
    v.push_back({n + "_NN_gelu_aux_nobias", d.ab, d.c, false, false, 64, 256, 96, false, true, true});
    v.push_back({n + "_NN_bias_gelu_aux_oddld", d.ab, d.c, false, false, 127, 100, 96, true, true, true, 0.f, 1, 3});
    v.push_back({n + "_NN_bias_beta1", d.ab, d.c, false, false, 127, 96, 64, true, false, false, 1.f});
    v.push_back({n + "_NN_bias_batch2", d.ab, d.c, false, false, 127, 96, 64, true, true, true, 0.f, 2});
    v.push_back({n + "_k0_bias", d.ab, d.c, false, false, 127, 96, 0, true, false, false, 1.f});
    // The GELU backward as the model calls it (d h = d_out W^T, NT), fusable
    // (ldc % 8 == 0, beta 0, one batch item, C of A/B's type).
    auto dg = [&](std::string name, bool ta, bool tb, int64_t m, int64_t nn, int64_t k) {
      GemmCase c{n + name, d.ab, d.c, ta, tb, m, nn, k};
      c.dgelu = true, c.bias_grad = true;
      return c;
    };
    v.push_back(dg("_NT_dgelu_bgrad", false, true, 127, 384, 96));
    v.push_back(dg("_NT_dgelu_bgrad_model", false, true, 512, 1024, 256));
    v.push_back(dg("_NN_dgelu_bgrad_1row", false, false, 1, 64, 32));
    GemmCase c = dg("_NT_dgelu_bgrad_acc", false, true, 200, 256, 64);
    c.accumulate = true;
    v.push_back(c);
    c = dg("_TN_dgelu_nobgrad", true, false, 96, 128, 127);
    c.bias_grad = false;
    v.push_back(c);
    c = dg("_NT_dgelu_bgrad_oddld", false, true, 127, 100, 96);  // ldc 103: fallback
    c.pad = 3;
    v.push_back(c);
    c = dg("_NN_dgelu_beta_cin", false, false, 64, 96, 127);  // beta: fallback
    c.beta = 0.5f, c.c_in = true, c.alpha = 0.25f;
    v.push_back(c);
    c = dg("_k0_dgelu_bgrad", false, false, 33, 40, 0);
    c.beta = 1.f, c.accumulate = true;
    v.push_back(c);
    // bias_grad of a plain GEMM (the column-sum fallback), c_in with a bias.
    c = GemmCase{n + "_NN_bgrad_plain", d.ab, d.c, false, false, 127, 96, 64, true};
    c.bias_grad = true;
    v.push_back(c);
    c = GemmCase{n + "_NN_cin_bias_beta1", d.ab, d.c, false, false, 127, 96, 64, true};
    c.beta = 1.f, c.c_in = true;
    v.push_back(c);
    c = GemmCase{n + "_NN_cin_pad_beta", d.ab, d.c, false, true, 70, 64, 96};
    c.beta = 0.75f, c.c_in = true, c.pad = 5;
    v.push_back(c);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGemmTest, ::testing::ValuesIn(Cases()), CaseName);

class CudaGemmErrorTest : public CudaVsCpu, public ::testing::Test {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_F(CudaGemmErrorTest, BadArgumentsAreInvalidArgument) {
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, gpu_->Allocate(1 << 20));
  GemmArgs g;
  g.m = 4, g.n = 4, g.k = 8;
  g.a = g.b = g.c = buf.data();
  g.lda = 8, g.ldb = 4, g.ldc = 4;
  ASSERT_OK(gpu_->Gemm(g));
  GemmArgs bad = g;
  bad.lda = 7;  // < k
  EXPECT_THAT(gpu_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.ldc = 3;
  EXPECT_THAT(gpu_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.c_dtype = DType::kF16;  // neither f32 nor ab_dtype (bf16)
  EXPECT_THAT(gpu_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.ab_dtype = bad.c_dtype = DType::kI32;
  EXPECT_THAT(gpu_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.m = -1;
  EXPECT_THAT(gpu_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.gelu_aux = buf.data();  // aux without gelu
  EXPECT_THAT(gpu_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.a = nullptr;
  EXPECT_THAT(gpu_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = g;
  bad.batch = 2, bad.stride_c = 4;  // outputs overlap
  EXPECT_THAT(gpu_->Gemm(bad), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK(gpu_->Synchronize());
}

TEST_F(CudaGemmErrorTest, AllocatingTooMuchIsOutOfMemory) {
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  auto r = gpu_->Allocate(size_t{1} << 52);
  EXPECT_THAT(r, StatusIs(StatusCode::kOutOfMemory));
  // The backend stays usable.
  ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, gpu_->Allocate(256));
  EXPECT_OK(gpu_->Memset(buf.data(), 0, 256));
  EXPECT_OK(gpu_->Synchronize());
}

#if STRATA_WITH_CUDA
// The fused GELU backward on cuBLASLt itself (a GemmRunner on the backend's
// stream, so the test knows which path ran). A = 1/16, B = 1 and k = 16 make
// the product exactly 1, so C is GELU'(pre) alone; pre in [-3.5, -0.5], where
// the tanh-GELU's derivative and the erf-GELU's differ by 1 % (0.5 % to 9e-4
// absolute), far above f16/bf16 rounding and, in f32, by orders of magnitude:
// an erf epilogue fails loudly. The
// bias gradient must be the column sums of that C (the sums of the product
// would be m = 256 per column, of the wrong axis n = 64).
double GeluGradTanh(double x) {
  const double k = std::sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}
double GeluGradErf(double x) {
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

using CudaGemmRunnerTest = CudaGemmErrorTest;

TEST_F(CudaGemmRunnerTest, FusedDgeluIsTheTanhDerivativeAndSumsItsOutput) {
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(DTypeName(dt)));
    auto runner = cuda::GemmRunner::Make(static_cast<cudaStream_t>(gpu_->native_stream()),
                                         cuda::GemmOptions{});
    ASSERT_OK(runner.status());
    const int64_t m = 256, n = 64, k = 16;
    std::vector<float> a(m * k, 1.f / 16), b(k * n, 1.f), pre(m * n);
    for (int64_t i = 0; i < m * n; ++i) pre[i] = -3.5f + 3.f * static_cast<float>(i) / (m * n - 1);
    pre = ::strata::testing::RoundTo(pre, dt);
    auto up = [&](const std::vector<uint8_t>& bytes) {
      auto buf = gpu_->Allocate(bytes.size());
      EXPECT_OK(buf.status());
      EXPECT_OK(gpu_->CopyToDevice(buf->data(), bytes.data(), bytes.size()));
      return std::move(buf).value();
    };
    DeviceBuffer A = up(::strata::testing::ToBytes(a, dt)), B = up(::strata::testing::ToBytes(b, dt));
    DeviceBuffer P = up(::strata::testing::ToBytes(pre, dt));
    DeviceBuffer C = up(std::vector<uint8_t>(m * n * DTypeSize(dt), 0xFF));
    DeviceBuffer D = up(std::vector<uint8_t>(n * 4, 0xFF));
    GemmArgs g;
    g.m = m, g.n = n, g.k = k;
    g.a = A.data(), g.lda = k, g.b = B.data(), g.ldb = n, g.c = C.data(), g.ldc = n;
    g.ab_dtype = g.c_dtype = dt;
    g.dgelu = true, g.gelu_aux = P.data();
    g.bias_grad = D.data(), g.bias_grad_dtype = DType::kF32;
    ASSERT_OK((*runner)->Run(g));
    ASSERT_OK(gpu_->Synchronize());
    // f32: whichever path cuBLASLt offers (its DGELU epilogue, or the GEMM
    // and our epilogue kernel); 16-bit: the fused one.
    const bool f32 = dt == DType::kF32;
    std::printf("[ dgelu ] %s: %s\n", std::string(DTypeName(dt)).c_str(),
                (*runner)->fused_epilogue_calls() == 1 ? "cuBLASLt's DGELU epilogue" : "the epilogue kernel");
    if (!f32) {
      EXPECT_EQ((*runner)->fused_epilogue_calls(), 1) << "cuBLASLt did not fuse DGELU: nothing checked";
      EXPECT_EQ((*runner)->fused_bias_grad_calls(), 1) << "cuBLASLt did not fuse the bias gradient";
    }
    std::vector<uint8_t> cb(m * n * DTypeSize(dt)), db(n * 4);
    ASSERT_OK(gpu_->CopyToHost(cb.data(), C.data(), cb.size()));
    ASSERT_OK(gpu_->CopyToHost(db.data(), D.data(), db.size()));
    const std::vector<double> out = ::strata::testing::ToDoubles(cb, dt);
    const std::vector<double> dbias = ::strata::testing::ToDoubles(db, DType::kF32);
    std::vector<double> ref_tanh(m * n), ref_erf(m * n), sums(n, 0.0);
    for (int64_t i = 0; i < m * n; ++i) {
      ref_tanh[i] = GeluGradTanh(pre[i]);
      ref_erf[i] = GeluGradErf(pre[i]);
      sums[i % n] += ref_tanh[i];
    }
    const double d_tanh = ::strata::testing::RelErr(out, ref_tanh);
    const double d_erf = ::strata::testing::RelErr(out, ref_erf);
    std::printf("[ dgelu ] %s: distance to the tanh derivative %.2e, to the erf one %.2e\n",
                std::string(DTypeName(dt)).c_str(), d_tanh, d_erf);
    // Rounding alone: f16 2e-4, bf16 1.6e-3, f32 under 1e-6 (a fast tanh a
    // few 1e-4 at most); the erf derivative is 6e-3 away, so in f32 the
    // flavour is told apart by a factor of six or more.
    EXPECT_LT(d_tanh, f32 ? 1e-3 : dt == DType::kF16 ? 2e-3 : 4e-3);
    EXPECT_LT(d_tanh, 0.5 * d_erf) << "the epilogue's GELU' is not the tanh-GELU's";
    const double d_bias = ::strata::testing::RelErr(dbias, sums);
    std::printf("[ dgelu ] %s: bias gradient relative error %.2e\n",
                std::string(DTypeName(dt)).c_str(), d_bias);
    EXPECT_LT(d_bias, 1e-2) << "bias_grad is not the column sums of the dGELU'd output";
  }
}

// The tuner (GemmOptions::tune) only ever picks an algorithm that gives the
// heuristic choice's bits, and leaves C as the call alone would: the bias +
// GELU forward, and the residual form C += A B + bias with C read in place
// (the tuner's trials must not accumulate into it).
TEST_F(CudaGemmRunnerTest, TuningKeepsTheBitsAndTheAccumulatedC) {
  if (::strata::testing::GpuTestsOnCpu()) GTEST_SKIP() << "CUDA-only behaviour";
  const int64_t m = 4096, n = 2048, k = 8192;  // 1.4e11 flops: above tune_min_flops
  const DType dt = DType::kBF16;
  auto up = [&](const std::vector<float>& v) {
    const std::vector<uint8_t> bytes = ::strata::testing::ToBytes(v, dt);
    auto buf = gpu_->Allocate(bytes.size());
    EXPECT_OK(buf.status());
    EXPECT_OK(gpu_->CopyToDevice(buf->data(), bytes.data(), bytes.size()));
    return std::move(buf).value();
  };
  const uint64_t seed = ::strata::testing::FreshSeed();
  SCOPED_TRACE(::strata::testing::SeedNote(seed));
  DeviceBuffer A = up(::strata::testing::RandomFloats(m * k, seed, -1.f, 1.f));
  DeviceBuffer B = up(::strata::testing::RandomFloats(k * n, seed + 1, -1.f, 1.f));
  DeviceBuffer bias = up(::strata::testing::RandomFloats(n, seed + 2, -1.f, 1.f));
  const std::vector<float> c0 = ::strata::testing::RandomFloats(m * n, seed + 3, -4.f, 4.f);
  for (bool residual : {false, true}) {
    SCOPED_TRACE(residual ? "C += A B + bias" : "C = GELU(A B + bias)");
    std::vector<uint8_t> result[2];
    int64_t tuned = 0;
    for (bool tune : {false, true}) {
      cuda::GemmOptions o;
      o.tune = tune;
      auto runner = cuda::GemmRunner::Make(static_cast<cudaStream_t>(gpu_->native_stream()), o);
      ASSERT_OK(runner.status());
      DeviceBuffer C = up(c0);
      GemmArgs g;
      g.m = m, g.n = n, g.k = k;
      g.a = A.data(), g.lda = k, g.b = B.data(), g.ldb = n, g.c = C.data(), g.ldc = n;
      g.ab_dtype = g.c_dtype = dt;
      g.bias = bias.data();
      if (residual) g.beta = 1.f;
      else g.gelu = true;
      ASSERT_OK((*runner)->Run(g));
      ASSERT_OK(gpu_->Synchronize());
      result[tune].resize(m * n * DTypeSize(dt));
      ASSERT_OK(gpu_->CopyToHost(result[tune].data(), C.data(), result[tune].size()));
      if (tune) tuned = (*runner)->tuned_plans();
      else EXPECT_EQ((*runner)->tuned_plans(), 0);
      std::printf("[ tune ] %s: tuned plans %lld, left the heuristic's algorithm: %lld\n",
                  residual ? "residual" : "gelu", static_cast<long long>((*runner)->tuned_plans()),
                  static_cast<long long>((*runner)->retuned_plans()));
    }
    EXPECT_EQ(tuned, 1) << "the tuner did not run: nothing checked";
    EXPECT_TRUE(result[0] == result[1]) << "tuning changed the result";
  }
}
#endif  // STRATA_WITH_CUDA

}  // namespace
}  // namespace strata::kernels
