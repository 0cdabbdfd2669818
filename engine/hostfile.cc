// SPDX-License-Identifier: Apache-2.0
#include "engine/hostfile.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace strata {

namespace {

Status LineError(const std::string& path, int line, const std::string& what) {
  return InvalidArgument("hostfile " + path + ":" + std::to_string(line) + ": " + what +
                         " (a line is \"HOST slots=N\", a comment after #, or blank)");
}

}  // namespace

Result<std::vector<HostSlots>> ParseHostfile(const std::string& text, const std::string& path) {
  std::vector<HostSlots> hosts;
  std::istringstream in(text);
  std::string raw;
  for (int line = 1; std::getline(in, raw); ++line) {
    if (const size_t hash = raw.find('#'); hash != std::string::npos) raw.resize(hash);
    std::istringstream words(raw);
    std::string host, word;
    if (!(words >> host)) continue;  // blank or a comment
    if (host.find('=') != std::string::npos) return LineError(path, line, "\"" + host + "\" is not a host name");
    int slots = 0;
    while (words >> word) {
      const size_t eq = word.find('=');
      const std::string key = word.substr(0, eq);
      if (eq == std::string::npos || key != "slots")
        return LineError(path, line, "\"" + word + "\" after host " + host + " is not slots=N");
      if (slots != 0) return LineError(path, line, "slots given twice for host " + host);
      const std::string v = word.substr(eq + 1);
      char* end = nullptr;
      errno = 0;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || errno != 0 || *end != '\0' || n < 1 || n > 4096)
        return LineError(path, line, "slots=" + v + " for host " + host + " is not an integer from 1 to 4096");
      slots = static_cast<int>(n);
    }
    if (slots == 0) return LineError(path, line, "host " + host + " has no slots=N");
    for (const HostSlots& h : hosts)
      if (h.host == host) return LineError(path, line, "host " + host + " is listed twice");
    hosts.push_back({host, slots});
  }
  if (hosts.empty()) return InvalidArgument("hostfile " + path + " lists no host (a line is \"HOST slots=N\")");
  return hosts;
}

Result<std::vector<HostSlots>> ReadHostfile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return ErrnoStatus("--hostfile: cannot open", path);
  std::ostringstream text;
  text << f.rdbuf();
  if (f.bad()) return ErrnoStatus("--hostfile: cannot read", path);
  return ParseHostfile(text.str(), path);
}

}  // namespace strata
