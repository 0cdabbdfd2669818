// SPDX-License-Identifier: Apache-2.0
#include "engine/train_log_plot.h"

#include <fstream>
#include <map>
#include <iostream>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "engine/plot.h"

namespace po = boost::program_options;

namespace strata {

namespace {

// A number `key` of `j` into *out: InvalidArgument naming `where` and the key otherwise.
Status NumberOf(const nlohmann::json& j, const char* key, const std::string& where, double* out) {
  if (!j.contains(key) || !j[key].is_number()) return InvalidArgument(where + ": no number \"" + key + "\"");
  *out = j[key].get<double>();
  return Status::OK();
}

Status StepOf(const nlohmann::json& j, const std::string& where, int64_t* out) {
  if (!j.contains("step") || !j["step"].is_number_integer()) return InvalidArgument(where + ": no integer \"step\"");
  *out = j["step"].get<int64_t>();
  return Status::OK();
}

}  // namespace

Result<TrainLog> ReadTrainLog(const std::string& path) {
  std::ifstream f(path);
  if (!f) return ErrnoStatus("cannot open the training log", path);
  TrainLog out;
  std::map<std::string, int> run_of;  // "run" id -> its index
  int legacy_run = -1;                // the run of an older log's lines
  std::string line;
  int64_t n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return InvalidArgument(where + ": not a JSON object (strata plot reads the lines strata train --log-json "
                                     "writes)");
    TrainLogPoint p;
    if (!j.contains("type")) {  // a log of strata before the records had types
      RETURN_IF_ERROR(NumberOf(j, "loss", where, &p.loss));
      RETURN_IF_ERROR(NumberOf(j, "tokens_per_s", where, &p.tokens_per_s));
      RETURN_IF_ERROR(StepOf(j, where, &p.step));
      if (legacy_run < 0 || (!out.steps.empty() && p.step <= out.steps.back().step)) legacy_run = out.runs++;
      p.run = legacy_run;
      out.steps.push_back(p);
      continue;
    }
    const std::string type = j["type"].is_string() ? j["type"].get<std::string>() : "";
    const std::string id = j.contains("run") && j["run"].is_string() ? j["run"].get<std::string>() : "";
    auto run = [&]() {
      auto it = run_of.find(id);
      if (it == run_of.end()) it = run_of.emplace(id, out.runs++).first;
      return it->second;
    };
    if (type == "run") {
      run_of[id] = out.runs++;  // a run id seen again is a new run all the same
    } else if (type == "step") {
      RETURN_IF_ERROR(NumberOf(j, "loss", where, &p.loss));
      RETURN_IF_ERROR(NumberOf(j, "tokens_per_s", where, &p.tokens_per_s));
      RETURN_IF_ERROR(StepOf(j, where, &p.step));
      p.run = run();
      out.steps.push_back(p);
    } else if (type == "val") {
      RETURN_IF_ERROR(NumberOf(j, "val_loss", where, &p.loss));
      RETURN_IF_ERROR(StepOf(j, where, &p.step));
      p.run = run();
      out.vals.push_back(p);
    }
  }
  if (f.bad()) return ErrnoStatus("cannot read the training log", path);
  if (out.steps.empty()) return InvalidArgument(path + ": no logged step in it");
  return out;
}

Status PlotTrainLog(const std::string& log_path, const std::string& png_path) {
  ASSIGN_OR_RETURN(TrainLog log, ReadTrainLog(log_path));
  PlotPanel loss{"training loss (validation loss dashed)", "step", "loss", false, {}, {}};
  PlotPanel speed{"throughput (tokens/s of each step)", "step", "tokens/s", false, {}, {}};
  for (int r = 0; r < log.runs; ++r) {
    const std::string name = log.runs == 1 ? std::string("loss") : "run " + std::to_string(r + 1);
    PlotSeries l{name, {}, {}, false}, s{log.runs == 1 ? std::string("tokens/s") : name, {}, {}, false};
    PlotSeries v{log.runs == 1 ? std::string("val loss") : name + " val", {}, {}, true};
    for (const auto& p : log.steps) {
      if (p.run != r) continue;
      l.x.push_back(static_cast<double>(p.step)), l.y.push_back(p.loss);
      s.x.push_back(static_cast<double>(p.step)), s.y.push_back(p.tokens_per_s);
    }
    for (const auto& p : log.vals)
      if (p.run == r) v.x.push_back(static_cast<double>(p.step)), v.y.push_back(p.loss);
    if (l.x.empty()) continue;  // a run that stopped before its first step
    loss.series.push_back(std::move(l));
    if (!v.x.empty()) loss.series.push_back(std::move(v));
    speed.series.push_back(std::move(s));
  }
  const std::string base = log_path.substr(log_path.rfind('/') + 1);
  return WritePlot(png_path, "strata train: " + base, {loss, speed});
}

int RunPlotCommand(int argc, char** argv) {
  std::string log, out;
  po::options_description desc(
      "strata plot LOG.jsonl: loss and tokens/s curves of a run logged with strata train --log-json, as a PNG "
      "(drawn by gnuplot)");
  desc.add_options()("help,h", "show this help")("log", po::value(&log)->value_name("LOG.jsonl"),
                                                 "the JSON-lines log (also the first positional argument)")(
      "out,o", po::value(&out)->value_name("FILE.png"),
      "where to write the chart (default: the log's name with .png; its gnuplot script goes beside it as .gp)");
  po::positional_options_description pos;
  pos.add("log", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: strata plot LOG.jsonl [-o FILE.png]\n" << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "strata plot: " << e.what() << "\ntry: strata plot --help\n";
    return 2;
  }
  if (log.empty()) {
    std::cerr << "strata plot: LOG.jsonl is missing (the file strata train --log-json wrote)\n"
                 "usage: strata plot LOG.jsonl [-o FILE.png]\n";
    return 2;
  }
  if (out.empty()) {
    out = log;
    const size_t dot = out.rfind('.');
    if (dot != std::string::npos && dot > out.rfind('/') + 1) out.resize(dot);
    out += ".png";
  }
  Status s = PlotTrainLog(log, out);
  if (!s.ok()) {
    std::cerr << "strata plot: " << s.ToString() << "\n";
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::cout << "wrote " << out << "\n";
  return 0;
}

}  // namespace strata
