// SPDX-License-Identifier: Apache-2.0
#include "engine/plot.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace strata {

namespace {

// gnuplot strings are double-quoted here; a double quote or backslash in a
// title would end or escape them.
std::string Quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += "'";
    else if (c == '\\') q += "/";
    else if (c != '\n') q += c;
  }
  return q + "\"";
}

std::string FindOnPath(const char* name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    const std::string p = dir + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// Runs `exe script` in `dir` and waits; what it wrote to stdout and stderr comes back in `output`.
Status RunTool(const std::string& exe, const std::string& dir, const std::string& script, std::string* output) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe for gnuplot");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addchdir_np(&fa, dir.c_str());
  std::string arg0 = "gnuplot";
  std::string arg1 = script;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return IoError("cannot start gnuplot", rc, exe);
  }
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) output->append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return ErrnoStatus("waitpid for gnuplot");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Internal("gnuplot failed on " + dir + "/" + script + " (exit status " + std::to_string(WEXITSTATUS(status)) +
                    "): " + *output);
  return Status::OK();
}

}  // namespace

bool PlotToolAvailable(std::string* why) {
  if (!FindOnPath("gnuplot").empty()) return true;
  if (why) *why = std::string("gnuplot is not on PATH: ") + kPlotInstallHint;
  return false;
}

Status WritePlot(const std::string& png_path, const std::string& title, const std::vector<PlotPanel>& panels) {
  if (panels.empty()) return InvalidArgument("plot " + png_path + ": no panels");
  std::ostringstream gp;
  gp.precision(9);
  const int height = 80 + 400 * static_cast<int>(panels.size());
  // The output is named relative to the script's directory (gnuplot runs
  // there), so the script redraws the chart wherever the files are copied.
  const size_t slash = png_path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : png_path.substr(0, slash);
  const std::string png_name = png_path.substr(slash == std::string::npos ? 0 : slash + 1);
  gp << "# Drawn by strata (engine/plot.cc). Redraw " << png_name << " with: cd to this directory; gnuplot "
     << png_name.substr(0, png_name.size() > 4 ? png_name.size() - 4 : png_name.size()) << ".gp\n";
  gp << "set terminal pngcairo noenhanced size 900," << height << " font \"sans,10\"\n";
  gp << "set output " << Quoted(png_name) << "\n";
  gp << "set multiplot layout " << panels.size() << ",1 title " << Quoted(title) << " font \"sans,12\"\n";
  gp << "set grid\nset key below\nset style data linespoints\n";
  for (size_t p = 0; p < panels.size(); ++p) {
    const PlotPanel& panel = panels[p];
    size_t points = 0;
    double x_lo = INFINITY, x_hi = -INFINITY;
    for (size_t s = 0; s < panel.series.size(); ++s) {
      const PlotSeries& ser = panel.series[s];
      if (ser.x.size() != ser.y.size())
        return InvalidArgument("plot " + png_path + ": series '" + ser.title + "' has " + std::to_string(ser.x.size()) +
                               " x values and " + std::to_string(ser.y.size()) + " y values");
      gp << "$p" << p << "s" << s << " << EOD\n";
      for (size_t i = 0; i < ser.x.size(); ++i)
        if (std::isfinite(ser.x[i]) && std::isfinite(ser.y[i])) {
          gp << ser.x[i] << " " << ser.y[i] << "\n";
          x_lo = std::min(x_lo, ser.x[i]);
          x_hi = std::max(x_hi, ser.x[i]);
          ++points;
        }
      gp << "EOD\n";
    }
    if (points == 0) return InvalidArgument("plot " + png_path + ": panel '" + panel.title + "' has no point to draw");
    gp << "set title " << Quoted(panel.title) << "\nset xlabel " << Quoted(panel.xlabel) << "\nset ylabel "
       << Quoted(panel.ylabel) << "\n";
    gp << (panel.log2_x ? "set logscale x 2\n" : "unset logscale x\n");
    // A little room past the first and last x: gnuplot drops a tic that
    // rounding puts just outside an autoscaled range (the largest transfer
    // size, the most threads).
    if (panel.log2_x && x_lo > 0) {
      gp << "set xrange [" << x_lo / 1.05 << ":" << x_hi * 1.05 << "]\n";
    } else {
      const double pad = x_hi > x_lo ? 0.02 * (x_hi - x_lo) : 1.0;
      gp << "set xrange [" << x_lo - pad << ":" << x_hi + pad << "]\n";
    }
    gp << "set yrange [0:*]\n";
    if (panel.xtics.empty()) {
      gp << "set xtics autofreq\n";
    } else {
      gp << "set xtics (";
      for (size_t i = 0; i < panel.xtics.size(); ++i)
        gp << (i ? ", " : "") << Quoted(panel.xtics[i].second) << " " << panel.xtics[i].first;
      gp << ")\n";
    }
    gp << "plot ";
    for (size_t s = 0; s < panel.series.size(); ++s) {
      const PlotSeries& ser = panel.series[s];
      gp << (s ? ", \\\n     " : "") << "$p" << p << "s" << s << " using 1:2 title " << Quoted(ser.title)
         << " with linespoints lw 2 pt 7 ps 0.6" << (ser.dashed ? " dt 2" : "");
    }
    gp << "\n";
  }
  gp << "unset multiplot\n";

  std::string script = png_path;
  if (script.size() > 4 && script.compare(script.size() - 4, 4, ".png") == 0) script.resize(script.size() - 4);
  script += ".gp";
  {
    std::ofstream f(script);
    if (!f) return ErrnoStatus("cannot create the gnuplot script", script);
    f << gp.str();
    f.flush();
    if (!f) return ErrnoStatus("cannot write the gnuplot script", script);
  }
  const std::string exe = FindOnPath("gnuplot");
  if (exe.empty())
    return Unavailable("gnuplot is not on PATH, so " + png_path + " was not drawn (its script " + script +
                       " was written: run gnuplot on it once installed): " + kPlotInstallHint);
  std::string output;
  return RunTool(exe, dir, script.substr(slash == std::string::npos ? 0 : slash + 1), &output);
}

}  // namespace strata
