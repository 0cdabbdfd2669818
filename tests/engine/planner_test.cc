// SPDX-License-Identifier: Apache-2.0
#include "engine/planner.h"

#include <cmath>
#include <sstream>
#include <string>

#include "base/bytes.h"
#include "tests/test_util.h"

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

// A small GPT (4 layers, C 128, T 128, vocab 256; batch 8) with room to
// spare on both tiers and its optimizer on the host, and its parameters.
PlanInputs SmallOffloaded() {
  PlanInputs in = Gpt(4, 128, 128, 256, 8, 1);
  in.gpu_budget = 8 * kGiB;
  in.host_budget = 8 * kGiB;
  in.offload_optimizer = "cpu";
  return in;
}
constexpr uint64_t kSmallParams = 4 * (12 * 128 * 128 + 13 * 128) + (256 + 128) * 128 + 2 * 128;

void ExpectRowsAddUp(const Plan& p) {
  uint64_t gpu = 0, host = 0, nvme = 0;
  for (const auto& r : p.rows) gpu += r.gpu, host += r.host, nvme += r.nvme;
  EXPECT_EQ(gpu, p.gpu_total);
  EXPECT_EQ(host, p.host_total);
  EXPECT_EQ(nvme, p.nvme_total);
}

const Plan::Row& RowOf(const Plan& p, const std::string& prefix) {
  for (const auto& r : p.rows)
    if (r.kind.rfind(prefix, 0) == 0) return r;
  ADD_FAILURE() << "no row " << prefix;
  return p.rows.front();
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
  PlanInputs in = SmallOffloaded();
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  EXPECT_EQ(p.optimizer, TierKind::kHost);
  // Adam on the host reads every gradient once and sends every parameter back.
  EXPECT_EQ(p.d2h, (4 * 12 * 128 * 128 + 4 * 13 * 128 + (256 + 128) * 128 + 2 * 128) * 4ull);
  EXPECT_EQ(p.h2d, p.d2h / 2);
}

// ZeRO stage >= 1 across W ranks: the rank's plan holds 1/W of the
// optimizer state (its slices), wherever it lives.
TEST(Planner, PartitionedOptimizerStateIsPerRank) {
  PlanInputs in = SmallOffloaded();
  ASSERT_OK_AND_ASSIGN(Plan whole, MakePlan(in));
  in.zero_partitions = 3;
  in.partitioned = true;
  ASSERT_OK_AND_ASSIGN(Plan third, MakePlan(in));
  const uint64_t P = kSmallParams;
  EXPECT_EQ(RowOf(whole, "optimizer").host, P * 12);
  EXPECT_EQ(RowOf(third, "optimizer").host, (P + 2) / 3 * 12);
  // The parameters stay whole (stages 1, 2), and beside them the rank
  // keeps its slice of each unit's, which its update writes (4 blocks, the
  // embedding, the final unit; each slice page-aligned).
  EXPECT_EQ(RowOf(third, "parameters").gpu, RowOf(whole, "parameters").gpu);
  const uint64_t block = 12 * 128 * 128 + 13 * 128, emb = (256 + 128) * 128, fin = 2 * 128;
  auto slice = [&](uint64_t n) { return AlignUp((n + 2) / 3 * in.param_bytes, 4096); };
  EXPECT_EQ(RowOf(third, "parameter slices").host, 4 * slice(block) + slice(emb) + slice(fin));
  for (const Plan::Row& r : whole.rows) EXPECT_NE(r.kind.rfind("parameter slices", 0), 0u);  // one rank: none
  ExpectRowsAddUp(third);
  EXPECT_LT(third.host_total, whole.host_total);
}

