// SPDX-License-Identifier: Apache-2.0
// `strata train --trace FILE` (TrainOptions::trace_path, base/trace.h): the
// timeline of an offloaded run holds what overlapped — the step's passes on
// the step's track, each shard's update on the optimizer's, each move
// between tiers on the store's movers — and tracing changes nothing else.
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

std::vector<double> RunLosses(const TrainOptions& o, std::string* log) {
  std::ostringstream out;
  auto t = Trainer::Create(o, out);
  EXPECT_OK(t.status());
  if (!t.ok()) return {};
  const std::vector<double> losses = testing::StepLosses(**t, 3);
  EXPECT_OK((*t)->FinishTrace());
  *log = out.str();
  return losses;
}

TEST(TraceRun, AnOffloadedRunsTimelineShowsPassesUpdatesAndMoves) {
  testing::TempDir nvme, out;
  TrainOptions o = testing::TinyTrainer(3);
  o.backend = "cpu";
  o.config.zero.offload_param.device = "cpu";
  o.config.zero.offload_optimizer.device = "nvme";
  o.config.zero.offload_optimizer.nvme_path = nvme.path();
  o.config.activation_checkpointing.cpu_checkpointing = true;
  o.config.gradient_clipping = 0;  // (the update during the backward: shards overlap the passes)
  std::string log;
  const std::vector<double> plain = RunLosses(o, &log);
  o.trace_path = out.File("run.json");
  const std::vector<double> traced = RunLosses(o, &log);
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(traced, plain);  // tracing changes nothing the run computes

  std::ifstream f(o.trace_path);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::map<int, std::string> track;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "M") track[e["tid"]] = e["args"]["name"];
  std::map<std::string, std::multiset<std::string>> names_on;  // track name -> event names
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") names_on[track[e["tid"]]].insert(e["name"].get<std::string>());
  const auto& step = names_on["step"];
  EXPECT_EQ(step.count("forward"), 3u);
  EXPECT_EQ(step.count("head and backward"), 3u);
  for (const char* s : {"step 1", "step 2", "step 3"}) EXPECT_EQ(step.count(s), 1u) << s;
  // Every shard's update, each step, on the optimizer's thread.
  std::multiset<std::string> updates;
  for (const std::string& e : names_on["optimizer (cpu)"])
    if (e.rfind("update of ", 0) == 0) updates.insert(e);
  EXPECT_EQ(updates.size(), 3u * 5u);  // (embedding, 3 blocks, final unit) x 3 steps
  EXPECT_EQ(updates.count("update of blk0"), 3u);
  // The optimizer state streamed to and from NVMe, named by tensor.
  int nvme_moves = 0;
  for (const auto& [name, events] : names_on)
    for (const std::string& e : events)
      if (e.find(" to nvme") != std::string::npos || e.find("nvme to ") != std::string::npos) ++nvme_moves;
  EXPECT_GT(nvme_moves, 0) << log;
}

TEST(TraceRun, SeveralRanksEachWriteTheirOwn) {
  EXPECT_EQ(TracePathOfRank("/x/run.json", 0, 1), "/x/run.json");
  EXPECT_EQ(TracePathOfRank("/x/run.json", 1, 2), "/x/run-rank1.json");
  EXPECT_EQ(TracePathOfRank("/x.d/run", 2, 3), "/x.d/run-rank2");
  EXPECT_EQ(TracePathOfRank(".trace", 0, 2), ".trace-rank0");
}

}  // namespace
}  // namespace strata
