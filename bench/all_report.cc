// SPDX-License-Identifier: Apache-2.0
#include "bench/all_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>
#include <sstream>

#include "base/bytes.h"
#include "bench/bench.h"
#include "engine/plot.h"

namespace strata::bench {

namespace {

using nlohmann::json;

std::string Num(double v) { return ReportCell(json(v)); }

std::string Str(const json& row, const char* key) {
  if (!row.contains(key)) return "";
  return row[key].is_string() ? row[key].get<std::string>() : ReportCell(row[key]);
}
double Dbl(const json& row, const char* key) {
  return row.contains(key) && row[key].is_number() ? row[key].get<double>() : 0.0;
}

const json& Rows(const ComponentRun* c) {
  static const json empty = json::array();
  return c && c->has_rows() ? c->result["rows"] : empty;
}

// The last row whose `key` is `value` (the largest size of a sweep in ascending order).
const json* LastRow(const ComponentRun* c, const char* key, const std::string& value) {
  const json* found = nullptr;
  for (const auto& r : Rows(c))
    if (Str(r, key) == value) found = &r;
  return found;
}

// The row with the largest "value" among those whose `key` is `value`.
const json* BestRow(const ComponentRun* c, const char* key, const std::string& value) {
  const json* best = nullptr;
  for (const auto& r : Rows(c))
    if (Str(r, key) == value && (!best || Dbl(r, "value") > Dbl(*best, "value"))) best = &r;
  return best;
}

std::string MdEscape(std::string s) {
  std::string o;
  for (char c : s) o += c == '|' ? std::string("\\|") : std::string(1, c == '\n' ? ' ' : c);
  return o;
}

std::string MdTable(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
  std::ostringstream os;
  os << "|";
  for (const auto& h : head) os << " " << MdEscape(h) << " |";
  os << "\n|";
  for (size_t i = 0; i < head.size(); ++i) os << "---|";
  os << "\n";
  for (const auto& r : rows) {
    os << "|";
    for (const auto& c : r) os << " " << MdEscape(c) << " |";
    os << "\n";
  }
  return os.str();
}

// A component's rows as a table, every column as strata-bench prints it.
std::string RowsTable(const ComponentRun& c) {
  std::vector<json> rows(Rows(&c).begin(), Rows(&c).end());
  const std::vector<std::string> cols = ReportColumns(rows);
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : rows) {
    std::vector<std::string> line;
    for (const auto& k : cols) line.push_back(r.contains(k) ? ReportCell(r[k]) : "");
    cells.push_back(std::move(line));
  }
  return MdTable(cols, cells);
}

std::string Seconds(double s) {
  char b[32];
  if (s >= 1e29) return "-";
  if (s >= 100) std::snprintf(b, sizeof b, "%.0f s", s);
  else if (s >= 1) std::snprintf(b, sizeof b, "%.2f s", s);
  else std::snprintf(b, sizeof b, "%.0f ms", s * 1e3);
  return b;
}

// ---- the headline table ----------------------------------------------------------

struct Headline {
  std::string what, measured, baseline, ratio, where;
};

Headline FromRow(const std::string& what, const json* r, const std::string& where, const std::string& missing) {
  if (!r) return {what, "-", "missing: " + missing, "-", ""};
  return {what, Num(Dbl(*r, "value")) + " " + Str(*r, "unit"),
          Num(Dbl(*r, "baseline")) + " " + Str(*r, "unit") + " (" + Str(*r, "baseline_name") + ")",
          Num(Dbl(*r, "ratio")), where};
}

std::string Why(const ComponentRun* c, const std::string& gpu_missing, bool needs_gpu) {
  if (needs_gpu && !gpu_missing.empty()) return "no usable GPU (" + gpu_missing + ")";
  if (!c || !c->ran) return c && !c->missing.empty() ? c->missing : "not run";
  if (!c->error.empty()) return "failed: " + c->error;
  if (!c->missing.empty()) return c->missing;
  return c->rc == 130 ? "stopped before it was measured" : "not measured (exit " + std::to_string(c->rc) + ")";
}

std::vector<Headline> Headlines(const MachineRun& run) {
  std::vector<Headline> h;
  const std::string& nogpu = run.gpu_missing;
  const ComponentRun* pcie = FindComponent(run, "pcie");
  const bool real_pcie = pcie && pcie->has_rows() && !pcie->result["meta"].value("stand_in", true);
  auto pcie_row = [&](const char* what, const char* op) {
    const json* r = real_pcie ? LastRow(pcie, "op", op) : nullptr;
    h.push_back(FromRow(what, r, r ? "copy engine, " + Str(*r, "size") + " copies" : "",
                        real_pcie ? Why(pcie, "", false) : Why(pcie, nogpu, true)));
  };
  pcie_row("host -> GPU (h2d)", "h2d");
  pcie_row("GPU -> host (d2h)", "d2h");
  pcie_row("both directions at once", "both");
  const ComponentRun* nvme = FindComponent(run, "nvme");
  for (auto [what, op] : {std::pair{"NVMe -> host (read)", "read"}, {"host -> NVMe (write)", "write"},
                          {"NVMe mixed (read + write at once)", "mixed"}}) {
    const json* r = BestRow(nvme, "op", op);
    h.push_back(FromRow(what, r,
                        r ? "NvmeTier, best: block " + Str(*r, "block") + ", qd " + Str(*r, "qd") + ", rings " +
                                Str(*r, "rings")
                          : "",
                        Why(nvme, "", false)));
  }
  const ComponentRun* adam = FindComponent(run, "adam");
  {
    // The roof and the STREAM copy at the most threads.
    const json* top = nullptr;
    for (const auto& r : Rows(adam))
      if (!top || Dbl(r, "threads") > Dbl(*top, "threads") ||
          (Dbl(r, "threads") == Dbl(*top, "threads") && Dbl(r, "baseline") > Dbl(*top, "baseline")))
        top = &r;
    if (top)
      h.push_back({"host memory: the Adam pass's roof", Num(Dbl(*top, "baseline")) + " GB/s",
                   Num(Dbl(*top, "copy")) + " GB/s (STREAM copy, same threads)",
                   Num(Dbl(*top, "copy") > 0 ? Dbl(*top, "baseline") / Dbl(*top, "copy") : 0),
                   Str(*top, "threads") + " threads, " + Str(*top, "params") + " params"});
    else
      h.push_back({"host memory: the Adam pass's roof", "-", "missing: " + Why(adam, "", false), "-", ""});
    // CPU Adam per ISA at the most threads.
    std::map<std::string, const json*> by_isa;
    for (const auto& r : Rows(adam)) {
      const json*& b = by_isa[Str(r, "isa")];
      if (!b || Dbl(r, "threads") > Dbl(*b, "threads") ||
          (Dbl(r, "threads") == Dbl(*b, "threads") && Dbl(r, "Gparam/s") > Dbl(*b, "Gparam/s")))
        b = &r;
    }
    for (const auto& [isa, r] : by_isa)
      h.push_back({"CPU Adam " + isa + " (" + Str(*r, "config") + ")",
                   Num(Dbl(*r, "Gparam/s")) + " G params/s = " + Num(Dbl(*r, "value")) + " GB/s",
                   Num(Dbl(*r, "baseline")) + " GB/s (roof: same arrays, bytes, threads)", Num(Dbl(*r, "ratio")),
                   Str(*r, "threads") + " threads, " + Str(*r, "params") + " params"});
    if (by_isa.empty()) h.push_back({"CPU Adam", "-", "missing: " + Why(adam, "", false), "-", ""});
  }
  const ComponentRun* att = FindComponent(run, "attention");
  if (att && att->has_rows()) {
    const json& meta = att->result["meta"];
    h.push_back({"bf16 GEMM " + std::to_string(meta.value("peak_size", 0)) + "^3 (cuBLASLt)",
                 Num(meta.value("peak_tflops", 0.0)) + " TFLOP/s", "the compute roof: attention and training below "
                 "are measured against it", "-", "this run"});
    for (const char* pass : {"fwd", "bwd"}) {
      const json* best = nullptr;
      const std::string shape = Str(Rows(att)[0], "shape");
      for (const auto& r : Rows(att))
        if (Str(r, "pass") == pass && Str(r, "shape") == shape && (!best || Dbl(r, "value") > Dbl(*best, "value")))
          best = &r;
      if (best)
        h.push_back(FromRow(std::string("flash attention ") + pass + ", best variant", best,
                            Str(*best, "variant") + ", " + shape, ""));
    }
  } else {
    h.push_back({"bf16 GEMM and flash attention", "-", "missing: " + Why(att, nogpu, true), "-", ""});
  }
  const ComponentRun* train = FindComponent(run, "train");
  const json* tok = LastRow(train, "figure", "tokens/s");
  if (tok) {
    const json& meta = train->result["meta"];
    const json* peak = LastRow(train, "figure", "GEMM peak");
    Headline t = FromRow("resident training tokens/s (ratio = MFU)", tok,
                         Str(meta, "backend") + ", " + std::to_string(meta.value("layers", 0)) + " layers, d " +
                             std::to_string(meta.value("d", 0)) + ", seq " + std::to_string(meta.value("seq", 0)) +
                             ", batch " + std::to_string(meta.value("batch", 0)),
                         "");
    t.baseline = Num(Dbl(*tok, "baseline")) + " tok/s (model FLOPs at the GEMM peak measured in that run: " +
                 (peak ? Num(Dbl(*peak, "value")) : std::string("?")) + " TFLOP/s)";
    h.push_back(t);
  } else {
    h.push_back({"resident training tokens/s", "-", "missing: " + Why(train, "", false), "-", ""});
  }
  return h;
}

// ---- the bound table --------------------------------------------------------------

std::string BoundSection(const MachineRun& run) {
  std::ostringstream os;
  os << "## What bounds offloaded training here\n\n";
  if (run.bounds.empty()) {
    os << "Not computed: " << run.bounds_missing << "\n\n";
    return os.str();
  }
  const OffloadRates& r = run.rates;
  os << "The plan `strata train` would make for each model under this machine's budgets (GPU "
     << FormatBytes(r.gpu_budget) << ", host " << FormatBytes(r.host_budget) << ", NVMe "
     << (r.nvme_free ? FormatBytes(r.nvme_free) + " free in " + run.nvme_dir : std::string("none")) << "), from "
     << "the same planner (engine/planner.h), and the time each resource needs for its share of a step at the "
     << "rates measured above. The slowest one bounds the step: strata overlaps the others with it, so this is "
     << "a lower bound on the step time (`strata train --dry-run --config ...` prints the full plan of a config).\n\n";
  os << "Rates used:\n\n";
  for (const auto& n : run.rate_notes) os << "- " << n << "\n";
  os << "\n";
  std::vector<std::vector<std::string>> rows;
  const BoundRow* largest = nullptr;
  for (const BoundRow& b : run.bounds) {
    const std::string params = Num(static_cast<double>(b.params) / 1e9) + " B";
    if (!b.fits) {
      rows.push_back({b.model.name, params, "no: " + b.why_not, "", "", "", "", "", "", "", "", "", ""});
      continue;
    }
    largest = &b;
    rows.push_back({b.model.name, params,
                    std::to_string(b.micro_batch) + " x " + std::to_string(b.grad_accum) + " x " +
                        std::to_string(b.model.seq) + " tokens",
                    PlacementText(b.plan), FormatBytes(b.plan.h2d) + " / " + FormatBytes(b.plan.d2h),
                    FormatBytes(b.plan.nvme_read) + " / " + FormatBytes(b.plan.nvme_write), Seconds(b.compute_s),
                    Seconds(b.pcie_s), Seconds(b.nvme_s), Seconds(b.adam_s),
                    r.host_roof_gbs > 0 ? Seconds(b.host_s) : std::string("-"), "**" + b.bound + "**: " + Seconds(b.step_s),
                    Num(b.tokens_per_s)});
  }
  os << MdTable({"model", "parameters", "fits? batch per step", "placement", "PCIe h2d / d2h per step",
                 "NVMe read / write per step", "compute", "PCIe", "NVMe", "CPU Adam", "host memory", "bound: step", "tokens/s"},
                rows);
  os << "\n";
  if (largest)
    os << "**The largest of these this machine trains: " << largest->model.name << " ("
       << Num(static_cast<double>(largest->params) / 1e9) << " B parameters), at about " << Num(largest->tokens_per_s)
       << " tokens/s, bound by " << largest->bound << ".**\n\n";
  else
    os << "**None of these models fits this machine's budgets.**\n\n";
  os << "Shapes: GPT-3's (Brown et al. 2020), vocabulary 50304, sequence 2048, bf16. Bytes per step are the "
        "planner's upper bounds from the sizes (the trainer's schedule keeps some blocks from the forward for the "
        "backward and moves less). CPU Adam: the offloaded parameters at the rate measured above; the GPU Adam "
        "(optimizer state on the GPU) is counted in neither.\n\n";
  return os.str();
}

// ---- charts -------------------------------------------------------------------------

std::vector<std::pair<double, std::string>> SizeTics(const std::set<double>& xs) {
  std::vector<std::pair<double, std::string>> t;
  for (double x : xs) {
    std::string s = FormatBytes(static_cast<uint64_t>(x));
    // "64.0 MiB" -> "64M", "1.00 GiB" -> "1G"
    const double v = std::atof(s.c_str());
    char b[32];
    std::snprintf(b, sizeof b, "%g%c", v, s.find("GiB") != std::string::npos   ? 'G'
                                          : s.find("MiB") != std::string::npos ? 'M'
                                          : s.find("KiB") != std::string::npos ? 'K'
                                                                               : 'B');
    t.push_back({x, b});
  }
  return t;
}

double RowBytes(const json& r, const char* key) {
  Result<uint64_t> b = ParseBytes(Str(r, key));
  return b.ok() ? static_cast<double>(*b) : NAN;
}

Status PciePlot(const MachineRun& run, const ComponentRun& c) {
  std::map<std::string, PlotSeries> engine, base;
  std::set<double> xs;
  std::vector<std::string> order;
  for (const auto& r : Rows(&c)) {
    const std::string op = Str(r, "op");
    const double x = RowBytes(r, "size");
    if (!engine.count(op)) {
      order.push_back(op);
      engine[op].title = op + " (copy engine)";
      base[op] = {op + ": " + Str(r, "baseline_name"), {}, {}, true};
    }
    engine[op].x.push_back(x), engine[op].y.push_back(Dbl(r, "value"));
    base[op].x.push_back(x), base[op].y.push_back(Dbl(r, "baseline"));
    xs.insert(x);
  }
  PlotPanel p{c.result["meta"].value("stand_in", false) ? "host <-> GPU stand-in (no GPU: host memcpy, not PCIe)"
                                                        : "host <-> GPU bandwidth against transfer size",
              "bytes per copy", "GB/s", true, SizeTics(xs), {}};
  for (const auto& op : order) p.series.push_back(engine[op]), p.series.push_back(base[op]);
  return WritePlot(run.out_dir + "/pcie.png", "strata-bench pcie", {p});
}

Status NvmePlot(const MachineRun& run, const ComponentRun& c) {
  std::vector<PlotPanel> panels;
  for (const char* op : {"read", "write", "mixed"}) {
    std::map<std::string, PlotSeries> tier, raw;
    std::vector<std::string> order;
    std::set<double> xs;
    for (const auto& r : Rows(&c)) {
      if (Str(r, "op") != op) continue;
      const std::string key = "qd " + Str(r, "qd") + (Dbl(r, "rings") > 1 ? " x " + Str(r, "rings") + " rings" : "") +
                              ", tensor " + Str(r, "tensor");
      if (!tier.count(key)) {
        order.push_back(key);
        tier[key].title = key;
        raw[key] = {key + " raw io_uring", {}, {}, true};
      }
      const double x = RowBytes(r, "block");
      tier[key].x.push_back(x), tier[key].y.push_back(Dbl(r, "value"));
      raw[key].x.push_back(x), raw[key].y.push_back(Dbl(r, "baseline"));
      xs.insert(x);
    }
    if (order.empty()) continue;
    PlotPanel p{std::string("NvmeTier ") + op + " against block size, a line per queue depth (dashed: raw io_uring)",
                "block size (aio.block_size)", "GB/s", true, SizeTics(xs), {}};
    for (const auto& k : order) p.series.push_back(tier[k]), p.series.push_back(raw[k]);
    panels.push_back(std::move(p));
  }
  if (panels.empty()) return InvalidArgument("nvme: no rows to draw");
  return WritePlot(run.out_dir + "/nvme.png", "strata-bench nvme in " + run.nvme_dir, panels);
}

Status AdamPlot(const MachineRun& run, const ComponentRun& c) {
  std::map<std::string, PlotSeries> isa;
  std::map<double, double> roof;  // threads -> the best roof, in G params/s
  std::set<double> xs;
  std::vector<std::string> order;
  std::string params;
  for (const auto& r : Rows(&c)) {
    const std::string k = Str(r, "isa");
    if (!isa.count(k)) order.push_back(k), isa[k].title = "CPU Adam " + k;
    const double t = Dbl(r, "threads");
    isa[k].x.push_back(t), isa[k].y.push_back(Dbl(r, "Gparam/s"));
    const double bpp = Dbl(r, "B/param");
    if (bpp > 0) roof[t] = std::max(roof[t], Dbl(r, "baseline") / bpp);
    xs.insert(t);
    params = Str(r, "params");
  }
  PlotPanel p{"CPU Adam against threads (" + params + " params; dashed: the host memory roof in params/s)",
              "threads", "G params/s", true, {}, {}};
  for (double x : xs) p.xtics.push_back({x, std::to_string(static_cast<int>(x))});
  for (const auto& k : order) p.series.push_back(isa[k]);
  PlotSeries rs{"roof (same bytes at the roof pass's GB/s)", {}, {}, true};
  for (auto [t, v] : roof) rs.x.push_back(t), rs.y.push_back(v);
  p.series.push_back(rs);
  return WritePlot(run.out_dir + "/adam.png", "strata-bench adam", {p});
}

std::string PlotLine(const MachineRun& run, const std::string& png, const std::string& alt) {
  if (std::find(run.plots.begin(), run.plots.end(), png) != run.plots.end())
    return "![" + alt + "](" + png + ")\n\n";
  return "(chart " + png + " not drawn: " + (run.plot_problem.empty() ? "no figures" : run.plot_problem) + ")\n\n";
}

}  // namespace

