// SPDX-License-Identifier: Apache-2.0
// strata-bench all's results and how they become the report: report.md
// with its headline table (every link and component: the figure, its
// baseline measured in the same run, the ratio), what bounds offloaded
// training (bench/offload_bound.h), one section per component with its
// full table, the PNG charts beside it (engine/plot.h), and the machine as
// `strata report` sees it.
//
// Thread-safety: plain data and free functions.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/offload_bound.h"
#include "engine/report.h"

namespace strata::bench {

// One component benchmark as `all` ran it.
struct ComponentRun {
  std::string name;               // the strata-bench command: "nvme"
  std::string title;              // the report's section title
  std::vector<std::string> args;  // its command line after "strata-bench"
  bool ran = false;
  int rc = 0;                     // its exit code (130: stopped)
  std::string missing;            // why it did not run, or why its figures are missing
  std::string error;              // its failure, when it failed
  nlohmann::json result;          // the JSON it wrote (null: none)
  double seconds = 0;
  bool has_rows() const { return result.is_object() && result.contains("rows") && !result["rows"].empty(); }
};

struct MachineRun {
  std::string out_dir;                 // --out
  std::string command_line;            // as typed
  std::string nvme_dir;                // where the NVMe figures were measured (--dir, or the temporary one)
  std::string nvme_dir_note;           // its filesystem and device
  bool quick = false, full = false;
  std::string gpu_missing;             // why no GPU is usable ("" with one)
  std::vector<ReportLine> machine;     // strata report's lines
  std::vector<ComponentRun> components;
  OffloadRates rates;
  std::vector<std::string> rate_notes; // where each rate came from
  std::vector<BoundRow> bounds;
  std::string bounds_missing;          // why there is no bound table
  std::vector<std::string> plots;      // PNG files written (names in out_dir)
  std::string plot_problem;            // why charts are missing (gnuplot not installed, ...)
  bool stopped = false;
  double seconds = 0;
};

// The component called `name`, or nullptr.
const ComponentRun* FindComponent(const MachineRun& run, const std::string& name);

// The rates the bound analysis uses, from the components' results; notes
// say where each one came from (or that it is missing).
OffloadRates RatesFromComponents(const MachineRun& run, std::vector<std::string>* notes);

// The charts: pcie.png (bandwidth against transfer size), nvme.png
// (bandwidth against block size, a line per queue depth), adam.png (G
// params/s against threads, a line per ISA, the roof dashed), each with its
// .gp script; fills run->plots, or run->plot_problem when gnuplot is missing.
void WritePlots(MachineRun* run);

// report.md's text, and its first two sections alone (the headline table
// and the bound table: what `all` prints when it ends).
std::string ReportMarkdown(const MachineRun& run);
std::string SummaryMarkdown(const MachineRun& run);

}  // namespace strata::bench
