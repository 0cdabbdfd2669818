// SPDX-License-Identifier: Apache-2.0
// The trainer on the CPU backend: the loss falls on real text; offloaded
// placements (tiny budgets forcing the host and NVMe tiers) give the same
// losses as an all-resident run, step by step; save/resume is bit-identical;
// storage failures are clear errors that leave the last checkpoint usable.
#include "engine/trainer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include "base/bytes.h"
#include "base/half.h"
#include "engine/checkpoint.h"
#include "engine/safetensors.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/fault_io_env.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

TrainOptions Tiny(int64_t steps) {
  TrainOptions o = testing::TinyTrainer(2);
  Config& c = o.config;
  c.trainer.eval_batches = 2;
  o.steps = steps;
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.gpu_memory_limit = 256 * kMiB;
  o.host_memory_limit = 256 * kMiB;
  return o;
}

std::vector<double> Losses(const TrainOptions& o, int64_t steps, std::string* plan = nullptr) {
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return {};
  if (plan) *plan = (*t)->PlanTable();
  std::vector<double> out;
  for (int64_t i = 0; i < steps; ++i) {
    auto r = (*t)->Step();
    EXPECT_OK(r.status());
    if (!r.ok()) break;
    out.push_back(r->loss);
  }
  return out;
}

TEST(Trainer, LossFallsOnRealText) {
  TrainOptions o = Tiny(30);
  auto losses = Losses(o, 30);
  ASSERT_EQ(losses.size(), 30u);
  double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[27] + losses[28] + losses[29]) / 3;
  EXPECT_NEAR(losses[0], std::log(256.0), 0.3);  // a fresh model is near uniform
  EXPECT_LT(last, first - 1.0) << "first " << first << " last " << last;
}

TEST(Trainer, OffloadedPlacementsGiveTheSameLosses) {
  TempDir nvme;
  TrainOptions resident = Tiny(4);
  std::string plan_r, plan_o;
  auto a = Losses(resident, 4, &plan_r);

  TrainOptions off = Tiny(4);
  // A GPU budget that holds the working set and two blocks at most: params
  // stream from the host, checkpoints and gradients live there, optimizer
  // state on NVMe.
  off.config.zero.offload_optimizer.device = "nvme";
  off.config.zero.offload_optimizer.nvme_path = nvme.path();
  off.config.zero.offload_optimizer.pipeline_read = true;
  off.config.zero.offload_optimizer.pipeline_write = true;
  off.config.zero.offload_param.device = "cpu";
  off.config.activation_checkpointing.cpu_checkpointing = true;
  auto b = Losses(off, 4, &plan_o);
  EXPECT_THAT(plan_o, HasSubstr("nvme"));
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1 << "\n" << plan_r << plan_o;
}