const ComponentRun* FindComponent(const MachineRun& run, const std::string& name) {
  for (const auto& c : run.components)
    if (c.name == name) return &c;
  return nullptr;
}

OffloadRates RatesFromComponents(const MachineRun& run, std::vector<std::string>* notes) {
  OffloadRates r;
  const ComponentRun* pcie = FindComponent(run, "pcie");
  const bool stand_in = pcie && pcie->has_rows() && pcie->result["meta"].value("stand_in", true);
  const std::string sfx = stand_in ? " (stand-in)" : "";
  auto pcie_rate = [&](const char* op, double* out) {
    const json* row = LastRow(pcie, "op", std::string(op) + sfx);
    if (row) *out = Dbl(*row, "value");
    return row;
  };
  const json* h2d = pcie_rate("h2d", &r.h2d_gbs);
  pcie_rate("both", &r.both_gbs);
  if (!pcie_rate("d2h", &r.d2h_gbs)) r.d2h_gbs = r.h2d_gbs;  // the stand-in measures h2d and both only
  if (h2d)
    notes->push_back(std::string(stand_in ? "host <-> \"GPU\": no GPU, so the GPU tier's stand-in, host memcpy on "
                                            "the copy engine's threads"
                                          : "PCIe: the copy engine") +
                     " at " + Str(*h2d, "size") + ": h2d " + Num(r.h2d_gbs) + ", d2h " + Num(r.d2h_gbs) +
                     ", both " + Num(r.both_gbs) + " GB/s");
  else
    notes->push_back("PCIe: missing (" + Why(pcie, "", false) + ")");
  const ComponentRun* nvme = FindComponent(run, "nvme");
  const json* rd = BestRow(nvme, "op", "read");
  const json* wr = BestRow(nvme, "op", "write");
  const json* mx = BestRow(nvme, "op", "mixed");
  if (rd && wr) {
    r.nvme_read_gbs = Dbl(*rd, "value"), r.nvme_write_gbs = Dbl(*wr, "value");
    if (mx) r.nvme_mixed_gbs = Dbl(*mx, "value");
    notes->push_back("NVMe: the NvmeTier's best of the sweep: read " + Num(r.nvme_read_gbs) + ", write " +
                     Num(r.nvme_write_gbs) + ", mixed " + (mx ? Num(r.nvme_mixed_gbs) : std::string("-")) +
                     " GB/s (`strata-bench nvme --tune` prints the aio block that gets them)");
  } else {
    notes->push_back("NVMe: missing (" + Why(nvme, "", false) + ")");
  }
  const ComponentRun* adam = FindComponent(run, "adam");
  const json* best = nullptr;
  for (const auto& row : Rows(adam))
    if (!best || Dbl(row, "threads") > Dbl(*best, "threads") ||
        (Dbl(row, "threads") == Dbl(*best, "threads") && Dbl(row, "Gparam/s") > Dbl(*best, "Gparam/s")))
      best = &row;
  if (best) {
    r.adam_params_per_s = Dbl(*best, "Gparam/s") * 1e9;
    r.host_roof_gbs = Dbl(*best, "baseline");
    notes->push_back("CPU Adam: " + Str(*best, "isa") + ", " + Str(*best, "threads") + " threads, " +
                     Str(*best, "config") + ": " + Num(Dbl(*best, "Gparam/s")) + " G params/s");
    notes->push_back("host memory: the roof pass beside that row (the Adam's arrays and byte pattern, trivial "
                     "arithmetic) at " + Str(*best, "params") + " parameters: " + Num(r.host_roof_gbs) +
                     " GB/s, which the CPU Adam and the copies share (a shard that fits the caches overstates it)");
  } else {
    notes->push_back("CPU Adam: missing (" + Why(adam, "", false) + ")");
  }
  const ComponentRun* train = FindComponent(run, "train");
  const json* tok = LastRow(train, "figure", "tokens/s");
  const json* peak = LastRow(train, "figure", "GEMM peak");
  if (tok && peak) {
    r.compute_flops = Dbl(*tok, "ratio") * Dbl(*peak, "value") * 1e12;
    notes->push_back("compute: the resident training run's model FLOP rate, MFU " +
                     Num(100 * Dbl(*tok, "ratio")) + "% of its GEMM peak " + Num(Dbl(*peak, "value")) + " TFLOP/s = " +
                     Num(r.compute_flops / 1e12) + " TFLOP/s on " + Str(train->result["meta"], "backend") +
                     " (a model of another size runs at a somewhat different MFU)");
  } else {
    notes->push_back("compute: missing (" + Why(train, "", false) + ")");
  }
  return r;
}

