// SPDX-License-Identifier: Apache-2.0
// The run log (engine/run_log.h): the JSON log's records — a "run" header
// per run, a "step" record per step with its own times and bytes, "log"
// records with aggregates named so, "val" and a "summary" — appended runs
// each after their header, never two at once; the printed line's format; an
// MFU above 100% stated as a baseline measured low; the progress line's
// rate, elapsed and time left, cleared before the run's last line.
#include "engine/run_log.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

std::vector<nlohmann::json> Records(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

StepReport Report(int64_t step, double loss) {
  StepReport r;
  r.step = step;
  r.loss = loss;
  r.lr = 1e-3;
  r.tokens = 1000;
  r.seconds = 0.5;
  r.forward_s = 0.2;
  r.backward_s = 0.3;
  r.h2d = 100 * step;
  return r;
}

// A tiny CPU run of `steps` steps that validates every `interval` and logs
// JSON into dir.
TrainOptions LoggedCpuRun(const TempDir& dir, int64_t steps, int64_t interval) {
  TrainOptions o = testing::TinyTrainer(2);
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.steps = steps;
  o.config.trainer.eval_batches = 1;
  o.config.trainer.eval_interval = interval;
  o.gpu_memory_limit = 256 * kMiB;
  o.host_memory_limit = 256 * kMiB;
  o.log_json = dir.File("log.jsonl");
  return o;
}

// The interval's validation after the last step is the run's final one: it
// is printed and logged once, not twice.
TEST(RunLog, AnIntervalEndingOnTheLastStepValidatesOnce) {
  TempDir dir;
  TrainOptions o = LoggedCpuRun(dir, 4, 2);
  std::ostringstream log, out;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_OK(t->Run(out));
  std::vector<int64_t> val_steps;
  for (const auto& j : Records(o.log_json))
    if (j["type"] == "val") val_steps.push_back(j["step"].get<int64_t>());
  EXPECT_EQ(val_steps, (std::vector<int64_t>{2, 4})) << out.str();
  const std::string text = out.str();
  size_t printed = 0;
  for (size_t at = text.find("val loss"); at != std::string::npos; at = text.find("val loss", at + 1)) ++printed;
  EXPECT_EQ(printed, 2u) << text;
}

// A whole run through Trainer::Run: its header, a record per step, the
// printed lines' records, the validation, the summary; a second run appends
// its own header and records after the first's.
TEST(RunLog, TheJsonLogOfARun) {
  TempDir dir;
  TrainOptions o = LoggedCpuRun(dir, 5, 4);
  o.config.steps_per_print = 2;
  o.argv = {"strata", "train", "--steps", "5"};
  for (int run = 0; run < 2; ++run) {
    std::ostringstream log, out;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    ASSERT_OK(t->Run(out));
    if (run == 0) {
      // The printed lines keep their format.
      EXPECT_THAT(out.str(), HasSubstr("step 1/5 | loss "));
      EXPECT_THAT(out.str(), HasSubstr("step 4 | val loss "));
    }
  }
  const std::vector<nlohmann::json> rec = Records(o.log_json);
  std::vector<std::string> types;
  for (const auto& j : rec) types.push_back(j["type"]);
  const std::vector<std::string> one = {"run", "step", "log", "step", "log", "step", "step", "log", "val",
                                        "step", "log", "val", "summary"};
  std::vector<std::string> two = one;
  two.insert(two.end(), one.begin(), one.end());
  EXPECT_EQ(types, two);
  const nlohmann::json& head = rec[0];
  for (const char* k : {"run", "time", "elapsed_s", "version", "start_time", "argv", "config", "plan", "first_step",
                        "total_steps", "backend", "gemm_baseline"})
    EXPECT_TRUE(head.contains(k)) << k;
  EXPECT_EQ(head["argv"], nlohmann::json::array({"strata", "train", "--steps", "5"}));
  EXPECT_EQ(head["config"]["model"]["n_layer"], 2);
  EXPECT_TRUE(head["plan"]["rows"].is_array());
  EXPECT_THAT(head["plan"]["table"].get<std::string>(), HasSubstr("parameters"));
  // The two runs' ids differ; every record carries its run's.
  EXPECT_NE(rec[0]["run"], rec[one.size()]["run"]);
  for (size_t i = 0; i < rec.size(); ++i) EXPECT_EQ(rec[i]["run"], rec[i < one.size() ? 0 : one.size()]["run"]) << i;
  // Each step's own figures; the printed lines' aggregates named so.
  int64_t step = 0;
  double last = 0;
  for (const auto& j : rec) {
    if (j["type"] == "run") last = 0;
    EXPECT_GE(j["elapsed_s"].get<double>(), last) << "elapsed_s goes back within a run";
    EXPECT_EQ(j["time"].get<std::string>().size(), 24u) << j["time"];  // 2025-12-01T22:07:00.123Z
    if (j["type"] == "step") {
      EXPECT_EQ(j["step"].get<int64_t>(), step % 5 + 1);
      ++step;
      for (const char* k : {"loss", "lr", "grad_norm", "tokens", "step_s", "forward_s", "backward_s", "optimizer_s",
                            "wait_s", "tokens_per_s", "mfu", "h2d_bytes", "d2h_bytes", "nvme_read_bytes",
                            "nvme_write_bytes"})
        EXPECT_TRUE(j.contains(k)) << k;
      EXPECT_EQ(j["tokens"], 2 * 4 * 32);
      EXPECT_GT(j["step_s"].get<double>(), 0);
    }
    if (j["type"] == "log") {
      EXPECT_FALSE(j.contains("tokens_per_s")) << "an aggregate under a per-step name";
      for (const char* k : {"interval_steps", "interval_s", "interval_tokens_per_s", "interval_mfu",
                            "interval_forward_s", "interval_h2d_bytes"})
        EXPECT_TRUE(j.contains(k)) << k;
    }
    if (j["type"] == "summary") {
      EXPECT_EQ(j["status"], "ok");
      EXPECT_EQ(j["steps"], 5);
      EXPECT_TRUE(j["val_loss"].is_number());
    }
    last = j["elapsed_s"].get<double>();
  }
  EXPECT_EQ(rec[2]["interval_steps"], 1);  // step 1's line: itself
  EXPECT_EQ(rec[4]["interval_steps"], 1);  // step 2's: itself
  EXPECT_EQ(rec[7]["interval_steps"], 2);  // step 4's: steps 3 and 4
}

// A second run appending to a log another run is writing fails at once,
// naming the file, instead of mixing its lines in.
TEST(RunLog, TwoRunsNeverWriteOneLogAtOnce) {
  TempDir dir;
  RunLog::Options o;
  o.total_steps = 3;
  o.json_path = dir.File("log.jsonl");
  std::ostringstream out;
  ASSERT_OK_AND_ASSIGN(RunLog first, RunLog::Open(&out, o, nlohmann::json::object()));
  auto second = RunLog::Open(&out, o, nlohmann::json::object());
  EXPECT_THAT(second, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(second.status().ToString(), HasSubstr(o.json_path));
  first.Finish(Status::OK(), "");
}

// An MFU above 100% (here: a baseline far below the rate the steps reach)
// is marked on each line, explained once, and recorded in the summary.
TEST(RunLog, AnMfuAbove100PercentIsStated) {
  TempDir dir;
  RunLog::Options o;
  o.total_steps = 3;
  o.every = 1;
  o.peak_flops = 1e3;
  o.peak_what = "a 1 kFLOP/s baseline";
  o.flops_per_token = 1e6;
  o.json_path = dir.File("log.jsonl");
  std::ostringstream out;
  ASSERT_OK_AND_ASSIGN(RunLog log, RunLog::Open(&out, o, nlohmann::json::object()));
  TierStoreStats st;
  for (int64_t s = 1; s <= 3; ++s) log.Add(Report(s, 5.0 - s), st);
  log.Finish(Status::OK(), "");
  const std::string text = out.str();
  EXPECT_THAT(text, HasSubstr("(baseline low)"));
  size_t warnings = 0;
  for (size_t at = text.find("warning: an MFU above 100%"); at != std::string::npos;
       at = text.find("warning: an MFU above 100%", at + 1))
    ++warnings;
  EXPECT_EQ(warnings, 1u) << text;
  EXPECT_THAT(text, HasSubstr("a 1 kFLOP/s baseline"));
  EXPECT_EQ(Records(o.json_path).back()["mfu_baseline_low"], true);
}

TEST(ProgressLine, RateElapsedAndTimeLeft) {
  ProgressLine p(false, 10, 50, 100.0);
  // 10 of this run's steps (10 -> 20) in 20 s: 30 to go at 2 s each.
  const std::string s = p.Text(20, 3.14159, 40000, 120.0);
  EXPECT_THAT(s, HasSubstr("] 20/50  loss 3.1416"));
  EXPECT_THAT(s, HasSubstr("2000 tok/s"));
  EXPECT_THAT(s, HasSubstr("0:20 elapsed, ~1:00 left"));
  EXPECT_THAT(p.Text(50, 1.0, 1, 130.0), ::testing::Not(HasSubstr("left")));
  EXPECT_EQ(ClockText(3725), "1:02:05");
  EXPECT_EQ(ClockText(7), "0:07");
}

// On a terminal the line is redrawn after each step and cleared before the
// run's last lines (nothing of it is left under them).
TEST(ProgressLine, ClearedBeforeTheFinalLine) {
  RunLog::Options o;
  o.total_steps = 3;
  o.every = 100;
  o.progress = true;
  std::ostringstream out;
  ASSERT_OK_AND_ASSIGN(RunLog log, RunLog::Open(&out, o, nlohmann::json::object()));
  TierStoreStats st;
  ::testing::internal::CaptureStderr();
  log.Add(Report(1, 4.0), st);
  log.Add(Report(2, 3.5), st);
  const std::string drawn = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(drawn, HasSubstr("] 2/3  loss 3.5000"));
  EXPECT_THAT(drawn, HasSubstr("elapsed"));
  ::testing::internal::CaptureStderr();
  log.Add(Report(3, 3.0), st);  // the last step: its line is printed, the progress line cleared
  log.Finish(Status::OK(), "");
  const std::string last = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(last, "\r\033[K") << "the progress line must be erased once, and nothing drawn after";
  EXPECT_THAT(out.str(), HasSubstr("step 3/3 |"));
}

}  // namespace
}  // namespace strata
