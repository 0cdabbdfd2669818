#include "engine/train_log_plot.h"

#include <fstream>
#include <iostream>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "engine/plot.h"

namespace po = boost::program_options;

namespace strata {

Result<std::vector<TrainLogPoint>> ReadTrainLog(const std::string& path) {
  std::ifstream f(path);
  if (!f) return ErrnoStatus("cannot open the training log", path);
  std::vector<TrainLogPoint> out;
  std::string line;
  int64_t n = 0;
  int run = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return InvalidArgument(where + ": not a JSON object (strata plot reads the lines strata train --log-json "
                                     "writes)");
    TrainLogPoint p;
    for (auto [key, value] : {std::pair<const char*, double*>{"loss", &p.loss}, {"tokens_per_s", &p.tokens_per_s}}) {
      if (!j.contains(key) || !j[key].is_number()) return InvalidArgument(where + ": no number \"" + key + "\"");
      *value = j[key].get<double>();
    }
    if (!j.contains("step") || !j["step"].is_number_integer())
      return InvalidArgument(where + ": no integer \"step\"");
    p.step = j["step"].get<int64_t>();
    if (!out.empty() && p.step <= out.back().step) ++run;
    p.run = run;
    out.push_back(p);
  }
  if (f.bad()) return ErrnoStatus("cannot read the training log", path);
  if (out.empty()) return InvalidArgument(path + ": no logged step in it");
  return out;
}

Status PlotTrainLog(const std::string& log_path, const std::string& png_path) {
  ASSIGN_OR_RETURN(std::vector<TrainLogPoint> points, ReadTrainLog(log_path));
  const int runs = points.back().run + 1;
  PlotPanel loss{"training loss", "step", "loss", false, {}, {}};
  PlotPanel speed{"throughput (tokens/s over the steps since the previous logged one)", "step", "tokens/s", false,
                  {}, {}};
  for (int r = 0; r < runs; ++r) {
    const std::string name = runs == 1 ? std::string("loss") : "run " + std::to_string(r + 1);
    PlotSeries l{name, {}, {}, false}, s{runs == 1 ? std::string("tokens/s") : name, {}, {}, false};
    for (const auto& p : points) {
      if (p.run != r) continue;
      l.x.push_back(static_cast<double>(p.step)), l.y.push_back(p.loss);
      s.x.push_back(static_cast<double>(p.step)), s.y.push_back(p.tokens_per_s);
    }
    loss.series.push_back(std::move(l));
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
