// SPDX-License-Identifier: Apache-2.0
#include "engine/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>

#include "base/device.h"
#include "engine/hostfile.h"
#include "engine/process_group.h"
#include "engine/rank_binding.h"

extern char** environ;

namespace strata {

namespace {

constexpr int kDefaultPort = 29500;  // torchrun's
const std::set<std::string> kOwnOptions = {"--num-gpus",   "--num-ranks",   "--hostfile", "--master-addr",
                                           "--master-port", "--launcher-args", "--backend"};

// The int in environment variable `var`, `fallback` when unset.
Result<int> EnvInt(const char* var, int fallback, int lo, int hi) {
  const char* v = std::getenv(var);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi)
    return InvalidArgument(std::string("environment variable ") + var + "=\"" + v + "\" is not an integer in [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(n);
}

std::vector<std::string> Words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

// The running strata binary, for the ranks (the same on every host).
Result<std::string> Self() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return IoError("reading the strata binary the ranks run", ec.value(), "/proc/self/exe");
  return p.string();
}

// 'text' for a POSIX shell.
std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string MasterAddr(const LaunchFlags& f, const std::vector<HostSlots>* hosts) {
  if (!f.master_addr.empty()) return f.master_addr;
  return hosts ? hosts->front().host : "127.0.0.1";
}

// The CPU backend's ranks: mpirun -n N (--hostfile) strata train ...
std::vector<ChildSpec> MpirunChildren(const LaunchFlags& f, int n, const std::string& self,
                                      const std::vector<std::string>& args) {
  const char* m = std::getenv("STRATA_MPIRUN");
  ChildSpec c;
  c.label = "mpirun";
  c.mpirun_tagged = true;
  c.stop_as = SIGUSR1;  // (engine/signals.h)
  c.argv = {m && *m ? m : "mpirun", "-n", std::to_string(n), "--tag-output", "--mca", "odls_base_sigkill_timeout",
            std::to_string(static_cast<int>(kStopGraceS))};
  if (!f.hostfile.empty()) c.argv.insert(c.argv.end(), {"--hostfile", f.hostfile});
  for (std::string& w : Words(f.launcher_args)) c.argv.push_back(std::move(w));
  c.argv.insert(c.argv.end(), {self, "train"});
  c.argv.insert(c.argv.end(), args.begin(), args.end());
  c.argv.insert(c.argv.end(), {"--backend", "cpu"});
  return {c};
}

// This machine's GPU ranks: rank0 .. rank0 + n - 1 of `world`.
Result<std::vector<ChildSpec>> GpuChildren(const LaunchFlags& f, int n, const std::string& self,
                                           const std::vector<std::string>& args,
                                           std::optional<RankBindings>* bindings,
                                           std::ostream& err) {
  std::string why;
  const int visible = CudaDeviceCount(&why);
  if (visible == 0)
    return Unavailable("--num-gpus " + std::to_string(n) + ": " + why +
                       "; CPU-backend ranks run with --backend cpu --num-ranks " + std::to_string(n));
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  if (n > visible)
    return InvalidArgument("--num-gpus " + std::to_string(n) + " but this machine shows " + std::to_string(visible) +
                           " GPU" + (visible == 1 ? "" : "s") +
                           (cvd ? std::string(" (CUDA_VISIBLE_DEVICES=") + cvd + ")" : std::string()));
  ASSIGN_OR_RETURN(const int rank0, EnvInt("STRATA_LAUNCH_RANK0", 0, 0, 1 << 20));
  ASSIGN_OR_RETURN(const int world, EnvInt("STRATA_LAUNCH_WORLD", rank0 + n, 1, 1 << 20));
  if (rank0 + n > world)
    return InvalidArgument("STRATA_LAUNCH_RANK0=" + std::to_string(rank0) + " + --num-gpus " + std::to_string(n) +
                           " is more than STRATA_LAUNCH_WORLD=" + std::to_string(world));
  std::vector<std::string> bus(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) bus[static_cast<size_t>(i)] = GpuPciBusId(i).value_or("");
  bindings->emplace(RankBindings::ForGpus(bus));
  const RankBindings* kept = &**bindings;  // (Launch holds it while the children start)
  const std::string addr = MasterAddr(f, nullptr);
  const int port = f.master_port ? f.master_port : kDefaultPort;
  err << "strata: launching ranks " << rank0 << ".." << rank0 + n - 1 << " of " << world
      << " on this machine's GPUs 0.." << n - 1 << " (master " << addr << ":" << port << ")\n";
  std::vector<ChildSpec> out;
  for (int i = 0; i < n; ++i) {
    const size_t li = static_cast<size_t>(i);
    err << "strata: rank " << rank0 + i << ": GPU " << i << (bus[li].empty() ? "" : " (" + bus[li] + ")") << ", "
        << kept->Describe(li) << "\n";
    ChildSpec c;
    c.label = "rank " + std::to_string(rank0 + i);
    c.argv = {self, "train"};
    c.argv.insert(c.argv.end(), args.begin(), args.end());
    c.argv.insert(c.argv.end(), {"--backend", "cuda"});
    c.env = {{"RANK", std::to_string(rank0 + i)},  {"WORLD_SIZE", std::to_string(world)},
             {"LOCAL_RANK", std::to_string(i)},     {"LOCAL_WORLD_SIZE", std::to_string(n)},
             {"MASTER_ADDR", addr},                 {"MASTER_PORT", std::to_string(port)}};
    c.prepare = [kept, li] { return kept->Bind(li); };
    out.push_back(std::move(c));
  }
  return out;
}

// One ssh per host, each running that host's launcher.
Result<std::vector<ChildSpec>> SshChildren(const LaunchFlags& f, const std::vector<HostSlots>& hosts,
                                           const std::string& self, const std::vector<std::string>& args,
                                           std::ostream& err) {
  std::vector<int> per_host;
  int world = 0;
  for (const HostSlots& h : hosts) {
    if (f.num_gpus > h.slots)
      return InvalidArgument("--num-gpus " + std::to_string(f.num_gpus) + " but host " + h.host + " has slots=" +
                             std::to_string(h.slots) + " in hostfile " + f.hostfile);
    per_host.push_back(f.num_gpus > 0 ? f.num_gpus : h.slots);
    world += per_host.back();
  }
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  if (ec) return IoError("reading the working directory (the ranks' on every host)", ec.value());
  const std::string addr = MasterAddr(f, &hosts);
  const int port = f.master_port ? f.master_port : kDefaultPort;
  std::string passed;  // the variables passed on
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    const std::string k = kv.substr(0, eq);
    if (eq == std::string::npos || k.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != std::string::npos)
      continue;
    if (k.rfind("NCCL_", 0) == 0 || k.rfind("UCX_", 0) == 0 ||
        (k.rfind("STRATA_", 0) == 0 && k.rfind("STRATA_LAUNCH_", 0) != 0))
      passed += " " + k + "=" + Quote(kv.substr(eq + 1));
  }
  err << "strata: launching " << world << " ranks on " << hosts.size() << " hosts of " << f.hostfile
      << " over ssh (master " << addr << ":" << port << ")\n";
  const char* ssh = std::getenv("STRATA_SSH");
  std::vector<ChildSpec> out;
  int rank0 = 0;
  for (size_t k = 0; k < hosts.size(); ++k) {
    std::string cmd = "cd " + Quote(cwd) + " && exec env STRATA_LAUNCH_RANK0=" + std::to_string(rank0) +
                      " STRATA_LAUNCH_WORLD=" + std::to_string(world) + passed + " " + Quote(self) + " train";
    for (const std::string& a : args) cmd += " " + Quote(a);
    cmd += " --num-gpus " + std::to_string(per_host[k]) + " --master-addr " + Quote(addr) + " --master-port " +
           std::to_string(port) + (f.backend == "auto" ? "" : " --backend " + f.backend);
    err << "strata: host " << hosts[k].host << ": ranks " << rank0 << ".." << rank0 + per_host[k] - 1 << "\n";
    ChildSpec c;
    c.label = "host " + hosts[k].host;
    c.argv = {ssh && *ssh ? ssh : "ssh"};
    for (std::string& w : Words(f.launcher_args)) c.argv.push_back(std::move(w));
    c.argv.insert(c.argv.end(), {hosts[k].host, cmd});
    out.push_back(std::move(c));
    rank0 += per_host[k];
  }
  return out;
}

}  // namespace

