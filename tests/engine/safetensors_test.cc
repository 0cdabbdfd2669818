// SPDX-License-Identifier: Apache-2.0
#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/half.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

TEST(Safetensors, ReadsTheGpt2Fixture) {
  ASSERT_OK_AND_ASSIGN(auto f, SafetensorsFile::Open(testing::SourcePath("tests/data/gpt2_tiny_ref.safetensors")));
  const SafetensorsEntry* e = f.Find("param.transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, DType::kF32);
  EXPECT_EQ(e->shape, (Shape{64, 192}));
  ASSERT_OK_AND_ASSIGN(auto loss, f.ReadF64("loss"));
  ASSERT_EQ(loss.size(), 1u);
  EXPECT_GT(loss[0], 1.0);
  ASSERT_OK_AND_ASSIGN(auto ids, f.ReadI32("input_ids"));
  EXPECT_EQ(ids.size(), 4u * 32u);
  EXPECT_TRUE(f.metadata().count("config"));
  EXPECT_THAT(f.ReadF32("nope"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(f.ReadI32("loss"), StatusIs(StatusCode::kInvalidArgument));
}

TEST(Safetensors, WriteThenReadRoundTrips) {
  TempDir dir;
  std::vector<float> a = testing::RandomFloats(6, 1);
  std::vector<uint16_t> b(5);
  for (size_t i = 0; i < b.size(); ++i) b[i] = FloatToBF16(0.5f * static_cast<float>(i) - 1.f);
  std::string path = dir.File("m.safetensors");
  ASSERT_OK(WriteSafetensors(path, {{"a", DType::kF32, Shape{2, 3}, a.data()},
                                    {"b", DType::kBF16, Shape{5}, b.data()}},
                             {{"step", "7"}}));
  ASSERT_OK_AND_ASSIGN(auto f, SafetensorsFile::Open(path));
  EXPECT_EQ(f.metadata().at("step"), "7");
  ASSERT_OK_AND_ASSIGN(auto ra, f.ReadF32("a"));
  EXPECT_EQ(ra, a);
  ASSERT_OK_AND_ASSIGN(auto rb, f.ReadF32("b"));
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(rb[i], BF16ToFloat(b[i]));
  // The header is padded so the data section starts 8-byte aligned.
  uint64_t n;
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
}

TEST(Safetensors, TruncatedFileIsDataLossNamingTheTensor) {
  TempDir dir;
  std::vector<float> a(1000, 1.5f);
  std::string path = dir.File("t.safetensors");
  ASSERT_OK(WriteSafetensors(path, {{"big", DType::kF32, Shape{1000}, a.data()}}));
  ASSERT_EQ(::truncate(path.c_str(), 2000), 0);
  auto f = SafetensorsFile::Open(path);
  EXPECT_THAT(f, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(f.status().ToString(), HasSubstr("'big'"));
  EXPECT_THAT(f.status().ToString(), HasSubstr(path));
}

TEST(Safetensors, GarbageHeaderIsAClearError) {
  TempDir dir;
  std::string path = dir.File("g.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = 5;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{bad}";
  }
  EXPECT_THAT(SafetensorsFile::Open(path), StatusIs(StatusCode::kDataLoss));
  {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = 1ull << 40;
    out.write(reinterpret_cast<const char*>(&n), 8);
  }
  EXPECT_THAT(SafetensorsFile::Open(path), StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(SafetensorsFile::Open(dir.File("missing")), StatusIs(StatusCode::kIoError));
}

TEST(Safetensors, UncommittedWriterLeavesPreviousFileIntact) {
  TempDir dir;
  std::string path = dir.File("c.safetensors");
  std::vector<float> old(4, 2.f);
  ASSERT_OK(WriteSafetensors(path, {{"x", DType::kF32, Shape{4}, old.data()}}));
  {
    ASSERT_OK_AND_ASSIGN(auto w, SafetensorsWriter::Begin(path, {{"x", DType::kF32, Shape{4}}}));
    float half[2] = {9.f, 9.f};
    ASSERT_OK(w->Append(half, sizeof half));
    EXPECT_THAT(w->Commit(), StatusIs(StatusCode::kFailedPrecondition));  // short
  }  // destroyed: temp removed
  ASSERT_OK_AND_ASSIGN(auto f, SafetensorsFile::Open(path));
  ASSERT_OK_AND_ASSIGN(auto x, f.ReadF32("x"));
  EXPECT_EQ(x, old);
  int files = 0;
  for (auto& p : std::filesystem::directory_iterator(dir.path())) (void)p, ++files;
  EXPECT_EQ(files, 1);
}

TEST(Safetensors, WriterRejectsOverflowAndDuplicates) {
  TempDir dir;
  EXPECT_THAT(SafetensorsWriter::Begin(dir.File("d"), {{"x", DType::kF32, Shape{1}}, {"x", DType::kF32, Shape{1}}}),
              StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(auto w, SafetensorsWriter::Begin(dir.File("o"), {{"x", DType::kF32, Shape{1}}}));
  float two[2] = {1, 2};
  EXPECT_THAT(w->Append(two, sizeof two), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace strata
