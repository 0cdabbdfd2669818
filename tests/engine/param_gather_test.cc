// SPDX-License-Identifier: Apache-2.0
// ParamGather (engine/param_gather.h): ZeRO stage 3's parameters gathered
// from the ranks' slices at each use, and fetched ahead of use in the
// step's order. One rank of two here, on the CPU backend, the other rank's
// slices put in by a fake collective (the MPI runs of the whole trainer are
// tests/engine/dp_ranks.cc; the NCCL one, data_parallel_gpu_test.cc).
#include "engine/param_gather.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "engine/model_state.h"
#include "engine/step_buffers.h"
#include "engine/step_schedule.h"
#include "kernels/backend.h"
#include "models/gpt2.h"
#include "models/model_program.h"
#include "tests/test_util.h"
#include "tiers/tier_store.h"

namespace strata {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

// Element i of unit u's whole parameters: distinct and exact in fp32.
float Value(size_t u, int64_t i) { return static_cast<float>(u * 100000 + static_cast<size_t>(i)); }

class ParamGatherTest : public ::testing::Test {
 protected:
  static constexpr int kWorld = 2;

  // A 3-block GPT (d 32) at ZeRO stage 3, this process rank `rank` of two.
  void SetUpRank(int rank, int n_layer = 3) {
    rank_ = rank;
    TierStoreOptions o;
    o.gpu_tier.stand_in = true;
    o.gpu_tier.budget_bytes = 64 * kMiB;
    o.host_tier.budget_bytes = 64 * kMiB;
    o.host_tier.pin = false;
    o.copy.stand_in = true;
    auto store = TierStore::Open(o);
    ASSERT_THAT(store, IsOk());
    store_ = std::move(*store);
    models::GptConfig g;
    g.n_layer = n_layer, g.n_embd = 32, g.n_head = 4, g.vocab_size = 128, g.seq_len = 16;
    auto spec = models::Gpt2Spec(g);
    ASSERT_THAT(spec, IsOk());
    spec_ = *spec;
    backend_ = kernels::MakeCpuBackend(1);
    Plan plan;
    plan.optimizer = plan.grads = plan.params = TierKind::kHost;
    plan.params_resident = false;
    plan.checkpoints = TierKind::kGpu;
    ModelState::Layout lay{DType::kF32, DType::kF32, 2, 16, 1, true};
    lay.rank = rank, lay.world = kWorld, lay.zero_stage = 3;
    auto state = ModelState::Create(store_.get(), spec_, plan, lay, false);
    ASSERT_THAT(state, IsOk());
    state_ = std::move(*state);
    ASSERT_TRUE(state_->layout().gathers_params());
    // This rank's slices: its part of the whole values (the padding 0).
    for (size_t u = 0; u < state_->size(); ++u) {
      const Shard& sh = state_->shard(u);
      auto v = store_->Acquire(sh.ps, TierKind::kHost, Access::kWriteDiscard);
      ASSERT_THAT(v, IsOk());
      float* f = static_cast<float*>(v->data);
      for (int64_t i = 0; i < sh.slice_pad; ++i) {
        const int64_t at = rank * sh.slice_pad + i;
        f[i] = at < sh.numel ? Value(u, at) : 0.0f;
      }
      ASSERT_THAT(store_->Release(sh.ps, TierKind::kHost, true), IsOk());
    }
  }

  // The gatherer, with the fake collective: the other rank's slice of the
  // unit `before_gather` named last, around this rank's (which must be in
  // its place already).
  std::unique_ptr<ParamGather> Make(uint64_t prefetch_elems) {
    ParamGather::Options o;
    o.prefetch_elems = prefetch_elems;
    o.before_gather = [this](size_t u) {
      if (fail_before_ == static_cast<int64_t>(u)) return Unavailable("the update of unit " + std::to_string(u) + " failed");
      log_.push_back("gather " + state_->shard(u).name);
      gathering_ = u;
      return Status::OK();
    };
    o.gather = [this](void* buf, size_t count, DType dtype, void* stream) -> Status {
      EXPECT_EQ(dtype, DType::kF32);
      EXPECT_EQ(stream, nullptr);
      const Shard& sh = state_->shard(gathering_);
      EXPECT_EQ(count, static_cast<size_t>(sh.slice_pad));
      float* all = static_cast<float*>(buf);
      for (int r = 0; r < kWorld; ++r)
        for (size_t i = 0; i < count; ++i) {
          const int64_t at = r * static_cast<int64_t>(count) + static_cast<int64_t>(i);
          const float want = at < sh.numel ? Value(gathering_, at) : 0.0f;
          if (r == rank_) {
            if (all[at] != want) return Internal("this rank's slice is not in its place at " + std::to_string(at));
          } else {
            all[at] = want;
          }
        }
      ++collectives_;
      return Status::OK();
    };
    auto g = ParamGather::Create(state_.get(), backend_.get(), std::move(o));
    EXPECT_THAT(g, IsOk());
    return g.ok() ? std::move(*g) : nullptr;
  }