TEST(Trainer, OffloadedPlacementsGiveTheSameLossesInBf16) {
  // bf16: gradients reach the optimizer in bf16 whatever the placement,
  // accumulated in fp32 first (through the accumulators when not resident).
  TempDir nvme;
  TrainOptions resident = Tiny(3);
  resident.config.bf16 = true;
  auto a = Losses(resident, 3);
  TrainOptions off = Tiny(3);
  off.config.bf16 = true;
  off.config.zero.offload_optimizer.device = "nvme";
  off.config.zero.offload_optimizer.nvme_path = nvme.path();
  off.config.zero.offload_param.device = "cpu";
  off.config.activation_checkpointing.cpu_checkpointing = true;
  off.gpu_memory_limit = 1900 * kKiB;  // too small to keep the gradients: they go to the host
  std::string plan;
  auto b = Losses(off, 3, &plan);
  EXPECT_THAT(plan, HasSubstr("bf16 on the host"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
  EXPECT_LT(a.back(), a.front());
}

// The GPU-assisted optimizer (here on the stand-in: the same chunk pipeline,
// the CPU Adam on the stand-in's memory) computes the same bits as the CPU
// Adam alone, whether it takes every shard or shares them with the CPU worker.
void ExpectAssistMatches(bool bf16) {
  TrainOptions host = Tiny(4);
  host.config.bf16 = bf16;
  host.config.zero.offload_optimizer.device = "cpu";
  host.config.trainer.gpu_assisted_optimizer = "off";
  // bf16: a GPU budget that keeps the parameters but sends the gradients to
  // the host, so the assist uploads them with the state.
  if (bf16) host.gpu_memory_limit = 2100 * kKiB;
  std::string plan;
  auto a = Losses(host, 4, &plan);
  if (bf16) {
    EXPECT_THAT(plan, HasSubstr("bf16 on the host"));
  }
  for (bool all : {true, false}) {
    TrainOptions o = host;
    o.config.trainer.gpu_assisted_optimizer = "on";
    o.assist_chunk_params = 1000;  // many chunks, a ragged last one, the three buffers reused
    o.assist_takes_all = all;
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    EXPECT_THAT(log.str(), HasSubstr("GPU-assisted streaming"));
    std::vector<double> b;
    double share = 0;
    for (int i = 0; i < 4; ++i) {
      ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
      b.push_back(r.loss);
      share = r.optimizer_gpu_share;  // of the previous step's update
    }
    if (all) {
      EXPECT_EQ(share, 1.0);
    }
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1 << (all ? " (all on the assist)" : "");
    // The state after the last update, too.
    ASSERT_OK(t->Evaluate(1).status());
    auto t2 = Trainer::Create(host, log);
    ASSERT_OK(t2.status());
    for (int i = 0; i < 4; ++i) ASSERT_OK((*t2)->Step().status());
    ASSERT_OK((*t2)->Evaluate(1).status());
    for (const char* name : {"transformer.wte.weight", "transformer.h.1.mlp.c_fc.weight", "transformer.ln_f.bias"}) {
      ASSERT_OK_AND_ASSIGN(std::vector<float> x, t->Parameter(name));
      ASSERT_OK_AND_ASSIGN(std::vector<float> y, (*t2)->Parameter(name));
      EXPECT_EQ(x, y) << name;
    }
  }
}

TEST(Trainer, GpuAssistedOptimizerGivesTheSameBits) { ExpectAssistMatches(false); }
TEST(Trainer, GpuAssistedOptimizerGivesTheSameBitsInBf16) { ExpectAssistMatches(true); }

TEST(Trainer, GpuAssistedOptimizerNeedsHostStateAndResidentParameters) {
  TrainOptions o = Tiny(1);  // everything fits on the (stand-in) GPU: no host state
  o.config.trainer.gpu_assisted_optimizer = "on";
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  EXPECT_THAT(log.str(), HasSubstr("gpu-assisted optimizer: off"));
  ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
  EXPECT_EQ(r.optimizer_gpu_share, 0.0);
}

// Micro-batch-major runs each micro-batch through the whole model and keeps
// one micro-batch's checkpoints; the gradients accumulate in fp32 across the
// micro-batches in the same order as layer-major's, so the losses are the
// same bits, resident or offloaded, fp32 or bf16.
void ExpectSchedulesAgree(bool bf16, bool offload, int64_t accum) {
  SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + (offload ? ", offloaded" : ", resident") + ", accumulation " +
               std::to_string(accum));
  TempDir nvme;
  TrainOptions lm = Tiny(3);
  lm.config.bf16 = bf16;
  lm.config.grad_accum = accum;
  lm.config.train_batch_size = lm.config.micro_batch * accum;
  if (offload) {
    // Parameters streamed, checkpoints and (bf16) gradients on the host,
    // optimizer state on NVMe: every accumulator crosses PCIe between
    // micro-batches.
    lm.config.zero.offload_optimizer.device = "nvme";
    lm.config.zero.offload_optimizer.nvme_path = nvme.path();
    lm.config.zero.offload_param.device = "cpu";
    lm.config.activation_checkpointing.cpu_checkpointing = true;
    lm.gpu_memory_limit = (bf16 ? 2000 : 2600) * kKiB;
  }
  TrainOptions mb = lm;
  mb.config.trainer.schedule = "micro-batch-major";
  std::string plan_l, plan_m;
  auto a = Losses(lm, 3, &plan_l);
  auto b = Losses(mb, 3, &plan_m);
  EXPECT_THAT(plan_l, HasSubstr("schedule: layer-major"));
  EXPECT_THAT(plan_m, HasSubstr("schedule: micro-batch-major"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  // The first step's loss is the same bits; later ones differ only through
  // the embedding gradient's summation order (head and token-scatter
  // contributions interleave by micro-batch), a few ulps of fp32.
  EXPECT_EQ(a[0], b[0]);
  const double tol = bf16 ? 1e-3 : 1e-7;
  for (size_t i = 1; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], tol * std::abs(a[i])) << "step " << i + 1 << "\n" << plan_l << plan_m;
  if (offload && bf16) {
    EXPECT_THAT(plan_m, HasSubstr("bf16 on the host")) << plan_m;
  }
  EXPECT_LT(a.back(), a.front());
}

TEST(Trainer, MicroBatchMajorGivesTheLayerMajorLosses) {
  for (bool bf16 : {false, true})
    for (bool offload : {false, true}) ExpectSchedulesAgree(bf16, offload, 3);
  ExpectSchedulesAgree(true, false, 1);
}

TEST(Trainer, MicroBatchMajorKeepsOneMicroBatchOfCheckpoints) {
  TrainOptions o = Tiny(1);
  o.config.bf16 = true;
  o.config.grad_accum = 4;
  o.config.train_batch_size = o.config.micro_batch * 4;
  ASSERT_OK_AND_ASSIGN(std::string lm, Trainer::DryRun(o));
  o.config.trainer.schedule = "micro-batch-major";
  ASSERT_OK_AND_ASSIGN(std::string mb, Trainer::DryRun(o));
  // Checkpoints: 3 sets (x_0..x_2) of 4 micro-batches x 4 x 32 x 64 bf16 = 16 KiB
  // each, against one micro-batch's.
  EXPECT_THAT(lm, ContainsRegex("activation checkpoints +192 KiB"));
  EXPECT_THAT(mb, ContainsRegex("activation checkpoints +48\\.0 KiB"));
}

void ExpectResumeIsBitIdentical(const std::string& schedule) {
  SCOPED_TRACE(schedule);
  TempDir dir;
  auto tiny = [&](int64_t steps) {
    TrainOptions o = Tiny(steps);
    o.config.trainer.schedule = schedule;
    return o;
  };
  auto straight = Losses(tiny(6), 6);
  ASSERT_EQ(straight.size(), 6u);

  std::ostringstream log;
  {
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(tiny(3), log));
    for (int i = 0; i < 3; ++i) ASSERT_OK(t->Step().status());
    ASSERT_OK(t->Save(dir.path()));
  }
  TrainOptions r = tiny(6);
  r.resume_dir = dir.path();
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(r, log));
  EXPECT_EQ(t->step(), 3);
  for (int i = 3; i < 6; ++i) {
    ASSERT_OK_AND_ASSIGN(StepReport rep, t->Step());
    EXPECT_EQ(rep.loss, straight[static_cast<size_t>(i)]) << "step " << i + 1;
  }
}

