// SPDX-License-Identifier: Apache-2.0
// Backend::AttentionDecode on the CUDA backend against the CPU backend: the
// same rows from a prefill and then one row at a time (multi-head and
// grouped-query, head dims 16..256, f32/bf16/f16), the cache the kernel wrote
// equal to the CPU's bit for bit (it is a copy), and the same bits run to run.
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/kernels/attention_decode.h"
#include "tests/kernels/backend_compare.h"
#include "tests/test_util.h"

namespace strata::kernels {
namespace {

using ::strata::kernels::testing::DecodeCase;
using ::strata::kernels::testing::DecodeRows;
using ::strata::kernels::testing::QkvWidth;
using ::strata::testing::RandomFloats;
using ::strata::testing::RelErr;
using ::strata::testing::ToBytes;
using ::strata::testing::Tolerance;

class CudaAttentionDecodeTest : public ::strata::testing::CudaVsCpu, public ::testing::TestWithParam<DecodeCase> {
 protected:
  void SetUp() override { STRATA_SETUP_CUDA_VS_CPU(); }
};

TEST_P(CudaAttentionDecodeTest, MatchesCpuAndRepeats) {
  const DecodeCase c = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  const std::vector<uint8_t> qkv = ToBytes(RandomFloats(c.T * QkvWidth(c), seed_, -2.f, 2.f), c.dt);
  const std::vector<double> ref = DecodeRows(cpu_.get(), c, qkv);
  const std::vector<double> got = DecodeRows(gpu_.get(), c, qkv);
  EXPECT_LE(RelErr(got, ref), Tolerance(c.dt, ::strata::testing::OpKind::kReduction));
  const int64_t C = c.H * c.D;
  for (int64_t t : {int64_t{0}, c.T - 1}) {
    std::vector<double> g(got.begin() + t * C, got.begin() + (t + 1) * C), r(ref.begin() + t * C, ref.begin() + (t + 1) * C);
    EXPECT_LE(RelErr(g, r), Tolerance(c.dt, ::strata::testing::OpKind::kReduction)) << "row " << t;
  }
  EXPECT_EQ(DecodeRows(gpu_.get(), c, qkv), got) << "a second run gave other values";
}

TEST_P(CudaAttentionDecodeTest, WritesTheCacheAsTheCpuDoes) {
  const DecodeCase c = GetParam();
  SCOPED_TRACE(::strata::testing::SeedNote(seed_));
  auto& mir = *mirrors_;
  const size_t es = DTypeSize(c.dt);
  const int64_t Ckv = c.Hkv * c.D, rows = std::max<int64_t>(c.prefill, 1);
  auto qkv = mir.Make(ToBytes(RandomFloats(rows * QkvWidth(c), seed_, -2.f, 2.f), c.dt));
  auto out = mir.Make(static_cast<size_t>(rows * c.H * c.D) * es);
  auto k = mir.Make(static_cast<size_t>(c.T * Ckv) * es), v = mir.Make(static_cast<size_t>(c.T * Ckv) * es);
  for (auto* m : {&k, &v}) mir.Poison(*m);
  // The cache holds T positions; the prefill writes the first `rows`.
  ASSERT_OK(cpu_->AttentionDecode(DecodeAttentionShape{1, rows, 0, rows, c.H, c.Hkv, c.D, c.dt, 0.f}, out.ref.data(),
                                  qkv.ref.data(), k.ref.data(), v.ref.data()));
  ASSERT_OK(gpu_->AttentionDecode(DecodeAttentionShape{1, rows, 0, rows, c.H, c.Hkv, c.D, c.dt, 0.f}, out.gpu.data(),
                                  qkv.gpu.data(), k.gpu.data(), v.gpu.data()));
  const size_t n = static_cast<size_t>(rows * Ckv) * es;
  for (auto* m : {&k, &v}) {
    std::vector<uint8_t> g = mir.GpuBytes(*m), r = mir.RefBytes(*m);
    EXPECT_TRUE(std::equal(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(n), r.begin()))
        << (m == &k ? "k" : "v") << " cache differs";
  }
}

std::vector<DecodeCase> Cases() {
  std::vector<DecodeCase> v;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    v.push_back({1, 1, 1, 16, 1, dt});
    v.push_back({129, 12, 12, 64, 7, dt});   // GPT-2 small's heads
    v.push_back({300, 8, 2, 128, 100, dt});  // grouped-query, Llama's head dim
    v.push_back({70, 4, 1, 80, 1, dt});      // head dim not a multiple of 32
  }
  v.push_back({64, 2, 2, 256, 13, DType::kF32});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionDecodeTest, ::testing::ValuesIn(Cases()), [](const auto& info) {
  const DecodeCase& c = info.param;
  return "T" + std::to_string(c.T) + "_H" + std::to_string(c.H) + "_kv" + std::to_string(c.Hkv) + "_D" +
         std::to_string(c.D) + "_pre" + std::to_string(c.prefill) + "_" + std::string(DTypeName(c.dt));
});

}  // namespace
}  // namespace strata::kernels