  // Acquires unit u (logged), checks every element, and releases it.
  void Use(ParamGather* g, size_t u) {
    log_.push_back("use " + state_->shard(u).name);
    auto p = g->Acquire(u);
    ASSERT_THAT(p, IsOk());
    const float* f = static_cast<const float*>(*p);
    for (int64_t i = 0; i < state_->shard(u).numel; ++i)
      ASSERT_EQ(f[i], Value(u, i)) << state_->shard(u).name << " element " << i;
    ASSERT_THAT(g->Release(u), IsOk());
  }

  std::string Log() const {
    std::string s;
    for (const std::string& e : log_) s += e + "\n";
    return s;
  }

  int rank_ = 0;
  std::unique_ptr<TierStore> store_;
  models::ModelSpec spec_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<ModelState> state_;
  std::vector<std::string> log_;
  size_t gathering_ = 0;
  int collectives_ = 0;
  int64_t fail_before_ = -1;
};

// Units: 0 emb, 1-3 blk0-blk2, 4 lnf.
const std::vector<size_t> kOrder = {0, 1, 2, 3, 0, 4, 3, 2, 1};

TEST_F(ParamGatherTest, GathersTheWholeUnitAroundThisRanksSlice) {
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    SetUpRank(rank);
    std::unique_ptr<ParamGather> g = Make(0);
    ASSERT_NE(g, nullptr);
    for (size_t u = 0; u < state_->size(); ++u) Use(g.get(), u);
    EXPECT_EQ(g->gathers(), state_->size());
    uint64_t other = 0;
    for (const Shard& sh : state_->shards()) other += static_cast<uint64_t>(sh.slice_pad) * 4;
    EXPECT_EQ(g->gathered_bytes(), other);  // the other rank's slices
  }
}

// In the step's order with a bucket of one unit, each acquisition starts the
// next unit's gather before it is used: every unit is gathered before its
// use, one ahead, and a unit still in a buffer is not gathered again.
TEST_F(ParamGatherTest, FetchesTheNextUnitInTheStepsOrderAhead) {
  SetUpRank(0);
  std::unique_ptr<ParamGather> g = Make(1);  // one element: at least the next unit
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->max_buffers(), ParamGather::kMaxHeld + 1);
  g->SetStepOrder(kOrder);
  g->BeginStep();
  for (size_t u : kOrder) Use(g.get(), u);
  ASSERT_THAT(g->EndStep(), IsOk());
  const std::string want =
      "use emb\ngather emb\ngather blk0\n"  // emb on demand, blk0 ahead
      "use blk0\ngather blk1\n"
      "use blk1\ngather blk2\n"
      "use blk2\n"  // emb, next, is still in a buffer
      "use emb\ngather lnf\n"
      "use lnf\n"   // blk2, next, is still in a buffer
      "use blk2\ngather blk1\n"
      "use blk1\ngather blk0\n"
      "use blk0\n";
  EXPECT_EQ(Log(), want);
  EXPECT_EQ(g->prefetched(), 6u);
  EXPECT_LE(g->buffers(), g->max_buffers());
}

