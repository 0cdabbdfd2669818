// `strata plot LOG.jsonl`: the loss and tokens/s curves of a training run
// from the JSON lines `strata train --log-json` appends (one object a
// logged step: "step", "loss", "tokens_per_s", ...), drawn with
// engine/plot.h into a PNG beside the log (LOG.png) or where -o says.
// A log that several runs appended to (the step count starting again)
// gives one curve per run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata {

struct TrainLogPoint {
  int run = 0;  // 0, 1, ...: a step not after the previous one starts the next run
  int64_t step = 0;
  double loss = 0;
  double tokens_per_s = 0;
};

// Reads every line; blank lines are skipped. InvalidArgument naming the
// file, the line and the key for a line that is not a JSON object or lacks
// a number "step", "loss" or "tokens_per_s"; IoError when the file cannot
// be read; InvalidArgument for a log without a step.
Result<std::vector<TrainLogPoint>> ReadTrainLog(const std::string& path);

// The chart of `log_path` into `png_path` (engine/plot.h's errors).
Status PlotTrainLog(const std::string& log_path, const std::string& png_path);

// The command line: strata plot LOG.jsonl [-o FILE.png]. argv[0] is "plot".
int RunPlotCommand(int argc, char** argv);

}  // namespace strata
