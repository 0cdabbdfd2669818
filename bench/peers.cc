// SPDX-License-Identifier: Apache-2.0
#include "bench/peers.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

#include "base/bytes.h"
#include "bench/args.h"

extern char** environ;

namespace strata::bench {

namespace {

#ifndef STRATA_PEERS_DIR
#define STRATA_PEERS_DIR "bench/peers"
#endif

constexpr const char* kScript = "train_peers.py";
constexpr const char* kPeers[] = {"eager", "compile", "fsdp2-offload", "deepspeed-zero3-offload",
                                  "deepspeed-zero2-offload"};

bool IsFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The script: the source tree's, else peers/ next to this binary; empty
// (and *tried says where it looked) when neither has it.
std::string FindScript(std::string* tried) {
  std::vector<std::string> places = {std::string(STRATA_PEERS_DIR) + "/" + kScript};
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    places.push_back(dir + "/peers/" + kScript);
  }
  for (const auto& p : places) {
    if (IsFile(p)) return p;
    *tried += (tried->empty() ? "" : ", ") + p;
  }
  return "";
}

// Runs argv (argv[0] looked up in PATH) to its end, stdin from /dev/null and,
// when `quiet`, stdout and stderr to /dev/null; the exit code, 128 + N when
// killed by signal N, -1 when it could not start (errno in *err).
int RunChild(const std::vector<std::string>& argv, bool quiet, int* err) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  if (quiet) {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }
  std::vector<std::string> copy = argv;
  std::vector<char*> args;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  std::cout << std::flush;
  std::cerr << std::flush;
  pid_t pid = -1;
  *err = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (*err != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The first Python that imports torch: $STRATA_TORCH_PYTHON alone when set,
// else python3, else /usr/bin/python3. Empty, with *tried saying what each
// candidate did, when none does.
std::string FindTorchPython(std::string* tried) {
  const char* named = std::getenv("STRATA_TORCH_PYTHON");
  std::vector<std::string> candidates;
  if (named && *named)
    candidates = {named};
  else
    candidates = {"python3", "/usr/bin/python3"};
  for (const auto& py : candidates) {
    int err = 0;
    const int rc = RunChild({py, "-c", "import torch"}, true, &err);
    if (rc == 0) return py;
    *tried += (tried->empty() ? "" : "; ") + (named && *named ? "STRATA_TORCH_PYTHON=" : std::string()) + py +
              (rc < 0 ? ": cannot run it (" + std::string(std::strerror(err)) + ")" : ": cannot import torch");
  }
  return "";
}

std::vector<std::string> ScriptArgs(const std::string& py, const std::string& script, const PeerRun& r,
                                    const std::string& json) {
  std::ostringstream clip;
  clip << r.clip;
  std::vector<std::string> a = {py,          script,
                                "--layers",  std::to_string(r.layers),
                                "--d-model", std::to_string(r.d),
                                "--heads",   std::to_string(r.heads),
                                "--seq",     std::to_string(r.seq),
                                "--vocab",   std::to_string(r.vocab),
                                "--micro-batch", std::to_string(r.batch),
                                "--accum",   std::to_string(r.accum),
                                "--steps",   std::to_string(r.steps),
                                "--warmup",  std::to_string(r.warmup),
                                "--step",    r.train ? "train" : "fwd-bwd",
                                "--clip",    clip.str(),
                                "--checkpoint", r.checkpoint,
                                "--dtype",   r.dtype,
                                "--device",  r.cpu ? "cpu" : "cuda",
                                "--json",    json};
  if (!r.peers.empty()) a.insert(a.end(), {"--peers", r.peers});
  return a;
}

// The script's JSON, or why there is none.
std::optional<nlohmann::json> ReadJson(const std::string& path, std::string* why) {
  std::ifstream f(path);
  if (!f) {
    *why = "wrote no " + path;
    return std::nullopt;
  }
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.contains("rows") || !j["rows"].is_array()) {
    *why = path + " is not the script's JSON";
    return std::nullopt;
  }
  return j;
}

// strata beside each peer: the peer's tokens/s the baseline, ratio strata / peer.
void PrintBeside(const nlohmann::json& rows, double strata_tps, nlohmann::json& out) {
  Report side("train --peers");
  for (const auto& r : rows) {
    const std::string peer = r.value("peer", "?"), status = r.value("status", "?");
    nlohmann::json row = {{"figure", "tokens/s vs " + peer}, {"unit", "tok/s"}};
    if (status == "ok" && r.value("tokens_per_s", 0.0) > 0) {
      row["baseline_name"] = peer + ": " + r.value("what", "");
      row["peer GPU peak"] = r.contains("gpu_peak_bytes") ? FormatBytes(r["gpu_peak_bytes"].get<uint64_t>())
                                                          : std::string("-");
      row = Report::WithRatio(row, strata_tps, r["tokens_per_s"].get<double>());
    } else {
      row["value"] = strata_tps;
      row["baseline_name"] = peer + ": " + status;
    }
    side.Add(row);
    out.push_back(row);
  }
  side.Note("ratio = strata's tokens/s / the peer's; each peer ran in a process of its own after strata's run");
  std::cout << "\nstrata beside its peers (same shape, same run):\n";
  side.Print();
}

void Skip(const std::string& why, Report& report) {
  std::cout << "peers: skipped: " << why << "\n";
  report.meta()["peers"] = {{"skipped", why}};
}

}  // namespace

