// SPDX-License-Identifier: Apache-2.0
// What the host has in memory, read once per call from the kernel.
//
// "Available" has one meaning in strata: the kernel's MemAvailable (its
// estimate of how much memory can be allocated without swapping: free
// memory plus what page cache and reclaimable slabs can give back). Budgets
// that default to a share of host memory take that share of `available`,
// except where a default is stated as a share of `total`.
//
// Thread-safety: a free function.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace strata {

struct HostMemoryInfo {
  uint64_t total_bytes = 0;      // MemTotal: the RAM the kernel manages
  uint64_t available_bytes = 0;  // MemAvailable (see above)
};

// From /proc/meminfo. IoError when it cannot be read, NotFound naming the
// field when the kernel does not report it.
Result<HostMemoryInfo> QueryHostMemory();

}  // namespace strata
