// SPDX-License-Identifier: Apache-2.0
// strata: the command-line front end.
//
//   strata train [--config FILE] [--data PATH] [--steps N] [--save DIR] [--save-every N]
//                [--resume DIR] [--allow-config-change] [--init-from FILE]
//                [--gpu-memory-limit SIZE] [--host-memory-limit SIZE]
//                [--dry-run] [--log-json FILE] [--trace FILE] [--backend auto|cpu|cuda] [--threads N]
//                [--optimizer-after-backward] [--no-speculative-update]
//                [--num-gpus N | --backend cpu --num-ranks N] [--hostfile FILE] [--partition-at-world-one]
//                [--master-addr ADDR] [--master-port PORT] [--launcher-args ARGS]
//                                          (several ranks: engine/launcher.h)
//   strata generate --model DIR [--prompt TEXT | --tokens IDS] ...   (engine/inference_cli.h)
//   strata eval --model DIR --data FILE [--batches N]                (engine/inference_cli.h)
//   strata report [--nvme PATH]... [--config FILE] [--json]   (engine/report.h)
//   strata plot LOG.jsonl [-o FILE.png]                       (engine/train_log_plot.h)
//   strata --version                                          the build: revision, compiler, CUDA, SIMD
//
// With no --config it trains the small default GPT on the bundled corpus
// (data/kjv.txt), on the GPU if there is one, else on the CPU backend.
//
// The command line is an input boundary like the config: a value given is
// used or refused, never replaced without a word (--steps -5, a zero memory
// limit, an empty path are errors); a misspelt option or command gets "did
// you mean"; files named are regular files, checked without blocking; a
// resume says what it would change of the checkpoint's config and refuses
// what would break bit-identity unless --allow-config-change.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <boost/program_options.hpp>

#include "base/bytes.h"
#include "base/device.h"
#include "comm/rank_env.h"
#include "engine/budgets.h"
#include "engine/checkpoint.h"
#include "engine/cli_parse.h"
#include "engine/config.h"
#include "engine/config_change.h"
#include "engine/config_json.h"
#include "engine/inference_cli.h"
#include "engine/launcher.h"
#include "engine/model_config.h"
#include "engine/report.h"
#include "engine/signals.h"
#include "engine/train_log_plot.h"
#include "engine/trainer.h"
#include "optim/cpu_features.h"

namespace po = boost::program_options;

