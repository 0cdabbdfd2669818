// SPDX-License-Identifier: Apache-2.0
// What GPU, if any, this process can use.
//
// Everything here works in a build without CUDA (it then reports no GPU), so
// callers need no #if: the GPU tier chooses its host stand-in and the tests
// skip with the reason given here.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace strata {

struct GpuInfo {
  int device = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sm_count = 0;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;          // cudaMemGetInfo at the time of the query
  uint64_t l2_bytes = 0;
  std::string pci_bus_id;           // "0000:17:00.0": for NUMA placement via hwloc
};

// Number of CUDA devices this process can use. 0 when built without CUDA, with
// no driver, or with no device; `why` (if given) then says which.
int CudaDeviceCount(std::string* why = nullptr);

// The PCI bus id of GPU `device` ("0000:17:00.0"), without creating a
// context on it (a launcher asks before its ranks start); Unavailable as
// QueryGpu, InvalidArgument for a device that is not there.
Result<std::string> GpuPciBusId(int device);

// Unavailable (with the reason) when there is no usable GPU `device`.
Result<GpuInfo> QueryGpu(int device = 0);

// True when this binary was built with CUDA.
bool BuiltWithCuda();

}  // namespace strata
