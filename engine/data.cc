// SPDX-License-Identifier: Apache-2.0
#include "engine/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace strata {

namespace {
constexpr int32_t kLlmcMagic = 20240520;     // uint16 tokens, version 1
constexpr int32_t kLlmcMagicU32 = 20240801;  // uint32 tokens, version 7 (llm.c's Llama 3 files)
constexpr int kLlmcHeaderInts = 256;
constexpr uint64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;
// Token files up to this many tokens have every id checked when opened;
// larger ones a sample (kSampleChunks evenly spaced runs, the first and last
// included), the rest as batches read them.
constexpr uint64_t kCheckAllTokens = uint64_t{1} << 28;
constexpr uint64_t kSampleChunks = 64;
constexpr uint64_t kSampleChunkTokens = uint64_t{1} << 20;
// A text file whose first 64 KiB hold more than 1% control bytes looks
// like binary tokens.
constexpr size_t kTextProbeBytes = 64 << 10;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const char* FileKind(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// Other llm.c files, by their magic, for the error that says what the file is.
const char* LlmcOtherFile(int32_t magic) {
  switch (magic) {
    case 20240326: return "an llm.c GPT-2 model checkpoint (gpt2_*.bin)";
    case 20240327: return "an llm.c debug state file";
    case 20240328: return "an llm.c tokenizer file";
    default: return nullptr;
  }
}

// True when the first 1 KiB is laid out as an llm.c token header (a small
// version, a token count that accounts for the file's size in uint16 or
// uint32 tokens, the rest zero) whatever its magic says.
bool LooksLikeLlmcHeader(const int32_t* h, uint64_t file_bytes) {
  if (file_bytes < kLlmcHeaderBytes || h[1] < 1 || h[1] > 16 || h[2] <= 0) return false;
  for (int i = 3; i < kLlmcHeaderInts; ++i)
    if (h[i] != 0) return false;
  const uint64_t n = static_cast<uint64_t>(h[2]);
  return file_bytes == kLlmcHeaderBytes + 2 * n || file_bytes == kLlmcHeaderBytes + 4 * n;
}

// The share of control bytes (not tab, newline, carriage return, form feed,
// vertical tab) in the first kTextProbeBytes.
double ControlByteShare(const uint8_t* p, size_t n) {
  n = std::min(n, kTextProbeBytes);
  size_t control = 0;
  for (size_t i = 0; i < n; ++i)
    if ((p[i] < 0x20 && (p[i] < 0x09 || p[i] > 0x0D)) || p[i] == 0x7F) ++control;
  return n ? static_cast<double>(control) / static_cast<double>(n) : 0.0;
}

std::string Percent(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%%", 100 * f);
  return b;
}

}  // namespace

Result<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path, const std::string& format) {
  if (format != "auto" && format != "text" && format != "tokens" && format != "tokens32")
    return InvalidArgument("data format \"" + format + "\" is not allowed (allowed: auto, text, tokens, tokens32)");
  // O_NONBLOCK: a FIFO without a writer would block open() forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open data file", path);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status s = ErrnoStatus("cannot stat data file", path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    if (S_ISDIR(st.st_mode))
      return InvalidArgument("data file " + path + " is a directory; give a file (text, or an llm.c/nanoGPT token file)");
    return InvalidArgument("data file " + path + " is " + FileKind(st.st_mode) +
                           "; strata memory-maps its data: give a regular file");
  }
  std::unique_ptr<TokenFile> f(new TokenFile());
  f->path_ = path;
  f->map_bytes_ = static_cast<size_t>(st.st_size);
  if (f->map_bytes_ == 0) {
    ::close(fd);
    return InvalidArgument("data file " + path + " is empty");
  }
  f->map_ = mmap(nullptr, f->map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  Status map_err = f->map_ == MAP_FAILED ? ErrnoStatus("cannot mmap data file", path) : Status::OK();
  ::close(fd);
  if (!map_err.ok()) {
    f->map_ = nullptr;
    return map_err;
  }
  madvise(f->map_, f->map_bytes_, MADV_RANDOM);
  RETURN_IF_ERROR(f->DetectFormat(format));
  return f;
}

