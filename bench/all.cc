// SPDX-License-Identifier: Apache-2.0
// strata-bench all: the whole machine report in one command.
//
// Runs every component benchmark at sizes chosen for a few minutes in all
// (--quick: under a minute, for CI; --full: each component's --full), by
// calling the components' own commands with those sizes (each section of
// the report says the command line that measured it, to repeat it alone):
//   pcie       host <-> GPU each direction and both at once (without a GPU:
//              the copy engine's host stand-in, labelled so)
//   nvme       host <-> NVMe read, write and mixed, by block size and queue depth
//   store      the same links through the TierStore
//   adam       the CPU Adam per ISA path against threads, the host memory roof
//   attention  the bf16 GEMM rate and the flash attention kernels (GPU only)
//   train      resident training tokens/s and MFU (without a GPU: the CPU
//              backend's smoke test)
// then `strata report`'s machine facts, and what bounds offloaded training
// for a few model sizes (bench/offload_bound.h: the planner strata train
// uses, at the rates just measured). It writes into --out: report.md (the
// headline table, the bound table, a section per component, the machine),
// report.json, each component's JSON and CSV, and the charts (PNG, with
// their gnuplot scripts; without gnuplot the report says how to install it).
//
// Ctrl-C stops the component in flight after its current measurement; the
// report is written with what was measured, and the exit code is 130.
// --dir must exist (the NVMe figures are measured there, in a private
// directory removed on exit); without it a temporary one under $TMPDIR or
// /var/tmp is used.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <oneapi/tbb/info.h>

#include "base/bytes.h"
#include "base/device.h"
#include "base/host_memory.h"
#include "bench/all_report.h"
#include "bench/bench.h"
#include "bench/sweep.h"
#include "engine/path_probe.h"
#include "engine/report.h"
#include "kernels/backend.h"

namespace po = boost::program_options;

namespace strata::bench {
namespace {

struct AllOptions {
  bool quick = false, full = false;
  std::string dir, out = "strata-bench-report";
  std::string only, skip;
  std::string models = "gpt-1.3b,gpt-6.7b,gpt-13b,gpt-30b,gpt-66b";
  int64_t accum = 8;
  std::string gpu_limit, host_limit;
};

const char* const kComponents[] = {"pcie", "nvme", "store", "adam", "attention", "train"};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, ',');)
    if (!p.empty()) v.push_back(p);
  return v;
}

// 1, 2, 4, ... up to every hardware thread (which is always last).
std::string ThreadList() {
  const int all = tbb::info::default_concurrency();
  std::string t;
  for (int n = 1; n < all; n *= 2) t += std::to_string(n) + ",";
  return t + std::to_string(all);
}

// Each component's command line at the sizes `all` chooses.
std::vector<std::string> ArgsFor(const std::string& name, const AllOptions& o, bool gpu, const std::string& dir) {
  const bool q = o.quick, f = o.full;
  using V = std::vector<std::string>;
  if (name == "pcie") {
    if (f) return {"pcie", "--full"};
    if (gpu) return q ? V{"pcie", "--sizes", "4MiB,64MiB", "--bytes", "256MiB", "--reps", "1", "--no-pageable"}
                      : V{"pcie", "--sizes", "4MiB,16MiB,64MiB,256MiB", "--bytes", "2GiB", "--reps", "3", "--no-pageable"};
    return q ? V{"pcie", "--sizes", "4MiB,64MiB", "--bytes", "128MiB", "--reps", "1"}
             : V{"pcie", "--sizes", "4MiB,16MiB,64MiB", "--bytes", "512MiB", "--reps", "3"};
  }
  if (name == "nvme") {
    if (f) return {"nvme", "--full", "--dir", dir};
    if (q) return {"nvme", "--quick", "--dir", dir};
    return {"nvme", "--size", "256MiB", "--tensor", "16MiB", "--block", "128KiB,1MiB,8MiB", "--qd", "1,8,32,128",
            "--reps", "2", "--dir", dir};
  }
  if (name == "store") {
    if (f) return {"store", "--full", "--dir", dir};
    if (q) return {"store", "--tensors", "4", "--tensor-size", "4MiB", "--reps", "1", "--ops", "10000", "--dir", dir};
    return {"store", "--dir", dir};
  }
  if (name == "adam") {
    if (q) return {"adam", "--sizes", "1M", "--threads", "1,all", "--config", "bf16:f32:bf16", "--reps", "3"};
    return {"adam", "--sizes", f ? "64M,256M" : "64M", "--threads", ThreadList(), "--config", "bf16:f32:bf16",
            "--reps", f ? "10" : "5"};
  }
  if (name == "attention") {
    if (f) return {"attention"};
    if (q) return {"attention", "--shape", "2,8,512,64", "--reps", "2", "--trials", "2", "--warmup", "1", "--peak-size",
                   "2048"};
    return {"attention", "--reps", "5", "--trials", "3"};
  }
  // train: resident training, the compute rate of the bound analysis.
  if (!gpu)
    return {"train", "--resident", "--backend", "cpu", "--steps", q ? "2" : "5", "--warmup", q ? "1" : "2"};
  if (f) return {"train", "--resident"};
  if (q) return {"train", "--resident", "--layers", "4", "--d", "1024", "--heads", "8", "--seq", "1024", "--batch", "4",
                 "--steps", "3", "--warmup", "1", "--no-profile", "--peak-size", "4096"};
  return {"train", "--resident", "--steps", "5", "--warmup", "2", "--no-profile"};
}

