// SPDX-License-Identifier: Apache-2.0
#include "base/device.h"

#include <string>

#include "base/cuda_check.h"

namespace strata {

bool BuiltWithCuda() { return STRATA_WITH_CUDA != 0; }

#if STRATA_WITH_CUDA

int CudaDeviceCount(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = std::string("no usable CUDA device: ") + cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device found";
  return n;
}

Result<std::string> GpuPciBusId(int device) {
  std::string why;
  const int n = CudaDeviceCount(&why);
  if (n == 0) return Unavailable(why);
  if (device < 0 || device >= n)
    return InvalidArgument("GPU " + std::to_string(device) + " requested but only " + std::to_string(n) +
                           " present");
  char bus[32] = {};
  CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus, sizeof bus, device));
  return std::string(bus);
}

Result<GpuInfo> QueryGpu(int device) {
  std::string why;
  int n = CudaDeviceCount(&why);
  if (n == 0) return Unavailable(why);
  if (device < 0 || device >= n)
    return InvalidArgument("GPU " + std::to_string(device) + " requested but only " +
                           std::to_string(n) + " present");
  cudaDeviceProp p{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&p, device));
  GpuInfo info;
  info.device = device;
  info.name = p.name;
  info.cc_major = p.major;
  info.cc_minor = p.minor;
  info.sm_count = p.multiProcessorCount;
  info.total_bytes = p.totalGlobalMem;
  info.l2_bytes = static_cast<uint64_t>(p.l2CacheSize);
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) == cudaSuccess) info.pci_bus_id = bus;
  int prev = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  cudaError_t err = cudaMemGetInfo(&free_b, &total_b);
  (void)cudaSetDevice(prev);
  CUDA_RETURN_IF_ERROR(err);
  info.free_bytes = free_b;
  return info;
}

#else  // !STRATA_WITH_CUDA

int CudaDeviceCount(std::string* why) {
  if (why) *why = "strata was built without CUDA (nvcc was not found at configure time)";
  return 0;
}

Result<std::string> GpuPciBusId(int) {
  std::string why;
  CudaDeviceCount(&why);
  return Unavailable(why);
}

Result<GpuInfo> QueryGpu(int) {
  std::string why;
  CudaDeviceCount(&why);
  return Unavailable(why);
}

#endif

}  // namespace strata