Status TokenFile::DetectFormat(const std::string& format) {
  const std::string& path = path_;
  const uint8_t* base = static_cast<const uint8_t*>(map_);
  int32_t header[kLlmcHeaderInts] = {};
  std::memcpy(header, base, std::min<size_t>(map_bytes_, sizeof header));
  const bool has_header = map_bytes_ >= kLlmcHeaderBytes;
  const bool llmc16 = has_header && header[0] == kLlmcMagic;
  const bool llmc32 = has_header && header[0] == kLlmcMagicU32;
  const bool bin_ext = path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
  if (format != "text" && !llmc16 && !llmc32) {
    // A header in all but its magic: reading it as raw tokens would train on
    // the header.
    if (const char* other = has_header ? LlmcOtherFile(header[0]) : nullptr)
      return InvalidArgument("data file " + path + " is " + other + " (magic " + std::to_string(header[0]) +
                             "), not an llm.c token file (magic 20240520: uint16, 20240801: uint32)");
    if (LooksLikeLlmcHeader(header, map_bytes_))
      return InvalidArgument("data file " + path + " has an llm.c token file's 256-int header (version " +
                             std::to_string(header[1]) + ", " + std::to_string(header[2]) + " tokens) but magic " +
                             std::to_string(header[0]) + ", not 20240520 or 20240801: corrupt or another format; "
                             "strata does not read it as raw tokens (that would train on the header)");
  }
  if (format == "text") {
    format_ = Format::kText;
    format_reason_ = "data.format \"text\"";
    if (llmc16 || llmc32)
      warnings_.push_back(path + " starts with an llm.c token header (magic " + std::to_string(header[0]) +
                          ") but data.format is \"text\": its bytes are the tokens");
  } else if (llmc16 || llmc32) {
    format_ = llmc16 ? Format::kLlmc : Format::kLlmcU32;
    format_reason_ = "detected from its header: magic " + std::to_string(header[0]) + ", version " +
                     std::to_string(header[1]);
  } else if (format == "tokens32") {
    format_ = Format::kRawU32;
    format_reason_ = "data.format \"tokens32\", no llm.c header";
  } else if (format == "tokens" || bin_ext) {
    format_ = Format::kRawU16;
    format_reason_ = format == "tokens" ? "data.format \"tokens\", no llm.c header" : "by its .bin extension, no llm.c header";
  } else {
    format_ = Format::kText;
    format_reason_ = "no llm.c header, not .bin";
    const double share = ControlByteShare(base, map_bytes_);
    if (share > 0.01)
      warnings_.push_back(path + " is read as text (byte tokens), but " + Percent(share) + " of its first " +
                          std::to_string(std::min(map_bytes_, kTextProbeBytes)) +
                          " bytes are control bytes, as in a binary token file; set data.format \"tokens\" (uint16) "
                          "or \"tokens32\" (uint32) to read it as tokens (or \"text\" to keep this and silence the "
                          "warning)");
  }
  if (format_ == Format::kLlmc || format_ == Format::kLlmcU32) return MapLlmcTokens(header);
  token_bytes_ = format_ == Format::kText ? 1 : format_ == Format::kRawU16 ? 2 : 4;
  if (map_bytes_ % static_cast<size_t>(token_bytes_))
    return DataLoss("uint" + std::to_string(8 * token_bytes_) + " token file's size (" + std::to_string(map_bytes_) +
                        " bytes) is not a multiple of " + std::to_string(token_bytes_),
                    path, map_bytes_ - map_bytes_ % static_cast<size_t>(token_bytes_));
  SetTokens(0, map_bytes_ / static_cast<size_t>(token_bytes_));
  return Status::OK();
}

// The tokens after an llm.c header: its version must be the one its magic
// comes with, its count within the file.
Status TokenFile::MapLlmcTokens(const int32_t* header) {
  const bool u32 = format_ == Format::kLlmcU32;
  const int32_t version = u32 ? 7 : 1;
  token_bytes_ = u32 ? 4 : 2;
  if (header[1] != version)
    return InvalidArgument("llm.c token file " + path_ + " has magic " + std::to_string(header[0]) + " and version " +
                           std::to_string(header[1]) + "; supported: magic 20240520 version 1 (uint16 tokens), magic "
                           "20240801 version 7 (uint32 tokens, as llm.c writes for Llama 3)");
  if (header[2] < 0)
    return DataLoss("llm.c token file's header gives a negative token count (" + std::to_string(header[2]) + ")", path_,
                    8);
  const uint64_t width = static_cast<uint64_t>(token_bytes_);
  const uint64_t have = (map_bytes_ - kLlmcHeaderBytes) / width;
  const uint64_t want = static_cast<uint64_t>(header[2]);
  if (have < want)
    return DataLoss("llm.c token file is truncated: the header says " + std::to_string(want) +
                        " tokens but the file holds " + std::to_string(have),
                    path_, kLlmcHeaderBytes + width * have);
  if (map_bytes_ != kLlmcHeaderBytes + width * want)
    warnings_.push_back(path_ + ": " + std::to_string(map_bytes_ - kLlmcHeaderBytes - width * want) +
                        " bytes after the header's " + std::to_string(want) + " tokens are not read");
  SetTokens(kLlmcHeaderBytes, want);
  return Status::OK();
}

