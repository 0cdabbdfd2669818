#include "engine/planner.h"

#include "tests/test_util.h"
#include "tiers/bytes.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// GPT shapes: block = 12C^2 + 13C, embedding = (Vp + T) C, ln_f = 2C.
PlanInputs Gpt(int64_t L, int64_t C, int64_t T, int64_t Vp, int64_t B, int64_t A) {
  PlanInputs in;
  in.n_layer = L;
  in.layer_params = static_cast<uint64_t>(12 * C * C + 13 * C);
  in.embedding_params = static_cast<uint64_t>((Vp + T) * C);
  in.final_params = static_cast<uint64_t>(2 * C);
  in.param_bytes = 2;
  in.checkpoint_bytes = static_cast<uint64_t>(B * T * C * 2);
  in.grad_accum = A;
  in.layer_workspace = static_cast<uint64_t>(B * T * C * 2 * 16);
  in.head_workspace = static_cast<uint64_t>(B * T * 8192 * 4);
  in.fixed_gpu = 1 << 20;
  return in;
}

TEST(Planner, SmallModelIsAllResident) {
  PlanInputs in = Gpt(4, 128, 128, 256, 8, 1);
  in.gpu_budget = 8 * kGiB;
  in.host_budget = 8 * kGiB;
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  EXPECT_TRUE(p.params_resident);
  EXPECT_EQ(p.optimizer, TierKind::kGpu);
  EXPECT_EQ(p.h2d, 0u);
  EXPECT_LE(p.gpu_total, in.gpu_budget);
}

TEST(Planner, ForcedCpuOptimizerIsHonoured) {
  PlanInputs in = Gpt(4, 128, 128, 256, 8, 1);
  in.gpu_budget = 8 * kGiB;
  in.host_budget = 8 * kGiB;
  in.offload_optimizer = "cpu";
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  EXPECT_EQ(p.optimizer, TierKind::kHost);
  // Adam on the host reads every gradient once and sends every parameter back.
  EXPECT_EQ(p.d2h, (4 * 12 * 128 * 128 + 4 * 13 * 128 + (256 + 128) * 128 + 2 * 128) * 4ull);
  EXPECT_EQ(p.h2d, p.d2h / 2);
}

TEST(Planner, Gpt67bIn24GiBFitsTheH200Host) {
  // The gpt-6.7b workload: fp32 gradients (27 GB) cannot stay on a 24 GiB
  // GPU, so they leave for the host in bf16; the plan with the least PCIe
  // traffic that fits 110 GiB of host memory.
  PlanInputs in = Gpt(32, 4096, 2048, 50304, 4, 8);
  in.gpu_budget = 24 * kGiB;
  in.host_budget = 110 * kGiB;
  in.grad_host_bytes = 2;
  in.offload_optimizer = "cpu";
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  EXPECT_EQ(p.grads, TierKind::kHost);
  EXPECT_EQ(p.optimizer, TierKind::kHost);
  EXPECT_LE(p.gpu_total, in.gpu_budget);
  EXPECT_LE(p.host_total, in.host_budget);
  // Whatever the choice, each step moves the gradients down once (bf16).
  EXPECT_GE(p.d2h, (32ull * (12ull * 4096 * 4096 + 13 * 4096)) * 2);
}

TEST(Planner, CheckpointsSplitBetweenGpuAndHost) {
  // 1.3B at 8 GiB with micro-batch 8: parameters resident, the checkpoints
  // that fit beside them stay on the GPU (the last layers'), the rest go to
  // the host.
  PlanInputs in = Gpt(24, 2048, 2048, 50304, 8, 4);
  in.gpu_budget = 8 * kGiB;
  in.host_budget = 100 * kGiB;
  in.grad_host_bytes = 2;
  in.offload_optimizer = "cpu";
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  EXPECT_EQ(p.checkpoints, TierKind::kHost);
  EXPECT_GT(p.checkpoint_gpu_layers, 0);
  EXPECT_LT(p.checkpoint_gpu_layers, 25);
  EXPECT_LE(p.gpu_total, in.gpu_budget);
  EXPECT_THAT(p.Table(in.gpu_budget, in.host_budget), HasSubstr("layers' on the GPU"));
}

TEST(Planner, Gpt67bIn12GiBStreamsParameters) {
  PlanInputs in = Gpt(32, 4096, 2048, 50304, 4, 8);
  in.gpu_budget = 12 * kGiB;
  in.host_budget = 200 * kGiB;
  in.offload_optimizer = "cpu";
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  EXPECT_FALSE(p.params_resident);
  EXPECT_EQ(p.params, TierKind::kHost);
  EXPECT_GE(p.prefetch_depth, 1);
  EXPECT_LE(p.gpu_total, in.gpu_budget);
  // Two passes of the blocks' parameters (forward, backward) per step.
  EXPECT_GE(p.h2d, 2ull * 32 * (12ull * 4096 * 4096 + 13 * 4096) * 2);
  std::string table = p.Table(in.gpu_budget, in.host_budget);
  EXPECT_THAT(table, AllOf(HasSubstr("parameters"), HasSubstr("optimizer"), HasSubstr("per step: H2D")));
}

TEST(Planner, OptimizerGoesToNvmeWhenHostIsShort) {
  PlanInputs in = Gpt(24, 2048, 2048, 50304, 8, 1);
  in.gpu_budget = 8 * kGiB;
  in.host_budget = 8 * kGiB;
  in.have_nvme = true;
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  EXPECT_EQ(p.optimizer, TierKind::kNvme);
  EXPECT_GT(p.nvme_read, 0u);
  EXPECT_LE(p.host_total, in.host_budget);
}

TEST(Planner, ImpossibleGpuBudgetSaysByHowMuch) {
  PlanInputs in = Gpt(24, 2048, 2048, 50304, 8, 1);
  in.gpu_budget = 256 * kMiB;
  in.host_budget = 500 * kGiB;
  auto r = MakePlan(in);
  EXPECT_THAT(r, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_EQ(r.status().tier(), TierKind::kGpu);
  EXPECT_GT(r.status().bytes_requested(), in.gpu_budget);
  EXPECT_THAT(r.status().ToString(), AllOf(HasSubstr("GPU budget"), HasSubstr("more than the budget")));
}

TEST(Planner, ImpossibleHostBudgetSuggestsNvme) {
  PlanInputs in = Gpt(24, 2048, 2048, 50304, 8, 1);
  in.gpu_budget = 8 * kGiB;
  in.host_budget = 1 * kGiB;
  auto r = MakePlan(in);
  EXPECT_THAT(r, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_EQ(r.status().tier(), TierKind::kHost);
  EXPECT_THAT(r.status().ToString(), HasSubstr("nvme_path"));
}

TEST(Planner, BadRequests) {
  PlanInputs in = Gpt(2, 64, 32, 256, 1, 1);
  in.gpu_budget = in.host_budget = kGiB;
  in.offload_optimizer = "nvme";
  EXPECT_THAT(MakePlan(in), StatusIs(StatusCode::kInvalidArgument));
  in.offload_optimizer = "disk";
  EXPECT_THAT(MakePlan(in), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace strata
