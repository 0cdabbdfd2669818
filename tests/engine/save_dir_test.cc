// SPDX-License-Identifier: Apache-2.0
// A run's places, checked before its first step and by --dry-run
// (engine/preflight.h): --save pointing at a file or a read-only place, an
// NVMe path without the space the plan puts there (the memlock check, which
// needs a process without CAP_IPC_LOCK, is in train_cli_test.cc). The --save directory is locked for the run (a
// second run fails naming the holder's PID) and cleared of what killed runs
// left (engine/save_dir.h). The tiers take what the plan needs plus a
// stated margin, not the whole budget, except an NVMe plan's host tier
// (engine/tier_sizes.h).
#include "engine/save_dir.h"

#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/bytes.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

TrainOptions Tiny(int64_t steps) {
  TrainOptions o = testing::TinyTrainer(2);
  o.steps = steps;
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.gpu_memory_limit = 256 * kMiB;
  o.host_memory_limit = 256 * kMiB;
  return o;
}

pid_t DeadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return pid;
}

// --save naming a file, or a directory below one: refused by --dry-run and
// by the run before anything is allocated, naming the path.
TEST(SaveDir, AFileIsRefusedBeforeTheRun) {
  TempDir dir;
  const std::string file = dir.File("a-file");
  std::ofstream(file) << "x";
  for (const std::string& save : {file, file + "/ckpt"}) {
    SCOPED_TRACE(save);
    TrainOptions o = Tiny(2);
    o.save_dir = save;
    auto d = Trainer::DryRun(o);
    EXPECT_THAT(d, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(d.status().ToString(), HasSubstr(file + " is a file"));
    std::ostringstream log;
    auto t = Trainer::Create(o, log);
    EXPECT_THAT(t, StatusIs(StatusCode::kInvalidArgument));
  }
  // A directory yet to be made is fine, and --dry-run does not make it.
  TrainOptions o = Tiny(2);
  o.save_dir = dir.File("new/ckpt");
  EXPECT_OK(Trainer::DryRun(o).status());
  EXPECT_FALSE(fs::exists(o.save_dir));
}

// A read-only file system (here /sys or /proc, where the machine mounts
// them so): IoError EROFS naming the place.
TEST(SaveDir, AReadOnlyPlaceIsRefused) {
  std::string ro;
  for (const char* p : {"/sys", "/proc/sys"}) {
    struct statvfs v {};
    if (::statvfs(p, &v) == 0 && (v.f_flag & ST_RDONLY)) {
      ro = p;
      break;
    }
  }
  if (ro.empty()) GTEST_SKIP() << "no read-only file system here to save into (/sys and /proc/sys are writable)";
  std::vector<std::string> warnings;
  Status s = CheckSaveDir(ro + "/strata-ckpt", 0, &warnings);
  EXPECT_THAT(s, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(s.sys_errno(), EROFS);
  EXPECT_THAT(s.ToString(), HasSubstr(ro));
}

// Two runs saving into one directory: the second fails at once naming the
// first's PID; once the first is gone the directory is free again.
TEST(SaveDir, ASecondRunFailsNamingTheHoldersPid) {
  TempDir dir;
  TrainOptions o = Tiny(2);
  o.save_dir = dir.path();
  std::ostringstream log;
  {
    ASSERT_OK_AND_ASSIGN(auto first, Trainer::Create(o, log));
    auto second = Trainer::Create(o, log);
    ASSERT_THAT(second, StatusIs(StatusCode::kFailedPrecondition));
    EXPECT_THAT(second.status().ToString(), HasSubstr("in use by another run (process " + std::to_string(::getpid())));
    EXPECT_THAT(second.status().ToString(), HasSubstr(dir.File(".lock")));
  }
  EXPECT_OK(Trainer::Create(o, log).status());
}

// What killed runs left in the --save directory: an unfinished save goes, a
// step moved aside while being replaced comes back when its directory is
// missing (else goes), a temporary `latest` goes; each is named. A live
// process's temporary directory stays.
TEST(SaveDir, LeftoversOfKilledRunsAreReclaimed) {
  TempDir dir;
  // A real step directory to be moved aside.
  {
    TrainOptions o = Tiny(1);
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    ASSERT_OK(t->Step().status());
    ASSERT_OK(t->Save(dir.path()));
  }
  const std::string dead = std::to_string(DeadPid());
  const std::string tmp = dir.File(".step-000002.tmp." + dead);
  fs::create_directories(tmp);
  std::ofstream(tmp + "/model.safetensors") << "half";
  const std::string old = dir.File(".step-000001.old." + dead);
  fs::rename(dir.File("step-000001"), old);  // killed between moving it aside and the new one's rename
  std::ofstream(dir.File("latest.tmp." + dead)) << "step-000002";
  const std::string live = dir.File(".step-000003.tmp.1");  // PID 1 lives
  fs::create_directories(live);

  TrainOptions o = Tiny(2);
  o.save_dir = dir.path();
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_THAT(log.str(), HasSubstr("removed " + tmp + ", a checkpoint left unfinished by process " + dead));
  EXPECT_TRUE(fs::exists(dir.File("step-000001/manifest.json")));
  EXPECT_FALSE(fs::exists(old));
  EXPECT_THAT(log.str(), HasSubstr("restored " + dir.File("step-000001")));
  EXPECT_FALSE(fs::exists(dir.File("latest.tmp." + dead)));
  EXPECT_TRUE(fs::exists(live));
  t.reset();
  // The restored step resumes.
  TrainOptions r = Tiny(2);
  r.resume_dir = dir.path();
  ASSERT_OK_AND_ASSIGN(auto t2, Trainer::Create(r, log));
  EXPECT_EQ(t2->step(), 1);
}

// --log-json naming a directory, --resume naming nothing: --dry-run says so.
TEST(Preflight, TheLogAndTheSourcesAreChecked) {
  TempDir dir;
  TrainOptions o = Tiny(1);
  o.log_json = dir.path();
  auto d = Trainer::DryRun(o);
  EXPECT_THAT(d, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(d.status().ToString(), HasSubstr("--log-json " + dir.path() + " is a directory"));
  o.log_json.clear();
  o.resume_dir = dir.File("no-such-checkpoint");
  d = Trainer::DryRun(o);
  EXPECT_THAT(d, StatusIs(StatusCode::kIoError));
  EXPECT_THAT(d.status().ToString(), HasSubstr("--resume"));
  o.resume_dir.clear();
  o.init_from = dir.File("no-such-model");
  d = Trainer::DryRun(o);
  EXPECT_THAT(d, StatusIs(StatusCode::kIoError));
  EXPECT_THAT(d.status().ToString(), HasSubstr("--init-from"));
}

// An NVMe path without the free space the plan puts there: --dry-run says
// so, naming the path, what is free and what is needed.
TEST(Preflight, NvmeWithoutTheSpaceThePlanNeeds) {
  TempDir nvme;
  struct statvfs v {};
  ASSERT_EQ(::statvfs(nvme.path().c_str(), &v), 0);
  const uint64_t free = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
  // d 4096: 12 d^2 parameters a block, 14 bytes each on NVMe (master, m, v and the bf16 parameters).
  const uint64_t per_layer = 12ull * 4096 * 4096 * 14;
  const uint64_t layers = free / per_layer + 2;
  if (layers > 10000) GTEST_SKIP() << FormatBytes(free) << " free: no config here needs more";
  TrainOptions o = Tiny(1);
  Config& c = o.config;
  c.model.n_layer = static_cast<int>(layers);
  c.model.n_embd = 4096;
  c.model.n_head = 32;
  c.model.seq_len = 32;
  c.micro_batch = 1;
  c.grad_accum = 1;
  c.train_batch_size = 1;
  c.bf16 = true;
  c.zero.offload_optimizer.device = "nvme";
  c.zero.offload_optimizer.nvme_path = nvme.path();
  c.zero.offload_param.device = "nvme";
  c.zero.offload_param.nvme_path = nvme.path();
  o.gpu_memory_limit = 64 * kGiB;  // the stand-in's: nothing is allocated by a dry run
  o.host_memory_limit = 16 * kGiB;
  auto d = Trainer::DryRun(o);
  ASSERT_THAT(d, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_THAT(d.status().ToString(), HasSubstr("the NVMe path " + nvme.path() + " has "));
  EXPECT_THAT(d.status().ToString(), HasSubstr("and the plan puts"));
}

// The tiers take what the plan needs plus the stated margin: a plan with
// nothing in host memory pins nothing, and the GPU tier is far below its
// 256 MiB budget for this small model; both say so in the plan table.
TEST(TierSizes, ThePlanAndAMarginNotTheBudget) {
  TrainOptions o = Tiny(1);
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_EQ(t->plan().host_total, 0u);
  const std::string table = t->PlanTable();
  EXPECT_THAT(table, HasSubstr("host 64.0 MiB (the plan's 0 B + a 64.0 MiB margin, unpinned: nothing planned there)"));
  ASSERT_OK(t->Step().status());
  const TrainerInfo info = t->Info();
  EXPECT_LT(info.gpu_tier_peak, t->plan().gpu_total + 64 * kMiB);
  // The optimizer state on the host: pinned, the plan's total plus the margin.
  TrainOptions h = Tiny(1);
  h.config.zero.offload_optimizer.device = "cpu";
  ASSERT_OK_AND_ASSIGN(auto t2, Trainer::Create(h, log));
  EXPECT_GT(t2->plan().host_total, 0u);
  EXPECT_THAT(t2->PlanTable(), HasSubstr("pinned)"));
  ASSERT_OK(t2->Step().status());
  ASSERT_OK(t2->Step().status());
}

// The optimizer state on NVMe: the host tier may take the whole budget, the
// room beyond the plan being the write-behind's, and the table says so.
TEST(TierSizes, AnNvmePlanGivesTheRestOfTheHostBudgetToTheWriteBehind) {
  TempDir nvme;
  TrainOptions o = Tiny(2);
  o.config.zero.offload_optimizer.device = "nvme";
  o.config.zero.offload_optimizer.nvme_path = nvme.path();
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_LT(t->plan().host_total + 64 * kMiB, o.host_memory_limit);
  EXPECT_THAT(t->PlanTable(), HasSubstr("host 256 MiB (the plan's "));
  EXPECT_THAT(t->PlanTable(), HasSubstr("and the rest of the budget as room for the NVMe write-behind"));
  ASSERT_OK(t->Step().status());
  ASSERT_OK(t->Step().status());
}

}  // namespace
}  // namespace strata
