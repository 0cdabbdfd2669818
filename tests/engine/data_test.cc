// SPDX-License-Identifier: Apache-2.0
#include "engine/data.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <tuple>
#include <utility>

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

// Regression: a token id outside the vocabulary was found mid-run; it is
// found when the loader opens, before the first step, naming the offset.
TEST(Data, TokenOutsideVocabularyIsFoundBeforeTheFirstStep) {
  TempDir dir;
  std::vector<uint16_t> toks(100, 3);
  toks[5] = 999;
  std::string p = dir.File("v.bin");
  WriteLlmc(p, toks);
  DataConfig cfg;
  cfg.path = p;
  cfg.sampling = "sequential";
  cfg.val_fraction = 0;
  auto r = DataLoader::Open(cfg, "", 512, 1, 8);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().ToString(),
              AllOf(HasSubstr("999"), HasSubstr("byte offset 1034"), HasSubstr(p), HasSubstr("before the first step")));
  // Within the vocabulary it opens, and says what it checked.
  ASSERT_OK_AND_ASSIGN(auto d, DataLoader::Open(cfg, "", 1000, 1, 8));
  EXPECT_THAT(d->Describe(), HasSubstr("every token id checked < vocab_size 1000"));
}

// Regression: an llm.c token file with a wrong magic was read as raw uint16,
// header included.
TEST(Data, LlmcHeaderWithAWrongMagicIsAnError) {
  TempDir dir;
  std::vector<uint16_t> toks(300, 7);
  for (const char* name : {"bad.bin", "bad.dat"}) {
    std::string p = dir.File(name);
    WriteLlmc(p, toks);
    {
      std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
      const int32_t magic = 20240521;  // one bit off
      f.write(reinterpret_cast<const char*>(&magic), 4);
    }
    for (const char* format : {"auto", "tokens"}) {
      auto r = TokenFile::Open(p, format);
      EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument)) << name << " " << format;
      EXPECT_THAT(r.status().ToString(), AllOf(HasSubstr(p), HasSubstr("magic 20240521"), HasSubstr("300 tokens")));
    }
    // Asked for as text, it is text (the bytes are the tokens).
    EXPECT_OK(TokenFile::Open(p, "text").status());
  }
}

TEST(Data, OtherLlmcFilesAreNamed) {
  TempDir dir;
  const std::pair<int32_t, const char*> cases[] = {{20240326, "model checkpoint"},
                                                   {20240328, "tokenizer"},
                                                   {20240801, "version 7 (uint32 tokens"}};  // a uint32 file's magic, version 3
  for (const auto& [magic, what] : cases) {
    std::string p = dir.File("f" + std::to_string(magic) + ".bin");
    std::vector<int32_t> header(256 + 64, 0);
    header[0] = magic;
    header[1] = 3;
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(header.data()), header.size() * 4);
    auto r = TokenFile::Open(p, "auto");
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument)) << magic;
    EXPECT_THAT(r.status().ToString(), HasSubstr(what));
  }
}

void WriteLlmcU32(const std::string& path, const std::vector<uint32_t>& toks, int32_t version = 7) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240801;
  header[1] = version;
  header[2] = static_cast<int32_t>(toks.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(toks.data()), static_cast<std::streamsize>(4 * toks.size()));
}

