// SPDX-License-Identifier: Apache-2.0
#include "engine/cli_parse.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "engine/config.h"

namespace strata {

namespace po = boost::program_options;

std::string Nearest(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& n : names) {
    const size_t d = EditDistance(word.substr(0, 100), n);
    if (d < best_d) best_d = d, best = n;
  }
  return best_d <= std::max<size_t>(2, word.size() / 3) ? best : "";
}

Status ParseCommandOptions(const std::string& cmd, int argc, char** argv, const po::options_description& desc,
                           po::variables_map* vm) {
  // No prefix guessing: "--top" must not silently become "--top-k".
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).style(style).run(), *vm);
    po::notify(*vm);
  } catch (const po::unknown_option& e) {
    const std::string opt = e.get_option_name();
    std::vector<std::string> names;
    for (const auto& o : desc.options()) names.push_back("--" + o->long_name());
    const std::string near = Nearest(opt, names);
    return InvalidArgument("strata " + cmd + ": unknown option " + opt +
                           (near.empty() ? "" : "; did you mean " + near + "?") + " (strata " + cmd + " --help)");
  } catch (const std::exception& e) {
    return InvalidArgument("strata " + cmd + ": " + e.what() + " (strata " + cmd + " --help)");
  }
  return Status::OK();
}

Result<std::unique_ptr<kernels::Backend>> BackendNamed(const std::string& name, int threads) {
  if (name == "cpu") return kernels::MakeCpuBackend(threads);
  if (name == "cuda") return kernels::MakeCudaBackend(0);
  if (name != "auto") return InvalidArgument("--backend \"" + name + "\" is not allowed (allowed: auto, cpu, cuda)");
  auto cuda = kernels::MakeCudaBackend(0);
  if (cuda.ok()) return cuda;
  return kernels::MakeCpuBackend(threads);
}

}  // namespace strata