TEST(Trainer, ResumeIsBitIdentical) {
  ExpectResumeIsBitIdentical("layer-major");
  ExpectResumeIsBitIdentical("micro-batch-major");
}

// model.safetensors: the Hugging Face weights (bf16 by default: the masters
// rounded); master.safetensors: the masters themselves, same names and shapes.
TEST(Trainer, CheckpointIsHuggingFaceSafetensors) {
  TempDir dir;
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(Tiny(1), log));
  ASSERT_OK(t->Step().status());
  ASSERT_OK(t->Save(dir.path()));
  ASSERT_OK_AND_ASSIGN(auto live, t->Parameter("transformer.h.0.ln_1.weight"));
  for (const char* file : {"model.safetensors", "master.safetensors"}) {
    SCOPED_TRACE(file);
    const bool hf = std::string(file) == "model.safetensors";
    ASSERT_OK_AND_ASSIGN(auto f, SafetensorsFile::Open(dir.path() + "/step-000001/" + file));
    const SafetensorsEntry* wte = f.Find("transformer.wte.weight");
    ASSERT_NE(wte, nullptr);
    EXPECT_EQ(wte->shape, (Shape{256, 64}));
    EXPECT_EQ(wte->dtype, hf ? DType::kBF16 : DType::kF32);
    const SafetensorsEntry* attn = f.Find("transformer.h.1.attn.c_attn.weight");
    ASSERT_NE(attn, nullptr);
    EXPECT_EQ(attn->shape, (Shape{64, 192}));  // Conv1D [in, out]
    EXPECT_EQ(f.metadata().at("format"), "pt");
    ASSERT_OK_AND_ASSIGN(auto w, f.ReadF32("transformer.h.0.ln_1.weight"));
    ASSERT_EQ(w.size(), live.size());
    for (size_t i = 0; i < w.size(); ++i)
      EXPECT_EQ(w[i], hf ? BF16ToFloat(FloatToBF16(live[i])) : live[i]) << i;
  }
}

