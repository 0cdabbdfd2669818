// SPDX-License-Identifier: Apache-2.0
// strata-bench as a user runs it: `all --quick` writes the whole report,
// --dir is never created and is left empty, bad arguments are named, and
// Ctrl-C stops cleanly with what was measured written.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/plot.h"
#include "tests/bench/cli_util.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::BenchBinary;
using ::strata::testing::Exists;
using ::strata::testing::ListDir;
using ::strata::testing::ReadFile;
using ::strata::testing::RunCommand;
using ::strata::testing::TempDir;

TEST(BenchAll, QuickWritesTheWholeReport) {
  TempDir dir, out;
  auto r = RunCommand({BenchBinary(), "all", "--quick", "--out", out.path(), "--dir", dir.path()});
  ASSERT_EQ(r.rc, 0) << r.output;
  const std::string md = ReadFile(out.File("report.md"));
  for (const char* section :
       {"## Summary", "## What bounds offloaded training here", "## Host <-> GPU (`pcie`)", "## Host <-> NVMe (`nvme`)",
        "## The tier store's links (`store`)", "## Host memory and the CPU Adam (`adam`)",
        "## GPU compute: bf16 GEMM and flash attention (`attention`)", "## Resident training (`train`)",
        "## Machine (`strata report`)", "## Files"})
    EXPECT_NE(md.find(section), std::string::npos) << "report.md lacks " << section;
  // Every headline row is a figure beside its baseline, or says why it is missing.
  for (const char* row : {"host -> GPU (h2d)", "GPU -> host (d2h)", "both directions at once", "NVMe -> host (read)",
                          "host -> NVMe (write)", "NVMe mixed", "host memory", "CPU Adam", "resident training"})
    EXPECT_NE(md.find("| " + std::string(row)), std::string::npos) << "no headline row " << row;
  for (const char* model : {"gpt-1.3b", "gpt-6.7b", "gpt-13b", "gpt-30b", "gpt-66b"})
    EXPECT_NE(md.find("| " + std::string(model) + " |"), std::string::npos) << "no bound row " << model;
  EXPECT_NE(md.find("bound: step"), std::string::npos);
  std::string why;
  if (!::strata::testing::HaveGpu(&why)) {
    EXPECT_NE(md.find("missing: no usable GPU"), std::string::npos) << "GPU rows must say why they are missing";
    EXPECT_NE(md.find("not PCIe"), std::string::npos) << "the stand-in's figures must be labelled";
  }
  for (const char* f : {"report.json", "pcie.json", "nvme.json", "store.json", "adam.json", "train.json",
                        "pcie.csv", "nvme.csv", "store.csv", "adam.csv", "train.csv", "pcie.gp", "nvme.gp", "adam.gp"})
    EXPECT_TRUE(Exists(out.File(f))) << f;
  if (PlotToolAvailable()) {
    for (const char* f : {"pcie.png", "nvme.png", "adam.png"}) {
      EXPECT_TRUE(Exists(out.File(f))) << f;
      EXPECT_NE(md.find(std::string("](") + f + ")"), std::string::npos) << "report.md does not link " << f;
    }
  } else {
    EXPECT_NE(md.find("apt-get install gnuplot-nox"), std::string::npos) << "the report must say how to install it";
  }
  nlohmann::json j = nlohmann::json::parse(ReadFile(out.File("report.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["bounds"].size(), 5u);
  EXPECT_GT(j["rates"]["nvme_read_gbs"].get<double>(), 0);
  // The CSV has the JSON's rows under a header.
  const std::string csv = ReadFile(out.File("nvme.csv"));
  EXPECT_EQ(csv.rfind("block,op,", 0), 0u) << csv;
  const size_t rows = nlohmann::json::parse(ReadFile(out.File("nvme.json")))["rows"].size();
  EXPECT_EQ(static_cast<size_t>(std::count(csv.begin(), csv.end(), '\n')), 1 + rows) << csv;
  EXPECT_TRUE(ListDir(dir.path()).empty()) << "strata-bench left files in --dir";
}

TEST(BenchAll, ComponentsCanBeChosen) {
  TempDir dir, out;
  auto r = RunCommand({BenchBinary(), "all", "--quick", "--only", "nvme", "--out", out.path(), "--dir", dir.path()});
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_TRUE(Exists(out.File("nvme.json")));
  EXPECT_FALSE(Exists(out.File("adam.json")));
  // Without the other rates the bound table says what it needs.
  EXPECT_NE(ReadFile(out.File("report.md")).find("Not computed: needs the rates of"), std::string::npos);
}

TEST(BenchDir, IsNeverCreatedAndNamedWhenMissing) {
  TempDir parent;
  const std::string missing = parent.File("no-such-dir");
  for (const char* cmd : {"nvme", "store", "all"}) {
    std::vector<std::string> argv = {BenchBinary(), cmd, "--dir", missing};
    if (std::string(cmd) == "all") argv.insert(argv.end(), {"--quick", "--out", parent.File("out")});
    auto r = RunCommand(argv);
    EXPECT_NE(r.rc, 0) << cmd;
    EXPECT_NE(r.output.find("--dir " + missing + " does not exist"), std::string::npos) << cmd << ": " << r.output;
    EXPECT_FALSE(Exists(missing)) << cmd << " created --dir";
  }
}

// What a killed strata-bench (kill -9) left in --dir goes with the next run,
// named; a directory whose owner lives, or that is not strata-bench's, stays.
TEST(BenchDir, AKilledRunsDirectoryIsRemovedByTheNext) {
  TempDir dir;
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  int st = 0;
  ::waitpid(dead, &st, 0);
  const std::string stale = dir.File("strata-bench.AAAAAA"), live = dir.File("strata-bench.BBBBBB"),
                    foreign = dir.File("strata-bench.CCCCCC");
  for (const std::string& d : {stale, live, foreign}) ::mkdir(d.c_str(), 0755);
  std::ofstream(stale + "/.owner") << dead << "\n";
  std::ofstream(stale + "/strata-nvme-" + std::to_string(dead) + "-0.swap") << std::string(4096, 'x');
  std::ofstream(live + "/.owner") << 1 << "\n";  // PID 1 lives
  auto r = RunCommand({BenchBinary(), "nvme", "--quick", "--dir", dir.path(), "--qd", "8", "--block", "1MiB"});
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_FALSE(Exists(stale));
  EXPECT_NE(r.output.find("removed " + stale + ", left by process " + std::to_string(dead)), std::string::npos)
      << r.output;
  EXPECT_TRUE(Exists(live));
  EXPECT_TRUE(Exists(foreign));
}

// An offload workload at a smoke size on the CPU backend: beside the
// all-resident baseline, the step set against the host memory it needs (the
// CPU Adam's bytes and the copies', at the roof rate measured in the run).
TEST(BenchTrain, AnOffloadWorkloadSetsItsStepAgainstTheHostMemory) {
  TempDir out;
  auto r = RunCommand({BenchBinary(), "train", "--workload", "gpt-1.3b-offload", "--layers", "2", "--d", "128",
                       "--heads", "2", "--seq", "64", "--vocab", "256", "--batch", "2", "--steps", "2", "--warmup",
                       "1", "--backend", "cpu", "--json", out.File("off.json")});
  ASSERT_EQ(r.rc, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(ReadFile(out.File("off.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  auto row = [&](const std::string& figure) -> nlohmann::json {
    for (const auto& x : j["rows"])
      if (x.value("figure", "") == figure) return x;
    return nullptr;
  };
  const nlohmann::json roof = row("host roof (the CPU Adam's byte pattern, all threads, after the steps)");
  ASSERT_TRUE(roof.is_object()) << r.output;
  EXPECT_GT(roof["value"].get<double>(), 0.1);  // GB/s: any machine's memory moves more
  const nlohmann::json bound = row("step time vs host memory bound");
  ASSERT_TRUE(bound.is_object()) << r.output;
  const double step = row("step")["value"].get<double>();
  EXPECT_EQ(bound["value"].get<double>(), step);
  EXPECT_GT(bound["baseline"].get<double>(), 0);
  EXPECT_NEAR(bound["ratio"].get<double>(), step / bound["baseline"].get<double>(), 1e-9 * bound["ratio"].get<double>());
  EXPECT_TRUE(row("tokens/s vs all-resident").is_object());
}

TEST(BenchArgs, BadArgumentsAreNamed) {
  struct Case {
    std::vector<std::string> args;
    std::string named;
  } cases[] = {
      {{"all", "--only", "bogus"}, "--only: unknown component 'bogus'"},
      {{"all", "--skip", "nvme,bogus"}, "'bogus'"},
      {{"all", "--models", "gpt-7b"}, "--models: unknown model 'gpt-7b'"},
      {{"all", "--quick", "--full"}, "--quick and --full"},
      {{"all", "--accum", "0"}, "--accum 0"},
      {{"all", "--gpu-memory-limit", "lots"}, "--gpu-memory-limit"},
      {{"all", "--outt", "x"}, "--outt"},
      {{"nvme", "--qd", "0"}, "--qd"},
      {{"nvme", "--block", "1000"}, "--block"},
      {{"nvme", "--size", "1MiB", "--tensor", "3MiB"}, "--tensor"},
      {{"nvme", "--rings", "x"}, "--rings"},
      {{"nvme", "--checksum", "md5"}, "--checksum 'md5'"},
      // Each value is range-checked before anything runs (bench/args.h):
      {{"nvme", "--tensor", "0"}, "--tensor 0 B: must be at least"},  // was SIGFPE (size % 0)
      {{"nvme", "--block", "0"}, "--block 0 B"},
      {{"nvme", "--reps", "0"}, "--reps 0"},  // was the default, silently
      {{"adam", "--threads", "-1"}, "--threads: '-1'"},
      {{"adam", "--threads", "100000"}, "--threads 100000: must be in [1, "},  // was capped by oneTBB
      {{"adam", "--reps", "0"}, "--reps 0: must be in [3, "},                   // was raised to 3, silently
      {{"adam", "--stagger", "-1"}, "--stagger: bad size '-1'"},                // was a segfault
      {{"adam", "--tile", "100"}, "--tile 100: must be a multiple of 64"},
      {{"adam", "--prefetch", "1M"}, "--prefetch 1.00 MiB: must be at most"},
      {{"pcie", "--chunk", "0", "--stand-in"}, "--chunk 0 B: must be at least"},
      {{"pcie", "--bytes", "0", "--stand-in"}, "--bytes 0 B"},
      {{"pcie", "--device", "-1", "--stand-in"}, "--device -1"},
      {{"pcie", "--sizes", "1TiB", "--stand-in"}, "--sizes 1.00 TiB: must be at most"},  // was std::bad_alloc
      {{"store", "--block", "99999999999"}, "--block 93.1 GiB: must be at most 1.00 GiB"},  // was cut to 32 bits
      {{"store", "--qd", "0"}, "--qd 0"},
      {{"store", "--tensor-size", "0"}, "--tensor-size 0 B"},
      {{"attention", "--peak-size", "0"}, "--peak-size 0"},
      {{"attention", "--shape", "1,1,1,4096"}, "--shape D 4096"},
      {{"train", "--resident", "--layers", "0"}, "--layers 0: must be in [1, "},  // was the default, silently
      {{"train", "--resident", "--peak-size", "3"}, "--peak-size 3"},             // gave an MFU of 11684%
      {{"train", "--resident", "--accum", "2"}, "--accum applies to --workload runs only"},
      {{"train", "--workload", "gpt-1.3b-offload", "--optimizer-ratio", "2"}, "--optimizer-ratio 2: must be in [0, 1]"},
      {{"train", "--resident", "--steps", "0"}, "--steps 0"},
      {{"train", "--workload", "gpt-1.3b-offload", "--piece-params", "3"}, "--piece-params 3"},
      {{"train", "--resident", "--piece-params", "1024"}, "--piece-params applies to --workload runs only"},
      {{"train", "--workload", "gpt-1.3b-nvme", "--nvme-checksum", "md5"}, "--nvme-checksum md5: not crc32c"},
      {{"train", "--workload", "gpt-1.3b-offload", "--nvme-checksum", "none"}, "--nvme-checksum applies to a workload with NVMe"},
      {{"train", "--resident", "--nvme-checksum", "none"}, "--nvme-checksum applies to --workload runs only"},
      {{"train", "--resident", "--trace", "t.json"}, "--trace applies to --workload runs only"},
      {{"train", "--workload", "gpt-1.3b-nvme", "--trace", "/no/such/dir/t.json"}, "--trace /no/such/dir/t.json: No such file"},
      {{"all", "--accum", "100000"}, "--accum 100000"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {BenchBinary()};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = RunCommand(argv);
    EXPECT_EQ(r.rc, 2) << c.args[0] << " " << c.args[1] << ": " << r.output;
    EXPECT_NE(r.output.find(c.named), std::string::npos) << "expected '" << c.named << "' in: " << r.output;
    EXPECT_EQ(r.output.find("measured:"), std::string::npos) << "measured before refusing: " << r.output;
  }
}

TEST(BenchArgs, HelpExplainsEveryOption) {
  struct Case {
    const char* cmd;
    std::vector<std::string> options;
  } cases[] = {
      {"all", {"--quick", "--full", "--dir", "--out", "--only", "--skip", "--models", "--accum", "--gpu-memory-limit",
               "--host-memory-limit"}},
      {"nvme", {"--tune", "--quick", "--size", "--tensor", "--block", "--qd", "--rings", "--reps", "--fixed",
                "--checksum", "--dir", "--json", "--full"}},
  };
  for (const Case& c : cases) {
    auto r = RunCommand({BenchBinary(), c.cmd, "--help"});
    EXPECT_EQ(r.rc, 0) << c.cmd;
    for (const auto& opt : c.options) EXPECT_NE(r.output.find(opt), std::string::npos) << c.cmd << " " << opt;
  }
}

// Ctrl-C part-way through a sweep: it stops after the measurement in
// flight, prints and writes what it measured, exits 130, removes its files.
TEST(BenchStop, CtrlCWritesWhatWasMeasured) {
  TempDir dir, out;
  const std::string json = out.File("nvme.json");
  auto r = ::strata::testing::RunAndSignal({BenchBinary(), "nvme", "--dir", dir.path(), "--size", "64MiB", "--tensor",
                                            "16MiB", "--block", "128KiB,256KiB,512KiB,1MiB", "--qd", "1,2,4",
                                            "--reps", "3", "--json", json},
                                           1.5, SIGINT);
  ASSERT_EQ(r.rc, 130) << r.output;
  EXPECT_NE(r.output.find("stopping after the measurement in flight"), std::string::npos) << r.output;
  nlohmann::json j = nlohmann::json::parse(ReadFile(json), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "no JSON written: " << r.output;
  EXPECT_GE(j["rows"].size(), 3u);       // the setting in flight finished
  EXPECT_LT(j["rows"].size(), 3u * 12);  // and the sweep did not
  bool noted = false;
  for (const auto& n : j["notes"]) noted |= n.get<std::string>().find("stopped by Ctrl-C") != std::string::npos;
  EXPECT_TRUE(noted) << j["notes"].dump();
  EXPECT_TRUE(ListDir(dir.path()).empty()) << "files left in --dir after Ctrl-C";
}

// SIGHUP (the terminal closed) stops a sweep as Ctrl-C does: its files are
// removed, what was measured is written.
TEST(BenchStop, HangupRemovesTheFiles) {
  TempDir dir, out;
  const std::string json = out.File("nvme.json");
  auto r = ::strata::testing::RunAndSignal({BenchBinary(), "nvme", "--dir", dir.path(), "--size", "64MiB", "--tensor",
                                            "16MiB", "--block", "128KiB,256KiB,512KiB,1MiB", "--qd", "1,2,4",
                                            "--reps", "3", "--json", json},
                                           1.5, SIGHUP);
  ASSERT_EQ(r.rc, 130) << r.output;
  EXPECT_TRUE(Exists(json)) << r.output;
  EXPECT_TRUE(ListDir(dir.path()).empty()) << "files left in --dir after SIGHUP";
}

TEST(BenchStop, AllWritesTheReportWhenStopped) {
  TempDir dir, out;
  auto r = ::strata::testing::RunAndSignal(
      {BenchBinary(), "all", "--only", "nvme,adam", "--out", out.path(), "--dir", dir.path()}, 1.5, SIGINT);
  ASSERT_EQ(r.rc, 130) << r.output;
  const std::string md = ReadFile(out.File("report.md"));
  EXPECT_NE(md.find("Stopped by Ctrl-C"), std::string::npos) << md.substr(0, 500);
  EXPECT_TRUE(ListDir(dir.path()).empty()) << "files left in --dir after Ctrl-C";
}

}  // namespace
}  // namespace strata