bool StartedByLauncher(const std::function<const char*(const char*)>& getenv) {
  for (const char* v : {"WORLD_SIZE", "RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* s = getenv(v);
    if (s && *s) return true;
  }
  return false;
}

Status CheckLaunchFlags(const LaunchFlags& f) {
  for (auto [flag, v] : {std::pair{"--num-gpus", f.num_gpus}, std::pair{"--num-ranks", f.num_ranks}})
    if (v < 0 || v > 4096)
      return InvalidArgument(std::string(flag) + " " + std::to_string(v) + ": must be from 1 to 4096");
  if (f.num_gpus > 0 && f.num_ranks > 0)
    return InvalidArgument("--num-gpus and --num-ranks exclude each other (GPU ranks or CPU ranks)");
  if (f.num_gpus > 0 && f.backend == "cpu")
    return InvalidArgument("--num-gpus is for the CUDA backend; CPU-backend ranks (over MPI, under mpirun): "
                           "--backend cpu --num-ranks " + std::to_string(f.num_gpus));
  if (f.num_ranks > 0 && f.backend != "cpu")
    return InvalidArgument("--num-ranks starts CPU-backend ranks (over MPI): give --backend cpu; GPU ranks: "
                           "--num-gpus " + std::to_string(f.num_ranks));
  if (f.master_port != 0 && (f.master_port < 1 || f.master_port > 65535))
    return InvalidArgument("--master-port " + std::to_string(f.master_port) + ": must be from 1 to 65535");
  const bool launch = WantsLaunch(f);
  if (!launch && (!f.master_addr.empty() || f.master_port != 0 || !f.launcher_args.empty()))
    return InvalidArgument(std::string(!f.master_addr.empty() ? "--master-addr" : f.master_port ? "--master-port"
                                                                                                 : "--launcher-args") +
                           " is for a launch: give --num-gpus N, --num-ranks N (--backend cpu) or --hostfile FILE");
  if (f.num_ranks > 0 && (!f.master_addr.empty() || f.master_port != 0))
    return InvalidArgument("--master-addr and --master-port are NCCL's rendezvous; CPU ranks meet through mpirun");
  return Status::OK();
}

std::vector<std::string> RankTrainArgs(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::string name = a.substr(0, a.find('='));
    if (kOwnOptions.count(name)) {
      if (name == a) ++i;  // "--opt V": skip V too
      continue;
    }
    out.push_back(a);
  }
  return out;
}