// ZeRO stage 2 across W ranks: the rank's gradients are its slices, 1/W of
// them wherever they live, and the optimizer reads (and the GPU sends down)
// only those; stage 1 keeps them whole.
TEST(Planner, StageTwoKeepsThisRanksGradientSlices) {
  PlanInputs in = SmallOffloaded();
  in.grad_host_bytes = 2;
  in.zero_partitions = 3;
  in.partitioned = true;
  ASSERT_OK_AND_ASSIGN(Plan one, MakePlan(in));
  in.partitions_grads = true;
  ASSERT_OK_AND_ASSIGN(Plan two, MakePlan(in));
  const uint64_t P = kSmallParams;
  const Plan::Row g1 = RowOf(one, "gradients"), g2 = RowOf(two, "gradients");
  EXPECT_EQ(g1.gpu + g1.host, P * 2);
  EXPECT_EQ(g2.gpu + g2.host, (P + 2) / 3 * 2);
  EXPECT_THAT(g2.kind, HasSubstr("this rank's slices"));
  EXPECT_EQ(one.d2h - two.d2h, P * 2 - (P + 2) / 3 * 2);
  ExpectRowsAddUp(two);
  EXPECT_LT(two.host_total + two.gpu_total, one.host_total + one.gpu_total);
}

// The ranks' sums beside the backward (overlap_comm) alternate two block
// accumulators: the working set grows by one block's fp32 gradient.
TEST(Planner, SumsBesideTheBackwardAddABlockAccumulator) {
  PlanInputs in = SmallOffloaded();
  in.grad_host_bytes = 2;
  in.zero_partitions = 2;
  in.partitioned = in.partitions_grads = true;
  ASSERT_OK_AND_ASSIGN(Plan one, MakePlan(in));
  in.second_block_accumulator = true;
  ASSERT_OK_AND_ASSIGN(Plan two, MakePlan(in));
  const Plan::Row w1 = RowOf(one, "working set"), w2 = RowOf(two, "working set");
  EXPECT_EQ(w2.gpu - w1.gpu, in.layer_params * 4);
  EXPECT_EQ(two.gpu_total - one.gpu_total, in.layer_params * 4);
  ExpectRowsAddUp(two);
}

// ZeRO stage 3: no rank holds a unit's whole parameters between uses (the
// gathers' buffers are outside the tiers), so the parameters take no tier
// memory, none streams, nothing is uploaded after the update, whatever
// offload_param asks; the slices stay on the host.
TEST(Planner, StageThreeGathersTheParametersInsteadOfPlacingThem) {
  PlanInputs in = SmallOffloaded();
  in.zero_partitions = 2;
  in.partitioned = true;
  ASSERT_OK_AND_ASSIGN(Plan two, MakePlan(in));
  in.gathers_params = true;
  in.offload_param = "cpu";  // (DeepSpeed's stage-3 offload config: the slices are on the host anyway)
  ASSERT_OK_AND_ASSIGN(Plan three, MakePlan(in));
  const uint64_t P = kSmallParams;
  EXPECT_EQ(RowOf(two, "parameters").gpu, P * in.param_bytes);
  const Plan::Row prow = RowOf(three, "parameters (ZeRO stage 3");
  EXPECT_EQ(prow.gpu + prow.host + prow.nvme, 0u);
  EXPECT_EQ(three.gpu_total + P * in.param_bytes, two.gpu_total);
  EXPECT_EQ(RowOf(three, "parameter slices").host, RowOf(two, "parameter slices").host);
  EXPECT_TRUE(three.params_resident);  // (nothing streams)
  // No uploads after the update; each of the pass's two uses of a unit
  // uploads this rank's half of it to be gathered.
  EXPECT_EQ(three.h2d + P * in.param_bytes, two.h2d + 2 * (P / 2) * in.param_bytes);
  EXPECT_THAT(three.Table(in.gpu_budget, in.host_budget), HasSubstr("gathered at each use"));
}

