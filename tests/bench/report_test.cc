// SPDX-License-Identifier: Apache-2.0
// strata report: every section, problems with their fixes, the NVMe paths
// probed; --json for machines.
#include "engine/report.h"

#include <fstream>

#include "engine/path_probe.h"
#include "tests/bench/cli_util.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::TempDir;

const ReportLine* Find(const std::vector<ReportLine>& lines, const std::string& section, const std::string& name) {
  for (const auto& l : lines)
    if (l.section == section && l.name == name) return &l;
  return nullptr;
}

TEST(Report, HasEverySectionAndEveryProblemHasAFix) {
  TempDir dir;
  const auto lines = CollectReport(ReportOptions{{dir.path()}, ""});
  for (const char* s : {"strata", "GPU", "CPU", "memory", "I/O", "NVMe paths"}) {
    bool found = false;
    for (const auto& l : lines) found |= l.section == s;
    EXPECT_TRUE(found) << "no section " << s;
  }
  for (const auto& l : lines) {
    if (!l.problem.empty()) {
      EXPECT_FALSE(l.fix.empty()) << l.section << " / " << l.name << ": " << l.problem;
    }
  }
  for (const char* name : {"version", "build", "compiler"}) EXPECT_NE(Find(lines, "strata", name), nullptr) << name;
  for (const char* name : {"NCCL", "cuBLASLt"}) EXPECT_NE(Find(lines, "GPU", name), nullptr) << name;
  for (const char* name : {"model", "SIMD", "CPU Adam path", "cores"}) EXPECT_NE(Find(lines, "CPU", name), nullptr);
  for (const char* name : {"host memory", "memlock limit"}) EXPECT_NE(Find(lines, "memory", name), nullptr);
  EXPECT_NE(Find(lines, "I/O", "io_uring"), nullptr);
  const ReportLine* nvme = Find(lines, "NVMe paths", dir.path());
  ASSERT_NE(nvme, nullptr);
  EXPECT_NE(nvme->value.find("free of"), std::string::npos) << nvme->value;
  EXPECT_NE(nvme->value.find("O_DIRECT"), std::string::npos) << nvme->value;
  // The probe's scratch file is gone.
  EXPECT_TRUE(::strata::testing::ListDir(dir.path()).empty());
  std::string why;
  if (!::strata::testing::HaveGpu(&why)) {
    const ReportLine* gpus = Find(lines, "GPU", "GPUs");
    ASSERT_NE(gpus, nullptr);
    EXPECT_FALSE(gpus->problem.empty());
  }
}

TEST(Report, AMissingNvmePathIsAProblemWithAFix) {
  const auto lines = CollectReport(ReportOptions{{"/nonexistent/strata-nvme"}, ""});
  const ReportLine* l = Find(lines, "NVMe paths", "/nonexistent/strata-nvme");
  ASSERT_NE(l, nullptr);
  EXPECT_FALSE(l->problem.empty());
  EXPECT_NE(l->fix.find("mkdir"), std::string::npos) << l->fix;
  const std::string text = ReportText(lines);
  EXPECT_NE(text.find("problems ("), std::string::npos);
  EXPECT_NE(text.find("fix: "), std::string::npos);
}

TEST(Report, ABadConfigIsAProblemAndTheRestIsStillThere) {
  TempDir dir;
  {
    std::ofstream f(dir.File("ds.json"));
    f << "{\"zero_optimization\": {\"offload_optimizer\": {\"nvme_pth\": \"/x\"}}}";
  }
  const auto lines = CollectReport(ReportOptions{{}, dir.File("ds.json")});
  const ReportLine* l = Find(lines, "NVMe paths", "config");
  ASSERT_NE(l, nullptr);
  EXPECT_NE(l->problem.find("nvme_pth"), std::string::npos) << l->problem;
  EXPECT_NE(Find(lines, "CPU", "model"), nullptr);
}

TEST(Report, TheConfigsNvmePathIsProbed) {
  TempDir dir;
  {
    std::ofstream f(dir.File("ds.json"));
    f << "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"offload_optimizer\": {\"device\": "
         "\"nvme\", \"nvme_path\": \""
      << dir.path() << "\"}}}";
  }
  const auto lines = CollectReport(ReportOptions{{}, dir.File("ds.json")});
  EXPECT_NE(Find(lines, "NVMe paths", dir.path()), nullptr);
}

TEST(PathProbe, SaysWhatIsWrong) {
  TempDir dir;
  EXPECT_FALSE(ProbePath(dir.File("missing")).error.empty());
  { std::ofstream f(dir.File("file")); }
  EXPECT_EQ(ProbePath(dir.File("file")).error, "not a directory");
  const PathProbe p = ProbePath(dir.path());
  EXPECT_TRUE(p.error.empty());
  EXPECT_TRUE(p.writable);
  EXPECT_GT(p.total_bytes, 0u);
  EXPECT_EQ(p.o_direct, p.o_direct_error.empty());
  EXPECT_FALSE(p.filesystem.empty());
}

TEST(StrataReport, JsonForMachines) {
  TempDir dir;
  auto r = ::strata::testing::RunCommand({::strata::testing::StrataBinary(), "report", "--json", "--nvme", dir.path()});
  ASSERT_EQ(r.rc, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  ASSERT_TRUE(j["sections"].is_array());
  EXPECT_EQ(j["sections"][0]["name"], "strata");
  EXPECT_TRUE(j["problems"].is_array());
  for (const auto& p : j["problems"]) EXPECT_FALSE(p["fix"].get<std::string>().empty()) << p.dump();
}

TEST(StrataReport, HelpAndBadArguments) {
  auto help = ::strata::testing::RunCommand({::strata::testing::StrataBinary(), "report", "--help"});
  EXPECT_EQ(help.rc, 0);
  for (const char* opt : {"--nvme", "--config", "--json"})
    EXPECT_NE(help.output.find(opt), std::string::npos) << opt << " not in:\n" << help.output;
  auto bad = ::strata::testing::RunCommand({::strata::testing::StrataBinary(), "report", "--nvme-path", "/x"});
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.output.find("--nvme-path"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace strata
