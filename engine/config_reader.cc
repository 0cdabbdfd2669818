// SPDX-License-Identifier: Apache-2.0
#include "engine/config_reader.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace strata {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

Result<int> LauncherWorldSize(const std::function<const char*(const char*)>& getenv) {
  for (const char* var : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* v = getenv(var);
    if (!v || !*v) continue;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || n < 1 || n > (1 << 20))
      return InvalidArgument(std::string("environment variable ") + var + "=\"" + v +
                             "\" (set by a launcher) is not a positive integer world size");
    return static_cast<int>(n);
  }
  return 1;
}

}  // namespace strata