// Without a prefetch bucket (0) every gather is on demand, at its use.
TEST_F(ParamGatherTest, ABucketOfZeroGathersOnlyOnDemand) {
  SetUpRank(1);
  std::unique_ptr<ParamGather> g = Make(0);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->max_buffers(), ParamGather::kMaxHeld);
  g->SetStepOrder(kOrder);
  g->BeginStep();
  for (size_t u : kOrder) Use(g.get(), u);
  ASSERT_THAT(g->EndStep(), IsOk());
  EXPECT_EQ(g->prefetched(), 0u);
  ASSERT_FALSE(log_.empty());
  for (size_t i = 1; i < log_.size(); ++i) {
    if (log_[i].rfind("gather ", 0) == 0) {
      EXPECT_EQ(log_[i - 1], "use " + log_[i].substr(7)) << i;
    }
  }
}

// An acquisition off the order gathers on demand, and the rest of the step
// fetches nothing ahead (as every rank does: the collectives match).
TEST_F(ParamGatherTest, AnAcquisitionOffTheOrderEndsThePrefetchUntilTheNextStep) {
  SetUpRank(0);
  std::unique_ptr<ParamGather> g = Make(1);
  ASSERT_NE(g, nullptr);
  g->SetStepOrder(kOrder);
  g->BeginStep();
  Use(g.get(), 0);  // (prefetches blk0)
  Use(g.get(), 4);  // off the order
  Use(g.get(), 2);
  Use(g.get(), 1);
  EXPECT_EQ(Log(),
            "use emb\ngather emb\ngather blk0\n"
            "use lnf\ngather lnf\n"
            "use blk1\ngather blk1\n"
            "use blk0\n");  // still in its buffer from the prefetch
  ASSERT_THAT(g->EndStep(), IsOk());
  log_.clear();
  // The next step is in order again.
  ASSERT_THAT(g->Invalidate(), IsOk());
  g->BeginStep();
  Use(g.get(), 0);
  EXPECT_EQ(Log(), "use emb\ngather emb\ngather blk0\n");
}

// After Invalidate (the optimizer wrote new parameters) nothing is current.
TEST_F(ParamGatherTest, InvalidateGathersEveryUnitAgain) {
  SetUpRank(0);
  std::unique_ptr<ParamGather> g = Make(0);
  ASSERT_NE(g, nullptr);
  Use(g.get(), 1);
  Use(g.get(), 1);
  EXPECT_EQ(g->gathers(), 1u);
  ASSERT_THAT(g->Invalidate(), IsOk());
  Use(g.get(), 1);
  EXPECT_EQ(g->gathers(), 2u);
}

TEST_F(ParamGatherTest, HoldingMoreThanThePlanCountsIsAnErrorNamingTheUnits) {
  SetUpRank(0);
  std::unique_ptr<ParamGather> g = Make(0);
  ASSERT_NE(g, nullptr);
  ASSERT_THAT(g->Acquire(0), IsOk());
  ASSERT_THAT(g->Acquire(4), IsOk());
  const Status more = g->Acquire(1).status();
  EXPECT_THAT(more, StatusIs(StatusCode::kInternal));
  EXPECT_THAT(more.message(), HasSubstr("blk0's parameters asked for while emb, lnf are held"));
  const Status not_held = g->Release(2);
  EXPECT_THAT(not_held, StatusIs(StatusCode::kInternal));
  EXPECT_THAT(not_held.message(), HasSubstr("blk1's parameters, which are not held"));
  ASSERT_THAT(g->Release(0), IsOk());
  ASSERT_THAT(g->Release(4), IsOk());
}

// The trainer's wait for a unit's update fails: the acquisition that would
// have gathered it (ahead or not) says which unit and why.
TEST_F(ParamGatherTest, AFailedWaitBeforeAGatherIsTheAcquisitionsError) {
  SetUpRank(0);
  std::unique_ptr<ParamGather> g = Make(1);
  ASSERT_NE(g, nullptr);
  g->SetStepOrder(kOrder);
  g->BeginStep();
  fail_before_ = 1;
  const Status s = g->Acquire(0).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(s.message(), HasSubstr("the update of unit 1 failed"));
}

