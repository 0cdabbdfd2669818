// SPDX-License-Identifier: Apache-2.0
#include "bench/bench.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include "base/device.h"
#include "base/host_memory.h"
#include "bench/sweep.h"

namespace po = boost::program_options;

namespace strata::bench {

namespace {
std::vector<Command>& MutableCommands() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace

Registrar::Registrar(const char* name, const char* summary, RunFn run) {
  MutableCommands().push_back({name, summary, run});
}

const std::vector<Command>& Commands() {
  auto& c = MutableCommands();
  std::sort(c.begin(), c.end(),
            [](const Command& a, const Command& b) { return std::string(a.name) < b.name; });
  return c;
}

void AddCommonOptions(po::options_description& desc, CommonOptions& opts) {
  desc.add_options()("help,h", "show this help")(
      "json", po::value(&opts.json_path)->value_name("FILE"), "also write the results as JSON to FILE")(
      "dir", po::value(&opts.dir)->value_name("PATH"),
      "directory for benchmark files (default: a temporary directory, removed afterwards)")(
      "full", po::bool_switch(&opts.full), "run the full sweep instead of the quick defaults");
}

bool ParseOptions(int argc, char** argv, const po::options_description& desc, int* exit_code,
                  po::positional_options_description* pos) {
  po::variables_map vm;
  try {
    // Like main's argv: the parser skips argv[0] (the subcommand name) itself.
    po::command_line_parser parser(argc, argv);
    parser.options(desc);
    if (pos) parser.positional(*pos);
    po::store(parser.run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: strata-bench " << argv[0] << " [options]\n" << desc << "\n";
      *exit_code = 0;
      return false;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "strata-bench " << argv[0] << ": " << e.what() << "\n"
              << "try: strata-bench " << argv[0] << " --help\n";
    *exit_code = 2;
    return false;
  }
  return true;
}

Report::Report(std::string command) : command_(std::move(command)) {}

void Report::Add(nlohmann::json row) {
  // Echo each row as it is measured: a long run killed part-way still shows
  // what it had (the table comes at the end).
  ClearProgressLine();
  std::cerr << "  measured: " << row.dump() << "\n";
  rows_.push_back(std::move(row));
}

nlohmann::json Report::WithRatio(nlohmann::json row, double value, double baseline) {
  row["value"] = value;
  row["baseline"] = baseline;
  row["ratio"] = baseline > 0 ? value / baseline : 0.0;
  return row;
}

void Report::Note(std::string line) { notes_.push_back(std::move(line)); }

std::string ReportCell(const nlohmann::json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    std::ostringstream os;
    double a = std::abs(d);
    os << std::fixed << std::setprecision(a == 0 ? 0 : a < 0.01 ? 5 : a < 10 ? 3 : a < 1000 ? 2 : 0)
       << d;
    return os.str();
  }
  return v.dump();
}

std::vector<std::string> ReportColumns(const std::vector<nlohmann::json>& rows) {
  std::vector<std::string> cols;
  for (const auto& r : rows)
    for (auto it = r.begin(); it != r.end(); ++it)
      if (std::find(cols.begin(), cols.end(), it.key()) == cols.end()) cols.push_back(it.key());
  // nlohmann::json objects iterate in key order; put the figure columns last.
  static const char* kLast[] = {"value", "unit", "baseline", "baseline_name", "ratio"};
  std::vector<std::string> ordered;
  for (const auto& c : cols)
    if (std::find(std::begin(kLast), std::end(kLast), c) == std::end(kLast)) ordered.push_back(c);
  for (const char* c : kLast)
    if (std::find(cols.begin(), cols.end(), c) != cols.end()) ordered.push_back(c);
  return ordered;
}

void Report::Print() const {
  ClearProgressLine();
  const std::vector<std::string> ordered = ReportColumns(rows_);
  std::vector<size_t> width(ordered.size());
  for (size_t i = 0; i < ordered.size(); ++i) width[i] = ordered[i].size();
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : rows_) {
    std::vector<std::string> line;
    for (size_t i = 0; i < ordered.size(); ++i) {
      std::string c = r.contains(ordered[i]) ? ReportCell(r[ordered[i]]) : "";
      width[i] = std::max(width[i], c.size());
      line.push_back(std::move(c));
    }
    cells.push_back(std::move(line));
  }
  auto print_line = [&](const std::vector<std::string>& line) {
    for (size_t i = 0; i < line.size(); ++i)
      std::cout << (i ? "  " : "") << std::setw(static_cast<int>(width[i])) << line[i];
    std::cout << "\n";
  };
  print_line(ordered);
  for (const auto& l : cells) print_line(l);
  for (const auto& n : notes_) std::cout << "  " << n << "\n";
  std::cout.flush();
}

Status Report::WriteJson(const std::string& path) const {
  if (path.empty()) return Status::OK();
  nlohmann::json j;
  j["command"] = command_;
  j["machine"] = MachineInfo();
  j["meta"] = meta_;
  j["rows"] = rows_;
  j["notes"] = notes_;
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) return ErrnoStatus("cannot create JSON output", tmp);
    f << j.dump(2) << "\n";
    f.flush();
    if (!f) return ErrnoStatus("cannot write JSON output", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus("cannot rename JSON output", path);
  return Status::OK();
}

Status Report::WriteCsv(const std::string& path) const { return bench::WriteCsv(rows_, path); }

Status WriteCsv(const std::vector<nlohmann::json>& rows, const std::string& path) {
  if (path.empty()) return Status::OK();
  auto quote = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  const std::vector<std::string> cols = ReportColumns(rows);
  std::ostringstream os;
  for (size_t i = 0; i < cols.size(); ++i) os << (i ? "," : "") << quote(cols[i]);
  os << "\n";
  for (const auto& r : rows) {
    for (size_t i = 0; i < cols.size(); ++i) {
      std::string cell;
      if (r.contains(cols[i])) cell = r[cols[i]].is_string() ? r[cols[i]].get<std::string>() : r[cols[i]].dump();
      os << (i ? "," : "") << quote(cell);
    }
    os << "\n";
  }
  std::ofstream f(path);
  if (!f) return ErrnoStatus("cannot create CSV output", path);
  f << os.str();
  f.flush();
  if (!f) return ErrnoStatus("cannot write CSV output", path);
  return Status::OK();
}

Result<BenchDir> BenchDir::Make(const std::string& path) {
  std::string parent = path;
  if (parent.empty()) {
    const char* base = std::getenv("TMPDIR");
    parent = base && *base ? base : "/var/tmp";
  } else {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
      return NotFound("--dir " + path + " does not exist (strata-bench never creates the directory it is "
                      "given: make it on the drive to measure, e.g. mkdir -p " + path + ")");
    if (!S_ISDIR(st.st_mode)) return InvalidArgument("--dir " + path + " is not a directory");
  }
  RemoveStaleBenchDirs(parent);
  std::string tmpl = parent + "/strata-bench.XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr)
    return ErrnoStatus("cannot create a directory for the benchmark's files", tmpl);
  BenchDir dir(tmpl);
  // Held while the directory lives, with this process's PID: a later run
  // tells it from one a killed run left.
  const std::string owner = tmpl + "/.owner";
  dir.lock_fd_ = ::open(owner.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (dir.lock_fd_ < 0 || ::flock(dir.lock_fd_, LOCK_EX | LOCK_NB) != 0)
    return ErrnoStatus("cannot lock the benchmark's directory", owner);
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::pwrite(dir.lock_fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    return ErrnoStatus("cannot write", owner);
  return dir;
}

void BenchDir::RemoveStaleBenchDirs(const std::string& parent) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("strata-bench.", 0) != 0 || !e.is_directory(ec)) continue;
    // Only a directory with an owner file (strata-bench's own) whose lock is
    // free and whose process is gone; anything else stays.
    const int fd = ::open((e.path() / ".owner").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    const long pid = n > 0 ? std::strtol(buf, nullptr, 10) : 0;
    const bool gone = ::flock(fd, LOCK_EX | LOCK_NB) == 0 && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 &&
                      errno == ESRCH;
    ::close(fd);
    if (!gone) continue;
    std::filesystem::remove_all(e.path(), ec);
    if (!ec)
      std::cerr << "strata-bench: removed " << e.path().string() << ", left by process " << pid
                << ", which was killed before it could\n";
  }
}

BenchDir::BenchDir(BenchDir&& o) noexcept : path_(std::move(o.path_)), owned_(o.owned_), lock_fd_(o.lock_fd_) {
  o.owned_ = false;
  o.lock_fd_ = -1;
}

BenchDir::~BenchDir() {
  if (owned_) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::json MachineInfo() {
  nlohmann::json m;
  std::ifstream cpu("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpu, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) m["cpu"] = line.substr(p + 2);
      break;
    }
  }
  m["cores"] = std::thread::hardware_concurrency();
  if (Result<HostMemoryInfo> hm = QueryHostMemory(); hm.ok()) m["memory_bytes"] = hm->total_bytes;
  auto gpu = QueryGpu(0);
  if (gpu.ok()) {
    m["gpu"] = gpu->name;
    m["gpu_memory_bytes"] = gpu->total_bytes;
  } else {
    m["gpu"] = nullptr;
  }
#ifndef NDEBUG
  m["warning"] = "built without NDEBUG (not a Release build): figures are not representative";
#endif
  return m;
}

void Die(const Status& s, const char* what) {
  throw BenchFailure(std::string(what) + " failed: " + s.ToString());
}

}  // namespace strata::bench
