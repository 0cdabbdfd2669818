// SPDX-License-Identifier: Apache-2.0
#include "tiers/host_tier.h"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/cuda_check.h"
#include "base/device.h"
#include "base/host_memory.h"
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

Status CheckMlockLimit(uint64_t bytes) {
  if (MemlockLimit() >= bytes || HasIpcLockCapability()) return Status::OK();
  return MlockError(0, bytes);
}

// ---- huge pages ------------------------------------------------------------------

namespace {

constexpr uint64_t kHugePage = uint64_t{2} << 20;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

Status MmapError(uint64_t bytes, int err, const char* what) {
  Status::Rep rep;
  rep.code = StatusCode::kOutOfMemory;
  rep.message = std::string("mmap of ") + FormatBytes(bytes) + " of host memory (" + what + ") failed (" +
                ErrName(err) + ")";
  rep.sys_errno = err;
  rep.tier = TierKind::kHost;
  rep.bytes_requested = bytes;
  return Status(std::move(rep));
}

// mmap(bytes) at a multiple of `align` (a power of two >= the page size):
// maps bytes + align - 4096 and gives back the ends.
Result<void*> MmapAligned(uint64_t bytes, uint64_t align, const char* what) {
  const uint64_t span = bytes + align - 4096;
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return MmapError(bytes, errno, what);
  const uintptr_t b = reinterpret_cast<uintptr_t>(p);
  const uintptr_t a = (b + align - 1) & ~(align - 1);
  if (a > b) munmap(p, a - b);
  const uintptr_t end = b + span, aend = a + bytes;
  if (end > aend) munmap(reinterpret_cast<void*>(aend), end - aend);
  return reinterpret_cast<void*>(a);
}

// The huge-page advice; failure only loses the hint (EINVAL on kernels
// without THP), so it is not an error.
void AdviseHugePages(void* p, uint64_t bytes, HostHugePages h) {
  if (h == HostHugePages::kOff) (void)madvise(p, bytes, MADV_NOHUGEPAGE);
  else (void)madvise(p, bytes, MADV_HUGEPAGE);
}

// Faults every page in by writing it (MADV_POPULATE_WRITE where the kernel
// has it, else a store per 4 KiB page; anonymous pages read as zero, so
// writing zero changes nothing).
void Prefault(void* p, uint64_t bytes) {
  if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
  volatile unsigned char* c = static_cast<volatile unsigned char*>(p);
  for (uint64_t o = 0; o < bytes; o += 4096) c[o] = 0;
}

// The kB figure of the first line starting with `key` in `in`.
Result<uint64_t> ReadKbField(std::istream& in, const std::string& key, const char* file) {
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::strtoull(line.c_str() + key.size(), nullptr, 10) * 1024;
  return NotFound(std::string(file) + " has no " + key + " line");
}

}  // namespace

std::string_view HostHugePagesName(HostHugePages h) {
  switch (h) {
    case HostHugePages::kAdvise: return "advise";
    case HostHugePages::kAligned: return "aligned";
    case HostHugePages::kOff: return "off";
  }
  return "?";
}

HostMapping::HostMapping(HostMapping&& o) noexcept : data_(o.data_), bytes_(o.bytes_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

HostMapping& HostMapping::operator=(HostMapping&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, bytes_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

HostMapping::~HostMapping() {
  if (data_) munmap(data_, bytes_);
}

Result<HostMapping> MapHostMemory(uint64_t bytes, HostHugePages huge_pages, bool prefault) {
  if (bytes == 0) return InvalidArgument("MapHostMemory: 0 bytes asked for");
  const uint64_t rounded = AlignUp(bytes, 4096);
  ASSIGN_OR_RETURN(void* p, MmapAligned(rounded, kHugePage, "MapHostMemory"));
  AdviseHugePages(p, rounded, huge_pages);
  if (prefault) Prefault(p, rounded);
  return HostMapping(p, rounded);
}

std::string TransparentHugePagesSetting() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return "";
  size_t a = line.find('['), b = line.find(']');
  if (a == std::string::npos || b == std::string::npos || b < a) return "";
  return line.substr(a + 1, b - a - 1);
}

bool TransparentHugePagesUsable() {
  std::string s = TransparentHugePagesSetting();
  if (s != "always" && s != "madvise") return false;
  return prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 0;
}

Result<uint64_t> ProcessAnonHugePages() {
  std::ifstream f("/proc/self/smaps_rollup");
  if (!f) return ErrnoStatus("open", "/proc/self/smaps_rollup");
  return ReadKbField(f, "AnonHugePages:", "/proc/self/smaps_rollup");
}

Result<uint64_t> AnonHugePagesOfMapping(const void* p) {
  std::ifstream f("/proc/self/smaps");
  if (!f) return ErrnoStatus("open", "/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  while (std::getline(f, line)) {
    // A mapping's header: "begin-end perms offset dev inode [path]" (hex).
    const size_t dash = line.find('-');
    if (dash == std::string::npos || dash == 0 || line.find(':') < dash) continue;
    char* end = nullptr;
    const uintptr_t lo = std::strtoull(line.c_str(), &end, 16);
    if (end != line.c_str() + dash) continue;
    const uintptr_t hi = std::strtoull(line.c_str() + dash + 1, &end, 16);
    if (*end != ' ') continue;
    if (a >= lo && a < hi) return ReadKbField(f, "AnonHugePages:", "/proc/self/smaps");
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return NotFound(std::string("no mapping of this process contains ") + buf + " (/proc/self/smaps)");
}

// ---- HostTier ----------------------------------------------------------------------

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
    ASSIGN_OR_RETURN(HostMemoryInfo m, QueryHostMemory());
    budget = m.total_bytes / 2;
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
  if (pin == Pin::kMlock) RETURN_IF_ERROR(CheckMlockLimit(budget));  // now rather than at some later allocation

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
  // kAligned: 2 MiB-aligned so that every whole 2 MiB of the slab can be a
  // huge page; otherwise wherever mmap puts it (page-aligned).
  ASSIGN_OR_RETURN(void* p, MmapAligned(bytes, options_.huge_pages == HostHugePages::kAligned ? kHugePage : 4096,
                                        "a host slab"));
  if (numa_node_ >= 0) {
    Status s = BindToNumaNode(p, bytes, numa_node_);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(status_mu_);
      if (registration_status_.ok()) registration_status_ = s;
    }
  }
  // Before any page is touched (pinning below faults them in); optional.
  AdviseHugePages(p, bytes, options_.huge_pages);
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
