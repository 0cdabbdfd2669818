// SPDX-License-Identifier: Apache-2.0
// base/trace.h: what a recording writes, from several threads, and its errors.
#include "base/trace.h"

#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace strata {
namespace {

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

TEST(Trace, WritesEveryThreadsSpansOnItsNamedTrack) {
  testing::TempDir dir;
  const std::string path = dir.File("run.json");
  ASSERT_OK_AND_ASSIGN(trace::Recording rec, trace::Recording::Begin(path));
  EXPECT_TRUE(trace::On());
  trace::NameThread("main");
  { trace::Span s("step", "forward"); }
  std::thread worker([] {
    trace::NameThread("worker");
    trace::Span s("optimizer", [] { return std::string("update of h.0"); });
  });
  worker.join();
  const double t = NowSeconds();
  trace::Complete("wait", "wait for \"x\"\n", t, t + 0.5);  // (a name that needs escaping)
  ASSERT_OK(rec.Finish());
  EXPECT_FALSE(trace::On());

  const nlohmann::json j = ReadJson(path);
  EXPECT_EQ(j["otherData"]["dropped_events"], 0);
  std::map<int, std::string> track_name;
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M") track_name[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "X") by_name[e["name"]] = e;
  }
  ASSERT_EQ(by_name.size(), 3u);
  EXPECT_EQ(track_name[by_name["forward"]["tid"]], "main");
  EXPECT_EQ(track_name[by_name["update of h.0"]["tid"]], "worker");
  EXPECT_EQ(by_name["update of h.0"]["cat"], "optimizer");
  const auto& w = by_name["wait for \"x\"\n"];
  EXPECT_EQ(w["tid"], by_name["forward"]["tid"]);
  EXPECT_NEAR(w["dur"].get<double>(), 5e5, 1.0);  // microseconds
  EXPECT_GE(w["ts"].get<double>(), by_name["forward"]["ts"].get<double>());
}

TEST(Trace, OffRecordsNothingAndASecondRecordingIsRefused) {
  testing::TempDir dir;
  trace::Complete("step", "dropped", 0, 1);  // not recording: nothing, no error
  ASSERT_OK_AND_ASSIGN(trace::Recording rec, trace::Recording::Begin(dir.File("a.json")));
  auto second = trace::Recording::Begin(dir.File("b.json"));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(second.status().message()), ::testing::HasSubstr("a.json"));
  ASSERT_OK(rec.Finish());
  EXPECT_TRUE(ReadJson(dir.File("a.json"))["traceEvents"].empty());
  ASSERT_OK(rec.Finish());  // (once only: nothing more)
}

TEST(Trace, AnUnwritablePathIsAnErrorBeforeAnythingRuns) {
  testing::TempDir dir;
  auto r = trace::Recording::Begin(dir.File("no/such/dir/run.json"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_THAT(r.status().ToString(), ::testing::HasSubstr("no/such/dir/run.json"));
  EXPECT_FALSE(trace::On());
}

TEST(Trace, DestroyingARecordingWritesIt) {
  testing::TempDir dir;
  {
    ASSERT_OK_AND_ASSIGN(trace::Recording rec, trace::Recording::Begin(dir.File("d.json")));
    trace::Span s("step", "kept");
  }
  EXPECT_FALSE(trace::On());
  EXPECT_EQ(ReadJson(dir.File("d.json"))["traceEvents"][0]["name"], "kept");
}

}  // namespace
}  // namespace strata
