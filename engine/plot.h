// SPDX-License-Identifier: Apache-2.0
// Line charts as PNG files, drawn by gnuplot (Debian: gnuplot-nox), for
// `strata plot` (training curves) and `strata-bench all` (bandwidth curves).
//
// WritePlot writes the gnuplot script, data inline, beside the PNG (same
// name, .gp) and runs `gnuplot` on it: the script is what to edit to
// restyle a chart, and is written even when gnuplot is missing, so
// `gnuplot FILE.gp` in its directory after installing it draws the same
// chart (the script names its PNG relative to its own directory, so the
// pair can be copied elsewhere and redrawn). Panels are stacked top to
// bottom in one image.
//
// Thread-safety: free functions; each call spawns its own gnuplot.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace strata {

struct PlotSeries {
  std::string title;
  std::vector<double> x, y;  // same length; points with a non-finite y are left out
  bool dashed = false;       // a baseline drawn beside the measured figure
};

struct PlotPanel {
  std::string title, xlabel, ylabel;
  bool log2_x = false;  // a base-2 log x axis (sizes, thread counts)
  std::vector<std::pair<double, std::string>> xtics;  // labelled x tics (empty: gnuplot's)
  std::vector<PlotSeries> series;
};

// Writes `png_path` (and its .gp script). Unavailable with the install hint
// when gnuplot is not on PATH (the script is written all the same);
// Internal with gnuplot's own message when it fails; IoError naming the
// file when the script cannot be written. InvalidArgument for a series
// whose x and y differ in length or a panel without a point.
Status WritePlot(const std::string& png_path, const std::string& title, const std::vector<PlotPanel>& panels);

// Whether gnuplot is on PATH; `why` says what to install when it is not.
bool PlotToolAvailable(std::string* why = nullptr);

// What to run to get the plotting tool, for messages.
inline constexpr char kPlotInstallHint[] =
    "install gnuplot (Debian/Ubuntu: apt-get install gnuplot-nox; scripts/install-deps.sh installs it)";

}  // namespace strata
