// SPDX-License-Identifier: Apache-2.0
// What bounds offloaded training: the plan is the one strata train makes,
// and the bounding resource follows the rates.
#include "bench/offload_bound.h"

#include "base/bytes.h"
#include "engine/budgets.h"
#include "engine/model_config.h"
#include "engine/trainer.h"
#include "tests/test_util.h"

namespace strata::bench {
namespace {

// Rates of a plausible GPU host; each test slows one resource down.
OffloadRates Rates() {
  OffloadRates r;
  r.h2d_gbs = r.d2h_gbs = 50;
  r.both_gbs = 80;
  r.nvme_read_gbs = r.nvme_write_gbs = r.nvme_mixed_gbs = 5;
  r.adam_params_per_s = 5e9;
  r.compute_flops = 400e12;
  r.gpu_budget = 70 * kGiB;
  r.host_budget = 100 * kGiB;
  r.nvme_free = 1000 * kGiB;
  return r;
}

ModelShape Shape(const std::string& name) {
  for (const auto& m : KnownModelShapes())
    if (m.name == name) return m;
  ADD_FAILURE() << "no shape " << name;
  return {};
}

BoundRow AnalyzeOne(const OffloadRates& r, const std::string& model) {
  auto be = kernels::MakeCpuBackend(1);
  auto rows = AnalyzeBounds(r, {Shape(model)}, *be, 8);
  return rows.at(0);
}

TEST(OffloadBound, AFastMachineIsBoundByCompute) {
  const BoundRow b = AnalyzeOne(Rates(), "gpt-1.3b");
  ASSERT_TRUE(b.fits) << b.why_not;
  EXPECT_EQ(b.bound, "compute");
  EXPECT_DOUBLE_EQ(b.step_s, b.compute_s);
  EXPECT_GT(b.compute_s, b.pcie_s);
  EXPECT_NEAR(b.tokens_per_s, b.tokens_per_step / b.step_s, 1e-6);
  EXPECT_EQ(b.tokens_per_step, b.micro_batch * 8 * 2048);
}

TEST(OffloadBound, ASlowCpuAdamBoundsAHostOptimizer) {
  OffloadRates r = Rates();
  r.gpu_budget = 24 * kGiB;  // the 6.7B's optimizer state (80 GB) cannot stay on the GPU
  r.adam_params_per_s = 1e6;
  const BoundRow b = AnalyzeOne(r, "gpt-6.7b");
  ASSERT_TRUE(b.fits) << b.why_not;
  ASSERT_NE(b.plan.optimizer, TierKind::kGpu) << PlacementText(b.plan);
  EXPECT_EQ(b.bound, "CPU Adam");
  EXPECT_NEAR(b.adam_s, static_cast<double>(b.plan.total_params - b.plan.optimizer_gpu_params) / 1e6, 1e-3);
}

// The CPU Adam and the copies share the host's memory: with a host roof
// slower than what the step moves through it, host memory bounds the step,
// at the Adam pass's 28 bytes per offloaded parameter plus the copies'.
TEST(OffloadBound, ASlowHostMemoryBoundsAHostOptimizer) {
  OffloadRates r = Rates();
  r.gpu_budget = 24 * kGiB;
  r.host_roof_gbs = 1;
  const BoundRow b = AnalyzeOne(r, "gpt-6.7b");
  ASSERT_TRUE(b.fits) << b.why_not;
  ASSERT_NE(b.plan.optimizer, TierKind::kGpu) << PlacementText(b.plan);
  EXPECT_EQ(b.bound, "host memory");
  const double bytes = 28.0 * static_cast<double>(b.plan.total_params - b.plan.optimizer_gpu_params) +
                       static_cast<double>(b.plan.h2d + b.plan.d2h + b.plan.nvme_read + b.plan.nvme_write);
  EXPECT_NEAR(b.host_s, bytes / 1e9, 1e-6 * b.host_s);
  EXPECT_DOUBLE_EQ(b.step_s, b.host_s);
  // Not measured: left out of the bound.
  r.host_roof_gbs = 0;
  const BoundRow c = AnalyzeOne(r, "gpt-6.7b");
  EXPECT_EQ(c.host_s, 0);
  EXPECT_NE(c.bound, "host memory");
}

TEST(OffloadBound, ASlowDiskBoundsAnNvmeOptimizer) {
  OffloadRates r = Rates();
  r.gpu_budget = 24 * kGiB;
  r.host_budget = 40 * kGiB;  // the 13B's fp32 state (156 GB) must go to NVMe
  r.nvme_read_gbs = r.nvme_write_gbs = r.nvme_mixed_gbs = 0.1;
  const BoundRow b = AnalyzeOne(r, "gpt-13b");
  ASSERT_TRUE(b.fits) << b.why_not;
  ASSERT_EQ(b.plan.optimizer, TierKind::kNvme) << PlacementText(b.plan);
  EXPECT_EQ(b.bound, "NVMe");
  EXPECT_GE(b.nvme_s, static_cast<double>(b.plan.nvme_read) / 0.1e9);
}

TEST(OffloadBound, NoRoomAnywhereSaysWhichBudget) {
  OffloadRates r = Rates();
  r.host_budget = 8 * kGiB;
  r.nvme_free = 0;  // no NVMe
  const BoundRow b = AnalyzeOne(r, "gpt-30b");
  EXPECT_FALSE(b.fits);
  EXPECT_NE(b.why_not.find("budget"), std::string::npos) << b.why_not;
}

TEST(OffloadBound, TooLittleNvmeSpaceIsSaid) {
  OffloadRates r = Rates();
  r.gpu_budget = 24 * kGiB;
  r.host_budget = 40 * kGiB;
  r.nvme_free = 10 * kGiB;
  const BoundRow b = AnalyzeOne(r, "gpt-13b");
  EXPECT_FALSE(b.fits);
  EXPECT_NE(b.why_not.find("free there"), std::string::npos) << b.why_not;
}

// The NVMe share of a step (strata-bench train --workload gpt-1.3b-nvme and
// the bound table): the longest of reads alone, writes alone, and all the
// bytes at the mixed rate; beside it the old sum.
TEST(NvmeBound, IsTheLongestOfReadWriteAndMixed) {
  // 6 GB read at 2 GB/s (3 s), 4 GB written at 4 GB/s (1 s), 10 GB at 2.5 GB/s mixed (4 s).
  const NvmeStepBound b = NvmeBoundOf(6'000'000'000, 4'000'000'000, 2, 4, 2.5);
  EXPECT_DOUBLE_EQ(b.read_s, 3);
  EXPECT_DOUBLE_EQ(b.write_s, 1);
  EXPECT_DOUBLE_EQ(b.mixed_s, 4);
  EXPECT_DOUBLE_EQ(b.overlapped_s(), 4);  // the disk shares itself between them: the mixed rate bounds
  EXPECT_DOUBLE_EQ(b.sum_s(), 4);
  // A disk that serves both at once as fast as either alone: the reads bound it, below the sum.
  const NvmeStepBound fast = NvmeBoundOf(6'000'000'000, 4'000'000'000, 2, 4, 10);
  EXPECT_DOUBLE_EQ(fast.mixed_s, 1);
  EXPECT_DOUBLE_EQ(fast.overlapped_s(), 3);
  EXPECT_DOUBLE_EQ(fast.sum_s(), 4);
  // Writes the slowest.
  EXPECT_DOUBLE_EQ(NvmeBoundOf(1'000'000'000, 4'000'000'000, 2, 1, 100).overlapped_s(), 4);
}

TEST(NvmeBound, AnUnmeasuredMixedRateIsLeftOutAndAMissingRateIsNeverFast) {
  const NvmeStepBound b = NvmeBoundOf(6'000'000'000, 4'000'000'000, 2, 4, 0);
  EXPECT_DOUBLE_EQ(b.mixed_s, 0);
  EXPECT_DOUBLE_EQ(b.overlapped_s(), 3);
  // Bytes to move at a rate of 0: the bound is effectively infinite, never 0.
  EXPECT_GE(NvmeBoundOf(1, 0, 0, 4, 0).overlapped_s(), 1e29);
  // Nothing to move: no time, whatever the rates.
  EXPECT_DOUBLE_EQ(NvmeBoundOf(0, 0, 0, 0, 0).overlapped_s(), 0);
}

// The bound table uses the same arithmetic: its NVMe time at the plan's bytes.
TEST(NvmeBound, TheBoundTableUsesIt) {
  OffloadRates r = Rates();
  r.gpu_budget = 24 * kGiB;
  r.host_budget = 40 * kGiB;  // the 13B's state must go to NVMe
  r.nvme_read_gbs = 1, r.nvme_write_gbs = 2, r.nvme_mixed_gbs = 0.5;
  const BoundRow b = AnalyzeOne(r, "gpt-13b");
  ASSERT_TRUE(b.fits) << b.why_not;
  ASSERT_GT(b.plan.nvme_read + b.plan.nvme_write, 0u);
  EXPECT_DOUBLE_EQ(b.nvme_s, NvmeBoundOf(b.plan.nvme_read, b.plan.nvme_write, 1, 2, 0.5).overlapped_s());
  EXPECT_DOUBLE_EQ(b.nvme_s, static_cast<double>(b.plan.nvme_read + b.plan.nvme_write) / 0.5e9);
}

// The bound table's plan inputs (engine/budgets.h, as strata train makes them)
// give the plan strata train --dry-run prints for the same config and budgets.
TEST(BenchPlanInputs, GivesTheDryRunsPlan) {
  for (const char* device : {"none", "cpu"}) {
    TrainOptions o;
    o.backend = "cpu";
    o.gpu_memory_limit = 2 * kGiB;
    o.host_memory_limit = 6 * kGiB;
    Config& c = o.config;
    c.model.n_layer = 12;
    c.model.n_embd = 768;
    c.model.n_head = 12;
    c.model.vocab_size = 50304;
    c.model.seq_len = 1024;
    c.micro_batch = 4;
    c.grad_accum = 2;
    c.train_batch_size = 8;
    c.bf16 = true;
    c.gradient_clipping = 0;
    c.zero.offload_optimizer.device = device;
    ASSERT_OK_AND_ASSIGN(std::string dry, Trainer::DryRun(o));

    auto be = kernels::MakeCpuBackend(1);
    ASSERT_OK_AND_ASSIGN(models::ModelSpec spec, ModelSpecFor(c));
    ASSERT_OK_AND_ASSIGN(PlanInputs in, PlanInputsFor(c, *be, spec, Budgets{2 * kGiB, 6 * kGiB, 0}, false));
    ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
    EXPECT_NE(dry.find(p.Table(2 * kGiB, 6 * kGiB)), std::string::npos)
        << "offload_optimizer.device " << device << "\ndry run:\n" << dry << "\nbench:\n" << p.Table(2 * kGiB, 6 * kGiB);
  }
}

}  // namespace
}  // namespace strata::bench
