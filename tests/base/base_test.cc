// SPDX-License-Identifier: Apache-2.0
// Tests for the base types: Status/Result, byte sizes, dtypes, half
// conversions, shapes.
#include <cerrno>
#include <cmath>
#include <limits>

#include "base/bytes.h"
#include "base/dtype.h"
#include "base/half.h"
#include "base/shape.h"
#include "base/status.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

TEST(Status, OkIsCheapAndEmpty) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(s.WithContext("ctx").ok());
}

TEST(Status, IoErrorCarriesErrnoPathOffset) {
  Status s = IoError("read", EIO, "/data/x.swp", 8192);
  EXPECT_THAT(s, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_EQ(s.path(), "/data/x.swp");
  EXPECT_EQ(s.offset(), 8192u);
  EXPECT_FALSE(s.retryable());
  std::string text = s.ToString();
  EXPECT_THAT(text, HasSubstr("EIO"));
  EXPECT_THAT(text, HasSubstr("/data/x.swp"));
  EXPECT_THAT(text, HasSubstr("offset 8192"));
  EXPECT_TRUE(IoError("read", EAGAIN).retryable());
}

TEST(Status, OutOfMemoryNamesTierAndBytes) {
  Status s = OutOfMemory(TierKind::kGpu, 3 * kGiB, kGiB, "layer 3 params");
  EXPECT_EQ(s.tier(), TierKind::kGpu);
  EXPECT_EQ(s.bytes_requested(), 3 * kGiB);
  EXPECT_EQ(s.bytes_available(), kGiB);
  EXPECT_THAT(s.ToString(), HasSubstr("tier gpu"));
  EXPECT_THAT(s.ToString(), HasSubstr("3.00 GiB"));
}

TEST(Status, WithContextKeepsFields) {
  Status s = IoError("write", ENOSPC, "/d/f", 4096).WithContext("checkpoint");
  EXPECT_EQ(s.sys_errno(), ENOSPC);
  EXPECT_EQ(s.path(), "/d/f");
  EXPECT_THAT(std::string(s.message()), HasSubstr("checkpoint: write"));
}

Result<int> Half(int v) {
  if (v % 2) return InvalidArgument("odd: " + std::to_string(v));
  return v / 2;
}
Result<int> Quarter(int v) {
  ASSIGN_OR_RETURN(int h, Half(v));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}
Status CheckEven(int v) {
  RETURN_IF_ERROR(Half(v).status());
  return Status::OK();
}

TEST(Result, PropagatesValuesAndErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_THAT(Quarter(6), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(Quarter(6).status().message()), HasSubstr("odd: 3"));
  EXPECT_OK(CheckEven(2));
  EXPECT_THAT(CheckEven(3), StatusIs(StatusCode::kInvalidArgument));
}

TEST(Result, OkStatusIsNotAValue) {
  Result<int> r{Status::OK()};
  EXPECT_THAT(r, StatusIs(StatusCode::kInternal));
}

TEST(Bytes, ParsesUnits) {
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("24GiB"), 24 * kGiB);
  EXPECT_EQ(*ParseBytes("24G"), 24 * kGiB);
  EXPECT_EQ(*ParseBytes("512 MiB"), 512 * kMiB);
  EXPECT_EQ(*ParseBytes("1.5GiB"), 3 * kGiB / 2);
  EXPECT_EQ(*ParseBytes("100MB"), 100'000'000u);
  EXPECT_EQ(*ParseBytes("8k"), 8 * kKiB);
  for (const char* bad : {"", "GiB", "12XB", "-1", "1.5", "1e400G", "abc"}) {
    auto r = ParseBytes(bad);
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument)) << bad;
  }
  EXPECT_THAT(std::string(ParseBytes("12XB").status().message()), HasSubstr("'12XB'"));
}

TEST(Bytes, Formats) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(24 * kGiB), "24.0 GiB");
  EXPECT_EQ(AlignUp(4097, 4096), 8192u);
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64, DType::kI32,
                  DType::kI16, DType::kU16, DType::kI8, DType::kU8}) {
    EXPECT_EQ(ParseDType(DTypeName(t)), t);
    EXPECT_EQ(ParseSafetensorsDType(SafetensorsDTypeName(t)), t);
    EXPECT_GT(DTypeSize(t), 0u);
  }
  EXPECT_EQ(ParseDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(ParseDType("fp16"), DType::kF16);
  EXPECT_FALSE(ParseDType("f8").has_value());
}

// Reference conversions through double arithmetic, for every 16-bit pattern.
double HalfRef(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

TEST(Half, DecodesEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    double ref = HalfRef(static_cast<uint16_t>(h));
    float got = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(static_cast<double>(got), ref) << h;
    }
  }
}

TEST(Half, EncodesRoundTripAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), h) << h;
  }
  // Midpoints between neighbouring halves round to the even one; every float
  // rounds to the nearest half.
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float f = BitsFloat(bits(rng));
    if (std::isnan(f)) continue;
    uint16_t h = FloatToHalf(f);
    double got = HalfRef(h);
    if (std::fabs(f) >= 65520.0) {  // RNE overflow threshold
      EXPECT_TRUE(std::isinf(got)) << f;
      continue;
    }
    double down = HalfRef(static_cast<uint16_t>(h - ((h & 0x7fff) ? 1 : 0)));
    double up = HalfRef(static_cast<uint16_t>(h + 1));
    EXPECT_LE(std::fabs(got - f), std::fabs(down - f) + 1e-300) << f;
    if (!std::isinf(up)) {
      EXPECT_LE(std::fabs(got - f), std::fabs(up - f) + 1e-300) << f;
    }
  }
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);   // tie -> even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
}

TEST(BF16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBF16(BitsFloat(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(FloatToBF16(BitsFloat(0x3f818000u)), 0x3f82);  // tie -> even
  EXPECT_EQ(FloatToBF16(BitsFloat(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(NAN))));
  EXPECT_TRUE(std::isinf(BF16ToFloat(FloatToBF16(INFINITY))));
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = BF16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(FloatToBF16(f), h);
    }
  }
}

TEST(Shape, BasicsAndChecks) {
  Shape s{4, 32, 64};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 4 * 32 * 64);
  EXPECT_EQ(s.ToString(), "[4, 32, 64]");
  EXPECT_EQ(Shape().numel(), 1);
  EXPECT_EQ(s, (Shape{4, 32, 64}));
  EXPECT_NE(s, (Shape{4, 32}));
  std::vector<int64_t> neg{3, -1};
  EXPECT_THAT(Shape::Make(neg), StatusIs(StatusCode::kInvalidArgument));
  std::vector<int64_t> big{1ll << 40, 1ll << 40};
  EXPECT_THAT(Shape::Make(big), StatusIs(StatusCode::kInvalidArgument));
  std::vector<int64_t> deep(9, 1);
  EXPECT_THAT(Shape::Make(deep), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace strata
