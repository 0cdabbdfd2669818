// SPDX-License-Identifier: Apache-2.0
#include "bench/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "base/bytes.h"
#include "base/host_memory.h"

namespace strata::bench {

void RefuseArgument(const std::string& what) { throw BadArgument(what); }

void CheckIntArg(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return;
  const std::string range = hi == INT64_MAX   ? "at least " + std::to_string(lo)
                            : lo == INT64_MIN ? "at most " + std::to_string(hi)
                                              : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  RefuseArgument(std::string(flag) + " " + std::to_string(value) + ": must be " + range);
}

void CheckRealArg(const char* flag, double value, double lo, double hi) {
  if (value >= lo && value <= hi) return;  // false for NaN
  std::ostringstream os;
  os << flag << " " << value << ": must be in [" << lo << ", " << hi << "]";
  RefuseArgument(os.str());
}

void CheckBytesArg(const char* flag, uint64_t value, uint64_t lo, uint64_t hi, uint64_t multiple) {
  const std::string v = std::string(flag) + " " + FormatBytes(value);
  if (value < lo) RefuseArgument(v + ": must be at least " + FormatBytes(lo));
  if (value > hi) RefuseArgument(v + ": must be at most " + FormatBytes(hi));
  if (multiple > 1 && value % multiple != 0)
    RefuseArgument(v + " (" + std::to_string(value) + " bytes): must be a multiple of " + FormatBytes(multiple));
}

void CheckBytesArgs(const char* flag, const std::vector<uint64_t>& values, uint64_t lo, uint64_t hi,
                    uint64_t multiple) {
  for (uint64_t v : values) CheckBytesArg(flag, v, lo, hi, multiple);
}

void CheckHostMemoryArg(const char* flag, uint64_t need, const std::string& what) {
  Result<HostMemoryInfo> m = QueryHostMemory();
  if (!m.ok() || need <= m->available_bytes / 10 * 8) return;
  RefuseArgument(std::string(flag) + ": " + what + " needs " + FormatBytes(need) +
                 " of host memory, more than 80% of the " + FormatBytes(m->available_bytes) + " available");
}

int64_t ParseIntArg(const char* flag, const std::string& text, int64_t lo, int64_t hi) {
  const bool digits = !text.empty() && text.find_first_not_of("0123456789", text[0] == '-' ? 1 : 0) == std::string::npos &&
                      text != "-";
  if (!digits) RefuseArgument(std::string(flag) + ": '" + text + "' is not an integer");
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE) RefuseArgument(std::string(flag) + " " + text + ": out of range [" + std::to_string(lo) + ", " +
                                      std::to_string(hi) + "]");
  CheckIntArg(flag, v, lo, hi);
  return v;
}

}  // namespace strata::bench