// The byte columns line up whatever the longest state name (stage 3's
// parameters row is longer than the others): the header, every row, the
// total and the budget end at the same column.
TEST(Planner, TableColumnsLineUpPastTheLongestName) {
  PlanInputs in = SmallOffloaded();
  in.zero_partitions = 2;
  in.partitioned = in.gathers_params = in.partitions_grads = true;
  in.offload_param = "cpu";
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  const std::string table = p.Table(in.gpu_budget, in.host_budget);
  std::istringstream lines(table);
  std::string line;
  size_t width = 0, rows = 0;
  while (std::getline(lines, line) && rows < p.rows.size() + 3) {
    if (width == 0) width = line.size();
    EXPECT_EQ(line.size(), width) << line;
    ++rows;
  }
  EXPECT_EQ(rows, p.rows.size() + 3);
  EXPECT_THAT(table, HasSubstr("parameters (ZeRO stage 3: gathered at each use) "));
}

// Nothing streams to lend its room when the parameters stay (resident, or
// gathered at stage 3): the plan keeps GPU room for two of the largest
// tensors passing through, an offloaded gradient on its way home or a host
// checkpoint on its way back. Found on the GPU: gpt-6.7b at stage 3 filled
// the budget with checkpoints and the last block's bf16 gradient (384 MiB)
// had no room.
TEST(Planner, ResidentOrGatheredParametersKeepRoomForTransit) {
  PlanInputs in = Gpt(32, 4096, 2048, 50304, 4, 8);
  in.gpu_budget = 20 * kGiB;  // (24 GiB less what is held beside the tiers)
  in.host_budget = 110 * kGiB;
  in.grad_host_bytes = 2;
  in.offload_optimizer = "cpu";
  in.partitioned = in.gathers_params = in.partitions_grads = in.second_block_accumulator = true;
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  ASSERT_EQ(p.grads, TierKind::kHost);
  ASSERT_EQ(p.checkpoints, TierKind::kHost);
  const uint64_t grad = AlignUp(in.embedding_params * 2, 4096);  // the largest unit's, one rank
  const uint64_t ck = in.checkpoint_bytes;
  EXPECT_EQ(RowOf(p, "transit").gpu, 2 * std::max(grad, ck));
  EXPECT_LE(p.gpu_total, in.gpu_budget);
  ExpectRowsAddUp(p);
  // Over two ranks the gradient passing through is the rank's slice.
  in.zero_partitions = 2;
  ASSERT_OK_AND_ASSIGN(Plan two, MakePlan(in));
  EXPECT_EQ(RowOf(two, "transit").gpu,
            2 * std::max(AlignUp((in.embedding_params + 1) / 2 * 2, 4096), AlignUp(ck, 4096)));
  // Streaming parameters: their prefetch buffers are the room.
  PlanInputs streamed = Gpt(32, 4096, 2048, 50304, 4, 8);
  streamed.gpu_budget = 12 * kGiB;
  streamed.host_budget = 110 * kGiB;
  streamed.grad_host_bytes = 2;
  streamed.offload_optimizer = "cpu";
  ASSERT_OK_AND_ASSIGN(Plan s, MakePlan(streamed));
  ASSERT_FALSE(s.params_resident);
  for (const Plan::Row& r : s.rows) EXPECT_NE(r.kind.rfind("transit", 0), 0u) << r.kind;
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

// ---- offload_optimizer.ratio (partial optimizer offload) ----------------------

// The small GPT: embedding (256 + 128) x 128 = 49152, blocks 198272 each,
// ln_f 256; 842496 in all.
constexpr uint64_t kEmb = 49152, kBlock = 198272, kLnF = 256, kAll = kEmb + 4 * kBlock + kLnF;

TEST(PlannerRatio, KeepsTheLongestForwardPrefixWithinOneMinusRatioOnTheGpu) {
  PlanInputs in = SmallOffloaded();
  ASSERT_OK_AND_ASSIGN(Plan whole, MakePlan(in));
  in.optimizer_offload_ratio = 0.5;
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  // (1 - 0.5) x 842496 = 421248: the embedding and block 0 (247424) fit,
  // block 1 more (445696) does not.
  EXPECT_EQ(p.shards, 6);
  EXPECT_EQ(p.optimizer_gpu_shards, 2);
  EXPECT_EQ(p.optimizer_gpu_params, kEmb + kBlock);
  EXPECT_EQ(p.total_params, kAll);
  EXPECT_EQ(p.optimizer, TierKind::kHost);
  EXPECT_EQ(whole.optimizer_gpu_shards, 0);
  ExpectRowsAddUp(p);
  ExpectRowsAddUp(whole);
  const uint64_t gpuN = kEmb + kBlock, restN = kAll - gpuN;
  // Optimizer state: 12 B per parameter on the GPU for the prefix, on the host for the rest.
  EXPECT_EQ(RowOf(p, "optimizer").gpu, gpuN * 12);
  EXPECT_EQ(RowOf(p, "optimizer").host, restN * 12);
  EXPECT_EQ(RowOf(whole, "optimizer").host, kAll * 12);
  // Gradients and parameters are on the GPU in both plans here; only the
  // optimizer state moves.
  EXPECT_EQ(p.gpu_total, whole.gpu_total + gpuN * 12);
  // (Beside the host tier's staging, which follows the largest offloaded shard.)
  const uint64_t staging = RowOf(p, "host staging").host, whole_staging = RowOf(whole, "host staging").host;
  EXPECT_GT(staging, 0u);
  EXPECT_EQ(p.host_total - staging, whole.host_total - whole_staging - gpuN * 12);
  // Per step: the prefix's gradients (fp32) no longer come down, its
  // parameters (2 B) no longer go up.
  EXPECT_EQ(whole.d2h - p.d2h, gpuN * 4);
  EXPECT_EQ(whole.h2d - p.h2d, gpuN * 2);
  EXPECT_EQ(p.d2h, restN * 4);
  EXPECT_EQ(p.h2d, restN * 2);
  std::string table = p.Table(in.gpu_budget, in.host_budget);
  EXPECT_THAT(table, HasSubstr("optimizer: first 2 of 6 shards (247424 params, 29.4%) on the GPU "
                               "(offload_optimizer.ratio 0.5, GPU Adam), the rest on the host (CPU Adam)"));
  EXPECT_THAT(whole.Table(in.gpu_budget, in.host_budget), ::testing::Not(HasSubstr("offload_optimizer.ratio")));
}

TEST(PlannerRatio, PrefixRuleAtTheEnds) {
  PlanInputs in = SmallOffloaded();
  struct Case {
    double ratio;
    int64_t shards;
    uint64_t params;
  } cases[] = {
      {1.0, 0, 0},
      {0.95, 0, 0},                      // 5% = 42124 < the embedding's 49152
      {0.94, 1, kEmb},                   // 50549
      {0.7, 2, kEmb + kBlock},           // 252748
      {0.2, 4, kEmb + 3 * kBlock},       // 673996 < 842240
      {0.0001, 5, kEmb + 4 * kBlock},    // 842411: all blocks, not ln_f
      {0.0, 6, kAll},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.ratio);
    in.optimizer_offload_ratio = c.ratio;
    ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
    EXPECT_EQ(p.optimizer_gpu_shards, c.shards);
    EXPECT_EQ(p.optimizer_gpu_params, c.params);
    EXPECT_EQ(RowOf(p, "optimizer").gpu, c.params * 12);
    EXPECT_EQ(RowOf(p, "optimizer").host, (kAll - c.params) * 12);
    ExpectRowsAddUp(p);
  }
  // 0: everything on the GPU, nothing crosses PCIe for the optimizer.
  in.optimizer_offload_ratio = 0;
  ASSERT_OK_AND_ASSIGN(Plan all, MakePlan(in));
  EXPECT_EQ(all.optimizer, TierKind::kGpu);
  EXPECT_EQ(all.grads, TierKind::kGpu);
  EXPECT_EQ(all.h2d, 0u);
  EXPECT_EQ(all.d2h, 0u);
  EXPECT_EQ(all.host_total, 0u);
  EXPECT_THAT(all.Table(in.gpu_budget, in.host_budget), HasSubstr("all 6 shards (842496 params) on the GPU"));
  in.optimizer_offload_ratio = 0.95;
  ASSERT_OK_AND_ASSIGN(Plan none, MakePlan(in));
  EXPECT_THAT(none.Table(in.gpu_budget, in.host_budget), HasSubstr("keeps no whole shard on the GPU"));
}