Result<int> Launch(const LaunchFlags& f, const std::vector<std::string>& train_args, std::ostream& out,
                   std::ostream& err) {
  RETURN_IF_ERROR(CheckLaunchFlags(f));
  ASSIGN_OR_RETURN(const std::string self, Self());
  const std::vector<std::string> args = RankTrainArgs(train_args);
  std::vector<ChildSpec> children;
  std::optional<RankBindings> bindings;
  if (!f.hostfile.empty()) {
    ASSIGN_OR_RETURN(const std::vector<HostSlots> hosts, ReadHostfile(f.hostfile));
    if (f.backend == "cpu") {
      int n = 0;
      for (const HostSlots& h : hosts) n += h.slots;
      if (f.num_ranks > 0) n = f.num_ranks;
      children = MpirunChildren(f, n, self, args);
    } else {
      ASSIGN_OR_RETURN(children, SshChildren(f, hosts, self, args, err));
    }
  } else if (f.num_ranks > 0) {
    children = MpirunChildren(f, f.num_ranks, self, args);
  } else {
    ASSIGN_OR_RETURN(children, GpuChildren(f, f.num_gpus, self, args, &bindings, err));
  }
  GroupResult r = ProcessGroup(kStopGraceS).Run(children, out, err);
  return r.exit_code;
}

Status PretendRankZero(const LaunchFlags& f) {
  RETURN_IF_ERROR(CheckLaunchFlags(f));
  int world = f.num_gpus > 0 ? f.num_gpus : f.num_ranks, local = world;
  if (!f.hostfile.empty()) {
    ASSIGN_OR_RETURN(const std::vector<HostSlots> hosts, ReadHostfile(f.hostfile));
    world = 0;
    for (const HostSlots& h : hosts) world += f.num_gpus > 0 && f.backend != "cpu" ? f.num_gpus : h.slots;
    if (f.backend == "cpu" && f.num_ranks > 0) world = f.num_ranks;
    local = f.backend != "cpu" && f.num_gpus > 0 ? f.num_gpus : hosts.front().slots;
    ::setenv("MASTER_ADDR", MasterAddr(f, &hosts).c_str(), 1);
  }
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("RANK", "0", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(std::min(local, world)).c_str(), 1);
  return Status::OK();
}

}  // namespace strata