// Large vocabularies: llm.c's uint32 token files (magic 20240801, version 7,
// as its data_common.py writes for Llama 3) and raw uint32 files
// (data.format "tokens32") carry ids past 65535; an id outside the
// vocabulary names the file and its byte offset at 4 bytes a token.
TEST(Data, Uint32TokenFiles) {
  TempDir dir;
  std::vector<uint32_t> toks(300);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint32_t>(100000 + i);
  const std::string llmc = dir.File("llama.tokens"), raw = dir.File("raw.u32");
  WriteLlmcU32(llmc, toks);
  std::ofstream(raw, std::ios::binary).write(reinterpret_cast<const char*>(toks.data()), 4 * 300);
  for (const auto& [path, format, want] : {std::tuple{llmc, "auto", TokenFile::Format::kLlmcU32},
                                           std::tuple{raw, "tokens32", TokenFile::Format::kRawU32}}) {
    SCOPED_TRACE(path);
    DataConfig cfg;
    cfg.path = path;
    cfg.format = format;
    cfg.sampling = "sequential";
    cfg.val_fraction = 0;
    ASSERT_OK_AND_ASSIGN(auto d, DataLoader::Open(cfg, "", 128256, 2, 10));
    EXPECT_THAT(d->Describe(), HasSubstr("uint32 tokens"));
    std::vector<int32_t> x(20), y(20);
    ASSERT_OK(d->NextTrain(x.data(), y.data()));
    for (int t = 0; t < 10; ++t) {
      EXPECT_EQ(x[t], 100000 + t);
      EXPECT_EQ(y[t], 100001 + t);
      EXPECT_EQ(x[10 + t], 100010 + t);
    }
    ASSERT_OK_AND_ASSIGN(auto f, TokenFile::Open(path, format));
    EXPECT_EQ(f->format(), want);
    EXPECT_EQ(f->size(), 300u);
    // vocab 100007: token 7 (100007) is the first outside it.
    auto r = DataLoader::Open(cfg, "", 100007, 1, 8);
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    const uint64_t offset = (path == llmc ? 1024 : 0) + 4 * 7;
    EXPECT_THAT(r.status().ToString(), AllOf(HasSubstr("token id 100007"), HasSubstr(path),
                                             HasSubstr("byte offset " + std::to_string(offset))));
  }
  // The uint32 magic with another version, a raw file of a size not a
  // multiple of 4, a truncated uint32 file: errors naming the file.
  WriteLlmcU32(llmc, toks, 2);
  auto v = TokenFile::Open(llmc, "auto");
  EXPECT_THAT(v, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(v.status().ToString(), AllOf(HasSubstr(llmc), HasSubstr("version 2"), HasSubstr("version 7")));
  std::ofstream(raw, std::ios::binary | std::ios::app) << "x";
  EXPECT_THAT(TokenFile::Open(raw, "tokens32"), StatusIs(StatusCode::kDataLoss));
  WriteLlmcU32(llmc, toks);
  std::filesystem::resize_file(llmc, 1024 + 4 * 299 + 2);
  auto cut = TokenFile::Open(llmc, "auto");
  EXPECT_THAT(cut, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(cut.status().ToString(), AllOf(HasSubstr("truncated"), HasSubstr("300 tokens"), HasSubstr("299")));
}

// The format is detected from the header whatever the name, and stated with
// why; a raw token file needs .bin or data.format "tokens".
TEST(Data, FormatIsDetectedAndStated) {
  TempDir dir;
  std::vector<uint16_t> toks(400);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i * 37 % 5000);
  std::string named = dir.File("shard.tokens");
  WriteLlmc(named, toks);
  ASSERT_OK_AND_ASSIGN(auto a, TokenFile::Open(named, "auto"));
  EXPECT_EQ(a->format(), TokenFile::Format::kLlmc);
  EXPECT_THAT(a->format_reason(), HasSubstr("detected from its header"));
  std::string raw = dir.File("raw.u16");
  std::ofstream(raw, std::ios::binary).write(reinterpret_cast<const char*>(toks.data()), 800);
  ASSERT_OK_AND_ASSIGN(auto b, TokenFile::Open(raw, "tokens"));
  EXPECT_EQ(b->format(), TokenFile::Format::kRawU16);
  EXPECT_THAT(b->format_reason(), HasSubstr("data.format \"tokens\""));
  // Without either it is text, with a warning that it looks like tokens.
  ASSERT_OK_AND_ASSIGN(auto c, TokenFile::Open(raw, "auto"));
  EXPECT_EQ(c->format(), TokenFile::Format::kText);
  ASSERT_EQ(c->warnings().size(), 1u);
  EXPECT_THAT(c->warnings()[0], AllOf(HasSubstr(raw), HasSubstr("control bytes"), HasSubstr("data.format \"tokens\"")));
  DataConfig cfg;
  cfg.path = raw;
  cfg.val_fraction = 0;
  ASSERT_OK_AND_ASSIGN(auto d, DataLoader::Open(cfg, "", 50304, 1, 8));
  EXPECT_THAT(d->Describe(), AllOf(HasSubstr("(text, byte-level tokens; no llm.c header, not .bin)"),
                                   HasSubstr("\nwarning: " + raw)));
  // Real text says nothing.
  ASSERT_OK_AND_ASSIGN(auto t, TokenFile::Open(testing::SourcePath("data/kjv.txt"), "auto"));
  EXPECT_TRUE(t->warnings().empty());
}

// Regression: a FIFO as --data blocked in open() forever.
TEST(Data, AFifoOrADirectoryIsAnErrorNotAHang) {
  TempDir dir;
  const std::string fifo = dir.File("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = TokenFile::Open(fifo, "auto");
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().ToString(), AllOf(HasSubstr(fifo), HasSubstr("FIFO"), HasSubstr("regular file")));
  auto d = TokenFile::Open(dir.path(), "auto");
  EXPECT_THAT(d, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(d.status().ToString(), HasSubstr("is a directory"));
  auto z = TokenFile::Open("/dev/zero", "auto");
  EXPECT_THAT(z, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(z.status().ToString(), HasSubstr("character device"));
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
