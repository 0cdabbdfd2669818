// SPDX-License-Identifier: Apache-2.0
// strata-bench's argument checks: every flag's value is checked against its
// range before anything is measured, and a value out of it is named with the
// range ("--tensor 0 B: must be at least 4.00 KiB"), never clamped, wrapped
// or silently replaced by a default.
//
// The checks throw BadArgument, which main() turns into the message, a
// "try: strata-bench CMD --help" line and exit 2 (bench/main.cc), so a
// subcommand states each check as one line before it starts.
//
// Thread-safety: free functions; call them on the thread that parses.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::bench {

// What the checks throw; main() prints it and exits 2.
class BadArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};
[[noreturn]] void RefuseArgument(const std::string& what);

// `flag`'s integer value within [lo, hi].
void CheckIntArg(const char* flag, int64_t value, int64_t lo, int64_t hi);
// `flag`'s real value within [lo, hi] (NaN is outside every range).
void CheckRealArg(const char* flag, double value, double lo, double hi);
// `flag`'s byte count within [lo, hi] and a multiple of `multiple` (>= 1);
// the message shows the sizes as FormatBytes does.
void CheckBytesArg(const char* flag, uint64_t value, uint64_t lo, uint64_t hi, uint64_t multiple = 1);
// Same, for each of a list's values.
void CheckBytesArgs(const char* flag, const std::vector<uint64_t>& values, uint64_t lo, uint64_t hi,
                    uint64_t multiple = 1);
// `need` bytes of host memory for what `flag` asks (`what`: "4 buffers of
// the largest size") within 80% of the memory available now.
void CheckHostMemoryArg(const char* flag, uint64_t need, const std::string& what);
// A decimal integer in [lo, hi] from `text` (no sign unless lo < 0, no
// suffix, no overflow): BadArgument naming `flag` and the text otherwise.
int64_t ParseIntArg(const char* flag, const std::string& text, int64_t lo, int64_t hi);

}  // namespace strata::bench
