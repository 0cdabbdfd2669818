// SPDX-License-Identifier: Apache-2.0
// What the pieces of the NVMe tier share: the direct-I/O alignment, the tier's
// log line, and the two small error helpers the pieces build their messages
// with. Internal to tiers/nvme/.
//
// Ownership: nothing is owned. Thread-safety: all functions are pure or write
// one line to stderr.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "base/status.h"

namespace strata::nvme {

constexpr uint64_t kAlign = 4096;  // O_DIRECT alignment of offsets, lengths, buffers

// One line on stderr: what the tier chose to do instead (a fallback), or an
// error no caller is there to receive (cleanup at destruction).
inline void Note(const std::string& line) {
  std::fprintf(stderr, "strata nvme: %s\n", line.c_str());
}

inline std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Unavailable carrying an errno (and a path): the machine lacks the thing
// (io_uring, O_DIRECT), and the errno says how it refused.
inline Status UnavailableErrno(std::string message, int err, std::string path = {}) {
  Status::Rep rep;
  rep.code = StatusCode::kUnavailable;
  rep.message = std::move(message);
  rep.sys_errno = err;
  rep.path = std::move(path);
  return Status(std::move(rep));
}

}  // namespace strata::nvme