namespace {

#ifndef STRATA_DATA_DIR
#define STRATA_DATA_DIR "data"
#endif
#ifndef STRATA_GIT_REVISION
#define STRATA_GIT_REVISION "unknown"
#endif
#ifndef STRATA_NVCC_VERSION
#define STRATA_NVCC_VERSION ""
#endif

std::string DefaultData() {
  const char* env = std::getenv("STRATA_DATA_DIR");
  return std::string(env && *env ? env : STRATA_DATA_DIR) + "/kjv.txt";
}

int Usage(std::ostream& os, int code) {
  os << "usage: strata train [options]     train a GPT (strata train --help)\n"
        "       strata generate [options] sample from a trained model (strata generate --help)\n"
        "       strata eval [options]     loss and perplexity of a model on a file (strata eval --help)\n"
        "       strata report [options]    what this machine offers, problems and fixes (strata report --help)\n"
        "       strata plot LOG.jsonl      loss and tokens/s curves of a --log-json file (strata plot --help)\n"
        "       strata --version           the build: revision, compiler, CUDA, SIMD paths\n";
  return code;
}

int Fail(const strata::Status& s) {
  std::cerr << "strata: " << s.ToString() << "\n";
  if (s.code() == strata::StatusCode::kCancelled && strata::StopSignal()) return 128 + strata::StopSignal();
  return s.code() == strata::StatusCode::kInvalidArgument ? 2 : 1;
}

// ---- strata --version ------------------------------------------------------------

std::string VersionText() {
  std::string s;
  for (const strata::ReportLine& l : strata::BuildFacts()) {
    if (l.name == "version") s = "strata " + l.value + " (git " + STRATA_GIT_REVISION + ")\n" + s;
    else s += l.name + ": " + l.value + (l.problem.empty() ? "" : " (" + l.problem + ")") + "\n";
  }
  s += std::string("CUDA: ") +
       (strata::BuiltWithCuda() ? std::string("yes, nvcc ") + STRATA_NVCC_VERSION : std::string("no")) + "\n";
  // The CPU Adam's paths: those compiled into this binary, and the one this
  // CPU takes (optim/cpu_features.h).
  std::string compiled = "scalar";
#if defined(__x86_64__)
  compiled += " avx2 avx512 avx512bf16";
#endif
  s += "CPU Adam SIMD paths compiled: " + compiled + "; this CPU takes " +
       std::string(strata::optim::IsaName(strata::optim::BestIsa())) + " (features: " +
       strata::optim::CpuFeatureString(strata::optim::DetectCpuFeatures()) + ")\n";
  return s;
}

// ---- strata train's flags --------------------------------------------------------

// The values of `strata train`'s flags.
struct TrainFlags {
  std::string config_path, data, save, resume, init_from, gpu_limit, host_limit, log_json, trace, backend = "auto";
  int64_t steps = -1, save_every = 0;
  int threads = 0;
  strata::LaunchFlags launch;  // several ranks (engine/launcher.h)
  bool dry_run = false, after_backward = false, no_speculation = false, allow_config_change = false,
       partition_one = false;
  po::variables_map given;  // which flags the command line gave
  std::string steps_help =
      "optimizer steps to train (default: trainer.steps, " + std::to_string(strata::TrainerConfig{}.steps) + ")";
  bool Given(const char* flag) const { return given.count(flag) > 0 && !given[flag].defaulted(); }
};

po::options_description TrainFlagsDescription(TrainFlags* f) {
  po::options_description desc("strata train options");
  desc.add_options()("help,h", "show this help")(
      "config", po::value(&f->config_path)->value_name("FILE"),
      "DeepSpeed-style ds_config.json with strata's model/data/trainer sections (default: the small built-in GPT)")(
      "data", po::value(&f->data)->value_name("PATH"), "training data: a text file or an llm.c/nanoGPT token file")(
      "steps", po::value(&f->steps)->value_name("N"), f->steps_help.c_str())(
      "save", po::value(&f->save)->value_name("DIR"), "write checkpoints under DIR (at the end, and every --save-every)")(
      "save-every", po::value(&f->save_every)->value_name("N"), "steps between checkpoints (needs --save)")(
      "resume", po::value(&f->resume)->value_name("DIR"),
      "continue from a checkpoint (a step directory or a --save DIR)")(
      "allow-config-change", po::bool_switch(&f->allow_config_change),
      "with --resume: accept config changes that make the run differ from an uninterrupted one (batch size, "
      "learning rate, precision, ...)")(
      "init-from", po::value(&f->init_from)->value_name("DIR|FILE"),
      "start from Hugging Face GPT-2 weights: a model directory (model.safetensors, or shards with "
      "model.safetensors.index.json; its tokenizer files go into every checkpoint) or a safetensors file, e.g. to "
      "fine-tune GPT-2")(
      "gpu-memory-limit", po::value(&f->gpu_limit)->value_name("SIZE"),
      "GPU memory strata may use, e.g. 24GiB (default: what the card has free)")(
      "host-memory-limit", po::value(&f->host_limit)->value_name("SIZE"),
      "pinned host memory strata may use (default: 80% of the available memory)")(
      "dry-run", po::bool_switch(&f->dry_run), "print the placement plan and exit")(
      "optimizer-after-backward", po::bool_switch(&f->after_backward),
      "update the offloaded optimizer state after the backward even without gradient clipping (same bits; "
      "a non-finite gradient then leaves the state untouched)")(
      "no-speculative-update", po::bool_switch(&f->no_speculation),
      "with gradient clipping, update after the backward instead of during it on speculation that the norm is "
      "within the threshold (same bits; saves the second master/m/v's host memory)")(
      "log-json", po::value(&f->log_json)->value_name("FILE"), "also append one JSON line per logged step to FILE")(
      "trace", po::value(&f->trace)->value_name("FILE"),
      "write a timeline of the run to FILE when it ends (Chrome trace-event JSON: the step's passes, each shard's "
      "update, each move between tiers, each wait; open it in ui.perfetto.dev); several ranks: FILE-rankN")(
      "backend", po::value(&f->backend)->value_name("NAME"), "auto, cpu or cuda")(
      "threads", po::value(&f->threads)->value_name("N"), "CPU threads for the CPU backend and CPU Adam (0: all)")(
      "partition-at-world-one", po::bool_switch(&f->partition_one),
      "with --num-gpus 1 (or another launcher's one rank) and zero_optimization.stage 1-3: take the partitioned "
      "path anyway, as DeepSpeed does (each slice is the whole unit; at stage 3 the parameters are gathered at each "
      "use), to measure or test it on one GPU; without it one rank runs stage 0's path")(
      "num-gpus", po::value(&f->launch.num_gpus)->value_name("N"),
      "data parallel: start N ranks, one per GPU of this machine (NCCL), each bound to its GPU's NUMA node; with "
      "--hostfile, N per host")(
      "num-ranks", po::value(&f->launch.num_ranks)->value_name("N"),
      "with --backend cpu: start N CPU-backend ranks under Open MPI's mpirun (they talk over MPI)")(
      "hostfile", po::value(&f->launch.hostfile)->value_name("FILE"),
      "start ranks on the hosts of FILE (DeepSpeed's format: \"HOST slots=N\" a line): over ssh on the CUDA "
      "backend, through mpirun on the CPU backend")(
      "master-addr", po::value(&f->launch.master_addr)->value_name("ADDR"),
      "rank 0's host for NCCL's rendezvous (default 127.0.0.1; with --hostfile, its first host)")(
      "master-port", po::value(&f->launch.master_port)->value_name("PORT"), "its TCP port (default 29500)")(
      "launcher-args", po::value(&f->launch.launcher_args)->value_name("ARGS"),
      "more arguments for mpirun (--num-ranks, --backend cpu --hostfile) or ssh (--hostfile), e.g. "
      "\"--oversubscribe\"");
  return desc;
}

// Parses argv into `f`; an unknown option gets the nearest known one.
strata::Status ParseTrainFlags(int argc, char** argv, const po::options_description& desc, TrainFlags* f) {
  // No prefix guessing: "--step" must not silently become "--steps" (nor
  // "--save" a later "--save-dir").
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).style(style).run(), f->given);
    po::notify(f->given);
  } catch (const po::unknown_option& e) {
    std::string opt = e.get_option_name();
    std::vector<std::string> names;
    for (const auto& o : desc.options()) names.push_back("--" + o->long_name());
    const std::string near = strata::Nearest(opt, names);
    return strata::InvalidArgument("strata train: unknown option " + opt +
                                   (near.empty() ? "" : "; did you mean " + near + "?") + " (strata train --help)");
  } catch (const std::exception& e) {
    return strata::InvalidArgument(std::string("strata train: ") + e.what() + " (strata train --help)");
  }
  return strata::Status::OK();
}

