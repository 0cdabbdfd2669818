// SPDX-License-Identifier: Apache-2.0
// `strata plot LOG.jsonl`: the loss and tokens/s curves of a training run
// from the JSON log `strata train --log-json` appends (engine/run_log.h):
// each run's "step" records (every step: its loss and its own tokens/s) and
// "val" records (the validation losses, as points on the loss panel), drawn
// with engine/plot.h into a PNG beside the log (LOG.png) or where -o says.
// A log that several runs appended to gives one curve per run (each "run"
// record starts one). Logs of strata before the "type" field (one object a
// printed line: "step", "loss", "tokens_per_s") still read, a step count
// starting again starting the next run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata {

struct TrainLogPoint {
  int run = 0;  // 0, 1, ...: the run (its "run" record; in an older log, a step not after the last)
  int64_t step = 0;
  double loss = 0;
  double tokens_per_s = 0;
};

struct TrainLog {
  std::vector<TrainLogPoint> steps;  // the steps, in order
  std::vector<TrainLogPoint> vals;   // the validation losses (loss = val_loss; tokens_per_s 0)
  int runs = 0;
};

// Reads every line; blank lines, and records of other types ("log",
// "summary", and types a later strata adds), are skipped. InvalidArgument
// naming the file, the line and the key for a line that is not a JSON
// object, a step record without a number "step", "loss" or "tokens_per_s",
// a "val" record without "val_loss"; IoError when the file cannot be read;
// InvalidArgument for a log without a step.
Result<TrainLog> ReadTrainLog(const std::string& path);

// The chart of `log_path` into `png_path` (engine/plot.h's errors).
Status PlotTrainLog(const std::string& log_path, const std::string& png_path);

// The command line: strata plot LOG.jsonl [-o FILE.png]. argv[0] is "plot".
int RunPlotCommand(int argc, char** argv);

}  // namespace strata