const char* TitleOf(const std::string& name) {
  if (name == "pcie") return "Host <-> GPU";
  if (name == "nvme") return "Host <-> NVMe";
  if (name == "store") return "The tier store's links";
  if (name == "adam") return "Host memory and the CPU Adam";
  if (name == "attention") return "GPU compute: bf16 GEMM and flash attention";
  return "Resident training";
}

// Runs one component in this process (its own command, at `args`), its
// JSON into out_dir/<name>.json and its rows into <name>.csv.
void RunComponent(ComponentRun* c, const std::string& out_dir) {
  const Command* cmd = nullptr;
  for (const auto& k : Commands())
    if (c->name == k.name) cmd = &k;
  if (!cmd) {
    c->missing = "strata-bench has no command " + c->name;
    return;
  }
  const std::string json_path = out_dir + "/" + c->name + ".json";
  std::remove(json_path.c_str());  // a stale file from an earlier run is no result of this one
  std::vector<std::string> args = c->args;
  args.push_back("--json");
  args.push_back(json_path);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  c->ran = true;
  const double t0 = NowSeconds();
  try {
    c->rc = cmd->run(static_cast<int>(args.size()), argv.data());
  } catch (const BenchFailure& e) {
    c->rc = 1;
    c->error = e.what();
  } catch (const std::exception& e) {
    c->rc = 1;
    c->error = e.what();
  }
  c->seconds = NowSeconds() - t0;
  ClearProgressLine();
  if (!c->error.empty()) std::cerr << "strata-bench all: " << c->name << " failed: " << c->error << "\n";
  std::ifstream f(json_path);
  if (f) {
    c->result = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (c->result.is_discarded()) {
      c->result = nullptr;
      c->error = "its JSON output " + json_path + " could not be parsed";
    }
  }
  if (c->has_rows()) {
    const std::vector<nlohmann::json> rows(c->result["rows"].begin(), c->result["rows"].end());
    Status s = WriteCsv(rows, out_dir + "/" + c->name + ".csv");
    if (!s.ok()) std::cerr << "strata-bench all: " << s.ToString() << "\n";
  }
}

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!f) return ErrnoStatus("cannot create", path);
  f << text;
  f.flush();
  if (!f) return ErrnoStatus("cannot write", path);
  return Status::OK();
}

