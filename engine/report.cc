// SPDX-License-Identifier: Apache-2.0
#include "engine/report.h"

#include <errno.h>
#include <hwloc.h>
#include <liburing.h>
#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <oneapi/tbb/version.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include <boost/program_options.hpp>
#include <boost/version.hpp>

#include "base/bytes.h"
#include "base/device.h"
#include "base/host_memory.h"
#include "engine/config.h"
#include "engine/gpu_facts.h"
#include "engine/path_probe.h"
#include "kernels/cuda/cuda_backend.h"
#include "optim/cpu_features.h"
#include "tiers/host_tier.h"

#ifndef STRATA_VERSION
#define STRATA_VERSION "unknown"
#endif
#ifndef STRATA_CUDA_ARCHS
#define STRATA_CUDA_ARCHS ""
#endif

namespace po = boost::program_options;

namespace strata {

namespace {

// Appends lines of one section.
class Section {
 public:
  Section(std::vector<ReportLine>* out, std::string name) : out_(out), name_(std::move(name)) {}
  void Add(std::string name, std::string value) { out_->push_back({name_, std::move(name), std::move(value), "", ""}); }
  void Problem(std::string name, std::string value, std::string problem, std::string fix) {
    out_->push_back({name_, std::move(name), std::move(value), std::move(problem), std::move(fix)});
  }

