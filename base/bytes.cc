// SPDX-License-Identifier: Apache-2.0
#include "base/bytes.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

namespace strata {

Result<uint64_t> ParseBytes(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  auto bad = [&](const char* why) {
    return InvalidArgument("cannot read '" + std::string(text) + "' as a byte size (" + why +
                           "; expected e.g. 4096, 512MiB, 24GiB, 1.5G, 100MB)");
  };
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return bad("no number");
  std::string num(s.substr(0, i));
  std::string_view unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  char* end = nullptr;
  double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(v) || v < 0) return bad("bad number");
  double mult = 1;
  if (unit.empty() || unit == "B" || unit == "b") {
    mult = 1;
  } else {
    char p = static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])));
    int power = p == 'K' ? 1 : p == 'M' ? 2 : p == 'G' ? 3 : p == 'T' ? 4 : 0;
    if (power == 0) return bad("unknown unit");
    std::string_view rest = unit.substr(1);
    double base;
    if (rest.empty() || rest == "iB" || rest == "ib" || rest == "i") {
      base = 1024;
    } else if (rest == "B") {
      base = 1000;
    } else {
      return bad("unknown unit");
    }
    mult = std::pow(base, power);
  }
  double bytes = v * mult;
  if (bytes >= 18446744073709551615.0) return bad("too large");
  if (unit.empty() && num.find('.') != std::string::npos) return bad("fractional byte count");
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v,
                kUnits[u]);
  return buf;
}

}  // namespace strata
