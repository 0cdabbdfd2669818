#include "engine/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace strata {

namespace {
constexpr int32_t kLlmcMagic = 20240520;
constexpr int kLlmcHeaderInts = 256;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

Result<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path, const std::string& format) {
  if (format != "auto" && format != "text" && format != "tokens")
    return InvalidArgument("data format \"" + format + "\" is not allowed (allowed: auto, text, tokens)");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open data file", path);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status s = ErrnoStatus("cannot stat data file", path);
    ::close(fd);
    return s;
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
  const uint8_t* base = static_cast<const uint8_t*>(f->map_);
  int32_t header[3] = {0, 0, 0};
  if (f->map_bytes_ >= sizeof header) std::memcpy(header, base, sizeof header);
  bool looks_llmc = f->map_bytes_ >= kLlmcHeaderInts * 4 && header[0] == kLlmcMagic;
  bool bin_ext = path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
  Format fmt;
  if (format == "text") fmt = Format::kText;
  else if (looks_llmc) fmt = Format::kLlmc;
  else if (format == "tokens" || bin_ext) fmt = Format::kRawU16;
  else fmt = Format::kText;
  f->format_ = fmt;
  if (fmt == Format::kText) {
    f->bytes_ = base;
    f->count_ = f->map_bytes_;
  } else if (fmt == Format::kLlmc) {
    if (header[1] != 1)
      return InvalidArgument("llm.c token file " + path + " has version " + std::to_string(header[1]) +
                             "; only version 1 (uint16 tokens) is supported");
    f->header_bytes_ = kLlmcHeaderInts * 4;
    uint64_t have = (f->map_bytes_ - f->header_bytes_) / 2;
    uint64_t want = static_cast<uint32_t>(header[2]);
    if (have < want)
      return DataLoss("llm.c token file is truncated: the header says " + std::to_string(want) +
                          " tokens but the file holds " + std::to_string(have),
                      path, f->header_bytes_ + 2 * have);
    f->tokens_ = reinterpret_cast<const uint16_t*>(base + f->header_bytes_);
    f->count_ = want;
  } else {
    if (f->map_bytes_ % 2)
      return DataLoss("uint16 token file has an odd size (" + std::to_string(f->map_bytes_) + " bytes)", path,
                      f->map_bytes_ - 1);
    f->tokens_ = reinterpret_cast<const uint16_t*>(base);
    f->count_ = f->map_bytes_ / 2;
  }
  return f;
}

TokenFile::~TokenFile() {
  if (map_) munmap(map_, map_bytes_);
}

uint64_t TokenFile::FileOffset(uint64_t i) const {
  return format_ == Format::kText ? i : header_bytes_ + 2 * i;
}

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
  return d;
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
    uint64_t k = position_ * static_cast<uint64_t>(B_) + static_cast<uint64_t>(b);
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
    switch (f.format()) {
      case TokenFile::Format::kText: return "text, byte-level tokens";
      case TokenFile::Format::kLlmc: return "llm.c uint16 tokens";
      case TokenFile::Format::kRawU16: return "raw uint16 tokens";
    }
    return "?";
  };
  std::string s = file_->path() + ": " + std::to_string(train_.size()) + " training tokens (" + fmt(*file_) + ")";
  if (val_.size())
    s += ", " + std::to_string(val_.size()) + " validation tokens" +
         (val_file_ ? " from " + val_file_->path() : std::string(" (held-out tail)"));
  return s;
}

}  // namespace strata