 private:
  std::vector<ReportLine>* out_;
  std::string name_;
};

std::string Compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("GCC ") + __VERSION__;
#else
  return "unknown";
#endif
}

void StrataSection(std::vector<ReportLine>* out) {
  Section s(out, "strata");
  s.Add("version", STRATA_VERSION);
#if defined(NDEBUG) && defined(__OPTIMIZE__)
  s.Add("build", "optimized (NDEBUG)");
#else
  s.Problem("build", "not optimized (assertions on)", "strata was built without optimization: training and "
            "strata-bench figures are slow", "rebuild with -DCMAKE_BUILD_TYPE=Release");
#endif
  if (BuiltWithCuda()) {
    s.Add("CUDA code", std::string("built for sm ") + STRATA_CUDA_ARCHS);
  } else if (std::ifstream("/proc/driver/nvidia/version")) {
    s.Problem("CUDA code", "not built", "an NVIDIA driver is loaded but this build has no CUDA code: it trains "
              "on the CPU backend", "install the CUDA Toolkit (nvcc on PATH or /usr/local/cuda) and rebuild");
  } else {
    s.Add("CUDA code", "not built (no nvcc when configured): the CPU backend and host stand-ins only");
  }
  s.Add("compiler", Compiler() + ", C++ " + std::to_string(__cplusplus));
  char hw[32];
  std::snprintf(hw, sizeof hw, "%u.%u.%u", HWLOC_API_VERSION >> 16, (HWLOC_API_VERSION >> 8) & 0xff,
                HWLOC_API_VERSION & 0xff);
  s.Add("libraries", std::string("oneTBB ") + TBB_VERSION_STRING + ", hwloc API " + hw + ", Boost " +
                         std::to_string(BOOST_VERSION / 100000) + "." + std::to_string(BOOST_VERSION / 100 % 1000) +
                         ", liburing (kernel interface checked under I/O)");
}

std::string LinkText(const PcieLink& l) {
  if (l.source.empty()) return "PCIe link unknown (neither NVML nor sysfs told)";
  std::string t = "PCIe Gen" + std::to_string(l.gen) + " x" + std::to_string(l.width);
  if (l.max_gen || l.max_width) t += " (max Gen" + std::to_string(l.max_gen) + " x" + std::to_string(l.max_width) + ")";
  return t + " from " + l.source;
}

void GpuSection(std::vector<ReportLine>* out) {
  Section s(out, "GPU");
  const GpuFacts f = CollectGpuFacts();
  if (!f.built_with_cuda) {
    s.Add("CUDA runtime", "none (built without CUDA)");
  } else {
    s.Add("CUDA runtime", CudaVersionText(f.runtime_version));
    const std::string drv = f.driver_version ? CudaVersionText(f.driver_version) +
                                                   (f.nvidia_driver.empty() ? "" : " (NVIDIA driver " + f.nvidia_driver + ")")
                                             : "none";
    if (f.driver_version == 0)
      s.Problem("CUDA driver", drv, "no NVIDIA driver answers: no GPU can be used",
                "install the NVIDIA driver (nvidia-smi should then list the GPUs)");
    else if (f.driver_version / 1000 < f.runtime_version / 1000)
      s.Problem("CUDA driver", drv, "the driver supports CUDA " + CudaVersionText(f.driver_version) +
                ", an older major version than the runtime (" + CudaVersionText(f.runtime_version) + ")",
                "update the NVIDIA driver, or build with a CUDA Toolkit of the driver's major version");
    else
      s.Add("CUDA driver", drv);
  }
  if (f.devices.empty()) {
    s.Problem("GPUs", "none usable", "no usable GPU (" + f.why_none + "): strata trains on the CPU backend, "
              "with the GPU tier in host memory", "check nvidia-smi, CUDA_VISIBLE_DEVICES and the driver; in a "
              "container, pass the GPUs in (docker run --gpus all)");
  }
  const std::string archs = STRATA_CUDA_ARCHS;
  for (const GpuDeviceFacts& d : f.devices) {
    const GpuInfo& g = d.info;
    std::ostringstream v;
    v << g.name << ", " << FormatBytes(g.total_bytes) << " (" << FormatBytes(g.free_bytes) << " free), compute "
      << g.cc_major << "." << g.cc_minor << ", " << g.sm_count << " SMs, " << LinkText(d.link) << ", NUMA node "
      << (d.numa_node >= 0 ? std::to_string(d.numa_node) : std::string("unknown")) << ", bus " << g.pci_bus_id;
    const std::string name = "GPU " + std::to_string(g.device);
    const std::string cc = std::to_string(g.cc_major) + std::to_string(g.cc_minor);
    if (!archs.empty() && archs.find(cc) == std::string::npos)
      s.Problem(name, v.str(), "this build's CUDA code is for sm " + archs + ", not this GPU's " + cc +
                " (kernels may fail to load)", "rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + cc);
    else if (d.link.width > 0 && d.link.max_width > 0 && d.link.width < d.link.max_width)
      s.Problem(name, v.str(), "the PCIe link runs at x" + std::to_string(d.link.width) + " of x" +
                std::to_string(d.link.max_width) + ": host<->GPU copies get a fraction of the bandwidth",
                "reseat the card or move it to a full-width slot; check the BIOS's lane bifurcation");
    else
      s.Add(name, v.str());
    if (d.link.gen > 0 && d.link.max_gen > d.link.gen)
      s.Add(name + " link", "Gen" + std::to_string(d.link.gen) + " now of Gen" + std::to_string(d.link.max_gen) +
            ": a GPU at rest lowers its link speed; nvidia-smi -q -d PCIE under load shows the working one");
    std::string runs, not_runs;
    for (const auto& var : kernels::kFlashVariants)
      (kernels::FlashVariantRuns(var, g.cc_major, g.cc_minor) ? runs : not_runs) += std::string(" ") + var.name;
    s.Add(name + " attention", "flash variants that run:" + (runs.empty() ? std::string(" none") : runs) +
          (not_runs.empty() ? "" : "; not here:" + not_runs + " (need compute 9.0 and sm_90a code)"));
  }
  s.Add("NCCL", f.nccl_version ? NcclVersionText(f.nccl_version) + " (libnccl.so.2)"
                               : "not found (" + f.nccl_error + "); strata trains on one GPU and does not need it");
  s.Add("cuBLASLt", f.built_with_cuda ? CublasLtVersionText(f.cublaslt_version) : "none (built without CUDA)");
}

// hwloc: packages, NUMA nodes (with their memory and CPUs), cores, threads.
void TopologyLines(Section& s) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0) {
    s.Add("topology", "hwloc could not load the topology");
    return;
  }
  auto count = [&](hwloc_obj_type_t t) { return hwloc_get_nbobjs_by_type(topo, t); };
  const int packages = count(HWLOC_OBJ_PACKAGE), nodes = count(HWLOC_OBJ_NUMANODE);
  const int cores = count(HWLOC_OBJ_CORE), pus = count(HWLOC_OBJ_PU);
  s.Add("cores", std::to_string(packages) + " package(s), " + std::to_string(cores) + " cores, " +
                     std::to_string(pus) + " hardware threads, " + std::to_string(nodes) + " NUMA node(s)");
  for (int i = 0; i < nodes; ++i) {
    hwloc_obj_t n = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    char* cpus = nullptr;
    hwloc_bitmap_list_asprintf(&cpus, n->cpuset);
    s.Add("NUMA node " + std::to_string(n->os_index),
          "CPUs " + std::string(cpus ? cpus : "?") + ", " + FormatBytes(n->attr->numanode.local_memory));
    std::free(cpus);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < pus)
    s.Add("this process", "may run on " + std::to_string(CPU_COUNT(&set)) + " of the " + std::to_string(pus) +
                              " hardware threads (cpuset / taskset): the CPU Adam and the CPU backend use those");
  hwloc_topology_destroy(topo);
}

