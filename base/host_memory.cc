// SPDX-License-Identifier: Apache-2.0
#include "base/host_memory.h"

#include <fstream>
#include <string>

namespace strata {

Result<HostMemoryInfo> QueryHostMemory() {
  const char* path = "/proc/meminfo";
  std::ifstream f(path);
  if (!f) return ErrnoStatus("cannot read the host's memory figures", path);
  HostMemoryInfo m;
  bool total = false, available = false;
  std::string key, unit;
  uint64_t kb = 0;
  while (f >> key >> kb) {
    std::getline(f, unit);  // " kB" (or nothing)
    if (key == "MemTotal:") m.total_bytes = kb * 1024, total = true;
    if (key == "MemAvailable:") m.available_bytes = kb * 1024, available = true;
  }
  if (!total) return NotFound(std::string(path) + " has no MemTotal line");
  if (!available) return NotFound(std::string(path) + " has no MemAvailable line (a kernel older than 3.14)");
  return m;
}

}  // namespace strata