nlohmann::json SummaryJson(const MachineRun& run) {
  nlohmann::json j;
  j["command"] = run.command_line;
  j["seconds"] = run.seconds;
  j["stopped"] = run.stopped;
  j["quick"] = run.quick;
  j["nvme_dir"] = run.nvme_dir;
  j["gpu_missing"] = run.gpu_missing;
  for (const auto& c : run.components)
    j["components"].push_back({{"name", c.name}, {"args", c.args}, {"ran", c.ran}, {"rc", c.rc},
                               {"missing", c.missing}, {"error", c.error}, {"seconds", c.seconds}});
  const OffloadRates& r = run.rates;
  j["rates"] = {{"h2d_gbs", r.h2d_gbs}, {"d2h_gbs", r.d2h_gbs}, {"both_gbs", r.both_gbs},
                {"nvme_read_gbs", r.nvme_read_gbs}, {"nvme_write_gbs", r.nvme_write_gbs},
                {"nvme_mixed_gbs", r.nvme_mixed_gbs}, {"adam_params_per_s", r.adam_params_per_s},
                {"host_roof_gbs", r.host_roof_gbs},
                {"compute_flops", r.compute_flops}, {"gpu_budget", r.gpu_budget}, {"host_budget", r.host_budget},
                {"nvme_free", r.nvme_free}, {"notes", run.rate_notes}};
  j["bounds"] = nlohmann::json::array();
  for (const auto& b : run.bounds) {
    nlohmann::json row{{"model", b.model.name}, {"params", b.params}, {"fits", b.fits}};
    if (!b.fits) {
      row["why_not"] = b.why_not;
    } else {
      row.update({{"micro_batch", b.micro_batch}, {"grad_accum", b.grad_accum}, {"tokens_per_step", b.tokens_per_step},
                  {"placement", PlacementText(b.plan)}, {"h2d", b.plan.h2d}, {"d2h", b.plan.d2h},
                  {"nvme_read", b.plan.nvme_read}, {"nvme_write", b.plan.nvme_write}, {"compute_s", b.compute_s},
                  {"pcie_s", b.pcie_s}, {"nvme_s", b.nvme_s}, {"adam_s", b.adam_s}, {"host_s", b.host_s}, {"bound", b.bound},
                  {"step_s", b.step_s}, {"tokens_per_s", b.tokens_per_s}});
    }
    j["bounds"].push_back(row);
  }
  j["bounds_missing"] = run.bounds_missing;
  j["plots"] = run.plots;
  j["plot_problem"] = run.plot_problem;
  j["machine"] = ReportJson(run.machine);
  return j;
}

// The bound analysis at the rates measured, under this machine's budgets.
void Bounds(MachineRun* run, const AllOptions& o, bool gpu, const std::vector<ModelShape>& models) {
  std::vector<std::string> notes;
  OffloadRates r = RatesFromComponents(*run, &notes);
  run->rate_notes = notes;
  std::vector<std::string> need;
  if (r.h2d_gbs <= 0) need.push_back("PCIe (pcie)");
  if (r.adam_params_per_s <= 0) need.push_back("the CPU Adam (adam)");
  if (r.compute_flops <= 0) need.push_back("the compute rate (train)");
  if (!need.empty()) {
    std::string missing;
    for (size_t i = 0; i < need.size(); ++i) missing += (i ? ", " : " ") + need[i];
    run->bounds_missing = "needs the rates of" + missing + ", which this run did not measure";
    run->rates = r;
    return;
  }
  if (!o.host_limit.empty()) {
    r.host_budget = BENCH_VALUE(ParseBytes(o.host_limit));
  } else if (Result<HostMemoryInfo> m = QueryHostMemory(); m.ok()) {
    r.host_budget = m->available_bytes / 10 * 8;  // strata train's default
  }
  std::unique_ptr<kernels::Backend> be;
  if (gpu) {
    auto cuda = kernels::MakeCudaBackend(0);
    if (cuda.ok()) be = std::move(cuda).value();
  }
  if (!be) be = kernels::MakeCpuBackend(1);
  if (!o.gpu_limit.empty()) {
    r.gpu_budget = BENCH_VALUE(ParseBytes(o.gpu_limit));
  } else if (Result<GpuInfo> g = QueryGpu(0); g.ok()) {
    r.gpu_budget = g->free_bytes > 512 * kMiB ? g->free_bytes - 512 * kMiB : g->free_bytes / 2;  // as strata train
  } else {
    r.gpu_budget = 4 * kGiB;  // strata train's stand-in GPU tier
  }
  if (r.nvme_read_gbs > 0 && r.nvme_write_gbs > 0) r.nvme_free = ProbePath(run->nvme_dir).free_bytes;
  run->rates = r;
  if (!gpu)
    run->rate_notes.push_back("no GPU: the plan is the CPU backend's, with strata train's 4 GiB stand-in GPU tier in "
                              "host memory (--gpu-memory-limit sets another)");
  run->bounds = AnalyzeBounds(r, models, *be, o.accum);
}