// A path given on the command line: not empty, and, when it exists, of the
// kind the flag needs (checked with stat, which never blocks on a FIFO).
strata::Status CheckPathFlag(const char* flag, const std::string& path, bool want_dir, bool must_exist) {
  if (path.empty()) return strata::InvalidArgument(std::string(flag) + " was given an empty path");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (must_exist) return strata::ErrnoStatus(std::string(flag) + ": cannot stat", path);
    return strata::Status::OK();
  }
  if (want_dir && !S_ISDIR(st.st_mode))
    return strata::InvalidArgument(std::string(flag) + " " + path + " is " +
                                   (S_ISREG(st.st_mode) ? "a file" : "not a directory") + "; give a directory");
  if (!want_dir && S_ISDIR(st.st_mode))
    return strata::InvalidArgument(std::string(flag) + " " + path + " is a directory; give a file");
  if (!want_dir && !S_ISREG(st.st_mode))
    return strata::InvalidArgument(std::string(flag) + " " + path + " is " +
                                   (S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISCHR(st.st_mode) ? "a character device"
                                                                                           : "not a regular file") +
                                   "; give a regular file");
  return strata::Status::OK();
}

// Values the flags cannot take. Every flag given is used as given: none
// falls back to its default without a word.
strata::Status CheckTrainFlags(const TrainFlags& f) {
  if (f.Given("steps") && f.steps < 1)
    return strata::InvalidArgument("--steps " + std::to_string(f.steps) + ": must be at least 1");
  if (f.Given("save-every") && f.save_every < 1)
    return strata::InvalidArgument("--save-every " + std::to_string(f.save_every) +
                                   ": must be at least 1 (leave it out to save only at the end)");
  if (f.Given("save-every") && !f.Given("save"))
    return strata::InvalidArgument("--save-every needs --save DIR (where the checkpoints go)");
  if (f.Given("threads") && (f.threads < 0 || f.threads > 4096))
    return strata::InvalidArgument("--threads " + std::to_string(f.threads) + ": must be from 0 (all) to 4096");
  if (f.threads > 0 && static_cast<unsigned>(f.threads) > std::thread::hardware_concurrency())
    std::cerr << "warning: --threads " << f.threads << " is more than the " << std::thread::hardware_concurrency()
              << " CPUs here: the threads will share them\n";
  if (f.backend != "auto" && f.backend != "cpu" && f.backend != "cuda")
    return strata::InvalidArgument("--backend \"" + f.backend + "\" is not allowed (allowed: auto, cpu, cuda)");
  if (f.Given("resume") && f.Given("init-from"))
    return strata::InvalidArgument("--resume and --init-from exclude each other (a checkpoint has its own weights)");
  if (f.allow_config_change && !f.Given("resume"))
    return strata::InvalidArgument("--allow-config-change is for --resume");
  if (f.Given("config")) RETURN_IF_ERROR(CheckPathFlag("--config", f.config_path, false, false));
  if (f.Given("data")) {
    RETURN_IF_ERROR(CheckPathFlag("--data", f.data, false, false));
    // The path is recorded in checkpoints' manifests (JSON, UTF-8).
    if (!strata::IsUtf8(f.data))
      return strata::InvalidArgument("--data: the path is not valid UTF-8: " + strata::PrintableText(f.data));
  }
  // --init-from: a model directory or a safetensors file.
  if (f.Given("init-from"))
    RETURN_IF_ERROR(CheckPathFlag("--init-from", f.init_from, std::filesystem::is_directory(f.init_from), true));
  if (f.Given("log-json")) RETURN_IF_ERROR(CheckPathFlag("--log-json", f.log_json, false, false));
  if (f.Given("trace")) RETURN_IF_ERROR(CheckPathFlag("--trace", f.trace, false, false));
  if (f.Given("save")) RETURN_IF_ERROR(CheckPathFlag("--save", f.save, true, false));
  if (f.Given("resume")) RETURN_IF_ERROR(CheckPathFlag("--resume", f.resume, true, true));
  return strata::Status::OK();
}