void CpuSection(std::vector<ReportLine>* out) {
  Section s(out, "CPU");
  const optim::CpuFeatures& f = optim::DetectCpuFeatures();
  s.Add("model", f.brand.empty() ? f.vendor : f.brand);
  s.Add("SIMD", optim::CpuFeatureString(f));
  const optim::Isa best = optim::BestIsa();
  const std::string path = std::string(optim::IsaName(best));
  if (best == optim::Isa::kScalar)
    s.Problem("CPU Adam path", path, "no AVX2+FMA+F16C: the CPU Adam runs plain C++, several times slower, and "
              "an offloaded optimizer step is likely bound by it", "train on a CPU with AVX2 (or AVX-512), or keep "
              "the optimizer state on the GPU (offload_optimizer.device none)");
  else
    s.Add("CPU Adam path", path + " (strata-bench adam measures every path this CPU has)");
  TopologyLines(s);
}

void MemorySection(std::vector<ReportLine>* out, bool gpu) {
  Section s(out, "memory");
  Result<HostMemoryInfo> m = QueryHostMemory();
  if (!m.ok()) {
    s.Problem("host memory", "unknown", m.status().ToString(), "check that /proc/meminfo is readable");
    return;
  }
  const uint64_t budget = m->available_bytes / 10 * 8;
  s.Add("host memory", FormatBytes(m->total_bytes) + " total, " + FormatBytes(m->available_bytes) + " available");
  s.Add("host budget", FormatBytes(budget) + " (strata train's default: 80% of the available; "
                       "--host-memory-limit sets it)");
  const uint64_t memlock = MemlockLimit();
  const bool cap = HasIpcLockCapability();
  const std::string lim = (memlock == UINT64_MAX ? std::string("unlimited") : FormatBytes(memlock)) +
                          (cap ? ", CAP_IPC_LOCK held" : "");
  if (gpu)
    s.Add("memlock limit", lim + " (pinning uses cudaHostRegister with a GPU: this limit does not apply)");
  else if (!cap && memlock < budget)
    s.Problem("memlock limit", lim, "without a GPU the host tier pins with mlock, which this limit caps below "
              "the host budget of " + FormatBytes(budget) + ": strata train would fail to open its host tier",
              "raise it: ulimit -l unlimited (a shell), `* - memlock unlimited` in /etc/security/limits.conf, "
              "docker run --ulimit memlock=-1; or run with CAP_IPC_LOCK; or set pin_memory false (pageable)");
  else
    s.Add("memlock limit", lim);
  const std::string thp = TransparentHugePagesSetting();
  if (thp == "never")
    s.Problem("transparent huge pages", thp, "the CPU Adam's buffers cannot get 2 MiB pages (more TLB misses)",
              "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (as root)");
  else
    s.Add("transparent huge pages", thp.empty() ? "unknown" : thp);
}

