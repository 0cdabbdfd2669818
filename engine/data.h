// SPDX-License-Identifier: Apache-2.0
// Training data: token streams from files, memory-mapped, cut into batches.
//
// Formats (DataConfig::format, "auto" picks by content):
// - llm.c token files: a 256 x int32 header (magic, version, token count)
//   followed by the tokens: magic 20240520 version 1, uint16 tokens (GPT-2),
//   or magic 20240801 version 7, uint32 tokens (what llm.c's
//   dev/data/data_common.py writes for Llama 3); detected from the header
//   whatever the file's name;
// - nanoGPT token files: raw uint16 tokens (".bin" with no header, or
//   data.format "tokens"); raw uint32 tokens with data.format "tokens32";
// - text: every byte is a token (vocabulary 256); a text file whose first
//   64 KiB look binary gets a warning (set data.format).
// A file whose header is an llm.c header but for its magic, or another llm.c
// file (a model, a tokenizer, uint32 tokens), is an error rather than raw
// uint16. The format and why it was chosen are stated in Describe(), as are
// the warnings. Data must be a regular file (opened without blocking: a FIFO
// is an error, never a hang). Token ids are checked against the vocabulary
// when the loader opens (every id up to 256 Mi tokens, else a sample), so a
// wrong file fails before the first step, not in the middle of the run.
//
// Batches are [B, T] token ids with targets shifted by one. Positions come
// from a counter, not hidden RNG state: batch k of the training stream is a
// pure function of (seed, k), so a resumed run draws exactly the batches an
// uninterrupted run would (the checkpoint stores k).
//
// Thread-safety: a DataLoader is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/config.h"

namespace strata {

class TokenFile {
 public:
  enum class Format { kText, kLlmc, kLlmcU32, kRawU16, kRawU32 };
  // `format`: "auto", "text", "tokens" (uint16) or "tokens32" (uint32).
  static Result<std::unique_ptr<TokenFile>> Open(const std::string& path, const std::string& format);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  uint64_t size() const { return count_; }
  uint32_t operator[](uint64_t i) const {
    return token_bytes_ == 1 ? bytes_[i] : token_bytes_ == 2 ? tokens_[i] : tokens32_[i];
  }
  Format format() const { return format_; }
  // Why the format is what it is ("detected from its header: ...").
  const std::string& format_reason() const { return format_reason_; }
  // What looked wrong but is read anyway (a text file that looks binary).
  const std::vector<std::string>& warnings() const { return warnings_; }
  const std::string& path() const { return path_; }
  // Byte offset in the file of token i (for error messages).
  uint64_t FileOffset(uint64_t i) const;
  // The first index in [begin, end) whose id is >= limit, or nullopt.
  std::optional<uint64_t> FindIdAtLeast(uint64_t begin, uint64_t end, uint32_t limit) const;

 private:
  TokenFile() = default;
  Status DetectFormat(const std::string& format);
  Status MapLlmcTokens(const int32_t* header);
  void SetTokens(uint64_t header_bytes, uint64_t count);
  std::string path_;
  Format format_ = Format::kText;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* bytes_ = nullptr;
  const uint16_t* tokens_ = nullptr;
  const uint32_t* tokens32_ = nullptr;
  int token_bytes_ = 1;  // 1 (text), 2 or 4
  uint64_t count_ = 0;
  uint64_t header_bytes_ = 0;
  std::string format_reason_;
  std::vector<std::string> warnings_;
};

// A contiguous range of a token file.
struct TokenSpan {
  const TokenFile* file = nullptr;
  uint64_t begin = 0, end = 0;
  uint64_t size() const { return end - begin; }
};

class DataLoader {
 public:
  // Opens `cfg.path` (or `default_path` when empty) and the validation data
  // (cfg.val_path, or the last cfg.val_fraction of the training file).
  // Errors: missing file (IoError), not a regular file, a split shorter
  // than seq_len + 1 tokens, a token id >= vocab_size (InvalidArgument naming
  // the file, the counts or the id and its byte offset).
  static Result<std::unique_ptr<DataLoader>> Open(const DataConfig& cfg, const std::string& default_path,
                                                  int vocab_size, int batch, int seq_len);

  // Fills tokens and targets ([B, T] int32 each) with training batch number
  // `position()` and advances. A token id >= vocab_size is InvalidArgument
  // naming the file, the byte offset and the id.
  Status NextTrain(int32_t* tokens, int32_t* targets);
  // Validation batch `index` (deterministic; sequential windows, wrapping).
  Status Val(uint64_t index, int32_t* tokens, int32_t* targets) const;

  // Data parallelism (engine/data_parallel.h): training batch p is then
  // rank `rank`'s slice of the global batch p of `world` × B samples —
  // samples [p·B·world + rank·B, p·B·world + (rank + 1)·B) of the one
  // sample sequence — so the sequence does not depend on the world size.
  void SetRanks(int rank, int world) {
    rank_ = rank;
    world_ = world;
  }
  uint64_t position() const { return position_; }
  void set_position(uint64_t p) { position_ = p; }

  uint64_t train_tokens() const { return train_.size(); }
  uint64_t val_tokens() const { return val_.size(); }
  // "data/kjv.txt: 3930958 training tokens (text, byte-level tokens; no llm.c
  // header, not .bin), 206892 validation tokens (held-out tail)", then a line
  // per file checked and per warning.
  std::string Describe() const;

 private:
  DataLoader() = default;
  Status Fill(const TokenSpan& span, uint64_t start, int32_t* tokens, int32_t* targets, int row) const;
  Status CheckIds(const TokenFile& f);

  DataConfig cfg_;
  std::unique_ptr<TokenFile> file_, val_file_;
  TokenSpan train_, val_;
  int vocab_ = 0, B_ = 0, T_ = 0;
  uint64_t position_ = 0;
  int rank_ = 0, world_ = 1;
  std::vector<std::string> checks_;  // what CheckIds checked, per file
};

}  // namespace strata
