// SPDX-License-Identifier: Apache-2.0
// `strata train` as a user runs it, on the CPU backend: a signal ends the
// step under way, saves a checkpoint through the normal save, says where
// and exits 128 + the signal; the resumed run gives the losses of a run
// that never stopped, bit for bit (engine/signals.h). Without --save it says
// nothing was saved; a second signal exits at once. --dry-run refuses what
// a run would fail on later (engine/preflight.h).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/capability.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "tests/bench/cli_util.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::CommandResult;
using ::strata::testing::ReadFile;
using ::strata::testing::RunAndSignalAt;
using ::strata::testing::RunAndSignalWhen;
using ::strata::testing::RunCommand;
using ::strata::testing::StrataBinary;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

// A small GPT, a line per step, `steps` steps.
std::string WriteConfig(const TempDir& dir, int steps, int n_layer = 2, int n_embd = 64, int seq = 32, int batch = 4) {
  const std::string path = dir.File("config.json");
  std::ofstream(path) << nlohmann::json{{"train_micro_batch_size_per_gpu", batch},
                                        {"steps_per_print", 1},
                                        {"model",
                                         {{"n_layer", n_layer},
                                          {"n_embd", n_embd},
                                          {"n_head", 4},
                                          {"vocab_size", 256},
                                          {"seq_len", seq}}},
                                        {"trainer", {{"steps", steps}, {"eval_batches", 1}}}}
                             .dump();
  return path;
}

std::vector<std::string> Train(const std::string& config, std::vector<std::string> more) {
  std::vector<std::string> argv = {StrataBinary(), "train", "--config", config, "--backend", "cpu", "--threads", "2"};
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

// Each step's loss in a JSON log, by step; the summaries' statuses in order.
std::map<int64_t, double> StepLosses(const std::string& path, std::vector<std::string>* statuses = nullptr) {
  std::map<int64_t, double> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["type"] == "step") out[j["step"].get<int64_t>()] = j["loss"].get<double>();
    if (j["type"] == "summary" && statuses) statuses->push_back(j["status"].get<std::string>());
  }
  return out;
}

// SIGINT once step 4 is logged: the step under way ends, a checkpoint is
// saved, exit 130; the resumed run continues bit-identically.
TEST(TrainSignals, SigintSavesAndTheResumeIsBitIdentical) {
  TempDir dir;
  const std::string config = WriteConfig(dir, 40);
  const CommandResult straight = RunCommand(Train(config, {"--log-json", dir.File("straight.jsonl")}));
  ASSERT_EQ(straight.rc, 0) << straight.output;
  const std::map<int64_t, double> want = StepLosses(dir.File("straight.jsonl"));
  ASSERT_EQ(want.size(), 40u);

  const std::string save = dir.File("ckpt"), log = dir.File("run.jsonl");
  const CommandResult stopped =
      RunAndSignalWhen(Train(config, {"--save", save, "--log-json", log}), "step 4/40 |", {SIGINT});
  ASSERT_EQ(stopped.rc, 130) << stopped.output;
  EXPECT_THAT(stopped.output, HasSubstr("stopping after the step under way"));
  EXPECT_THAT(stopped.output, HasSubstr("stopped by SIGINT after step "));
  EXPECT_THAT(stopped.output, HasSubstr("the state was saved to " + save + "/step-"));
  EXPECT_THAT(stopped.output, HasSubstr("continue with --resume " + save));
  std::vector<std::string> statuses;
  const size_t before = StepLosses(log, &statuses).size();
  ASSERT_GE(before, 4u);
  ASSERT_LT(before, 40u) << "the run was not stopped";
  EXPECT_EQ(statuses, (std::vector<std::string>{"stopped"}));

  const CommandResult resumed = RunCommand(Train(config, {"--resume", save, "--save", save, "--log-json", log}));
  ASSERT_EQ(resumed.rc, 0) << resumed.output;
  statuses.clear();
  const std::map<int64_t, double> got = StepLosses(log, &statuses);
  EXPECT_EQ(statuses, (std::vector<std::string>{"stopped", "ok"}));
  ASSERT_EQ(got.size(), 40u);
  for (const auto& [step, loss] : want) EXPECT_EQ(got.at(step), loss) << "step " << step;
}

