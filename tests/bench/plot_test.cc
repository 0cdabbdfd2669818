// SPDX-License-Identifier: Apache-2.0
// engine/plot.h and `strata plot`'s log reader: bad input is refused naming
// what is wrong; a chart is drawn by gnuplot when it is installed, and its
// script is written either way.
#include "engine/plot.h"

#include <fstream>

#include "engine/train_log_plot.h"
#include "tests/bench/cli_util.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::Exists;
using ::strata::testing::ReadFile;
using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;

void Write(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

TEST(WritePlot, RefusesSeriesOfUnequalLength) {
  TempDir dir;
  PlotPanel p{"t", "x", "y", false, {}, {{"s", {1, 2, 3}, {1, 2}, false}}};
  EXPECT_THAT(WritePlot(dir.File("a.png"), "t", {p}), StatusIs(StatusCode::kInvalidArgument));
}

TEST(WritePlot, RefusesAPanelWithoutAPoint) {
  TempDir dir;
  PlotPanel p{"empty", "x", "y", false, {}, {{"s", {}, {}, false}}};
  Status s = WritePlot(dir.File("a.png"), "t", {p});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(s.ToString().find("empty"), std::string::npos) << s.ToString();
}

TEST(WritePlot, WritesTheScriptAndThePng) {
  TempDir dir;
  PlotPanel p{"bandwidth \"quoted\"", "bytes", "GB/s", true, {{1 << 20, "1M"}, {8 << 20, "8M"}},
              {{"read", {1 << 20, 8 << 20}, {1.5, 2.5}, false}, {"raw", {1 << 20, 8 << 20}, {1.6, 2.6}, true}}};
  Status s = WritePlot(dir.File("bw.png"), "title", {p, p});
  // The script is there whatever happened to gnuplot, with the data in it.
  const std::string gp = ReadFile(dir.File("bw.gp"));
  EXPECT_NE(gp.find("8388608 2.5"), std::string::npos) << gp;
  EXPECT_NE(gp.find("logscale x 2"), std::string::npos);
  // The x range reaches a little past the first and last point, so gnuplot
  // keeps their tics (on the H200's report, 256M and 16 threads had none).
  EXPECT_NE(gp.find("set xrange [998643.81:8808038.4]"), std::string::npos) << gp;
  std::string why;
  if (!PlotToolAvailable(&why)) {
    EXPECT_THAT(s, StatusIs(StatusCode::kUnavailable));
    EXPECT_NE(s.ToString().find("gnuplot"), std::string::npos);
    GTEST_SKIP() << why;
  }
  ASSERT_OK(s);
  const std::string png = ReadFile(dir.File("bw.png"));
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
}

TEST(ReadTrainLog, NamesTheLineAndTheKey) {
  TempDir dir;
  Write(dir.File("log.jsonl"), "{\"step\": 1, \"loss\": 5.0, \"tokens_per_s\": 100}\n{\"step\": 2, \"tokens_per_s\": 90}\n");
  auto r = ReadTrainLog(dir.File("log.jsonl"));
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(r.status().ToString().find("log.jsonl:2"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().ToString().find("\"loss\""), std::string::npos) << r.status().ToString();
  Write(dir.File("bad.jsonl"), "not json\n");
  EXPECT_THAT(ReadTrainLog(dir.File("bad.jsonl")), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ReadTrainLog(dir.File("missing.jsonl")), StatusIs(StatusCode::kIoError));
}

// The records strata train writes now: a "run" header starts each run
// (a resumed one continues the step count and is a run of its own), "step"
// records are the curve, "val" records its validation points, the others
// are skipped.
TEST(ReadTrainLog, RunHeadersStepAndValRecords) {
  TempDir dir;
  Write(dir.File("log.jsonl"),
        "{\"type\": \"run\", \"run\": \"a\", \"first_step\": 0}\n"
        "{\"type\": \"step\", \"run\": \"a\", \"step\": 1, \"loss\": 5.0, \"tokens_per_s\": 100}\n"
        "{\"type\": \"log\", \"run\": \"a\", \"step\": 1, \"loss\": 5.0, \"interval_tokens_per_s\": 100}\n"
        "{\"type\": \"step\", \"run\": \"a\", \"step\": 2, \"loss\": 4.5, \"tokens_per_s\": 110}\n"
        "{\"type\": \"val\", \"run\": \"a\", \"step\": 2, \"val_loss\": 4.7}\n"
        "{\"type\": \"summary\", \"run\": \"a\", \"status\": \"stopped\"}\n"
        "{\"type\": \"run\", \"run\": \"b\", \"first_step\": 2}\n"
        "{\"type\": \"step\", \"run\": \"b\", \"step\": 3, \"loss\": 4.2, \"tokens_per_s\": 120}\n"
        "{\"type\": \"a later kind\", \"run\": \"b\"}\n");
  ASSERT_OK_AND_ASSIGN(TrainLog log, ReadTrainLog(dir.File("log.jsonl")));
  EXPECT_EQ(log.runs, 2);
  ASSERT_EQ(log.steps.size(), 3u);
  EXPECT_EQ(log.steps[1].run, 0);
  EXPECT_EQ(log.steps[2].run, 1);
  EXPECT_EQ(log.steps[2].step, 3);
  ASSERT_EQ(log.vals.size(), 1u);
  EXPECT_DOUBLE_EQ(log.vals[0].loss, 4.7);
  Write(dir.File("bad.jsonl"), "{\"type\": \"val\", \"run\": \"a\", \"step\": 2}\n");
  auto bad = ReadTrainLog(dir.File("bad.jsonl"));
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(bad.status().ToString().find("\"val_loss\""), std::string::npos) << bad.status().ToString();
}

TEST(ReadTrainLog, AStepCountStartingAgainIsTheNextRun) {
  TempDir dir;
  Write(dir.File("log.jsonl"),
        "{\"step\": 1, \"loss\": 5.0, \"tokens_per_s\": 100}\n\n{\"step\": 10, \"loss\": 4.0, \"tokens_per_s\": 120}\n"
        "{\"step\": 1, \"loss\": 5.1, \"tokens_per_s\": 99}\n");
  ASSERT_OK_AND_ASSIGN(TrainLog read, ReadTrainLog(dir.File("log.jsonl")));
  const std::vector<TrainLogPoint>& points = read.steps;
  EXPECT_EQ(read.runs, 2);
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points[0].run, 0);
  EXPECT_EQ(points[1].run, 0);
  EXPECT_EQ(points[2].run, 1);
  EXPECT_DOUBLE_EQ(points[1].loss, 4.0);
  EXPECT_DOUBLE_EQ(points[1].tokens_per_s, 120);
}

// strata train --log-json, then strata plot on what it wrote.
TEST(StrataPlot, DrawsWhatStrataTrainLogged) {
  TempDir dir;
  const std::string log = dir.File("run.jsonl");
  auto train = ::strata::testing::RunCommand({::strata::testing::StrataBinary(), "train", "--backend", "cpu", "--steps", "3",
                                       "--log-json", log});
  ASSERT_EQ(train.rc, 0) << train.output;
  ASSERT_OK_AND_ASSIGN(TrainLog read, ReadTrainLog(log));
  EXPECT_EQ(read.steps.size(), 3u);  // every step
  EXPECT_EQ(read.vals.size(), 1u);   // the validation at the end
  auto plot = ::strata::testing::RunCommand({::strata::testing::StrataBinary(), "plot", log});
  EXPECT_TRUE(Exists(dir.File("run.gp")));
  if (!PlotToolAvailable()) {
    EXPECT_NE(plot.rc, 0);
    EXPECT_NE(plot.output.find("gnuplot"), std::string::npos) << plot.output;
    GTEST_SKIP() << "gnuplot is not installed";
  }
  ASSERT_EQ(plot.rc, 0) << plot.output;
  EXPECT_TRUE(Exists(dir.File("run.png")));
  auto out = ::strata::testing::RunCommand({::strata::testing::StrataBinary(), "plot", log, "-o", dir.File("other.png")});
  EXPECT_EQ(out.rc, 0) << out.output;
  EXPECT_TRUE(Exists(dir.File("other.png")));
}

TEST(StrataPlot, BadArgumentsAreNamed) {
  auto none = ::strata::testing::RunCommand({::strata::testing::StrataBinary(), "plot"});
  EXPECT_EQ(none.rc, 2);
  EXPECT_NE(none.output.find("LOG.jsonl"), std::string::npos) << none.output;
  auto bogus = ::strata::testing::RunCommand({::strata::testing::StrataBinary(), "plot", "--bogus"});
  EXPECT_EQ(bogus.rc, 2);
  EXPECT_NE(bogus.output.find("--bogus"), std::string::npos) << bogus.output;
  auto help = ::strata::testing::RunCommand({::strata::testing::StrataBinary(), "plot", "--help"});
  EXPECT_EQ(help.rc, 0);
  EXPECT_NE(help.output.find("--out"), std::string::npos) << help.output;
}

}  // namespace
}  // namespace strata
