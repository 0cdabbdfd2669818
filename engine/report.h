// SPDX-License-Identifier: Apache-2.0
// `strata report` (what DeepSpeed users know as ds_report): what this
// machine and this build offer for offloaded training, and every problem
// found with what to do about it.
//
// Sections, in order: strata (version, build type, CUDA code built,
// compiler, libraries), GPU (CUDA runtime and driver, each GPU's memory,
// compute capability, PCIe generation and width, NUMA node, the flash
// attention variants it runs; NCCL and cuBLASLt versions: engine/gpu_facts.h),
// CPU (model, SIMD features and the path the CPU Adam takes, cores and NUMA
// layout from hwloc, the CPUs this process may use), memory (host memory,
// the host budget strata train pins by default, the memlock limit that
// pinning without a GPU needs, transparent huge pages), I/O (kernel,
// io_uring and the opcodes the NVMe tier uses), NVMe paths (each configured
// path's filesystem, device, free space, and whether O_DIRECT works:
// engine/path_probe.h).
//
// A line with a problem carries the fix; the text output lists the problems
// again at the end, and --json gives everything to machines. Collecting
// touches nothing but one scratch file per NVMe path (removed).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

struct ReportLine {
  std::string section;  // "strata", "GPU", "CPU", "memory", "I/O", "NVMe paths"
  std::string name;
  std::string value;
  std::string problem;  // "" when fine
  std::string fix;      // what to do (with a problem)
};

struct ReportOptions {
  std::vector<std::string> nvme_paths;  // --nvme; with none, those of config_path, else the default
  std::string config_path;              // --config: its zero_optimization.offload_*.nvme_path
};

// The report's "strata" section alone (version, build type, CUDA code,
// compiler, libraries): what `strata --version` prints. Touches nothing.
std::vector<ReportLine> BuildFacts();

// The lines of the report. A config that cannot be read becomes a problem
// line of its own (the rest is still collected).
std::vector<ReportLine> CollectReport(const ReportOptions& options);

// "== section ==" blocks of aligned name/value lines, then "problems (N):"
// with each problem and its fix (or "problems: none").
std::string ReportText(const std::vector<ReportLine>& lines);
// {"sections": [{"name", "items": [{name, value, problem?, fix?}]}] in report order,
//  "problems": [{section, name, problem, fix}]}
nlohmann::json ReportJson(const std::vector<ReportLine>& lines);

// The command line: strata report [--nvme PATH]... [--config FILE] [--json].
// argv[0] is "report". Exit 0 (problems are reported, not failed on), 2 for
// bad arguments.
int RunReportCommand(int argc, char** argv);

}  // namespace strata