// The config: the file's, read with what the command line knows ("auto"
// values, the model of --init-from), or the built-in demo.
strata::Result<strata::Config> ConfigFrom(const TrainFlags& f) {
  strata::ConfigSources sources;
  sources.steps = f.Given("steps") ? f.steps : -1;
  // Started by a launcher as one of several ranks (engine/data_parallel.h):
  // the batch rule counts them.
  ASSIGN_OR_RETURN(sources.world_size, strata::LauncherWorldSize([](const char* v) { return std::getenv(v); }));
  std::optional<strata::WeightsModel> weights;
  if (!f.init_from.empty()) {
    ASSIGN_OR_RETURN(strata::WeightsModel w, strata::ModelFromHfWeights(f.init_from));
    sources.model_dtype = w.dtype;
    sources.model = w.model;
    weights = w;
  }
  if (f.config_path.empty()) {
    strata::Config c = strata::DefaultConfig();
    c.world_size = sources.world_size;
    c.train_batch_size = c.micro_batch * c.grad_accum * c.world_size;
    if (weights) {
      c.model = weights->model;
      if (weights->from_config_json)
        std::cerr << "model: " << weights->model.arch << " of " << weights->n_head_from << "\n";
      else
        std::cerr << "model: the shape of " << f.init_from << " (heads from " << weights->n_head_from << ")\n";
    }
    return c;
  }
  sources.require_model = f.init_from.empty();
  std::vector<std::string> warnings;
  auto c = strata::LoadConfig(f.config_path, sources, &warnings);
  for (const auto& w : warnings) std::cerr << "warning: " << w << "\n";
  return c;
}

