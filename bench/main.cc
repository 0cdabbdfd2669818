// SPDX-License-Identifier: Apache-2.0
// strata-bench: offload bandwidth and component benchmarks.
//
// Subcommands (each in bench/<name>.cc) register themselves; `strata-bench`
// with no arguments lists them. Every figure is printed beside its physical
// baseline measured in the same run, and the ratio. Ctrl-C stops a sweep
// cleanly (bench/sweep.h: what was measured is written, exit 130); a failure
// (bench.h's Die, or any exception: std::bad_alloc of a buffer too large)
// unwinds to here, so every command's files are removed; a bad argument
// (bench/args.h) is named with its range, exit 2.
#include <cstring>
#include <iostream>

#include "bench/args.h"
#include "bench/bench.h"
#include "bench/sweep.h"

int main(int argc, char** argv) {
  using strata::bench::Commands;
#if !defined(NDEBUG) || !defined(__OPTIMIZE__)
  std::cerr << "WARNING: strata-bench was built without optimization; figures are not "
               "representative (build with CMAKE_BUILD_TYPE=Release)\n";
#endif
  auto usage = [&](std::ostream& os) {
    os << "usage: strata-bench <command> [options]   (strata-bench <command> --help)\n\ncommands:\n";
    for (const auto& c : Commands()) os << "  " << c.name << std::string(11 - std::min<size_t>(10, std::strlen(c.name)), ' ') << c.summary << "\n";
  };
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  strata::bench::InstallStopHandler();
  for (const auto& c : Commands()) {
    if (std::strcmp(c.name, argv[1])) continue;
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const strata::bench::BadArgument& e) {
      strata::bench::ClearProgressLine();
      std::cerr << "strata-bench " << c.name << ": " << e.what() << "\ntry: strata-bench " << c.name << " --help\n";
      return 2;
    } catch (const strata::bench::BenchFailure& e) {
      strata::bench::ClearProgressLine();
      std::cerr << "strata-bench " << c.name << ": " << e.what() << "\n";
      return 1;
    } catch (const std::exception& e) {  // std::bad_alloc, ...: the files go as the stack unwinds
      strata::bench::ClearProgressLine();
      std::cerr << "strata-bench " << c.name << ": " << e.what() << "\n";
      return 1;
    }
  }
  std::cerr << "strata-bench: unknown command '" << argv[1] << "'\n";
  usage(std::cerr);
  return 2;
}