TEST(Trainer, ResumeOfAnotherModelShapeIsRefused) {
  TempDir dir;
  std::ostringstream log;
  {
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(Tiny(1), log));
    ASSERT_OK(t->Step().status());
    ASSERT_OK(t->Save(dir.path()));
  }
  TrainOptions r = Tiny(2);
  r.config.model.n_layer = 3;
  r.resume_dir = dir.path();
  auto t = Trainer::Create(r, log);
  EXPECT_THAT(t, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(t.status().ToString(), HasSubstr("n_layer"));
}

TEST(Trainer, ImpossiblePlanFailsBeforeAllocating) {
  TrainOptions o = Tiny(1);
  o.gpu_memory_limit = 64 * kKiB;
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_THAT(t, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_THAT(t.status().ToString(), HasSubstr("GPU budget"));
  auto d = Trainer::DryRun(o);
  EXPECT_THAT(d, StatusIs(StatusCode::kOutOfMemory));
}

TEST(Trainer, DryRunPrintsThePlan) {
  TrainOptions o = Tiny(1);
  ASSERT_OK_AND_ASSIGN(std::string table, Trainer::DryRun(o));
  EXPECT_THAT(table, HasSubstr("parameters"));
  EXPECT_THAT(table, HasSubstr("per step: H2D"));
}

// ENOSPC from the NVMe swap file mid-run: a clear error naming the file, and
// the checkpoint written before stays loadable.
TEST(Trainer, FullDiskDuringTrainingIsAClearErrorAndTheCheckpointSurvives) {
  TempDir nvme, ckpt;
  testing::FaultIoEnv env;
  TrainOptions o = Tiny(6);
  o.config.zero.offload_optimizer.device = "nvme";
  o.config.zero.offload_optimizer.nvme_path = nvme.path();
  o.nvme_env = &env;
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_OK(t->Step().status());
  ASSERT_OK(t->Save(ckpt.path()));
  env.Add({.site = testing::FaultSite::kCompleteIo, .io = testing::FaultIo::kWrite,
           .error = ENOSPC});  // every write from now on
  Status failure;
  for (int i = 0; i < 4 && failure.ok(); ++i) {
    auto r = t->Step();
    failure = r.status();
  }
  EXPECT_THAT(failure, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(failure.sys_errno(), ENOSPC);
  EXPECT_THAT(failure.ToString(), HasSubstr(nvme.path()));
  t.reset();
  TrainOptions r = Tiny(2);
  r.resume_dir = ckpt.path();
  ASSERT_OK_AND_ASSIGN(auto t2, Trainer::Create(r, log));
  EXPECT_EQ(t2->step(), 1);
  ASSERT_OK(t2->Step().status());
}

// The swap files in `dir` (the NVMe tier's), deleted behind the trainer's back.
int DeleteSwapFiles(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file() && ::unlink(e.path().c_str()) == 0) ++n;
  return n;
}

// A swap file deleted between steps (a cleaner in /var/tmp, a careless rm):
// the next step fails before it changes anything, naming the file, and the
// last checkpoint resumes.
TEST(Trainer, DeletedSwapFileStopsTheNextStepAndTheCheckpointSurvives) {
  TempDir nvme, ckpt;
  TrainOptions o = Tiny(6);
  o.config.zero.offload_optimizer.device = "nvme";
  o.config.zero.offload_optimizer.nvme_path = nvme.path();
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_OK(t->Step().status());
  ASSERT_OK(t->Save(ckpt.path()));
  ASSERT_OK(t->Step().status());
  ASSERT_GE(DeleteSwapFiles(nvme.path()), 1);
  auto r = t->Step();
  ASSERT_THAT(r, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(r.status().sys_errno(), ENOENT);
  EXPECT_THAT(r.status().ToString(), HasSubstr(nvme.path()));
  EXPECT_THAT(r.status().ToString(), HasSubstr("deleted while in use"));
  EXPECT_EQ(t->step(), 2);  // nothing of the failed step happened
  t.reset();
  TrainOptions again = Tiny(2);
  again.resume_dir = ckpt.path();
  ASSERT_OK_AND_ASSIGN(auto t2, Trainer::Create(again, log));
  EXPECT_EQ(t2->step(), 1);
  ASSERT_OK(t2->Step().status());
}

// The swap files in `dir` overwritten in place (another process writing
// into them, a stray dd): every value of each replaced, the size kept.
// `seen`, when given, gets what was found (each entry, its size and what
// failed), for the failure message. Written with O_DIRECT, as the store
// writes them: a buffered write that collides with the store's direct
// write-behind fails the page cache's invalidation, and the kernel then
// reports EIO at fsync (about one run in twenty). A filesystem without
// O_DIRECT gets a buffered write.
int OverwriteSwapFiles(const std::string& dir, std::string* seen = nullptr) {
  int n = 0;
  std::ostringstream what;
  what << dir << ":";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    what << " " << e.path().filename().string();
    if (!e.is_regular_file()) continue;
    what << " (" << e.file_size() << " bytes)";
    const size_t size = static_cast<size_t>(e.file_size());
    int fd = size % 4096 == 0 ? ::open(e.path().c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT) : -1;
    if (fd < 0) fd = ::open(e.path().c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      what << " open: " << std::strerror(errno);
      continue;
    }
    // Plausible values (fp32 0.01), so that nothing but a checksum can tell;
    // page-aligned for O_DIRECT.
    std::unique_ptr<float, decltype(&std::free)> junk(
        static_cast<float*>(std::aligned_alloc(4096, std::max<size_t>((size + 4095) / 4096 * 4096, 4096))), &std::free);
    std::fill(junk.get(), junk.get() + size / 4, 0.01f);
    const auto bytes = static_cast<ssize_t>(size / 4 * 4);
    const ssize_t wrote = ::pwrite(fd, junk.get(), static_cast<size_t>(bytes), 0);
    if (wrote < 0)
      what << " pwrite: " << std::strerror(errno);
    else if (wrote != bytes)
      what << " pwrite wrote " << wrote << " of " << bytes << " bytes";
    else if (::fsync(fd) != 0)
      what << " fsync: " << std::strerror(errno);
    else
      ++n;
    ::close(fd);
  }
  if (seen != nullptr) *seen = what.str();
  return n;
}

// A swap file overwritten in place during a run: the NVMe tier's block
// checksums (crc32c, on by default) make the next read of it DataLoss naming
// the file and the offset, where the loss used to jump from 3.0 to 5.5 with
// exit 0. trainer.nvme_checksum "none" turns the checks off.
TEST(Trainer, SwapFileOverwrittenInPlaceIsDataLossNamingTheFileAndOffset) {
  for (const char* checksum : {"crc32c", "none"}) {
    SCOPED_TRACE(checksum);
    TempDir nvme;
    TrainOptions o = Tiny(6);
    o.config.zero.offload_optimizer.device = "nvme";
    o.config.zero.offload_optimizer.nvme_path = nvme.path();
    o.config.trainer.nvme_checksum = checksum;
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    ASSERT_OK(t->Step().status());
    std::string seen;
    ASSERT_GE(OverwriteSwapFiles(nvme.path(), &seen), 1) << seen;
    Status failure;
    for (int i = 0; i < 4 && failure.ok(); ++i) failure = t->Step().status();
    if (std::string(checksum) == "none") {
      EXPECT_OK(failure) << "with the checks off nothing notices";
      continue;
    }
    ASSERT_THAT(failure, StatusIs(StatusCode::kDataLoss));
    EXPECT_THAT(failure.ToString(), HasSubstr("checksum mismatch"));
    EXPECT_THAT(failure.ToString(), HasSubstr(nvme.path() + "/strata-nvme-"));
    EXPECT_TRUE(failure.offset().has_value()) << failure.ToString();
  }
}

// `strata train` (Run) with --save: the state the deleted file still holds
// (through the tier's open descriptor) is saved before it stops, and resumes
// exactly where an uninterrupted run would be.
TEST(Trainer, RunSavesTheStateWhenASwapFileIsDeleted) {
  TempDir nvme, ckpt;
  TrainOptions o = Tiny(4);
  o.config.zero.offload_optimizer.device = "nvme";
  o.config.zero.offload_optimizer.nvme_path = nvme.path();
  o.save_dir = ckpt.path();
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_OK(t->Step().status());
  ASSERT_OK(t->Step().status());
  ASSERT_GE(DeleteSwapFiles(nvme.path()), 1);
  std::ostringstream out;
  Status s = t->Run(out);
  ASSERT_THAT(s, StatusIs(StatusCode::kIoError));
  EXPECT_THAT(s.ToString(), HasSubstr("stopping before step 3"));
  EXPECT_THAT(s.ToString(), HasSubstr("was saved to " + ckpt.path()));
  t.reset();

  TrainOptions straight = Tiny(4);
  ASSERT_OK_AND_ASSIGN(auto u, Trainer::Create(straight, log));
  std::vector<double> want;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(StepReport r, u->Step());
    want.push_back(r.loss);
  }
  TrainOptions again = Tiny(4);
  again.resume_dir = ckpt.path();
  ASSERT_OK_AND_ASSIGN(auto t2, Trainer::Create(again, log));
  ASSERT_EQ(t2->step(), 2);
  for (int i = 2; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(StepReport r, t2->Step());
    EXPECT_EQ(r.loss, want[static_cast<size_t>(i)]) << "step " << i + 1;
  }
}

