// SPDX-License-Identifier: Apache-2.0
// NUMA placement through hwloc: which node a GPU (by PCI bus id) or the
// calling thread is near, and binding memory to a node before it is touched.
//
// The topology is loaded once per process (with PCI devices) on first use.
// On a machine with one NUMA node, or where hwloc cannot see the device,
// callers get -1 / a no-op and keep working: placement is an optimization,
// never a reason to fail.
//
// Thread-safety: all functions are thread-safe (the topology is read-only
// after loading).
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace strata {

// Number of NUMA nodes hwloc sees (at least 1).
int NumaNodeCount();

// The NUMA node closest to the PCI device `bus_id` ("0000:17:00.0", as
// cudaDeviceGetPCIBusId gives it), or -1 when unknown (no such device in the
// topology, no NUMA information).
int NumaNodeOfPciBusId(const std::string& bus_id);

// The node of the CPU the calling thread runs on now, or -1 when unknown.
int NumaNodeOfCurrentThread();

// Binds [addr, addr + bytes) to `node` (hwloc_set_area_membind, strict bind)
// so that pages touched afterwards are placed there. No-op (OK) when
// node < 0 or there is only one node. InvalidArgument for a node that does
// not exist; Unavailable when the OS refuses memory binding.
Status BindToNumaNode(void* addr, uint64_t bytes, int node);

// The node holding the (touched) page at `addr`, or -1 when unknown.
int NumaNodeOfAddress(const void* addr);

}  // namespace strata
