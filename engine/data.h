// Training data: token streams from files, memory-mapped, cut into batches.
//
// Formats (DataConfig::format, "auto" picks by content):
// - llm.c token files: a 256 x int32 header (magic 20240520, version 1,
//   token count) followed by uint16 tokens;
// - nanoGPT token files: raw uint16 tokens (".bin" with no header);
// - text: every byte is a token (vocabulary 256).
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
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/config.h"

namespace strata {

class TokenFile {
 public:
  enum class Format { kText, kLlmc, kRawU16 };
  // `format`: "auto", "text" or "tokens".
  static Result<std::unique_ptr<TokenFile>> Open(const std::string& path, const std::string& format);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  uint64_t size() const { return count_; }
  uint32_t operator[](uint64_t i) const {
    return format_ == Format::kText ? bytes_[i] : tokens_[i];
  }
  Format format() const { return format_; }
  const std::string& path() const { return path_; }
  // Byte offset in the file of token i (for error messages).
  uint64_t FileOffset(uint64_t i) const;

 private:
  TokenFile() = default;
  std::string path_;
  Format format_ = Format::kText;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* bytes_ = nullptr;
  const uint16_t* tokens_ = nullptr;
  uint64_t count_ = 0;
  uint64_t header_bytes_ = 0;
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
  // Errors: missing file (IoError), a split shorter than seq_len + 1 tokens
  // (InvalidArgument naming the file and the counts).
  static Result<std::unique_ptr<DataLoader>> Open(const DataConfig& cfg, const std::string& default_path,
                                                  int vocab_size, int batch, int seq_len);

  // Fills tokens and targets ([B, T] int32 each) with training batch number
  // `position()` and advances. A token id >= vocab_size is InvalidArgument
  // naming the file, the byte offset and the id.
  Status NextTrain(int32_t* tokens, int32_t* targets);
  // Validation batch `index` (deterministic; sequential windows, wrapping).
  Status Val(uint64_t index, int32_t* tokens, int32_t* targets) const;

  uint64_t position() const { return position_; }
  void set_position(uint64_t p) { position_ = p; }

  uint64_t train_tokens() const { return train_.size(); }
  uint64_t val_tokens() const { return val_.size(); }
  std::string Describe() const;  // "data/kjv.txt: 4.1 M tokens (text, byte-level); val 207 K tokens ..."

 private:
  DataLoader() = default;
  Status Fill(const TokenSpan& span, uint64_t start, int32_t* tokens, int32_t* targets, int row) const;

  DataConfig cfg_;
  std::unique_ptr<TokenFile> file_, val_file_;
  TokenSpan train_, val_;
  int vocab_ = 0, B_ = 0, T_ = 0;
  uint64_t position_ = 0;
};

}  // namespace strata
