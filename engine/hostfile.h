// SPDX-License-Identifier: Apache-2.0
// The hostfile of a launch over several machines: DeepSpeed's format (and
// Open MPI's), one host a line —
//
//   # comment
//   worker-1 slots=8
//   worker-2 slots=4   # a comment after the entry
//
// A line is blank, a comment, or a host name followed by slots=N (N >= 1,
// the ranks — GPUs — it runs). A host appears once. The hosts' order is
// the ranks' order: the first host runs ranks 0 .. slots-1, and rank 0's
// host is the master unless --master-addr says otherwise.
//
// Thread-safety: free functions.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace strata {

struct HostSlots {
  std::string host;
  int slots = 0;
};

// `text` is the content of `path` (named in errors). InvalidArgument
// "PATH:LINE: ..." for a malformed line (no slots=, a slots value that is
// not a positive integer, an unknown key, a host listed twice) and for a
// file with no host.
Result<std::vector<HostSlots>> ParseHostfile(const std::string& text, const std::string& path);
// Reads `path` first (IoError naming it).
Result<std::vector<HostSlots>> ReadHostfile(const std::string& path);

}  // namespace strata