TEST(ParamGatherSizes, AheadUnitsAreTheBucketsWholeUnitsAtLeastOne) {
  models::GptConfig c;
  c.n_layer = 4, c.n_embd = 64, c.n_head = 4, c.vocab_size = 256, c.seq_len = 32;
  auto spec = models::Gpt2Spec(c);
  ASSERT_THAT(spec, IsOk());
  int64_t largest = 0;
  for (const auto& u : spec->units) largest = std::max(largest, u.numel);
  EXPECT_EQ(ParamGather::AheadUnits(*spec, 0), 0u);
  EXPECT_EQ(ParamGather::AheadUnits(*spec, 1), 1u);
  EXPECT_EQ(ParamGather::AheadUnits(*spec, static_cast<uint64_t>(largest) * 2), 2u);
  EXPECT_EQ(ParamGather::AheadUnits(*spec, uint64_t{1} << 40), spec->units.size());
  // A buffer holds the largest unit padded to the world's equal slices.
  const uint64_t pad3 = static_cast<uint64_t>((largest + 2) / 3 * 3);
  EXPECT_EQ(ParamGather::BufferBytes(*spec, DType::kBF16, 3), pad3 * 2);
  EXPECT_EQ(ParamGather::DeviceBytes(*spec, DType::kBF16, 3, 1), 3 * pad3 * 2);
  EXPECT_EQ(ParamGather::DeviceBytes(*spec, DType::kBF16, 3, 0), 2 * pad3 * 2);
}

// The order the trainer gives it is what the step's passes acquire,
// recorded with the step's schedule.
TEST(ParamGatherOrder, IsRecordedFromTheStepsPasses) {
  models::GptConfig g;
  g.n_layer = 3, g.n_embd = 32, g.n_head = 4, g.vocab_size = 128, g.seq_len = 16;
  auto spec = models::Gpt2Spec(g);
  ASSERT_THAT(spec, IsOk());
  std::unique_ptr<kernels::Backend> backend = kernels::MakeCpuBackend(1);
  for (const int64_t micro : {int64_t{1}, int64_t{2}}) {
    for (const bool layer_major : {true, false}) {
      if (micro == 1 && !layer_major) continue;
      SCOPED_TRACE("micro-batches " + std::to_string(micro) + (layer_major ? ", layer-major" : ", micro-batch-major"));
      TierStoreOptions o;
      o.gpu_tier.stand_in = true;
      o.gpu_tier.budget_bytes = 64 * kMiB;
      o.host_tier.budget_bytes = 64 * kMiB;
      o.host_tier.pin = false;
      o.copy.stand_in = true;
      auto store = TierStore::Open(o);
      ASSERT_THAT(store, IsOk());
      auto program = models::ModelProgram::Make(backend.get(), *spec, 2, 16, DType::kF32);
      ASSERT_THAT(program, IsOk());
      Plan plan;
      plan.optimizer = plan.grads = plan.params = TierKind::kHost;
      plan.params_resident = false;
      plan.checkpoints = TierKind::kGpu;
      ModelState::Layout lay{DType::kF32, DType::kF32, 2, 16, micro, layer_major};
      lay.world = 2, lay.zero_stage = 3;
      auto state = ModelState::Create(store->get(), *spec, plan, lay, false);
      ASSERT_THAT(state, IsOk());
      StepBuffers::Sizes z;
      z.block_scratch = program->block_scratch_bytes();
      z.head_scratch = program->head_scratch_bytes();
      z.batch = 2, z.seq = 16, z.micro_batches = micro;
      z.residual_sets = layer_major ? micro : 1;
      z.dtype = DType::kF32;
      z.accumulators = !lay.grad_is_accumulator();  // (stage 3: the gradients are slices)
      auto buffers = StepBuffers::Allocate((*store)->gpu_tier(), *spec, z);
      ASSERT_THAT(buffers, IsOk());
      std::vector<size_t> gathers;
      auto s = RecordStepSchedule(*program, state->get(), &*buffers, backend.get(), StepShape{micro, layer_major},
                                  **store, &gathers);
      ASSERT_THAT(s, IsOk());
      std::vector<size_t> want;
      for (int64_t pass = 0; pass < (layer_major ? 1 : micro); ++pass) want.insert(want.end(), kOrder.begin(), kOrder.end());
      EXPECT_EQ(gathers, want);
      // Stage 3 has no whole parameters in the store: none is scheduled.
      for (const auto& t : s->tensors()) EXPECT_EQ(t.name.find(".p"), std::string::npos) << t.name;
    }
  }
}

}  // namespace
}  // namespace strata