int RunAll(int argc, char** argv) {
  AllOptions o;
  po::options_description desc(
      "strata-bench all: every component benchmark, one report (report.md with its tables and charts, plus the "
      "raw JSON/CSV), and what bounds offloaded training on this machine");
  desc.add_options()("help,h", "show this help")(
      "quick", po::bool_switch(&o.quick), "CI sizes: the whole run in under a minute (figures indicative only)")(
      "full", po::bool_switch(&o.full), "each component's --full sweep (much longer)")(
      "dir", po::value(&o.dir)->value_name("PATH"),
      "an existing directory on the drive to measure (the NVMe figures; NVMe offload's nvme_path); strata-bench "
      "never creates it and removes its own files from it (default: a temporary directory under $TMPDIR or /var/tmp)")(
      "out", po::value(&o.out)->value_name("DIR"),
      "where report.md, report.json, the JSON/CSV of each component and the charts go (created; default "
      "./strata-bench-report)")(
      "only", po::value(&o.only)->value_name("LIST"),
      "run only these components: pcie,nvme,store,adam,attention,train")(
      "skip", po::value(&o.skip)->value_name("LIST"), "leave these components out")(
      "models", po::value(&o.models)->value_name("LIST"),
      "model sizes for the bound table (default gpt-1.3b,gpt-6.7b,gpt-13b,gpt-30b,gpt-66b; known: gpt-1.3b, "
      "gpt-2.7b, gpt-6.7b, gpt-13b, gpt-30b, gpt-66b, gpt-175b)")(
      "accum", po::value(&o.accum)->value_name("N"),
      "gradient accumulation steps of the bound table's runs (default 8; the micro-batch is the largest of 8, 4, "
      "2, 1 that fits)")(
      "gpu-memory-limit", po::value(&o.gpu_limit)->value_name("SIZE"),
      "the GPU budget of the bound table (default: the GPU's free memory less 512 MiB, as strata train)")(
      "host-memory-limit", po::value(&o.host_limit)->value_name("SIZE"),
      "the host budget of the bound table (default: 80% of the available memory, as strata train)");
  int code = 0;
  if (!ParseOptions(argc, argv, desc, &code)) return code;
  auto bad = [](const std::string& what) {
    std::cerr << "strata-bench all: " << what << "\ntry: strata-bench all --help\n";
    return 2;
  };
  if (o.quick && o.full) return bad("--quick and --full exclude each other");
  if (o.accum < 1 || o.accum > (1 << 16)) return bad("--accum " + std::to_string(o.accum) + ": must be in [1, 65536]");
  if (!o.only.empty() && !o.skip.empty()) return bad("--only and --skip exclude each other");
  for (const std::string* list : {&o.only, &o.skip})
    for (const auto& n : Split(*list))
      if (std::find(std::begin(kComponents), std::end(kComponents), n) == std::end(kComponents))
        return bad(std::string(list == &o.only ? "--only" : "--skip") + ": unknown component '" + n +
                   "' (known: pcie, nvme, store, adam, attention, train)");
  std::vector<ModelShape> models;
  for (const auto& n : Split(o.models)) {
    auto it = std::find_if(KnownModelShapes().begin(), KnownModelShapes().end(),
                           [&](const ModelShape& m) { return m.name == n; });
    if (it == KnownModelShapes().end())
      return bad("--models: unknown model '" + n + "' (known: gpt-1.3b, gpt-2.7b, gpt-6.7b, gpt-13b, gpt-30b, "
                 "gpt-66b, gpt-175b)");
    models.push_back(*it);
  }
  for (const auto& [flag, text] : {std::pair{"--gpu-memory-limit", &o.gpu_limit}, {"--host-memory-limit", &o.host_limit}})
    if (!text->empty())
      if (auto b = ParseBytes(*text); !b.ok()) return bad(std::string(flag) + ": " + std::string(b.status().message()));
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return bad("--out " + o.out + ": cannot create it: " + ec.message());

  // The NVMe figures' directory: --dir (which must exist), else a temporary
  // one; each component makes its private directory inside it.
  BenchDir dir = BENCH_VALUE(BenchDir::Make(o.dir));
  MachineRun run;
  run.out_dir = o.out;
  run.quick = o.quick;
  run.full = o.full;
  run.nvme_dir = o.dir.empty() ? dir.path() : o.dir;
  {
    const PathProbe p = ProbePath(run.nvme_dir);
    run.nvme_dir_note = p.filesystem + (p.device.empty() ? "" : " on " + p.device) + ", " +
                        FormatBytes(p.free_bytes) + " free";
  }
  run.command_line = "strata-bench";
  for (int i = 0; i < argc; ++i) run.command_line += std::string(" ") + argv[i];
  std::string why;
  const bool gpu = CudaDeviceCount(&why) > 0;
  if (!gpu) run.gpu_missing = why;
  const double t0 = NowSeconds();

  std::vector<std::string> chosen;
  for (const char* n : kComponents) {
    const auto only = Split(o.only), skip = Split(o.skip);
    if (!only.empty() && std::find(only.begin(), only.end(), n) == only.end()) continue;
    if (std::find(skip.begin(), skip.end(), n) != skip.end()) continue;
    chosen.push_back(n);
  }
  std::cout << "strata-bench all: " << chosen.size() << " components into " << o.out << "; NVMe figures in "
            << run.nvme_dir << " (" << run.nvme_dir_note << ")" << (gpu ? "" : "; no usable GPU (" + why + ")")
            << "\n" << std::flush;
  for (size_t i = 0; i < chosen.size(); ++i) {
    ComponentRun c;
    c.name = chosen[i];
    c.title = TitleOf(c.name);
    c.args = ArgsFor(c.name, o, gpu, dir.path());
    if (StopRequested()) {
      c.missing = "stopped by Ctrl-C before it ran";
    } else if (c.name == "attention" && !gpu) {
      c.missing = "no usable GPU (" + why + "): the bf16 GEMM and flash attention kernels need one";
    } else {
      std::string cmdline = "strata-bench";
      for (const auto& a : c.args) cmdline += " " + a;
      std::cout << "\n== [" << i + 1 << "/" << chosen.size() << "] " << c.title << ": " << cmdline << "\n"
                << std::flush;
      RunComponent(&c, o.out);
      if (c.name == "pcie" && c.has_rows() && c.result["meta"].value("stand_in", false))
        c.missing = "No usable GPU (" + why + "): these are the copy engine's host stand-in (memcpy on its worker "
                    "threads beside a plain memcpy), not PCIe.";
    }
    run.components.push_back(std::move(c));
  }
  run.stopped = StopRequested();
  run.machine = CollectReport(ReportOptions{{run.nvme_dir}, ""});
  if (!run.stopped) Bounds(&run, o, gpu, models);
  else run.bounds_missing = "stopped by Ctrl-C";
  WritePlots(&run);
  run.seconds = NowSeconds() - t0;
  BENCH_CHECK_OK(WriteFile(o.out + "/report.md", ReportMarkdown(run)));
  BENCH_CHECK_OK(WriteFile(o.out + "/report.json", SummaryJson(run).dump(2) + "\n"));
  ClearProgressLine();
  std::cout << "\n" << SummaryMarkdown(run) << "wrote " << o.out << "/report.md (charts: "
            << (run.plots.empty() ? "none: " + run.plot_problem : std::to_string(run.plots.size()) + " PNG") << ")\n";
  return run.stopped ? kStoppedExit : 0;
}

}  // namespace

STRATA_BENCH_COMMAND("all", "every component at sensible sizes, one report (report.md, charts, JSON/CSV) and what "
                     "bounds offloaded training", RunAll);

}  // namespace strata::bench