// The run the flags ask for.
strata::Result<strata::TrainOptions> TrainOptionsFrom(const TrainFlags& f) {
  RETURN_IF_ERROR(CheckTrainFlags(f));
  strata::TrainOptions o;
  ASSIGN_OR_RETURN(o.config, ConfigFrom(f));
  if (!f.data.empty()) o.config.data.path = f.data;
  o.default_data = DefaultData();
  o.steps = f.Given("steps") ? f.steps : -1;
  o.save_dir = f.save;
  o.save_every = f.save_every;
  o.resume_dir = f.resume;
  o.init_from = f.init_from;
  o.log_json = f.log_json;
  o.trace_path = f.trace;
  o.backend = f.backend;
  o.cpu_threads = f.threads;
  o.optimizer_after_backward = f.after_backward;
  o.speculative_update = !f.no_speculation;
  o.progress = isatty(STDERR_FILENO) && isatty(STDOUT_FILENO);
  o.launched = strata::StartedByLauncher([](const char* v) { return std::getenv(v); });
  if (f.partition_one) {
    if (o.config.zero.stage < 1)
      return strata::InvalidArgument("--partition-at-world-one needs zero_optimization.stage 1, 2 or 3 (the config's "
                                     "is 0: nothing is partitioned)");
    if (!o.launched)
      return strata::InvalidArgument("--partition-at-world-one is for the ranks' path: start with --num-gpus 1 (or "
                                     "under a launcher)");
    o.partition_at_world_one = true;
  }
  for (auto [text, out, flag] : {std::tuple{&f.gpu_limit, &o.gpu_memory_limit, "--gpu-memory-limit"},
                                 std::tuple{&f.host_limit, &o.host_memory_limit, "--host-memory-limit"}}) {
    if (!f.Given(flag + 2)) continue;
    auto b = strata::ParseBytes(*text);
    if (!b.ok()) return b.status().WithContext(flag);
    if (*b == 0)
      return strata::InvalidArgument(std::string(flag) + " " + *text +
                                     ": must be more than 0 (leave it out for the default)");
    *out = *b;
  }
  return o;
}

// Before a resume: the checkpoint must have steps left to train, and the
// run's config may change only what keeps the uninterrupted run's bits
// unless --allow-config-change. Returns false (and says why) when there is
// nothing to do.
strata::Result<bool> CheckResume(const strata::TrainOptions& o, bool allow_change) {
  ASSIGN_OR_RETURN(strata::CheckpointManifest m, strata::ReadCheckpointManifest(o.resume_dir));
  const int64_t total = strata::TotalSteps(o);
  const std::string steps_from = o.steps >= 0 ? "--steps" : "trainer.steps";
  if (m.step > total)
    return strata::InvalidArgument("--resume " + m.path + " is at step " + std::to_string(m.step) +
                                   ", past the run's " + std::to_string(total) + " steps (" + steps_from +
                                   "): nothing to train; give --steps above " + std::to_string(m.step));
  if (m.step == total) {
    std::cerr << "strata: nothing to train: " << m.path << " is at step " << m.step << ", the run's last ("
              << steps_from << " " << total << "); give --steps above " << m.step << " to train further\n";
    return false;
  }
  if (m.config.is_null()) return true;
  std::vector<strata::ConfigChange> changes = strata::ConfigChanges(m.config, strata::ConfigToJson(o.config));
  std::string breaking;
  for (const strata::ConfigChange& c : changes) {
    std::cerr << "resume: config change: " << strata::DescribeChange(c) << "\n";
    if (c.breaks_identity) breaking += "\n  " + strata::DescribeChange(c);
  }
  if (!breaking.empty() && !allow_change)
    return strata::InvalidArgument("--resume " + m.path +
                                   ": the run's config changes what the checkpoint was trained with, so the resumed "
                                   "run would not continue it bit for bit:" +
                                   breaking + "\npass --allow-config-change to resume with the changes");
  return true;
}

