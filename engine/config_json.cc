// SPDX-License-Identifier: Apache-2.0
#include "engine/config_json.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iterator>
#include <map>
#include <vector>

namespace strata {

using nlohmann::json;

namespace {

// An fd closed at scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

const char* FileKind(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// Length of the UTF-8 sequence starting at s[i], or 0 when it is not one.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
  return n;
}

// "line:column" (1-based) of byte `offset` of `text`.
std::string LineColumn(std::string_view text, size_t offset) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') line++, col = 1;
    else col++;
  }
  return std::to_string(line) + ":" + std::to_string(col);
}

// An input iterator over the text that publishes how far the parser has
// read (nlohmann's SAX interface gives no positions but to errors).
class CountingIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  CountingIterator(const char* p, const char* base, size_t* read) : p_(p), base_(base), read_(read) {}
  reference operator*() const { return *p_; }
  CountingIterator& operator++() {
    ++p_;
    *read_ = static_cast<size_t>(p_ - base_);
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const CountingIterator& o) const { return p_ == o.p_; }
  bool operator!=(const CountingIterator& o) const { return p_ != o.p_; }

 private:
  const char* p_;
  const char* base_;
  size_t* read_;
};

// Builds the DOM as nlohmann's own SAX DOM parser does, knowing at each
// value its key path, and collecting errors instead of throwing.
class ConfigSax {
 public:
  ConfigSax(std::string_view text, const std::string& source, int max_depth, const size_t* read)
      : text_(text), source_(source), max_depth_(max_depth), read_(read) {}

  bool null() { return Value(nullptr); }
  bool boolean(bool v) { return Value(v); }
  bool number_integer(json::number_integer_t v) { return Value(v); }
  bool number_unsigned(json::number_unsigned_t v) { return Value(v); }
  bool number_float(json::number_float_t v, const std::string&) { return Value(v); }
  bool string(std::string& v) { return Value(std::move(v)); }
  bool binary(json::binary_t& v) { return Value(std::move(v)); }

  bool start_object(size_t) { return Open(json::object()); }
  bool start_array(size_t) { return Open(json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(std::string& k) {
    Frame& f = frames_.back();
    const size_t end = *read_;  // just past the key's closing quote
    const size_t begin = KeyStart(end);
    auto [it, fresh] = f.keys.emplace(k, begin);
    if (!fresh)
      errors_.push_back(source_ + ":" + LineColumn(text_, begin) + ": " + Path(&k) +
                        ": duplicate key (first at " + LineColumn(text_, it->second) +
                        "); DeepSpeed refuses a key given twice: keep one");
    f.key = k;
    return true;
  }

  bool parse_error(size_t, const std::string& last_token, const json::exception& e) {
    const std::string where = source_ + ":" + LineColumn(text_, *read_ > 0 ? *read_ - 1 : 0);
    if (e.id == 406)  // out_of_range: number overflow
      errors_.push_back(where + ": " + Path(nullptr) + ": the number " + PrintableText(last_token, 40) +
                        " is out of range (beyond double's ±1.8e308)");
    else
      errors_.push_back(where + ": not valid JSON: " + PrintableText(e.what(), 200));
    return false;
  }

  json& root() { return root_; }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  struct Frame {
    json* value;
    std::map<std::string, size_t> keys;  // key -> byte offset of its opening quote
    std::string key;                     // the key of the value being read (objects)
  };

  // Where the value now read goes.
  json* Place(json v) {
    if (frames_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Frame& f = frames_.back();
    if (f.value->is_array()) {
      f.value->push_back(std::move(v));
      return &f.value->back();
    }
    json& slot = (*f.value)[f.key];
    slot = std::move(v);
    return &slot;
  }
  bool Value(json v) {
    Place(std::move(v));
    return true;
  }
  bool Open(json container) {
    if (static_cast<int>(frames_.size()) >= max_depth_) {
      errors_.push_back(source_ + ":" + LineColumn(text_, *read_ > 0 ? *read_ - 1 : 0) + ": " + Path(nullptr) +
                        ": nested deeper than " + std::to_string(max_depth_) +
                        " levels (a DeepSpeed config has a handful)");
      return false;
    }
    json* v = Place(std::move(container));
    frames_.push_back({v, {}, {}});
    return true;
  }
  bool Close() {
    frames_.pop_back();
    return true;
  }

  // The path of the value being read ("optimizer.params.betas[1]"); `key`
  // (when given) replaces the innermost object's current key. Each
  // component is shortened for the message.
  std::string Path(const std::string* key) const {
    std::string p;
    for (size_t i = 0; i < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.value->is_array()) {
        p += '[';
        p += std::to_string(f.value->size());
        p += ']';
      } else {
        const std::string& k = (i + 1 == frames_.size() && key) ? *key : f.key;
        if (!p.empty()) p += '.';
        p += PrintableText(k, 40);
      }
    }
    return p.empty() ? "(top level)" : PrintableText(p, 200);
  }

  // The offset of the opening quote of the key string that ends at `end`.
  size_t KeyStart(size_t end) const {
    if (end < 2 || end > text_.size()) return end;
    for (size_t i = end - 1; i-- > 0;) {
      if (text_[i] != '"') continue;
      size_t slashes = 0;
      while (i > slashes && text_[i - 1 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) return i;
    }
    return end;
  }

  std::string_view text_;
  const std::string& source_;
  const int max_depth_;
  const size_t* read_;
  json root_;
  std::vector<Frame> frames_;
  std::vector<std::string> errors_;
};

}  // namespace

std::string JoinConfigErrors(const std::vector<std::string>& errors) {
  constexpr size_t kShown = kConfigErrorsShown;
  std::string msg = errors.empty() ? std::string() : errors.front();
  for (size_t i = 1; i < errors.size() && i < kShown; ++i) msg += "\n  " + errors[i];
  if (errors.size() > kShown) msg += "\n  ... and " + std::to_string(errors.size() - kShown) + " more";
  if (errors.size() > 1) msg += "\n(" + std::to_string(errors.size()) + " errors)";
  return msg;
}

bool JsonDeeperThan(const json& j, int max) {
  std::vector<std::pair<const json*, int>> todo = {{&j, 0}};
  while (!todo.empty()) {
    auto [v, d] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    if (d >= max) return true;
    for (const json& e : *v) todo.push_back({&e, d + 1});
  }
  return false;
}

bool IsUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8Length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string PrintableText(std::string_view s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = Utf8Length(s, i);
    if (n == 1 && b >= 0x20 && b != 0x7F) {
      out += s[i++];
    } else if (n > 1) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", b);
      out += hex;
      ++i;
    }
  }
  return out;
}