void WritePlots(MachineRun* run) {
  const std::pair<const char*, Status (*)(const MachineRun&, const ComponentRun&)> charts[] = {
      {"pcie", PciePlot}, {"nvme", NvmePlot}, {"adam", AdamPlot}};
  std::string why;
  if (!PlotToolAvailable(&why)) run->plot_problem = why;
  for (auto [name, draw] : charts) {
    const ComponentRun* c = FindComponent(*run, name);
    if (!c || !c->has_rows()) continue;
    Status s = draw(*run, *c);  // writes the .gp script even without gnuplot
    if (s.ok())
      run->plots.push_back(std::string(name) + ".png");
    else if (run->plot_problem.empty())
      run->plot_problem = s.ToString();
  }
}

std::string SummaryMarkdown(const MachineRun& run) {
  std::ostringstream os;
  os << "## Summary\n\n";
  std::vector<std::vector<std::string>> rows;
  for (const Headline& h : Headlines(run)) rows.push_back({h.what, h.measured, h.baseline, h.ratio, h.where});
  os << MdTable({"link / component", "measured", "baseline (same run)", "ratio", "setting"}, rows) << "\n";
  os << BoundSection(run);
  return os.str();
}

std::string ReportMarkdown(const MachineRun& run) {
  std::ostringstream os;
  std::string cpu = "?", gpu = run.gpu_missing.empty() ? "" : "no usable GPU";
  for (const auto& l : run.machine) {
    if (l.section == "CPU" && l.name == "model") cpu = l.value;
    if (l.section == "GPU" && l.name == "GPU 0") gpu = l.value.substr(0, l.value.find(','));
  }
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  os << "# strata-bench all: " << cpu << ", " << gpu << "\n\n";
  os << date << ". `" << run.command_line << "`, " << Seconds(run.seconds) << ". NVMe figures in " << run.nvme_dir
     << " (" << run.nvme_dir_note << ").\n\n";
  if (run.quick) os << "> `--quick`: CI-sized runs; the figures show the code paths work, not what the machine can do.\n\n";
  if (run.stopped) os << "> Stopped by Ctrl-C: what follows is what was measured before.\n\n";
  os << "Every figure stands beside its baseline measured in this run, and the ratio (figure / baseline).\n\n";

  os << SummaryMarkdown(run);

  for (const ComponentRun& c : run.components) {
    os << "## " << c.title << " (`" << c.name << "`)\n\n";
    std::string cmd = "strata-bench";
    for (const auto& a : c.args) cmd += " " + a;
    if (!c.ran) {
      os << "Not run: " << c.missing << "\n\n";
      continue;
    }
    os << "`" << cmd << "` (" << Seconds(c.seconds) << ", exit " << c.rc << "): [" << c.name << ".json](" << c.name
       << ".json)" << (c.has_rows() ? ", [" + c.name + ".csv](" + c.name + ".csv)" : "") << "\n\n";
    if (!c.error.empty()) os << "**Failed:** " << c.error << "\n\n";
    if (!c.missing.empty()) os << c.missing << "\n\n";
    if (!c.has_rows()) {
      if (c.error.empty() && c.missing.empty()) os << "No figures (exit " << c.rc << ", see its output).\n\n";
      continue;
    }
    if (c.name == "pcie" || c.name == "nvme" || c.name == "adam")
      os << PlotLine(run, c.name + ".png", c.title);
    os << RowsTable(c) << "\n";
    if (c.result.contains("notes"))
      for (const auto& n : c.result["notes"]) os << "- " << n.get<std::string>() << "\n";
    os << "\n";
  }

  os << "## Machine (`strata report`)\n\n";
  std::vector<std::vector<std::string>> mrows;
  for (const auto& l : run.machine)
    mrows.push_back({l.section, l.name, l.value, l.problem.empty() ? "" : l.problem + " — fix: " + l.fix});
  os << MdTable({"section", "item", "value", "problem and fix"}, mrows) << "\n";

  os << "## Files\n\n";
  os << "Beside this report: each component's JSON (rows, notes, machine) and CSV (its rows); the charts as PNG, "
        "each with the gnuplot script that drew it (`gnuplot NAME.gp` redraws it).";
  if (!run.plot_problem.empty()) os << " Charts: " << run.plot_problem << ".";
  os << "\n";
  return os.str();
}

}  // namespace strata::bench
