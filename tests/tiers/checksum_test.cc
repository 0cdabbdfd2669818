// SPDX-License-Identifier: Apache-2.0
// crc32c and xxhash64 against published vectors; the SSE4.2 and table paths
// against each other on awkward lengths and alignments.
#include "tiers/nvme/checksum.h"

#include <cstring>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace strata {
namespace {

using checksum_internal::Crc32cExtendHardware;
using checksum_internal::Crc32cExtendPortable;
using checksum_internal::Crc32cHardwareAvailable;

uint32_t Crc(const std::string& s) { return Crc32c(s.data(), s.size()); }

// RFC 3720 (iSCSI) appendix B.4 and the usual check value.
TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(Crc(""), 0u);
  EXPECT_EQ(Crc("123456789"), 0xE3069283u);
  std::vector<uint8_t> buf(32, 0);
  EXPECT_EQ(Crc32c(buf.data(), 32), 0x8A9136AAu);
  std::fill(buf.begin(), buf.end(), 0xff);
  EXPECT_EQ(Crc32c(buf.data(), 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(buf.data(), 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(Crc32c(buf.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32c, BothPathsAgreeOnAwkwardLengthsAndAlignments) {
  // Long enough for the 3 x 8 KiB interleave plus the 3 x 256 B one and tails.
  auto data = testing::RandomBytes(3 * 8192 * 2 + 3 * 256 + 77, 11);
  std::vector<size_t> lengths = {0,
                                 1,
                                 7,
                                 8,
                                 9,
                                 15,
                                 255,
                                 256,
                                 767,
                                 768,
                                 769,
                                 1000,
                                 4096,
                                 3 * 8192 - 1,
                                 3 * 8192,
                                 3 * 8192 + 1,
                                 3 * 8192 + 3 * 256 + 5};
  lengths.push_back(data.size() - 8);
  for (size_t misalign = 0; misalign < 8; ++misalign) {
    for (size_t n : lengths) {
      if (misalign + n > data.size()) continue;
      const uint8_t* p = data.data() + misalign;
      uint32_t portable = Crc32cExtendPortable(0, p, n);
      // Bitwise reference: one bit at a time, no tables.
      uint32_t ref = ~0u;
      for (size_t i = 0; i < n; ++i) {
        ref ^= p[i];
        for (int b = 0; b < 8; ++b) ref = (ref & 1) ? (ref >> 1) ^ 0x82F63B78u : ref >> 1;
      }
      ref = ~ref;
      EXPECT_EQ(portable, ref) << "n=" << n << " misalign=" << misalign;
      EXPECT_EQ(Crc32c(p, n), ref) << "n=" << n << " misalign=" << misalign;
      if (Crc32cHardwareAvailable()) {
        EXPECT_EQ(Crc32cExtendHardware(0, p, n), ref) << "n=" << n << " misalign=" << misalign;
      }
    }
  }
}

TEST(Crc32c, ExtendEqualsOneShot) {
  auto data = testing::RandomBytes(100000, 5);
  uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{4095}, size_t{50000}, data.size()}) {
    uint32_t c = Crc32c(data.data(), cut);
    c = Crc32cExtend(c, data.data() + cut, data.size() - cut);
    EXPECT_EQ(c, whole) << cut;
    uint32_t p = Crc32cExtendPortable(Crc32cExtendPortable(0, data.data(), cut), data.data() + cut,
                                      data.size() - cut);
    EXPECT_EQ(p, whole) << cut;
  }
}

TEST(Crc32c, DetectsASingleFlippedBit) {
  auto data = testing::RandomBytes(1 << 20, 3);
  uint32_t before = Crc32c(data.data(), data.size());
  data[123457] ^= 0x10;
  EXPECT_NE(Crc32c(data.data(), data.size()), before);
}

// xxHash's own sanity vectors (cli/xsum_sanity_check.c): the test buffer is
// generated from PRIME32/PRIME64 as below.
TEST(XxHash64, SanityVectors) {
  constexpr uint64_t kPrime32 = 2654435761u;
  constexpr uint64_t kPrime64 = 11400714785074694797ull;
  std::vector<uint8_t> buf(4096 + 64 + 1);
  uint64_t gen = kPrime32;
  for (auto& b : buf) {
    b = static_cast<uint8_t>(gen >> 56);
    gen *= kPrime64;
  }
  struct V {
    size_t len;
    uint64_t seed;
    uint64_t want;
  };
  const V vectors[] = {
      {0, 0, 0xEF46DB3751D8E999ull},          {0, kPrime32, 0xAC75FDA2929B17EFull},
      {1, 0, 0xE934A84ADB052768ull},          {1, kPrime32, 0x5014607643A9B4C3ull},
      {4, 0, 0x9136A0DCA57457EEull},          {14, 0, 0x8282DCC4994E35C8ull},
      {14, kPrime32, 0xC3BD6BF63DEB6DF0ull},  {222, 0, 0xB641AE8CB691C174ull},
      {222, kPrime32, 0x20CB8AB7AE10C14Aull},
  };
  for (const V& v : vectors) {
    EXPECT_EQ(XxHash64(buf.data(), v.len, v.seed), v.want) << "len=" << v.len << " seed=" << v.seed;
  }
}

TEST(XxHash64, IndependentOfAlignment) {
  auto data = testing::RandomBytes(5000, 9);
  std::vector<uint8_t> shifted(data.size() + 8);
  for (size_t misalign = 1; misalign < 8; ++misalign) {
    std::memcpy(shifted.data() + misalign, data.data(), data.size());
    for (size_t n : {size_t{3}, size_t{31}, size_t{32}, size_t{33}, size_t{4999}}) {
      EXPECT_EQ(XxHash64(shifted.data() + misalign, n), XxHash64(data.data(), n));
    }
  }
}

TEST(Checksum, KindsNamesAndDispatch) {
  for (ChecksumKind k : {ChecksumKind::kNone, ChecksumKind::kCrc32c, ChecksumKind::kXxh64}) {
    EXPECT_EQ(ParseChecksumKind(ChecksumName(k)), k);
  }
  EXPECT_EQ(ParseChecksumKind("xxhash64"), ChecksumKind::kXxh64);
  EXPECT_FALSE(ParseChecksumKind("md5").has_value());
  std::string s = "123456789";
  EXPECT_EQ(ComputeChecksum(ChecksumKind::kCrc32c, s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(ComputeChecksum(ChecksumKind::kXxh64, s.data(), s.size()),
            XxHash64(s.data(), s.size()));
  EXPECT_EQ(ComputeChecksum(ChecksumKind::kNone, s.data(), s.size()), 0u);
}

}  // namespace
}  // namespace strata