Result<std::string> ReadConfigText(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: a FIFO without a writer would block open() forever.
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus("cannot open config file", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("cannot stat config file", path);
  if (S_ISDIR(st.st_mode)) return InvalidArgument(path + ": is a directory; --config wants a JSON file");
  if (!S_ISREG(st.st_mode))
    return InvalidArgument(path + ": is " + FileKind(st.st_mode) + "; a config must be a regular JSON file");
  auto too_big = [&](uint64_t n) {
    return InvalidArgument(path + ": is " + std::to_string(n) + " bytes; a config file is at most " +
                           std::to_string(max_bytes) + " bytes (" + std::to_string(max_bytes >> 20) + " MiB)");
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return too_big(static_cast<uint64_t>(st.st_size));
  // Read to the end, never more than the cap (a file may grow, /proc files
  // report size 0).
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("cannot read config file", path);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) return too_big(text.size());
  }
  return text;
}

Result<json> ParseConfigJson(std::string_view text, const std::string& source, int max_depth) {
  if (text.size() >= 2 && ((text[0] == '\xFF' && text[1] == '\xFE') || (text[0] == '\xFE' && text[1] == '\xFF')))
    return InvalidArgument(source + ":1:1: the file is UTF-16 (it starts with a UTF-16 byte-order mark); JSON configs "
                           "are UTF-8: save it as UTF-8");
  size_t read = 0;
  ConfigSax sax(text, source, max_depth, &read);
  const CountingIterator first(text.data(), text.data(), &read), last(text.data() + text.size(), text.data(), &read);
  try {
    json::sax_parse(first, last, &sax, json::input_format_t::json, /*strict=*/true, /*ignore_comments=*/true);
  } catch (const std::exception& e) {  // not expected from the SAX path; kept at the boundary
    return InvalidArgument(source + ": cannot parse: " + PrintableText(e.what(), 200));
  }
  const std::vector<std::string>& errors = sax.errors();
  if (errors.empty()) return std::move(sax.root());
  return InvalidArgument(JoinConfigErrors(errors));
}

}  // namespace strata
