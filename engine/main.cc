// strata: the command-line front end.
//
//   strata train [--config FILE] [--data PATH] [--steps N] [--save DIR] [--save-every N]
//                [--resume DIR] [--gpu-memory-limit SIZE] [--host-memory-limit SIZE]
//                [--dry-run] [--log-json FILE] [--backend auto|cpu|cuda] [--threads N]
//                [--optimizer-after-backward] [--no-speculative-update]
//   strata report [--nvme PATH]... [--config FILE] [--json]   (engine/report.h)
//   strata plot LOG.jsonl [-o FILE.png]                       (engine/train_log_plot.h)
//
// With no --config it trains the small default GPT on the bundled corpus
// (data/kjv.txt), on the GPU if there is one, else on the CPU backend.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <tuple>

#include <boost/program_options.hpp>

#include "base/bytes.h"
#include "engine/config.h"
#include "engine/report.h"
#include "engine/signals.h"
#include "engine/train_log_plot.h"
#include "engine/trainer.h"

namespace po = boost::program_options;

namespace {

#ifndef STRATA_DATA_DIR
#define STRATA_DATA_DIR "data"
#endif

std::string DefaultData() {
  const char* env = std::getenv("STRATA_DATA_DIR");
  return std::string(env && *env ? env : STRATA_DATA_DIR) + "/kjv.txt";
}

int Usage(std::ostream& os, int code) {
  os << "usage: strata train [options]     train a GPT (strata train --help)\n"
        "       strata report [options]    what this machine offers, problems and fixes (strata report --help)\n"
        "       strata plot LOG.jsonl      loss and tokens/s curves of a --log-json file (strata plot --help)\n"
        "       strata --version\n";
  return code;
}

int Fail(const strata::Status& s) {
  std::cerr << "strata: " << s.ToString() << "\n";
  if (s.code() == strata::StatusCode::kCancelled && strata::StopSignal()) return 128 + strata::StopSignal();
  return s.code() == strata::StatusCode::kInvalidArgument ? 2 : 1;
}

// The values of `strata train`'s flags.
struct TrainFlags {
  std::string config_path, data, save, resume, init_from, gpu_limit, host_limit, log_json, backend = "auto";
  int64_t steps = -1, save_every = 0;
  int threads = 0;
  bool dry_run = false, after_backward = false, no_speculation = false;
  std::string steps_help =
      "optimizer steps to train (default: trainer.steps, " + std::to_string(strata::TrainerConfig{}.steps) + ")";
};

po::options_description TrainFlagsDescription(TrainFlags* f) {
  po::options_description desc("strata train options");
  desc.add_options()("help,h", "show this help")(
      "config", po::value(&f->config_path)->value_name("FILE"),
      "DeepSpeed-style ds_config.json with strata's model/data/trainer sections (default: the small built-in GPT)")(
      "data", po::value(&f->data)->value_name("PATH"), "training data: a text file or an llm.c/nanoGPT token file")(
      "steps", po::value(&f->steps)->value_name("N"), f->steps_help.c_str())(
      "save", po::value(&f->save)->value_name("DIR"), "write checkpoints under DIR (at the end, and every --save-every)")(
      "save-every", po::value(&f->save_every)->value_name("N"), "steps between checkpoints")(
      "resume", po::value(&f->resume)->value_name("DIR"),
      "continue from a checkpoint (a step directory or a --save DIR)")(
      "init-from", po::value(&f->init_from)->value_name("DIR|FILE"),
      "start from Hugging Face GPT-2 weights: a model directory (its model.safetensors; its tokenizer files go into "
      "every checkpoint) or a model.safetensors, e.g. to fine-tune GPT-2")(
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
      "backend", po::value(&f->backend)->value_name("NAME"), "auto, cpu or cuda")(
      "threads", po::value(&f->threads)->value_name("N"), "CPU threads for the CPU backend and CPU Adam (0: all)");
  return desc;
}

// The run the flags ask for; config warnings go to stderr.
strata::Result<strata::TrainOptions> TrainOptionsFrom(const TrainFlags& f) {
  strata::TrainOptions o;
  std::vector<std::string> warnings;
  if (!f.config_path.empty()) {
    ASSIGN_OR_RETURN(o.config, strata::LoadConfig(f.config_path, 1, &warnings));
  }
  for (const auto& w : warnings) std::cerr << "warning: " << w << "\n";
  if (!f.data.empty()) o.config.data.path = f.data;
  o.default_data = DefaultData();
  o.steps = f.steps;
  o.save_dir = f.save;
  o.save_every = f.save_every;
  o.resume_dir = f.resume;
  o.init_from = f.init_from;
  if (!f.resume.empty() && !f.init_from.empty())
    return strata::InvalidArgument("--resume and --init-from exclude each other (a checkpoint has its own weights)");
  o.log_json = f.log_json;
  o.backend = f.backend;
  o.cpu_threads = f.threads;
  o.optimizer_after_backward = f.after_backward;
  o.speculative_update = !f.no_speculation;
  o.progress = isatty(STDERR_FILENO) && isatty(STDOUT_FILENO);
  if (f.steps == 0) return strata::InvalidArgument("--steps must be at least 1");
  if (f.save_every < 0) return strata::InvalidArgument("--save-every must not be negative");
  for (auto [text, out, flag] : {std::tuple{&f.gpu_limit, &o.gpu_memory_limit, "--gpu-memory-limit"},
                                 std::tuple{&f.host_limit, &o.host_memory_limit, "--host-memory-limit"}}) {
    if (text->empty()) continue;
    auto b = strata::ParseBytes(*text);
    if (!b.ok()) return b.status().WithContext(flag);
    *out = *b;
  }
  return o;
}

int Train(int argc, char** argv) {
  TrainFlags f;
  const po::options_description desc = TrainFlagsDescription(&f);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: strata train [options]\n" << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "strata train: " << e.what() << "\n";
    return Usage(std::cerr, 2);
  }
  // Started by a multi-process launcher: each process would train the whole
  // model alone (and write the same checkpoints). Refuse before anything.
  auto world = strata::LauncherWorldSize([](const char* v) { return std::getenv(v); });
  if (!world.ok()) return Fail(world.status());
  if (*world != 1)
    return Fail(strata::Unavailable(
        "started as one of " + std::to_string(*world) +
        " processes (the launcher's world size): strata train runs one process on one GPU so far, and every "
        "process would train the whole model alone and write the same checkpoints; start it without the launcher"));
  auto o = TrainOptionsFrom(f);
  if (!o.ok()) return Fail(o.status());
  o->argv.assign(argv - 1, argv + argc);  // the JSON log's record of the command line ("strata", "train", ...)
  if (f.dry_run) {
    auto plan = strata::Trainer::DryRun(*o);
    if (!plan.ok()) return Fail(plan.status());
    std::cout << *plan;
    return 0;
  }
  strata::InstallStopSignalHandlers();  // engine/signals.h: a signal ends the step, saves, exits 128 + N
  auto t = strata::Trainer::Create(*o, std::cerr);
  if (!t.ok()) return Fail(t.status());
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
    std::cout << "strata 0.1.0\n";
    return 0;
  }
  if (cmd == "train") return Train(argc - 1, argv + 1);
  if (cmd == "report") return strata::RunReportCommand(argc - 1, argv + 1);
  if (cmd == "plot") return strata::RunPlotCommand(argc - 1, argv + 1);
  std::cerr << "strata: unknown command '" << cmd << "'\n";
  return Usage(std::cerr, 2);
}
