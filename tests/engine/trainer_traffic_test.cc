// SPDX-License-Identifier: Apache-2.0
// PCIe bytes per step of the offload trainer with the GPU budget tight
// (CPU backend: the GPU tier is a host stand-in and its copy engine counts
// every byte, so StepReport.h2d/d2h are exact). The step's access schedule
// runs through the prefetcher: each step moves exactly what the schedule says
// (Trainer::traffic, printed beside the plan), no copy is loaded twice, the store never has to
// make room on its own, and losses do not depend on the room.
#include <sstream>

#include "base/bytes.h"
#include "engine/trainer.h"
#include "engine/model_config.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

TrainOptions Streamed(int64_t n_layer, bool bf16, uint64_t gpu_limit) {
  TrainOptions o = testing::TinyTrainer(n_layer);
  Config& c = o.config;
  c.bf16 = bf16;
  c.zero.offload_optimizer.device = "cpu";
  c.zero.offload_param.device = "cpu";
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.gpu_memory_limit = gpu_limit;
  o.host_memory_limit = 256 * kMiB;
  return o;
}

// The sizes the bytes are made of.
struct Sizes {
  uint64_t block = 0;   // one block's parameters, in the compute dtype
  uint64_t grads = 0;   // every gradient, as the optimizer reads them
  uint64_t upload = 0;  // the embedding's and ln_f's parameters (GPU home, updated on the host)
  uint64_t ck_set = 0;  // one layer's checkpoints, all micro-batches
};

Sizes SizesOf(const TrainOptions& o) {
  const Config& c = o.config;
  Result<models::ModelSpec> spec = ModelSpecFor(c);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return Sizes{};
  const models::ModelSpec& m = *spec;
  const uint64_t dt = c.bf16 ? 2 : 4;
  const uint64_t block = static_cast<uint64_t>(m.units[1].numel);
  const uint64_t emb = static_cast<uint64_t>(m.units.front().numel);
  const uint64_t lnf = static_cast<uint64_t>(m.units.back().numel);
  Sizes s;
  s.block = block * dt;
  s.grads = (static_cast<uint64_t>(m.n_layer) * block + emb + lnf) * dt;  // fp32, or bf16 in bf16 training
  s.upload = (emb + lnf) * dt;
  s.ck_set = static_cast<uint64_t>(c.grad_accum * c.micro_batch * c.model.seq_len * m.d_model) * dt;
  return s;
}

struct Tight {
  const char* name;
  int64_t n_layer;
  bool bf16;
  uint64_t gpu_limit;
};

class TrainerTraffic : public ::testing::TestWithParam<Tight> {};

TEST_P(TrainerTraffic, BytesPerStepAreWhatThePlanSays) {
  const Tight& p = GetParam();
  const TrainOptions o = Streamed(p.n_layer, p.bf16, p.gpu_limit);
  ASSERT_OK_AND_ASSIGN(std::string estimate, Trainer::DryRun(o));
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  const Plan plan = t->plan();
  const ScheduledTraffic traffic = t->traffic();
  const std::string table = t->PlanTable();
  ASSERT_FALSE(plan.params_resident) << table;
  ASSERT_EQ(plan.params, TierKind::kHost) << table;
  ASSERT_EQ(plan.checkpoints, TierKind::kHost) << table;
  ASSERT_EQ(plan.grads, TierKind::kHost) << table;

  const Sizes s = SizesOf(o);
  const uint64_t L = static_cast<uint64_t>(p.n_layer);
  const uint64_t host_sets = L + 1 - static_cast<uint64_t>(plan.checkpoint_gpu_layers);
  // Down: every gradient, and every host checkpoint once (written in the
  // forward, it goes home when the window has no room for it until the
  // backward, or after the backward has read it).
  EXPECT_EQ(traffic.d2h, s.grads + host_sets * s.ck_set) << table;
  // Up: each block's new parameters once at least, twice at most; host
  // checkpoints back once at most (the head's input never); the embedding's
  // and ln_f's updates. No reloads.
  const uint64_t back = (plan.checkpoint_gpu_layers == 0 ? host_sets - 1 : host_sets) * s.ck_set;
  EXPECT_LE(traffic.h2d, 2 * L * s.block + back + s.upload) << table;
  EXPECT_GE(traffic.h2d, L * s.block + s.upload) << table;
  // The room is used: blocks kept from the forward for the backward come
  // in once, below the planner's estimate of two passes.
  EXPECT_LT(traffic.h2d, 2 * L * s.block + back + s.upload) << table;

  for (int step = 1; step <= 5; ++step) {
    ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
    if (step == 1) continue;  // no update to upload yet, first loads from nothing resident
    EXPECT_EQ(r.h2d, traffic.h2d) << "step " << step << "\n" << table;
    EXPECT_EQ(r.d2h, traffic.d2h) << "step " << step << "\n" << table;
  }
  TrainerInfo info = t->Info();
  EXPECT_GT(info.swap_window, 0u);
  EXPECT_EQ(info.swap_forced, 0u);
  EXPECT_EQ(info.swap_fragmented, 0u);
  // Every GPU copy dropped was dropped by the prefetcher: the store never had
  // to make room by itself (which would have meant a reload).
  EXPECT_EQ(info.gpu_evictions, info.swap_evictions);
  EXPECT_THAT(table, ::testing::HasSubstr("per step (scheduled)"));
  (void)estimate;
}

