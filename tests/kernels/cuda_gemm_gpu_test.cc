// CUDA backend GEMMs (cuBLASLt) against the CPU backend: every transpose
// combination, awkward sizes, padded leading dimensions, bias / GELU / saved
// pre-activation epilogues (fused and fallback), beta accumulation, batches.
#include <algorithm>
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
};

std::string CaseName(const ::testing::TestParamInfo<GemmCase>& info) { return info.param.name; }

class CudaGemmTest : public CudaVsCpu, public ::testing::TestWithParam<GemmCase> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_P(CudaGemmTest, MatchesCpu) {
  const GemmCase p = GetParam();
  SCOPED_TRACE("seed " + std::to_string(seed_));
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
  Mirror aux = mir.Make(sc * p.batch * DTypeSize(p.c));
  if (p.pad > 0 && p.beta == 0.f) {
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
    g.gelu_aux = p.aux ? (gpu ? aux.gpu : aux.ref).data() : nullptr;
    g.batch = p.batch, g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
    return be->Gemm(g);
  };
  ASSERT_OK(run(cpu_.get(), false));
  ASSERT_OK(run(gpu_.get(), true));
  // f32 with GELU: tanh implementations differ in the last bits.
  double tol = Tolerance(p.c, OpKind::kReduction);
  if (p.c == DType::kF32 && p.gelu) tol = 1e-4;
  EXPECT_CLOSE(mir, C, p.c, tol, p.name + " C");
  if (p.aux) EXPECT_CLOSE(mir, aux, p.c, tol, p.name + " gelu_aux");

  // Run the GPU GEMM again with the same inputs: bitwise the same output
  // (plans are cached; cuBLASLt is deterministic for a fixed algorithm).
  if (p.beta == 0.f) {
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

}  // namespace
}  // namespace strata::kernels
