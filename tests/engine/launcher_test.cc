// SPDX-License-Identifier: Apache-2.0
// engine/launcher.h's rules and engine/process_group.h's behaviour over
// real child processes (sh): lines prefixed by label, the first failure
// named first with its status and stderr tail, the others stopped, a
// signal to the launcher passed on, mpirun's tagged lines sorted by rank.
// `strata train` launching ranks: tests/engine/launcher_train.sh.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "base/clock.h"
#include "engine/launcher.h"
#include "engine/process_group.h"
#include "engine/rank_binding.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

ChildSpec Sh(const std::string& label, const std::string& script) {
  ChildSpec c;
  c.label = label;
  c.argv = {"sh", "-c", script};
  return c;
}

TEST(Launcher, RankArgsLeaveOutTheLaunchersOwn) {
  EXPECT_EQ(RankTrainArgs({"--num-gpus", "2", "--steps", "5", "--master-port=1234", "--backend", "auto",
                           "--hostfile", "h", "--config=c.json", "--launcher-args", "-x", "--num-ranks=3",
                           "--master-addr", "a"}),
            (std::vector<std::string>{"--steps", "5", "--config=c.json"}));
}

TEST(Launcher, FlagsThatCannotGoTogetherNameTheOneToUse) {
  LaunchFlags f;
  f.num_gpus = 2;
  f.backend = "cpu";
  EXPECT_THAT(CheckLaunchFlags(f), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(CheckLaunchFlags(f).message(), HasSubstr("--backend cpu --num-ranks 2"));
  f = LaunchFlags{};
  f.num_ranks = 2;
  EXPECT_THAT(CheckLaunchFlags(f).message(), HasSubstr("give --backend cpu"));
  f.backend = "cpu";
  EXPECT_OK(CheckLaunchFlags(f));
  f.master_port = 1234;
  EXPECT_THAT(CheckLaunchFlags(f).message(), HasSubstr("CPU ranks meet through mpirun"));
  f = LaunchFlags{};
  f.master_addr = "x";
  EXPECT_THAT(CheckLaunchFlags(f).message(), HasSubstr("--master-addr is for a launch"));
  f = LaunchFlags{};
  f.num_gpus = 1;
  f.num_ranks = 1;
  EXPECT_THAT(CheckLaunchFlags(f).message(), HasSubstr("exclude each other"));
}

TEST(Launcher, StartedByALauncherIsSeenFromItsVariables) {
  auto env = [](std::map<std::string, std::string> m) {
    return [m](const char* v) -> const char* {
      auto it = m.find(v);
      return it == m.end() ? nullptr : it->second.c_str();
    };
  };
  EXPECT_FALSE(StartedByLauncher(env({})));
  EXPECT_TRUE(StartedByLauncher(env({{"WORLD_SIZE", "1"}})));
  EXPECT_TRUE(StartedByLauncher(env({{"OMPI_COMM_WORLD_SIZE", "2"}})));
  EXPECT_TRUE(StartedByLauncher(env({{"RANK", "0"}})));
}

TEST(ProcessGroup, LinesArePrefixedAndAllEndingWellIsZero) {
  std::ostringstream out, err;
  GroupResult r = ProcessGroup(5).Run({Sh("rank 0", "echo to-out; echo to-err >&2"),
                                       Sh("rank 1", "printf 'no newline' >&2; echo $RANK_VAR >&2")},
                                      out, err);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.failed, "");
  EXPECT_THAT(out.str(), HasSubstr("to-out\n"));
  EXPECT_THAT(err.str(), HasSubstr("[rank 0] to-err\n"));
  EXPECT_THAT(err.str(), HasSubstr("[rank 1] no newline\n"));
}

TEST(ProcessGroup, EnvironmentIsEachChilds) {
  std::ostringstream out, err;
  ChildSpec a = Sh("rank 0", "echo rank=$RANK >&2");
  a.env = {{"RANK", "0"}};
  ChildSpec b = Sh("rank 1", "echo rank=$RANK >&2");
  b.env = {{"RANK", "1"}};
  b.prepare = [] { return std::string("warning: from prepare"); };
  ASSERT_EQ(ProcessGroup(5).Run({a, b}, out, err).exit_code, 0);
  EXPECT_THAT(err.str(), HasSubstr("[rank 0] rank=0\n"));
  EXPECT_THAT(err.str(), HasSubstr("[rank 1] rank=1\n"));
  EXPECT_THAT(err.str(), HasSubstr("[rank 1] warning: from prepare\n"));
}