int Train(int argc, char** argv) {
  TrainFlags f;
  const po::options_description desc = TrainFlagsDescription(&f);
  if (strata::Status s = ParseTrainFlags(argc, argv, desc, &f); !s.ok()) {
    std::cerr << s.message() << "\n";
    return 2;
  }
  if (f.given.count("help")) {
    std::cout << "usage: strata train [options]\n" << desc << "\n";
    return 0;
  }
  for (const char* flag : {"num-gpus", "num-ranks", "master-port"})
    if (f.Given(flag) && f.given[flag].as<int>() < 1)
      return Fail(strata::InvalidArgument("--" + std::string(flag) + " " + std::to_string(f.given[flag].as<int>()) +
                                          ": must be at least 1"));
  if (f.Given("master-addr") && f.launch.master_addr.empty())
    return Fail(strata::InvalidArgument("--master-addr was given an empty address"));
  if (f.Given("hostfile")) {
    if (strata::Status s = CheckPathFlag("--hostfile", f.launch.hostfile, false, true); !s.ok()) return Fail(s);
  }
  f.launch.backend = f.backend;
  if (strata::Status s = strata::CheckLaunchFlags(f.launch); !s.ok()) return Fail(s);
  if (strata::WantsLaunch(f.launch)) {
    const auto getenv = [](const char* v) { return std::getenv(v); };
    if (strata::StartedByLauncher(getenv)) {
      // Started by mpirun, torchrun or our own launcher: join as the rank given.
      std::cerr << "strata: started by a launcher (RANK/WORLD_SIZE or OMPI_COMM_WORLD_* set): joining its ranks; "
                   "--num-gpus, --num-ranks and --hostfile start none\n";
    } else if (f.dry_run) {
      if (strata::Status s = strata::PretendRankZero(f.launch); !s.ok()) return Fail(s);  // rank 0's plan
    } else {
      // The command line's own errors once, here, rather than from every rank.
      if (strata::Status s = CheckTrainFlags(f); !s.ok()) return Fail(s);
      auto code = strata::Launch(f.launch, std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
      if (!code.ok()) return Fail(code.status());
      return *code;
    }
  }
  auto o = TrainOptionsFrom(f);
  if (!o.ok()) return Fail(o.status());
  o->argv.assign(argv - 1, argv + argc);  // the JSON log's record of the command line ("strata", "train", ...)
  if (!o->resume_dir.empty()) {
    auto go = CheckResume(*o, f.allow_config_change);
    if (!go.ok()) return Fail(go.status());
    if (!*go) return 0;
  }
  if (f.dry_run) {
    auto plan = strata::Trainer::DryRun(*o);
    if (!plan.ok()) return Fail(plan.status());
    std::cout << *plan;
    return 0;
  }
  strata::InstallStopSignalHandlers();  // engine/signals.h: a signal ends the step, saves, exits 128 + N
  auto t = strata::Trainer::Create(*o, std::cerr);
  if (!t.ok()) return Fail(t.status());
  // Tests of the launcher (tests/engine/launcher_train.sh): the rank that
  // STRATA_TEST_FAIL_RANK names exits with status 3 once set up, as a rank
  // that dies would, while the others wait for it in the first step.
  if (const char* fail = std::getenv("STRATA_TEST_FAIL_RANK"); fail && *fail && o->launched) {
    auto env = strata::comm::RankEnvFromEnvironment();
    if (env.ok() && std::to_string(env->rank) == fail) {
      std::cerr << "strata: STRATA_TEST_FAIL_RANK=" << fail << ": rank " << fail << " exits with status 3\n";
      std::_Exit(3);  // (as a dying rank: no MPI_Finalize, which would wait for the others)
    }
  }
  strata::Status s = (*t)->Run(std::cout);
  if (!s.ok()) return Fail(s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage(std::cerr, 2);
  std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") return Usage(std::cout, 0);
  if (cmd == "--version" || cmd == "version") {
    std::cout << VersionText();
    return 0;
  }
  if (cmd == "train") return Train(argc - 1, argv + 1);
  if (cmd == "generate") return strata::RunGenerateCommand(argc - 1, argv + 1);
  if (cmd == "eval") return strata::RunEvalCommand(argc - 1, argv + 1);
  if (cmd == "report") return strata::RunReportCommand(argc - 1, argv + 1);
  if (cmd == "plot") return strata::RunPlotCommand(argc - 1, argv + 1);
  const std::string near = strata::Nearest(cmd, {"train", "generate", "eval", "report", "plot", "--version", "--help"});
  std::cerr << "strata: unknown command '" << strata::PrintableText(cmd) << "'"
            << (near.empty() ? "" : "; did you mean '" + near + "'?") << "\n";
  return Usage(std::cerr, 2);
}