const char* PeerNames() { return "eager, compile, fsdp2-offload, deepspeed-zero3-offload, deepspeed-zero2-offload"; }

void CheckPeerList(const std::string& list) {
  std::stringstream ss(list);
  std::string name;
  bool any = false;
  while (std::getline(ss, name, ',')) {
    if (name.empty()) continue;  // "eager,,compile" as the script reads it
    bool known = false;
    for (const char* p : kPeers) known |= name == p;
    if (!known) RefuseArgument("--peer-list '" + name + "': not a peer (known: " + PeerNames() + ")");
    any = true;
  }
  if (!any) RefuseArgument("--peer-list '" + list + "': names no peer (known: " + PeerNames() + ")");
}

void RunPeers(const PeerRun& run, double strata_tokens_per_s, Report& report) {
  std::string tried;
  const std::string script = FindScript(&tried);
  if (script.empty()) return Skip("the peer script is not here (looked at " + tried + ")", report);
  tried.clear();
  const std::string py = FindTorchPython(&tried);
  if (py.empty())
    return Skip("no Python here imports torch (" + tried +
                    "); set STRATA_TORCH_PYTHON to one that does (scripts/install-deps.sh installs python3-torch)",
                report);
  BenchDir dir = BENCH_VALUE(BenchDir::Make(""));
  const std::string json = dir.path() + "/peers.json";
  std::cout << "\npeers: " << py << " " << script << "\n";
  int err = 0;
  const int rc = RunChild(ScriptArgs(py, script, run, json), false, &err);
  std::string why;
  std::optional<nlohmann::json> j = rc < 0 ? std::nullopt : ReadJson(json, &why);
  if (rc < 0) why = "cannot run " + py + ": " + std::strerror(err);
  if (j && j->contains("skipped")) return Skip((*j)["skipped"].get<std::string>(), report);
  if (!j) return Skip(script + " exited " + std::to_string(rc) + " and " + why, report);
  nlohmann::json rows = nlohmann::json::array();
  PrintBeside((*j)["rows"], strata_tokens_per_s, rows);
  report.meta()["peers"] = {{"python", py}, {"script", script}, {"exit", rc}, {"strata_tokens_per_s", strata_tokens_per_s},
                            {"beside", rows}, {"script_json", *j}};
}

}  // namespace strata::bench