// The host update holds a whole shard's master/m/v while the next one is
// read ahead and the last written behind: the host window is the three
// largest offloaded shards' state, the embedding's (twice a block in GPT
// 1.3B) among them, not three blocks'.
TEST(Planner, NvmeOptimizerWindowHoldsTheThreeLargestShards) {
  PlanInputs in = Gpt(24, 2048, 2048, 50304, 8, 1);
  in.gpu_budget = 139 * kGiB;
  in.host_budget = 8 * kGiB;
  in.have_nvme = true;
  in.offload_optimizer = "nvme";
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  ASSERT_EQ(p.optimizer, TierKind::kNvme);
  EXPECT_EQ(RowOf(p, "optimizer").host, (in.embedding_params + 2 * in.layer_params) * 12);
  // Per rank, each shard's slice.
  in.zero_partitions = 4;
  ASSERT_OK_AND_ASSIGN(Plan q, MakePlan(in));
  EXPECT_EQ(RowOf(q, "optimizer").host,
            ((in.embedding_params + 3) / 4 + 2 * ((in.layer_params + 3) / 4)) * 12);
}

TEST(PlannerRatio, RestGoesToNvme) {
  PlanInputs in = Gpt(4, 128, 128, 256, 8, 1);
  in.gpu_budget = 8 * kGiB;
  in.host_budget = 8 * kGiB;
  in.have_nvme = true;
  in.offload_optimizer = "nvme";
  in.optimizer_offload_ratio = 0.5;
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  const uint64_t gpuN = kEmb + kBlock, restN = kAll - gpuN;
  EXPECT_EQ(p.optimizer, TierKind::kNvme);
  EXPECT_EQ(p.optimizer_gpu_shards, 2);
  EXPECT_EQ(RowOf(p, "optimizer").gpu, gpuN * 12);
  EXPECT_EQ(RowOf(p, "optimizer").nvme, restN * 12);
  EXPECT_EQ(p.nvme_read, restN * 12);
  EXPECT_EQ(p.nvme_write, restN * 12);
  ExpectRowsAddUp(p);
  EXPECT_THAT(p.Table(in.gpu_budget, in.host_budget), HasSubstr("the rest on the nvme (CPU Adam)"));
}

