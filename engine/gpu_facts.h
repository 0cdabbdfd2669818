// SPDX-License-Identifier: Apache-2.0
// What `strata report` says about the GPUs and the NVIDIA libraries: CUDA
// runtime and driver versions, each GPU's memory, compute capability, PCIe
// link and NUMA node, and the NCCL and cuBLASLt versions.
//
// Nothing here needs a GPU or links NCCL or NVML: the driver version comes
// from cudaDriverGetVersion (0 without a driver), NCCL's from
// ncclGetVersion in libnccl.so.2 opened at run time (dlopen), the PCIe link
// from NVML (libnvidia-ml.so.1, dlopen) or else from sysfs
// (/sys/bus/pci/devices/<bus id>/current_link_speed, current_link_width).
// A build without CUDA reports that and no devices.
//
// Thread-safety: a free function; call it from one thread at a time (NVML
// is initialized and shut down inside).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/device.h"

namespace strata {

struct PcieLink {
  int gen = 0, width = 0;          // now (a GPU at rest may run its link at a lower generation)
  int max_gen = 0, max_width = 0;  // what the device and slot can do
  std::string source;              // "NVML", "sysfs", or "" when unknown
};

struct GpuDeviceFacts {
  GpuInfo info;
  PcieLink link;
  int numa_node = -1;  // hwloc's node nearest the GPU; -1 unknown
};

struct GpuFacts {
  bool built_with_cuda = false;
  int runtime_version = 0;         // CUDA runtime, 1000 * major + 10 * minor (12040 = 12.4)
  int driver_version = 0;          // the CUDA version the driver supports; 0: no driver
  std::string nvidia_driver;       // NVML's driver version ("550.54.15"); "" without NVML
  std::vector<GpuDeviceFacts> devices;
  std::string why_none;            // when devices is empty
  int nccl_version = 0;            // NCCL_VERSION_CODE of libnccl.so.2 (22105 = 2.21.5); 0: not found
  std::string nccl_error;          // why not (dlopen's message)
  uint64_t cublaslt_version = 0;   // cublasLtGetVersion (120400 = 12.4.0); 0 without CUDA
};

GpuFacts CollectGpuFacts();

// 12040 -> "12.4".
std::string CudaVersionText(int v);
// 22105 -> "2.21.5" (NCCL's code: major*10000 + minor*100 + patch from 2.9 on, major*1000 before).
std::string NcclVersionText(int code);
// 120400 -> "12.4.0" (major*10000 + minor*100 + patch).
std::string CublasLtVersionText(uint64_t v);

}  // namespace strata