INSTANTIATE_TEST_SUITE_P(Placements, TrainerTraffic,
                         ::testing::Values(
                             // fp32, 8 blocks: checkpoints split (the last sets on the GPU).
                             Tight{"Fp32CheckpointsSplit", 8, false, 3300 * kKiB},
                             // fp32, 8 blocks: every checkpoint on the host.
                             Tight{"Fp32CheckpointsOnHost", 8, false, 2900 * kKiB},
                             // bf16, 8 blocks: bf16 gradients on the host, checkpoints on the host.
                             Tight{"Bf16", 8, true, 1900 * kKiB}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(TrainerTrafficRoomy, AWindowThatHoldsTheStepLoadsEachBlockOnce) {
  // Parameters stream (the planner's estimate), but the GPU room left holds
  // the whole step: each block's new parameters come up once, and no
  // checkpoint comes back.
  const TrainOptions o = Streamed(4, false, 3 * kMiB);
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  const Plan plan = t->plan();
  const ScheduledTraffic traffic = t->traffic();
  ASSERT_FALSE(plan.params_resident) << t->PlanTable();
  const Sizes s = SizesOf(o);
  EXPECT_EQ(traffic.h2d, 4 * s.block + s.upload) << t->PlanTable();
  for (int step = 1; step <= 3; ++step) {
    ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
    if (step > 1) {
      EXPECT_EQ(r.h2d, traffic.h2d) << "step " << step;
    }
  }
}

TEST(TrainerTrafficRoomy, LossesDoNotDependOnTheRoom) {
  TrainOptions resident = Streamed(8, false, 64 * kMiB);
  resident.config.zero.offload_param.device = "none";
  resident.config.zero.offload_optimizer.device = "none";
  std::vector<std::vector<double>> losses;
  for (const TrainOptions& o : {resident, Streamed(8, false, 2900 * kKiB)}) {
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    losses.emplace_back();
    for (int i = 0; i < 3; ++i) {
      ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
      losses.back().push_back(r.loss);
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
}

// The optimizer state on NVMe passes through the host tier a whole shard at
// a time, three shards at once (read ahead, updating, written behind). With
// an embedding ten times a block, a host tier sized for three blocks ran out
// of room for the embedding's third tensor ("no room for tensor 'emb.v'" at
// step 2). The run completes with the optimizer on NVMe and gives the
// optimizer-on-the-host run's losses. (Bytes per step are not asserted:
// under load a lagging write-behind or a read-ahead that finds the copy
// still in host memory moves a shard's bytes into another step, or drops
// them, either way.)
TEST(TrainerTrafficNvme, AnEmbeddingLargerThanTheBlocksFitsTheHostWindow) {
  testing::TempDir nvme;
  TrainOptions host = testing::TinyTrainer(4, 256, 128);
  Config& c = host.config;
  c.model.vocab_size = 50304;
  c.micro_batch = 2;
  c.grad_accum = 1;
  c.train_batch_size = 2;
  c.bf16 = true;
  c.gradient_clipping = 0;
  c.zero.offload_optimizer.device = "cpu";
  host.backend = "cpu";
  host.cpu_threads = 2;
  host.host_memory_limit = 1 * kGiB;
  TrainOptions o = host;
  o.config.zero.offload_optimizer.device = "nvme";
  o.config.zero.offload_optimizer.nvme_path = nvme.path();
  o.config.zero.offload_optimizer.pipeline_read = o.config.zero.offload_optimizer.pipeline_write = true;
  std::vector<std::vector<double>> losses;
  for (const TrainOptions* run : {&host, &o}) {
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(*run, log));
    ASSERT_EQ(t->plan().optimizer, run == &o ? TierKind::kNvme : TierKind::kHost) << t->PlanTable();
    losses.emplace_back();
    for (int step = 1; step <= 4; ++step) {
      ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
      losses.back().push_back(r.loss);
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Micro-batch-major under the same tight budgets: each micro-batch streams
// the blocks and its checkpoints, the gradient accumulators cross between
// micro-batches when they live on the host, and still every step moves
// exactly the schedule's bytes, with no reload the prefetcher did not plan.
TEST(TrainerTrafficMicroBatchMajor, BytesPerStepAreTheSchedules) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    TrainOptions o = Streamed(8, bf16, (bf16 ? 2000 : 2900) * kKiB);
    o.config.trainer.schedule = "micro-batch-major";
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    const Plan plan = t->plan();
    const ScheduledTraffic traffic = t->traffic();
    const std::string table = t->PlanTable();
    ASSERT_FALSE(plan.params_resident) << table;
    ASSERT_FALSE(plan.layer_major) << table;
    const Sizes s = SizesOf(o);
    // Every block goes up at least once per step; every gradient comes down.
    EXPECT_GE(traffic.h2d, 8 * s.block + s.upload) << table;
    EXPECT_GE(traffic.d2h, s.grads) << table;
    for (int step = 1; step <= 4; ++step) {
      ASSERT_OK_AND_ASSIGN(StepReport r, t->Step());
      if (step == 1) continue;
      EXPECT_EQ(r.h2d, traffic.h2d) << "step " << step << "\n" << table;
      EXPECT_EQ(r.d2h, traffic.d2h) << "step " << step << "\n" << table;
    }
    TrainerInfo info = t->Info();
    EXPECT_EQ(info.swap_forced, 0u);
    EXPECT_EQ(info.gpu_evictions, info.swap_evictions);
  }
}

}  // namespace
}  // namespace strata