TEST(PlannerRatio, HostGradientsAndStreamedParametersKeepThePrefixOnTheGpu) {
  // 6.7B with its blocks streamed from the host (offload_param cpu); with
  // ratio 0.92 the embedding and the first block (0.42 G of the 6.66 G
  // parameters, within the 8%) keep their state, gradients and parameters
  // on the GPU anyway.
  PlanInputs in = Gpt(32, 4096, 2048, 50304, 4, 8);
  in.gpu_budget = 24 * kGiB;
  in.host_budget = 200 * kGiB;
  in.grad_host_bytes = 2;
  in.offload_optimizer = "cpu";
  in.offload_param = "cpu";
  ASSERT_OK_AND_ASSIGN(Plan whole, MakePlan(in));
  in.optimizer_offload_ratio = 0.92;
  ASSERT_OK_AND_ASSIGN(Plan p, MakePlan(in));
  const uint64_t block = 12ull * 4096 * 4096 + 13 * 4096, emb = (50304ull + 2048) * 4096, lnf = 2 * 4096;
  const uint64_t all = emb + 32 * block + lnf;
  ASSERT_EQ(p.optimizer_gpu_shards, 2) << "8% of " << all << " holds the embedding and one block";
  ASSERT_EQ(p.grads, TierKind::kHost) << p.Table(in.gpu_budget, in.host_budget);
  const uint64_t gpuN = emb + block;
  EXPECT_FALSE(p.params_resident);
  EXPECT_EQ(p.params, TierKind::kHost);
  ExpectRowsAddUp(p);
  const Plan::Row& prow = RowOf(p, "parameters");
  EXPECT_EQ(prow.gpu, (emb + lnf) * 2 + static_cast<uint64_t>(p.prefetch_depth + 1) * block * 2 + block * 2);
  EXPECT_EQ(prow.host, all * 2 - block * 2);
  EXPECT_EQ(RowOf(p, "optimizer").gpu, gpuN * 12);
  EXPECT_EQ(RowOf(p, "gradients").gpu, gpuN * 2);
  EXPECT_EQ(RowOf(p, "gradients").host, (all - gpuN) * 2);
  // Per step: 31 blocks stream (forward and backward), not 32; ln_f's
  // parameters go up after its update, the embedding's do not; the
  // offloaded shards' gradients come down; host checkpoints go both ways.
  const uint64_t ck_host = RowOf(p, "activation").host, ck_set = 8 * in.checkpoint_bytes;
  const uint64_t x_l = p.checkpoint_gpu_layers == 0 && p.checkpoints == TierKind::kHost ? ck_set : 0;
  EXPECT_EQ(p.h2d, 2 * 31 * block * 2 + lnf * 2 + ck_host - x_l);
  EXPECT_EQ(p.d2h, (all - gpuN) * 2 + ck_host);
  EXPECT_LE(p.gpu_total, in.gpu_budget);
  EXPECT_FALSE(whole.params_resident);
}