void IoSection(std::vector<ReportLine>* out) {
  Section s(out, "I/O");
  struct utsname u {};
  if (uname(&u) == 0) s.Add("kernel", std::string(u.sysname) + " " + u.release);
  io_uring ring{};
  const int r = io_uring_queue_init(8, &ring, 0);
  if (r < 0) {
    const int err = -r;
    std::ifstream dis("/proc/sys/kernel/io_uring_disabled");
    int disabled = 0;
    dis >> disabled;
    std::string fix = err == ENOSYS  ? "a kernel with io_uring (5.6 or newer) is needed"
                      : err == EPERM ? (disabled ? "sysctl kernel.io_uring_disabled=0 (it is " +
                                                       std::to_string(disabled) + ")"
                                                 : std::string("in a container, allow io_uring in the seccomp "
                                                               "profile (docker run --security-opt seccomp=...)"))
                      : err == ENOMEM ? "raise the memlock limit (older kernels count io_uring rings in it)"
                                      : "see io_uring_setup(2) for " + std::string(std::strerror(err));
    s.Problem("io_uring", std::string("refused: ") + std::strerror(err),
              "the NVMe tier needs io_uring: NVMe offload and strata-bench nvme cannot run", fix);
    return;
  }
  std::string missing;
  if (io_uring_probe* p = io_uring_get_probe_ring(&ring)) {
    const std::pair<int, const char*> ops[] = {{IORING_OP_READ, "READ"}, {IORING_OP_WRITE, "WRITE"},
                                               {IORING_OP_READ_FIXED, "READ_FIXED"},
                                               {IORING_OP_WRITE_FIXED, "WRITE_FIXED"}};
    for (auto [op, name] : ops)
      if (!io_uring_opcode_supported(p, op)) missing += std::string(" ") + name;
    io_uring_free_probe(p);
  }
  io_uring_queue_exit(&ring);
  if (missing.empty())
    s.Add("io_uring", "works (READ, WRITE, READ_FIXED, WRITE_FIXED)");
  else
    s.Problem("io_uring", "works, lacking" + missing, "the NVMe tier's transfers need these opcodes",
              "a kernel of 5.6 or newer");
}

void NvmeSection(std::vector<ReportLine>* out, const ReportOptions& o) {
  Section s(out, "NVMe paths");
  std::vector<std::string> paths = o.nvme_paths;
  if (!o.config_path.empty()) {
    std::vector<std::string> warnings;
    Result<Config> c = LoadConfig(o.config_path, 1, &warnings);
    if (!c.ok()) {
      s.Problem("config", o.config_path, c.status().ToString(), "fix the config (strata train would refuse it too)");
    } else {
      for (const auto* off : {&c->zero.offload_optimizer, &c->zero.offload_param})
        if (!off->nvme_path.empty() && std::find(paths.begin(), paths.end(), off->nvme_path) == paths.end())
          paths.push_back(off->nvme_path);
      if (paths.empty()) s.Add("config", o.config_path + " names no nvme_path");
    }
  }
  if (paths.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    paths.push_back(tmp && *tmp ? tmp : "/var/tmp");
    s.Add("configured", "none given (--nvme PATH or --config FILE); below: strata-bench's default directory");
  }
  for (const std::string& p : paths) {
    const PathProbe pr = ProbePath(p);
    if (!pr.error.empty()) {
      s.Problem(p, pr.error, "the NVMe tier cannot use it", "create it on the NVMe drive (mkdir -p " + p +
                ") or correct nvme_path");
      continue;
    }
    std::string v = pr.filesystem + (pr.device.empty() ? "" : " on " + pr.device) +
                    (pr.rotational == 1 ? " (rotational)" : pr.rotational == 0 ? " (not rotational)" : "") + ", " +
                    FormatBytes(pr.free_bytes) + " free of " + FormatBytes(pr.total_bytes) + ", O_DIRECT " +
                    (pr.o_direct ? "works" : "fails: " + pr.o_direct_error);
    if (!pr.writable)
      s.Problem(p, v, "cannot create files in it", "give the training user write access, or another path");
    else if (!pr.o_direct)
      s.Problem(p, v, "O_DIRECT does not work here (" + pr.filesystem + "): the NVMe tier refuses the path rather "
                "than go through the page cache", "put nvme_path on a disk filesystem (ext4 or xfs on the NVMe "
                "drive), not tmpfs, overlayfs or a network mount");
    else if (pr.free_bytes < 16 * kGiB)
      s.Problem(p, v, "little free space: optimizer state on NVMe takes 12 B per parameter (6.7B parameters: "
                "80 GB)", "free space, or choose a path on a larger drive");
    else
      s.Add(p, v);
    // Virtual disks (virtio) call themselves rotational by default, so that alone is no verdict.
    if (pr.o_direct && !pr.device.empty() && (pr.device.rfind("nvme", 0) != 0 || pr.rotational == 1))
      s.Add(p + " device", pr.device + (pr.rotational == 1 ? " says it is rotational" : " is not an NVMe drive") +
                               " (a virtual, SATA or spinning disk?): strata-bench nvme --dir " + p +
                               " measures what it gives");
  }
}

}  // namespace