void TokenFile::SetTokens(uint64_t header_bytes, uint64_t count) {
  const uint8_t* p = static_cast<const uint8_t*>(map_) + header_bytes;
  header_bytes_ = header_bytes;
  count_ = count;
  bytes_ = p;
  tokens_ = reinterpret_cast<const uint16_t*>(p);
  tokens32_ = reinterpret_cast<const uint32_t*>(p);
}

std::optional<uint64_t> TokenFile::FindIdAtLeast(uint64_t begin, uint64_t end, uint32_t limit) const {
  auto scan = [&](const auto* ids) -> std::optional<uint64_t> {
    for (uint64_t i = begin; i < end; ++i)
      if (ids[i] >= limit) return i;
    return std::nullopt;
  };
  if (token_bytes_ == 1) return limit > 255 ? std::nullopt : scan(bytes_);
  return token_bytes_ == 2 ? scan(tokens_) : scan(tokens32_);
}

TokenFile::~TokenFile() {
  if (map_) munmap(map_, map_bytes_);
}

uint64_t TokenFile::FileOffset(uint64_t i) const { return header_bytes_ + static_cast<uint64_t>(token_bytes_) * i; }

Result<std::unique_ptr<DataLoader>> DataLoader::Open(const DataConfig& cfg, const std::string& default_path,
                                                     int vocab_size, int batch, int seq_len) {
  if (batch < 1 || seq_len < 1) return InvalidArgument("batch and seq_len must be positive");
  std::unique_ptr<DataLoader> d(new DataLoader());
  d->cfg_ = cfg;
  d->vocab_ = vocab_size;
  d->B_ = batch;
  d->T_ = seq_len;
  std::string path = cfg.path.empty() ? default_path : cfg.path;
  if (path.empty()) return InvalidArgument("no training data: give data.path in the config or --data PATH");
  ASSIGN_OR_RETURN(d->file_, TokenFile::Open(path, cfg.format));
  if (d->file_->format() == TokenFile::Format::kText && vocab_size < 256)
    return InvalidArgument("data file " + path + " is read as text (byte tokens 0..255) but model.vocab_size is " +
                           std::to_string(vocab_size) + "; use vocab_size >= 256 or a token file");
  const uint64_t need = static_cast<uint64_t>(seq_len) + 1;
  uint64_t n = d->file_->size();
  if (!cfg.val_path.empty()) {
    ASSIGN_OR_RETURN(d->val_file_, TokenFile::Open(cfg.val_path, cfg.format));
    d->train_ = {d->file_.get(), 0, n};
    d->val_ = {d->val_file_.get(), 0, d->val_file_->size()};
  } else {
    uint64_t nval = static_cast<uint64_t>(static_cast<double>(n) * cfg.val_fraction);
    if (cfg.val_fraction > 0 && nval < need) nval = std::min<uint64_t>(need, n);
    d->train_ = {d->file_.get(), 0, n - nval};
    d->val_ = {d->file_.get(), n - nval, n};
  }
  if (d->train_.size() < need)
    return InvalidArgument("training data in " + path + " has " + std::to_string(d->train_.size()) +
                           " tokens after the validation split; seq_len " + std::to_string(seq_len) + " needs at least " +
                           std::to_string(need));
  if (d->val_.size() != 0 && d->val_.size() < need)
    return InvalidArgument("validation data in " + d->val_.file->path() + " has " + std::to_string(d->val_.size()) +
                           " tokens; seq_len " + std::to_string(seq_len) + " needs at least " + std::to_string(need));
  RETURN_IF_ERROR(d->CheckIds(*d->file_));
  if (d->val_file_) RETURN_IF_ERROR(d->CheckIds(*d->val_file_));
  return d;
}