// --dry-run and the run share one budget computation (engine/budgets.h): the
// plan the dry run prints is the plan that runs, whatever the placement.
// (The run's table adds what it measured of its schedule; the dry run's
// starts with the stage's note, the model and the batch.)
TEST(Trainer, DryRunPrintsThePlanThatRuns) {
  auto lines = [](const std::string& text, std::initializer_list<const char*> drop) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) {
      bool keep = !l.empty();
      for (const char* d : drop) keep = keep && l.rfind(d, 0) != 0;
      if (keep) out.push_back(l);
    }
    return out;
  };
  struct Case {
    const char* what;
    void (*set)(TrainOptions&, const std::string& dir);
  };
  const Case cases[] = {
      {"all on the GPU", [](TrainOptions&, const std::string&) {}},
      {"optimizer on the host",
       [](TrainOptions& o, const std::string&) { o.config.zero.offload_optimizer.device = "cpu"; }},
      {"parameters streamed",
       [](TrainOptions& o, const std::string&) {
         o.config.zero.offload_optimizer.device = "cpu";
         o.config.zero.offload_param.device = "cpu";
         o.gpu_memory_limit = 3 * kMiB;
       }},
      {"optimizer on NVMe, micro-batch-major",
       [](TrainOptions& o, const std::string& dir) {
         o.config.zero.offload_optimizer.device = "nvme";
         o.config.zero.offload_optimizer.nvme_path = dir;
         o.config.trainer.schedule = "micro-batch-major";
       }},
  };
  bool streamed = false;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir dir;
    TrainOptions o = Tiny(1);
    c.set(o, dir.path());
    ASSERT_OK_AND_ASSIGN(std::string dry, Trainer::DryRun(o));
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    const std::vector<std::string> planned = lines(dry, {"zero_optimization.stage", "model:", "batch:"});
    const std::vector<std::string> ran = lines(t->PlanTable(), {"swap window:", "per step (scheduled):"});
    EXPECT_EQ(planned, ran) << "dry run:\n" << dry << "\nrun:\n" << t->PlanTable();
    EXPECT_GT(planned.size(), 8u);
    for (const std::string& l : ran)
      streamed = streamed || (l.rfind("prefetch depth: ", 0) == 0 && l.find("depth: -") == std::string::npos);
  }
  EXPECT_TRUE(streamed) << "no case streamed the parameters: the 3 MiB limit no longer forces it";
}

}  // namespace
}  // namespace strata
