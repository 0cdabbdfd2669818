#include "tiers/host_tier.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>

#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <string>

#include "tiers/cuda_check.h"
#include "tiers/device.h"
#include "tiers/numa.h"

namespace strata {

uint64_t MemlockLimit() {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 0;
  return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(rl.rlim_cur);
}

bool HasIpcLockCapability() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      uint64_t caps = std::strtoull(line.c_str() + 7, nullptr, 16);
      return (caps >> 14) & 1;  // CAP_IPC_LOCK = 14
    }
  }
  return false;
}

namespace {
std::string LimitText(uint64_t v) { return v == UINT64_MAX ? "unlimited" : FormatBytes(v); }
const char* ErrName(int err) {
  const char* n = strerrorname_np(err);
  return n ? n : "?";
}
Status MlockError(int err, uint64_t bytes) {
  struct rlimit rl {};
  getrlimit(RLIMIT_MEMLOCK, &rl);
  uint64_t soft = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
  uint64_t hard = rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : rl.rlim_max;
  std::string msg = "cannot pin " + FormatBytes(bytes) + " of host memory with mlock";
  if (err != 0) msg += std::string(" (") + ErrName(err) + ")";
  msg += ": RLIMIT_MEMLOCK is " + LimitText(soft) + " (hard limit " + LimitText(hard) +
         ") and the process lacks CAP_IPC_LOCK. Raise it (ulimit -l unlimited; memlock in "
         "/etc/security/limits.conf; LimitMEMLOCK=infinity for systemd; docker --ulimit "
         "memlock=-1) or turn pinning off (pin_memory: false)";
  Status::Rep rep;
  rep.code = StatusCode::kOutOfMemory;
  rep.message = std::move(msg);
  rep.sys_errno = err;
  rep.tier = TierKind::kHost;
  rep.bytes_requested = bytes;
  rep.bytes_available = soft == UINT64_MAX ? 0 : soft;
  return Status(std::move(rep));
}
}  // namespace

HostTier::HostTier(SlabTierConfig config, const HostTierOptions& options, Pin pin, int node)
    : SlabTier(config), options_(options), pin_(pin), numa_node_(node) {}

HostTier::~HostTier() { ReleaseSlabs(); }

std::string_view HostTier::pin_method() const {
  switch (pin_) {
    case Pin::kCuda: return "cudaHostRegister";
    case Pin::kMlock: return "mlock";
    case Pin::kNone: return "none";
  }
  return "?";
}

Status HostTier::registration_status() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return registration_status_;
}


Result<std::unique_ptr<HostTier>> HostTier::Open(const HostTierOptions& options) {
  uint64_t budget = options.budget_bytes;
  if (budget == 0) {
    struct sysinfo si {};
    if (sysinfo(&si) != 0) return ErrnoStatus("sysinfo");
    budget = static_cast<uint64_t>(si.totalram) * si.mem_unit / 2;
  }
  budget &= ~uint64_t{4095};
  if (budget == 0) return InvalidArgument("host tier budget " + std::to_string(options.budget_bytes) +
                                          " is below one page (4096 bytes)");
  if (options.slab_bytes > kGiB)
    return InvalidArgument("host slab_bytes " + FormatBytes(options.slab_bytes) +
                           " exceeds 1 GiB, the largest buffer io_uring can register");

  // How to pin.
  Pin pin = Pin::kNone;
  bool gpu = CudaDeviceCount() > 0;
  if (options.pin) {
    switch (options.pin_method) {
      case PinMethod::kAuto: pin = gpu ? Pin::kCuda : Pin::kMlock; break;
      case PinMethod::kCuda:
        if (!gpu) {
          std::string why;
          CudaDeviceCount(&why);
          return Unavailable("host tier: pinning with cudaHostRegister needs a usable GPU (" + why + ")");
        }
        pin = Pin::kCuda;
        break;
      case PinMethod::kMlock: pin = Pin::kMlock; break;
    }
  }
  if (pin == Pin::kMlock && MemlockLimit() < budget && !HasIpcLockCapability()) {
    // Fail now rather than at some later allocation.
    return MlockError(0, budget);
  }

  // Where to place it.
  int node = -1;
  switch (options.numa) {
    case NumaPlacement::kNearGpu:
      if (gpu) {
        auto info = QueryGpu(options.gpu_device);
        if (info.ok()) node = NumaNodeOfPciBusId(info->pci_bus_id);
      }
      if (node < 0) node = NumaNodeOfCurrentThread();
      break;
    case NumaPlacement::kCallingThread: node = NumaNodeOfCurrentThread(); break;
    case NumaPlacement::kNode:
      if (options.numa_node < 0 || options.numa_node >= NumaNodeCount())
        return InvalidArgument("host tier: NUMA node " + std::to_string(options.numa_node) +
                               " does not exist (this machine has " + std::to_string(NumaNodeCount()) +
                               ")");
      node = options.numa_node;
      break;
    case NumaPlacement::kNone: break;
  }
  if (NumaNodeCount() <= 1 && options.numa != NumaPlacement::kNode) node = -1;  // nothing to bind

  SlabTierConfig config;
  config.kind = TierKind::kHost;
  config.budget = budget;
  config.slab_bytes = options.slab_bytes == 0 ? 0 : AlignUp(options.slab_bytes, 4096);
  config.alignment = 4096;
  std::unique_ptr<HostTier> tier(new HostTier(config, options, pin, node));
  if (options.reserve_all) RETURN_IF_ERROR(tier->ReserveAll());
  return tier;
}

Result<void*> HostTier::MapSlab(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    Status::Rep rep;
    rep.code = StatusCode::kOutOfMemory;
    rep.message = "mmap of a " + FormatBytes(bytes) + " host slab failed (" + ErrName(err) + ")";
    rep.sys_errno = err;
    rep.tier = TierKind::kHost;
    rep.bytes_requested = bytes;
    return Status(std::move(rep));
  }
  if (numa_node_ >= 0) {
    Status s = BindToNumaNode(p, bytes, numa_node_);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(status_mu_);
      if (registration_status_.ok()) registration_status_ = s;
    }
  }
  (void)madvise(p, bytes, MADV_HUGEPAGE);  // fewer TLB misses and pinned pages to track; optional
  if (pin_ == Pin::kMlock) {
    if (mlock(p, bytes) != 0) {
      int err = errno;
      munmap(p, bytes);
      return MlockError(err, bytes);
    }
  } else if (pin_ == Pin::kCuda) {
#if STRATA_WITH_CUDA
    Status s = [&]() -> Status {
      CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.gpu_device));
      CUDA_RETURN_IF_ERROR(cudaHostRegister(p, bytes, cudaHostRegisterPortable));
      return Status::OK();
    }();
    if (!s.ok()) {
      munmap(p, bytes);
      return s.WithContext("pinning a " + FormatBytes(bytes) + " host slab");
    }
#else
    munmap(p, bytes);
    return Internal("host tier: cudaHostRegister pinning in a build without CUDA");
#endif
  }
  if (options_.on_map) {
    Status s = options_.on_map(p, bytes);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(status_mu_);
      if (registration_status_.ok()) registration_status_ = s;
    }
  }
  return p;
}

void HostTier::UnmapSlab(void* base, uint64_t bytes) {
  if (options_.on_unmap) options_.on_unmap(base);
  if (pin_ == Pin::kMlock) {
    munlock(base, bytes);
  } else if (pin_ == Pin::kCuda) {
#if STRATA_WITH_CUDA
    (void)cudaHostUnregister(base);
    (void)cudaGetLastError();
#endif
  }
  munmap(base, bytes);
}

}  // namespace strata
