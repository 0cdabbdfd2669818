// SPDX-License-Identifier: Apache-2.0
#include "engine/gpu_facts.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <memory>

#include "tiers/numa.h"

#if STRATA_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif

namespace strata {

namespace {

// A dlopen'ed library, closed at scope end.
struct Library {
  explicit Library(const char* name) : handle(::dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
    if (!handle) {
      const char* e = ::dlerror();
      error = e ? e : "dlopen failed";
    }
  }
  ~Library() {
    if (handle) ::dlclose(handle);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  template <typename Fn>
  Fn Get(const char* symbol) const {
    return handle ? reinterpret_cast<Fn>(::dlsym(handle, symbol)) : nullptr;
  }
  void* handle;
  std::string error;
};

int NcclVersion(std::string* error) {
  Library nccl("libnccl.so.2");
  if (!nccl.handle) {
    *error = nccl.error;
    return 0;
  }
  using GetVersion = int (*)(int*);  // ncclResult_t ncclGetVersion(int*); ncclSuccess == 0
  auto get = nccl.Get<GetVersion>("ncclGetVersion");
  int v = 0;
  if (!get || get(&v) != 0) {
    *error = "libnccl.so.2 has no working ncclGetVersion";
    return 0;
  }
  return v;
}

// NVML, opened for one report. The handles are opaque pointers; every call
// returns 0 (NVML_SUCCESS) on success.
class Nvml {
 public:
  Nvml() : lib_("libnvidia-ml.so.1") {
    using Init = int (*)();
    auto init = lib_.Get<Init>("nvmlInit_v2");
    ok_ = init && init() == 0;
  }
  ~Nvml() {
    using Shutdown = int (*)();
    if (auto shutdown = ok_ ? lib_.Get<Shutdown>("nvmlShutdown") : nullptr) shutdown();
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  std::string DriverVersion() const {
    using Fn = int (*)(char*, unsigned);
    auto f = ok_ ? lib_.Get<Fn>("nvmlSystemGetDriverVersion") : nullptr;
    char buf[96] = {};
    return f && f(buf, sizeof buf) == 0 ? std::string(buf) : std::string();
  }
  bool Link(const std::string& bus_id, PcieLink* link) const {
    using ByBus = int (*)(const char*, void**);
    using Get = int (*)(void*, unsigned*);
    auto by_bus = ok_ ? lib_.Get<ByBus>("nvmlDeviceGetHandleByPciBusId_v2") : nullptr;
    void* dev = nullptr;
    if (!by_bus || by_bus(bus_id.c_str(), &dev) != 0) return false;
    unsigned v[4] = {};
    const char* names[4] = {"nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
                            "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"};
    for (int i = 0; i < 4; ++i) {
      auto f = lib_.Get<Get>(names[i]);
      if (!f || f(dev, &v[i]) != 0) return false;
    }
    *link = {static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]), static_cast<int>(v[3]), "NVML"};
    return true;
  }

 private:
  Library lib_;
  bool ok_ = false;
};

// "16.0 GT/s PCIe" -> 4 (PCIe generation by transfer rate).
int GenOfSpeed(const std::string& s) {
  const double gt = std::atof(s.c_str());
  if (gt >= 60) return 6;
  if (gt >= 30) return 5;
  if (gt >= 15) return 4;
  if (gt >= 7.5) return 3;
  if (gt >= 4.5) return 2;
  if (gt >= 2) return 1;
  return 0;
}

bool SysfsLink(std::string bus_id, PcieLink* link) {
  std::transform(bus_id.begin(), bus_id.end(), bus_id.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::string dir = "/sys/bus/pci/devices/" + bus_id + "/";
  auto read = [&](const char* name) {
    std::ifstream f(dir + name);
    std::string s;
    std::getline(f, s);
    return s;
  };
  const std::string cs = read("current_link_speed"), cw = read("current_link_width");
  if (cs.empty() || cw.empty()) return false;
  *link = {GenOfSpeed(cs), std::atoi(cw.c_str()), GenOfSpeed(read("max_link_speed")),
           std::atoi(read("max_link_width").c_str()), "sysfs"};
  return true;
}

}  // namespace

std::string CudaVersionText(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string NcclVersionText(int code) {
  if (code <= 0) return "none";
  if (code >= 20900) return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." +
                            std::to_string(code % 100);
  return std::to_string(code / 1000) + "." + std::to_string(code % 1000 / 100) + "." + std::to_string(code % 100);
}

std::string CublasLtVersionText(uint64_t v) {
  if (v == 0) return "none";
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
}

GpuFacts CollectGpuFacts() {
  GpuFacts f;
  f.built_with_cuda = BuiltWithCuda();
#if STRATA_WITH_CUDA
  cudaRuntimeGetVersion(&f.runtime_version);
  if (cudaDriverGetVersion(&f.driver_version) != cudaSuccess) f.driver_version = 0;
  f.cublaslt_version = cublasLtGetVersion();
#endif
  f.nccl_version = NcclVersion(&f.nccl_error);
  const int n = CudaDeviceCount(&f.why_none);
  Nvml nvml;
  f.nvidia_driver = nvml.DriverVersion();
  for (int d = 0; d < n; ++d) {
    Result<GpuInfo> info = QueryGpu(d);
    if (!info.ok()) continue;
    GpuDeviceFacts g;
    g.info = *info;
    if (!g.info.pci_bus_id.empty()) {
      if (!nvml.Link(g.info.pci_bus_id, &g.link)) SysfsLink(g.info.pci_bus_id, &g.link);
      g.numa_node = NumaNodeOfPciBusId(g.info.pci_bus_id);
    }
    f.devices.push_back(std::move(g));
  }
  if (!f.devices.empty()) f.why_none.clear();
  return f;
}

}  // namespace strata