std::vector<ReportLine> BuildFacts() {
  std::vector<ReportLine> out;
  StrataSection(&out);
  return out;
}

std::vector<ReportLine> CollectReport(const ReportOptions& options) {
  std::vector<ReportLine> lines;
  StrataSection(&lines);
  GpuSection(&lines);
  CpuSection(&lines);
  MemorySection(&lines, CudaDeviceCount() > 0);
  IoSection(&lines);
  NvmeSection(&lines, options);
  return lines;
}

std::string ReportText(const std::vector<ReportLine>& lines) {
  std::ostringstream os;
  size_t width = 0;
  for (const auto& l : lines) width = std::max(width, l.name.size());
  std::string section;
  std::vector<const ReportLine*> problems;
  for (const auto& l : lines) {
    if (l.section != section) {
      os << (section.empty() ? "" : "\n") << "== " << l.section << " ==\n";
      section = l.section;
    }
    os << (l.problem.empty() ? "  " : "! ") << l.name << std::string(width + 2 - l.name.size(), ' ') << l.value << "\n";
    if (!l.problem.empty()) problems.push_back(&l);
  }
  if (problems.empty()) {
    os << "\nproblems: none\n";
  } else {
    os << "\nproblems (" << problems.size() << "):\n";
    for (size_t i = 0; i < problems.size(); ++i)
      os << "  " << i + 1 << ". " << problems[i]->section << " / " << problems[i]->name << ": " << problems[i]->problem
         << "\n     fix: " << problems[i]->fix << "\n";
  }
  return os.str();
}

nlohmann::json ReportJson(const std::vector<ReportLine>& lines) {
  nlohmann::json j;
  j["sections"] = nlohmann::json::array();
  j["problems"] = nlohmann::json::array();
  for (const auto& l : lines) {
    if (j["sections"].empty() || j["sections"].back()["name"] != l.section)
      j["sections"].push_back({{"name", l.section}, {"items", nlohmann::json::array()}});
    nlohmann::json item{{"name", l.name}, {"value", l.value}};
    if (!l.problem.empty()) {
      item["problem"] = l.problem;
      item["fix"] = l.fix;
      j["problems"].push_back({{"section", l.section}, {"name", l.name}, {"problem", l.problem}, {"fix", l.fix}});
    }
    j["sections"].back()["items"].push_back(item);
  }
  return j;
}

int RunReportCommand(int argc, char** argv) {
  ReportOptions o;
  bool json = false;
  po::options_description desc(
      "strata report: what this machine and build offer for offloaded training, and every problem found with "
      "its fix");
  desc.add_options()("help,h", "show this help")(
      "nvme", po::value(&o.nvme_paths)->value_name("PATH"),
      "an NVMe path to check (repeatable): filesystem, device, free space, O_DIRECT")(
      "config", po::value(&o.config_path)->value_name("FILE"),
      "a ds_config.json whose zero_optimization.offload_*.nvme_path to check")(
      "json", po::bool_switch(&json), "print JSON instead of text (sections, and the problems with their fixes)");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: strata report [--nvme PATH]... [--config FILE] [--json]\n" << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "strata report: " << e.what() << "\ntry: strata report --help\n";
    return 2;
  }
  const std::vector<ReportLine> lines = CollectReport(o);
  if (json)
    std::cout << ReportJson(lines).dump(2) << "\n";
  else
    std::cout << "strata report\n\n" << ReportText(lines);
  return 0;
}

}  // namespace strata
