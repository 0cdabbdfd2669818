#include "engine/data.h"

#include <fstream>

#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

void WriteLlmc(const std::string& path, const std::vector<uint16_t>& toks, int32_t claimed = -1) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = claimed >= 0 ? claimed : static_cast<int32_t>(toks.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(toks.data()), static_cast<std::streamsize>(2 * toks.size()));
}

TEST(Data, TextBatchesAreShiftedByOne) {
  TempDir dir;
  std::string p = dir.File("t.txt");
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>('a' + i % 26));
  std::ofstream(p) << text;
  DataConfig cfg;
  cfg.path = p;
  cfg.val_fraction = 0.1;
  ASSERT_OK_AND_ASSIGN(auto d, DataLoader::Open(cfg, "", 256, 4, 16));
  EXPECT_EQ(d->train_tokens(), 900u);
  EXPECT_EQ(d->val_tokens(), 100u);
  std::vector<int32_t> x(64), y(64);
  ASSERT_OK(d->NextTrain(x.data(), y.data()));
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 15; ++t) EXPECT_EQ(x[b * 16 + t + 1], y[b * 16 + t]);
  for (int32_t v : x) EXPECT_TRUE(v >= 'a' && v <= 'z');
  EXPECT_EQ(d->position(), 1u);
}

TEST(Data, BatchesArePureFunctionsOfPosition) {
  TempDir dir;
  std::string p = dir.File("t.txt");
  std::string text(5000, 'x');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(i * 7 % 251);
  std::ofstream(p, std::ios::binary) << text;
  DataConfig cfg;
  cfg.path = p;
  ASSERT_OK_AND_ASSIGN(auto a, DataLoader::Open(cfg, "", 256, 2, 8));
  ASSERT_OK_AND_ASSIGN(auto b, DataLoader::Open(cfg, "", 256, 2, 8));
  std::vector<int32_t> x1(16), y1(16), x2(16), y2(16);
  for (int i = 0; i < 5; ++i) ASSERT_OK(a->NextTrain(x1.data(), y1.data()));
  b->set_position(4);
  ASSERT_OK(b->NextTrain(x2.data(), y2.data()));
  EXPECT_EQ(x1, x2);
  EXPECT_EQ(y1, y2);
}

TEST(Data, LlmcAndRawTokenFiles) {
  TempDir dir;
  std::vector<uint16_t> toks(300);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i % 50000);
  std::string p = dir.File("train.bin");
  WriteLlmc(p, toks);
  DataConfig cfg;
  cfg.path = p;
  cfg.sampling = "sequential";
  cfg.val_fraction = 0;
  ASSERT_OK_AND_ASSIGN(auto d, DataLoader::Open(cfg, "", 50304, 1, 10));
  std::vector<int32_t> x(10), y(10);
  ASSERT_OK(d->NextTrain(x.data(), y.data()));
  for (int t = 0; t < 10; ++t) EXPECT_EQ(x[t], t);
  ASSERT_OK(d->NextTrain(x.data(), y.data()));
  EXPECT_EQ(x[0], 10);
  std::string raw = dir.File("raw.bin");
  std::ofstream(raw, std::ios::binary).write(reinterpret_cast<const char*>(toks.data()), 600);
  cfg.path = raw;
  ASSERT_OK_AND_ASSIGN(auto r, DataLoader::Open(cfg, "", 50304, 1, 10));
  ASSERT_OK(r->NextTrain(x.data(), y.data()));
  EXPECT_EQ(y[9], 10);
}

TEST(Data, TruncatedLlmcFileIsDataLoss) {
  TempDir dir;
  std::vector<uint16_t> toks(100, 1);
  std::string p = dir.File("cut.bin");
  WriteLlmc(p, toks, 500);
  DataConfig cfg;
  cfg.path = p;
  auto r = DataLoader::Open(cfg, "", 256, 1, 8);
  EXPECT_THAT(r, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(r.status().ToString(), AllOf(HasSubstr("500"), HasSubstr(p)));
}

TEST(Data, TokenOutsideVocabularyNamesOffset) {
  TempDir dir;
  std::vector<uint16_t> toks(100, 3);
  toks[5] = 999;
  std::string p = dir.File("v.bin");
  WriteLlmc(p, toks);
  DataConfig cfg;
  cfg.path = p;
  cfg.sampling = "sequential";
  cfg.val_fraction = 0;
  ASSERT_OK_AND_ASSIGN(auto d, DataLoader::Open(cfg, "", 512, 1, 8));
  std::vector<int32_t> x(8), y(8);
  Status s = d->NextTrain(x.data(), y.data());
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(s.ToString(), AllOf(HasSubstr("999"), HasSubstr("byte offset 1034"), HasSubstr(p)));
}

TEST(Data, TooShortAndMissingFiles) {
  TempDir dir;
  std::string p = dir.File("s.txt");
  std::ofstream(p) << "short";
  DataConfig cfg;
  cfg.path = p;
  EXPECT_THAT(DataLoader::Open(cfg, "", 256, 1, 64), StatusIs(StatusCode::kInvalidArgument));
  cfg.path = dir.File("nope.txt");
  auto r = DataLoader::Open(cfg, "", 256, 1, 8);
  EXPECT_THAT(r, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(r.status().sys_errno(), ENOENT);
  cfg.path = p;
  EXPECT_THAT(DataLoader::Open(cfg, "", 100, 1, 2), StatusIs(StatusCode::kInvalidArgument));  // text needs 256
}

TEST(Data, BundledCorpusOpens) {
  DataConfig cfg;
  ASSERT_OK_AND_ASSIGN(auto d, DataLoader::Open(cfg, testing::SourcePath("data/kjv.txt"), 256, 8, 128));
  EXPECT_GT(d->train_tokens(), 3'000'000u);
  std::vector<int32_t> x(8 * 128), y(8 * 128);
  ASSERT_OK(d->Val(0, x.data(), y.data()));
  ASSERT_OK(d->NextTrain(x.data(), y.data()));
}

}  // namespace
}  // namespace strata