TEST(ProcessGroup, FirstFailureIsReportedFirstAndStopsTheOthers) {
  std::ostringstream out, err;
  const double t0 = NowSeconds();
  // rank 0 would run 60 s; it ignores SIGTERM (as a rank stuck in a
  // collective does), so the grace's SIGKILL ends it.
  GroupResult r = ProcessGroup(1).Run({Sh("rank 0", "trap '' TERM; echo waiting >&2; sleep 60"),
                                       Sh("rank 1", "echo about to fail >&2; sleep 0.3; exit 7")},
                                      out, err);
  EXPECT_LT(NowSeconds() - t0, 20);
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(r.failed, "rank 1");
  EXPECT_THAT(r.report, StartsWith("strata: rank 1 failed first: exit status 7\n"));
  EXPECT_THAT(r.report, HasSubstr("  [rank 1] about to fail\n"));
  EXPECT_THAT(r.report, HasSubstr("rank 0 then ended with signal 9"));
}

TEST(ProcessGroup, AKilledChildIsNamedWithItsSignal) {
  std::ostringstream out, err;
  GroupResult r =
      ProcessGroup(5).Run({Sh("rank 0", "sleep 30"), Sh("rank 1", "sleep 0.2; kill -9 $$")}, out, err);
  EXPECT_EQ(r.exit_code, 128 + 9);
  EXPECT_THAT(r.report, StartsWith("strata: rank 1 failed first: signal 9"));
  EXPECT_THAT(r.report, HasSubstr("rank 0 then ended with signal 15"));  // the launcher's SIGTERM
}

TEST(ProcessGroup, ASignalToTheLauncherReachesEveryChild) {
  std::ostringstream out, err;
  std::thread sender([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::kill(::getpid(), SIGTERM);
  });
  const std::string stops = "trap 'echo stopping >&2; exit 143' TERM; while :; do sleep 0.05; done";
  GroupResult r = ProcessGroup(5).Run({Sh("rank 0", stops), Sh("rank 1", stops)}, out, err);
  sender.join();
  EXPECT_EQ(r.exit_code, 143);
  EXPECT_EQ(r.failed, "");  // a stop, not a failure
  EXPECT_THAT(err.str(), HasSubstr("[rank 0] stopping"));
  EXPECT_THAT(err.str(), HasSubstr("[rank 1] stopping"));
  EXPECT_THAT(r.report, HasSubstr("stopped by Terminated"));
}

TEST(ProcessGroup, MpirunsTaggedLinesAreSortedByRank) {
  std::ostringstream out, err;
  ChildSpec m = Sh("mpirun",
                   "printf '[1,0]<stderr>:half a [1,1]<stderr>:one line\\n' >&2; "
                   "printf '[1,0]<stderr>:line\\n[1,0]<stdout>:out of 0\\n' >&2; "
                   "printf '  Process name: [[123,1],1]\\n  Exit code:    3\\n' >&2; exit 3");
  m.mpirun_tagged = true;
  GroupResult r = ProcessGroup(5).Run({m}, out, err);
  EXPECT_THAT(err.str(), HasSubstr("[rank 1] one line\n"));
  EXPECT_THAT(err.str(), HasSubstr("[rank 0] half a line\n"));
  EXPECT_THAT(err.str(), HasSubstr("[mpirun]   Exit code:    3\n"));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.failed, "rank 1");
  EXPECT_THAT(r.report, StartsWith("strata: rank 1 failed first: exit status 3 (as mpirun reports it)"));
  EXPECT_THAT(r.report, HasSubstr("[rank 1] one line"));
}

TEST(ProcessGroup, AProgramThatIsNotThereEndsWith127) {
  std::ostringstream out, err;
  ChildSpec c;
  c.label = "rank 0";
  c.argv = {"/nonexistent/strata"};
  GroupResult r = ProcessGroup(5).Run({c}, out, err);
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_THAT(r.report, HasSubstr("cannot run /nonexistent/strata"));
}

// Ranks whose GPU's node is unknown share the machine's cores in equal runs;
// a forked child bound to rank 1's share runs on those PUs only.
TEST(RankBindings, RanksOfUnknownNodesSplitTheMachinesCores) {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  const RankBindings b = RankBindings::ForGpus({"", ""});
  ASSERT_EQ(b.size(), 2u);
  if (b.Describe(0).rfind("unbound", 0) == 0) GTEST_SKIP() << b.Describe(0);
  EXPECT_THAT(b.Describe(0), HasSubstr("any NUMA node, "));
  EXPECT_THAT(b.Describe(1), HasSubstr("of the machine's"));
  if (cpus < 2) GTEST_SKIP() << "one CPU: nothing to split";
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!b.Bind(1).empty()) ::_exit(3);  // the OS refused: a warning, not this test's subject
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) != 0) ::_exit(2);
    ::_exit(CPU_COUNT(&set) < cpus && !CPU_ISSET(0, &set) ? 0 : 1);  // rank 1: the second half, not PU 0
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  if (WEXITSTATUS(st) == 3) GTEST_SKIP() << "binding refused here";
  EXPECT_EQ(WEXITSTATUS(st), 0) << b.Describe(1);
}

}  // namespace
}  // namespace strata
