// SPDX-License-Identifier: Apache-2.0
// strata-bench: shared pieces for the subcommands.
//
// Each subcommand lives in its own file (bench/<name>.cc) and registers itself
// with STRATA_BENCH_COMMAND. Every figure a subcommand prints stands beside
// its physical baseline measured in the same run, with the ratio: use
// Report::Add with `value`, `baseline` and their names so the table and the
// JSON say the same thing.
//
// Abort-on-error is allowed here (tools, not the library): BENCH_CHECK_OK.
// Die() throws a BenchFailure that main() catches (exit 1), so the stack
// unwinds on the way out: BenchDir and the tiers remove their files on every
// exit path (an error, Ctrl-C through bench/sweep.h, or the end).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/status.h"

namespace strata::bench {

using RunFn = int (*)(int argc, char** argv);

struct Command {
  const char* name;
  const char* summary;
  RunFn run;
};

struct Registrar {
  Registrar(const char* name, const char* summary, RunFn run);
};
const std::vector<Command>& Commands();

#define STRATA_BENCH_COMMAND(name, summary, fn) \
  static ::strata::bench::Registrar strata_bench_registrar_##fn(name, summary, fn)

// Options every subcommand takes.
struct CommonOptions {
  std::string json_path;  // --json FILE
  std::string dir;        // --dir PATH (empty: a temporary directory, removed afterwards)
  bool full = false;      // --full: the big sweep instead of the quick defaults
};
void AddCommonOptions(boost::program_options::options_description& desc, CommonOptions& opts);

// Parses argv (argv[0] is the subcommand name). Prints help and returns false
// when --help was given or the options are bad (then *exit_code is set).
bool ParseOptions(int argc, char** argv, const boost::program_options::options_description& desc,
                  int* exit_code, boost::program_options::positional_options_description* pos = nullptr);

// A result table. Each row is a set of named columns; Print() shows them
// aligned in insertion order of the first row's keys, WriteJson() writes
// {"command":..., "machine":..., "rows":[...]}.
class Report {
 public:
  explicit Report(std::string command);
  // A row: any columns. By convention figures are given with "value",
  // "unit", "baseline", "baseline_name", "ratio" (Ratio() fills it).
  void Add(nlohmann::json row);
  // Sets row["ratio"] = value / baseline and returns the row.
  static nlohmann::json WithRatio(nlohmann::json row, double value, double baseline);
  void Note(std::string line);  // printed under the table, kept in the JSON
  void Print() const;
  // Writes the JSON to `path` (nothing when empty). Errors name the file.
  Status WriteJson(const std::string& path) const;
  // The rows as CSV (a header of every column in Print()'s order, then one
  // line per row; nothing when `path` is empty). Errors name the file.
  Status WriteCsv(const std::string& path) const;
  const std::vector<nlohmann::json>& rows() const { return rows_; }
  nlohmann::json& meta() { return meta_; }

 private:
  std::string command_;
  std::vector<nlohmann::json> rows_;
  std::vector<std::string> notes_;
  nlohmann::json meta_;
};

// A private directory for a benchmark's files, removed with everything in it
// when the object goes (Die() unwinds, so on every exit path but kill -9).
// With `path` empty it is made under $TMPDIR (or /var/tmp, which is usually
// on disk, unlike /tmp on tmpfs); a given path (--dir) must exist already —
// strata-bench never creates it, so a typo cannot measure the wrong disk —
// and the private directory is made inside it (PATH/strata-bench.XXXXXX).
// The directory holds a lock (flock on its ".owner" file, with the PID)
// while it lives; Make first removes the strata-bench directories a killed
// run (kill -9) left in the same place — their lock free, their process
// gone — and says so on stderr.
class BenchDir {
 public:
  // NotFound naming --dir and the path when it does not exist,
  // InvalidArgument when it is not a directory.
  static Result<BenchDir> Make(const std::string& path);
  BenchDir(BenchDir&& o) noexcept;
  BenchDir& operator=(BenchDir&&) = delete;
  BenchDir(const BenchDir&) = delete;
  ~BenchDir();
  const std::string& path() const { return path_; }

 private:
  explicit BenchDir(std::string path) : path_(std::move(path)), owned_(true) {}
  static void RemoveStaleBenchDirs(const std::string& parent);
  std::string path_;
  bool owned_ = false;
  int lock_fd_ = -1;  // the ".owner" file, locked
};

// Median of `v` (copied; v may be unsorted). 0 for an empty vector.
double Median(std::vector<double> v);

// Machine facts for reports: CPU model, cores, memory, GPU name if any.
nlohmann::json MachineInfo();

// What Die() throws; main() prints it and exits 1.
class BenchFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
[[noreturn]] void Die(const Status& s, const char* what);

// The column order of Print() and WriteCsv(): the descriptive columns in
// key order, then value, unit, baseline, baseline_name, ratio.
std::vector<std::string> ReportColumns(const std::vector<nlohmann::json>& rows);
// Rows as CSV (Report::WriteCsv; `all` writes its components' rows read back from their JSON).
Status WriteCsv(const std::vector<nlohmann::json>& rows, const std::string& path);
// One cell as Print() shows it (numbers rounded to a few digits).
std::string ReportCell(const nlohmann::json& v);

}  // namespace strata::bench

#define BENCH_CHECK_OK(expr)                                \
  do {                                                      \
    ::strata::Status strata_bench_s_ = (expr);              \
    if (!strata_bench_s_.ok()) ::strata::bench::Die(strata_bench_s_, #expr); \
  } while (0)

// Unwraps a Result or dies: auto x = BENCH_VALUE(MakeX());
#define BENCH_VALUE(expr)                                                      \
  ([&]() {                                                                     \
    auto strata_bench_r_ = (expr);                                             \
    if (!strata_bench_r_.ok()) ::strata::bench::Die(strata_bench_r_.status(), #expr); \
    return std::move(strata_bench_r_).value();                                 \
  }())