// Every id of `f` (or, in a large file, an even sample of runs of ids) is
// below the vocabulary, so that a wrong file fails before the first step.
Status DataLoader::CheckIds(const TokenFile& f) {
  if (f.format() == TokenFile::Format::kText) return Status::OK();  // bytes, and the vocabulary holds 256
  const uint64_t n = f.size();
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  if (n <= kCheckAllTokens) {
    runs.push_back({0, n});
  } else {
    for (uint64_t c = 0; c < kSampleChunks; ++c) {
      const uint64_t begin = (n - kSampleChunkTokens) / (kSampleChunks - 1) * c;
      runs.push_back({begin, std::min(n, begin + kSampleChunkTokens)});
    }
    runs.back() = {n - kSampleChunkTokens, n};
  }
  for (const auto& [begin, end] : runs)
    if (std::optional<uint64_t> i = f.FindIdAtLeast(begin, end, static_cast<uint32_t>(vocab_)))
      return InvalidArgument("token id " + std::to_string(f[*i]) + " at byte offset " +
                             std::to_string(f.FileOffset(*i)) + " of " + f.path() +
                             " is outside the model's vocabulary (vocab_size " + std::to_string(vocab_) +
                             "; found checking the data before the first step)");
  std::string note = n <= kCheckAllTokens ? "every token id checked < vocab_size " + std::to_string(vocab_)
                                          : "token ids < vocab_size " + std::to_string(vocab_) + " in a sample of " +
                                                std::to_string(kSampleChunks) + " x " +
                                                std::to_string(kSampleChunkTokens) + " tokens (the rest as read)";
  checks_.push_back(f.path() + ": " + note);
  return Status::OK();
}

Status DataLoader::Fill(const TokenSpan& span, uint64_t start, int32_t* tokens, int32_t* targets, int row) const {
  for (int t = 0; t <= T_; ++t) {
    uint64_t i = span.begin + start + static_cast<uint64_t>(t);
    uint32_t id = (*span.file)[i];
    if (id >= static_cast<uint32_t>(vocab_))
      return InvalidArgument("token id " + std::to_string(id) + " at byte offset " +
                             std::to_string(span.file->FileOffset(i)) + " of " + span.file->path() +
                             " is outside the model's vocabulary (vocab_size " + std::to_string(vocab_) + ")");
    if (t < T_) tokens[row * T_ + t] = static_cast<int32_t>(id);
    if (t > 0) targets[row * T_ + t - 1] = static_cast<int32_t>(id);
  }
  return Status::OK();
}

Status DataLoader::NextTrain(int32_t* tokens, int32_t* targets) {
  const uint64_t windows = train_.size() - static_cast<uint64_t>(T_);  // valid start positions
  for (int b = 0; b < B_; ++b) {
    uint64_t k = (position_ * static_cast<uint64_t>(world_) + static_cast<uint64_t>(rank_)) * static_cast<uint64_t>(B_) +
                 static_cast<uint64_t>(b);
    uint64_t start;
    if (cfg_.sampling == "sequential") {
      start = (k * static_cast<uint64_t>(T_)) % windows;
    } else {
      start = SplitMix64(cfg_.seed ^ SplitMix64(k)) % windows;
    }
    RETURN_IF_ERROR(Fill(train_, start, tokens, targets, b));
  }
  ++position_;
  return Status::OK();
}

Status DataLoader::Val(uint64_t index, int32_t* tokens, int32_t* targets) const {
  if (val_.size() == 0) return FailedPrecondition("no validation data (data.val_fraction is 0 and no data.val_path)");
  const uint64_t windows = val_.size() - static_cast<uint64_t>(T_);
  for (int b = 0; b < B_; ++b) {
    uint64_t k = index * static_cast<uint64_t>(B_) + static_cast<uint64_t>(b);
    RETURN_IF_ERROR(Fill(val_, (k * static_cast<uint64_t>(T_)) % windows, tokens, targets, b));
  }
  return Status::OK();
}

std::string DataLoader::Describe() const {
  auto fmt = [](const TokenFile& f) {
    std::string what;
    switch (f.format()) {
      case TokenFile::Format::kText: what = "text, byte-level tokens"; break;
      case TokenFile::Format::kLlmc: what = "llm.c uint16 tokens"; break;
      case TokenFile::Format::kLlmcU32: what = "llm.c uint32 tokens"; break;
      case TokenFile::Format::kRawU16: what = "raw uint16 tokens"; break;
      case TokenFile::Format::kRawU32: what = "raw uint32 tokens"; break;
    }
    return what + "; " + f.format_reason();
  };
  std::string s = file_->path() + ": " + std::to_string(train_.size()) + " training tokens (" + fmt(*file_) + ")";
  if (val_.size())
    s += ", " + std::to_string(val_.size()) + " validation tokens" +
         (val_file_ ? " from " + val_file_->path() + " (" + fmt(*val_file_) + ")" : std::string(" (held-out tail)"));
  for (const std::string& c : checks_) s += "\n  " + c;
  for (const TokenFile* f : {file_.get(), val_file_.get()})
    if (f)
      for (const std::string& w : f->warnings()) s += "\nwarning: " + w;
  return s;
}

}  // namespace strata
