// SPDX-License-Identifier: Apache-2.0
// Backend::AttentionDecode on the CPU backend: a prefill and then one row at
// a time against the cache give the rows AttentionForward gives over the
// whole sequence (multi-head and grouped-query), and bad shapes are errors
// naming the field.
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/kernels/attention_decode.h"
#include "tests/test_util.h"

namespace strata::kernels {
namespace {

using ::strata::kernels::testing::DecodeCase;
using ::strata::kernels::testing::DecodeRows;
using ::strata::kernels::testing::QkvWidth;
using ::strata::kernels::testing::RepeatKvHeads;
using ::strata::testing::RandomFloats;
using ::strata::testing::RelErr;
using ::strata::testing::StatusIs;
using ::strata::testing::ToBytes;
using ::strata::testing::ToDoubles;

class AttentionDecodeTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(AttentionDecodeTest, MatchesFullAttention) {
  const DecodeCase c = GetParam();
  const uint64_t seed = ::strata::testing::TestSeed(31);
  SCOPED_TRACE(::strata::testing::SeedNote(seed));
  auto be = MakeCpuBackend(2);
  const std::vector<uint8_t> qkv = ToBytes(RandomFloats(c.T * QkvWidth(c), seed, -2.f, 2.f), c.dt);
  const std::vector<double> got = DecodeRows(be.get(), c, qkv);

  const std::vector<uint8_t> full = RepeatKvHeads(c, qkv);
  const size_t es = DTypeSize(c.dt);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer q, be->Allocate(full.size()));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer out, be->Allocate(static_cast<size_t>(c.T * c.H * c.D) * es));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer lse, be->Allocate(static_cast<size_t>(c.T * c.H) * 8));
  ASSERT_OK(be->CopyToDevice(q.data(), full.data(), full.size()));
  ASSERT_OK(be->AttentionForward(AttentionShape{1, c.T, c.H, c.D, c.dt, 0.f}, out.data(), lse.as<float>(), q.data(),
                                 nullptr));
  std::vector<uint8_t> ref_bytes(out.bytes());
  ASSERT_OK(be->CopyToHost(ref_bytes.data(), out.data(), out.bytes()));
  const std::vector<double> ref = ToDoubles(ref_bytes, c.dt);
  const double tol = c.dt == DType::kF32 ? 2e-6 : 8e-3;
  EXPECT_LE(RelErr(got, ref), tol);
  // Row by row: the first rows attend to one or two keys, the last to all.
  const int64_t C = c.H * c.D;
  for (int64_t t : {int64_t{0}, c.T / 2, c.T - 1}) {
    std::vector<double> g(got.begin() + t * C, got.begin() + (t + 1) * C), r(ref.begin() + t * C, ref.begin() + (t + 1) * C);
    EXPECT_LE(RelErr(g, r), tol) << "row " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionDecodeTest,
    ::testing::Values(DecodeCase{1, 1, 1, 8, 1, DType::kF32}, DecodeCase{37, 4, 4, 16, 5, DType::kF32},
                      DecodeCase{37, 4, 4, 16, 1, DType::kF32}, DecodeCase{64, 8, 2, 32, 17, DType::kF32},
                      DecodeCase{50, 6, 1, 24, 50, DType::kF32}, DecodeCase{40, 4, 2, 64, 9, DType::kBF16},
                      DecodeCase{40, 4, 4, 40, 3, DType::kF16}),
    [](const auto& info) {
      const DecodeCase& c = info.param;
      return "T" + std::to_string(c.T) + "_H" + std::to_string(c.H) + "_kv" + std::to_string(c.Hkv) + "_D" +
             std::to_string(c.D) + "_pre" + std::to_string(c.prefill) + "_" + std::string(DTypeName(c.dt));
    });

TEST(AttentionDecodeErrors, NameTheField) {
  auto be = MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer b, be->Allocate(1 << 16));
  auto run = [&](DecodeAttentionShape s) { return be->AttentionDecode(s, b.data(), b.data(), b.data(), b.data()); };
  const DecodeAttentionShape ok{1, 2, 3, 8, 4, 2, 8, DType::kF32, 0.f};
  EXPECT_OK(run(ok));
  auto expect = [&](DecodeAttentionShape s, const std::string& word) {
    const Status st = run(s);
    EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_NE(st.message().find(word), std::string::npos) << st.message();
  };
  DecodeAttentionShape s = ok;
  s.past = 7;
  expect(s, "capacity");
  s = ok, s.heads = 3;
  expect(s, "kv_heads");
  s = ok, s.head_dim = 0;
  expect(s, "head_dim");
  s = ok, s.rows = -1;
  expect(s, "rows");
  s = ok, s.scale = -1.f;
  expect(s, "scale");
  EXPECT_THAT(be->AttentionDecode(ok, b.data(), b.data(), nullptr, b.data()), StatusIs(StatusCode::kInvalidArgument));
  s = ok, s.dtype = DType::kI32;
  expect(s, "dtype");
}

}  // namespace
}  // namespace strata::kernels