TEST(PlannerRatio, RatioWithoutAnOffloadDeviceIsAnError) {
  PlanInputs in = Gpt(4, 128, 128, 256, 8, 1);
  in.gpu_budget = in.host_budget = 8 * kGiB;
  in.optimizer_offload_ratio = 0.3;
  auto r = MakePlan(in);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().ToString(),
              AllOf(HasSubstr("zero_optimization.offload_optimizer.ratio 0.3"), HasSubstr("\"cpu\" or \"nvme\"")));
  in.offload_optimizer = "cpu";
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    in.optimizer_offload_ratio = bad;
    EXPECT_THAT(MakePlan(in), StatusIs(StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(PlannerRatio, AGpuBudgetTheRatioOverfillsSaysSo) {
  // 1.3B at 8 GiB fits with the optimizer on the host (CheckpointsSplit...);
  // keeping 70% of its state on the GPU (12 B/param) does not.
  PlanInputs in = Gpt(24, 2048, 2048, 50304, 8, 4);
  in.gpu_budget = 8 * kGiB;
  in.host_budget = 100 * kGiB;
  in.grad_host_bytes = 2;
  in.offload_optimizer = "cpu";
  ASSERT_OK(MakePlan(in).status());
  in.optimizer_offload_ratio = 0.3;
  auto r = MakePlan(in);
  EXPECT_THAT(r, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_EQ(r.status().tier(), TierKind::kGpu);
  EXPECT_GT(r.status().bytes_requested(), in.gpu_budget);
  EXPECT_THAT(r.status().ToString(),
              AllOf(HasSubstr("GPU budget with zero_optimization.offload_optimizer.ratio 0.3"),
                    HasSubstr("more than the budget of 8.00 GiB"),
                    HasSubstr("(raise zero_optimization.offload_optimizer.ratio or --gpu-memory-limit; at ratio 1 the plan fits)")));
  // A budget too small whatever the ratio: the usual advice.
  in.gpu_budget = 256 * kMiB;
  r = MakePlan(in);
  EXPECT_THAT(r, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_THAT(r.status().ToString(), AllOf(HasSubstr("ratio 0.3"), HasSubstr("(raise --gpu-memory-limit")));
}

}  // namespace
}  // namespace strata