// SIGTERM without --save: says nothing was saved, exit 143.
TEST(TrainSignals, SigtermWithoutSaveSaysNothingWasSaved) {
  TempDir dir;
  const CommandResult r = RunAndSignalWhen(Train(WriteConfig(dir, 200), {}), "step 2/200 |", {SIGTERM});
  ASSERT_EQ(r.rc, 128 + SIGTERM) << r.output;
  EXPECT_THAT(r.output, HasSubstr("stopped by SIGTERM after step "));
  EXPECT_THAT(r.output, HasSubstr("nothing was saved (no --save DIR)"));
}

// SIGHUP (the terminal closed) saves as SIGINT does: exit 129.
TEST(TrainSignals, SighupSaves) {
  TempDir dir;
  const std::string save = dir.File("ckpt");
  const CommandResult r = RunAndSignalWhen(Train(WriteConfig(dir, 200), {"--save", save}), "step 2/200 |", {SIGHUP});
  ASSERT_EQ(r.rc, 128 + SIGHUP) << r.output;
  EXPECT_THAT(r.output, HasSubstr("stopped by SIGHUP"));
  EXPECT_TRUE(std::filesystem::exists(save + "/latest")) << r.output;
}

// A second signal while the first is being handled exits at once. The
// second goes once the run has said it saw the first: sent back to back,
// two SIGINTs can arrive as one on a loaded machine.
TEST(TrainSignals, ASecondSignalExitsAtOnce) {
  TempDir dir;
  // Steps long enough (about a second here) for the second to come while the first waits.
  const std::string config = WriteConfig(dir, 200, 6, 384, 128, 8);
  const CommandResult r = RunAndSignalAt(Train(config, {"--save", dir.File("ckpt")}),
                                         {{"step 1/200 |", SIGINT}, {"stopping after the step under way", SIGINT}});
  ASSERT_EQ(r.rc, 130) << r.output;
  EXPECT_THAT(r.output, HasSubstr("second signal: exiting now"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("saved checkpoint"))) << r.output;
}

// --save naming a file fails at once, in --dry-run too, naming it.
TEST(TrainPreflight, SaveToAFileFailsBeforeTheFirstStep) {
  TempDir dir;
  const std::string file = dir.File("not-a-dir");
  std::ofstream(file) << "x";
  for (const bool dry : {true, false}) {
    std::vector<std::string> more = {"--save", file};
    if (dry) more.push_back("--dry-run");
    const CommandResult r = RunCommand(Train(WriteConfig(dir, 5), more));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr("--save " + file + " is a file; give a directory"));
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("step 1/")));
  }
}

// Without CAP_IPC_LOCK and with RLIMIT_MEMLOCK at 1 MiB, a plan that pins
// more host memory with mlock (no GPU) is refused by --dry-run, naming the
// limit. (The child drops CAP_IPC_LOCK from its bounding set before exec, so
// that even root runs without it.)
TEST(TrainPreflight, MemlockBelowThePinnedBytes) {
  TempDir dir;
  const std::string config = dir.File("host.json");
  std::ofstream(config) << R"({"train_micro_batch_size_per_gpu": 4,
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
      "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "seq_len": 32}})";
  const std::string out = dir.File("out.txt");
  std::vector<std::string> args = {StrataBinary(), "train", "--config", config, "--backend", "cpu", "--dry-run"};
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    if (::prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0) != 0 && ::geteuid() == 0) ::_exit(77);
    struct rlimit low {};
    ::getrlimit(RLIMIT_MEMLOCK, &low);
    low.rlim_cur = 1 << 20;
    if (::setrlimit(RLIMIT_MEMLOCK, &low) != 0) ::_exit(77);
    ::execv(cargs[0], cargs.data());
    ::_exit(127);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  const int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  if (rc == 77) GTEST_SKIP() << "cannot drop CAP_IPC_LOCK or lower RLIMIT_MEMLOCK here";
  const std::string output = ReadFile(out);
  EXPECT_EQ(rc, 1) << output;
  EXPECT_THAT(output, HasSubstr("RLIMIT_MEMLOCK is 1.00 MiB"));
  EXPECT_THAT(output, HasSubstr("the host tier pins"));
}

}  // namespace
}  // namespace strata
