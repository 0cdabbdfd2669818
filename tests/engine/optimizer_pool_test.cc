// SPDX-License-Identifier: Apache-2.0
// OptimizerPool (engine/optimizer_pool.h) with fake shard updates: the claim
// order of each kind of job, the workers' split, the speculative verdicts
// (commit swaps the sets, a miss redoes in place with the true multiplier),
// the check of each shard's own gradient, sticky errors and Abort.
#include "engine/optimizer_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/bytes.h"
#include "engine/gradient_counts.h"
#include "engine/link_bytes.h"
#include "engine/model_state.h"
#include "models/gpt2.h"
#include "tests/test_util.h"
#include "tiers/tier_store.h"

namespace strata {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

// What a fake update saw.
struct Call {
  size_t shard;
  bool speculative;
  double multiplier;
};

// Records each update; can hold a shard until released, or fail one.
class FakeUpdater final : public ShardUpdater {
 public:
  explicit FakeUpdater(const char* what = "") : what_(what) {}

  Result<CopyTicket> Update(size_t shard, const OptJob&, const ShardHow& how, const CopyTicket&) override {
    std::unique_lock<std::mutex> lk(mu_);
    calls_.push_back({shard, how.speculative, how.multiplier});
    cv_.notify_all();
    cv_.wait(lk, [&] { return std::find(held_.begin(), held_.end(), shard) == held_.end(); });
    if (fail_shard_ == static_cast<int64_t>(shard)) return Unavailable("injected failure of shard " + std::to_string(shard));
    return CopyTicket{};
  }
  const char* what() const override { return what_; }

  void Hold(size_t s) {
    std::lock_guard<std::mutex> lk(mu_);
    held_.push_back(s);
  }
  void Release(size_t s) {
    std::lock_guard<std::mutex> lk(mu_);
    held_.erase(std::remove(held_.begin(), held_.end(), s), held_.end());
    cv_.notify_all();
  }
  void FailShard(size_t s) {
    std::lock_guard<std::mutex> lk(mu_);
    fail_shard_ = static_cast<int64_t>(s);
  }
  // Waits until `n` updates have begun.
  void AwaitCalls(size_t n) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return calls_.size() >= n; });
  }
  std::vector<Call> calls() const {
    std::lock_guard<std::mutex> lk(mu_);
    return calls_;
  }
  std::vector<size_t> shards() const {
    std::vector<size_t> s;
    for (const Call& c : calls()) s.push_back(c.shard);
    return s;
  }

 private:
  const char* what_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> calls_;
  std::vector<size_t> held_;
  int64_t fail_shard_ = -1;
};

// A 3-block GPT's state with the optimizer on the host (5 shards: the
// embedding, 3 blocks, the final unit), in a store with the GPU stand-in.
struct PoolFixture : ::testing::Test {
  std::unique_ptr<TierStore> store;
  std::unique_ptr<ModelState> state;
  std::unique_ptr<GradientCounts> counts;
  std::unique_ptr<OptimizerCopies> copies;
  std::vector<int32_t> device_counts;  // the stand-in's "device" non-finite counts
  FakeUpdater cpu, gpu{" (gpu-assisted)"};

  void SetUp() override { Make(false); }

  void Make(bool speculative) {
    copies.reset();  // (what lives in the store goes before it)
    counts.reset();
    state.reset();
    store.reset();
    TierStoreOptions o;
    o.gpu_tier.stand_in = true;
    o.gpu_tier.budget_bytes = 64 * kMiB;
    o.host_tier.budget_bytes = 64 * kMiB;
    o.host_tier.pin = false;
    o.copy.stand_in = true;
    auto s = TierStore::Open(o);
    ASSERT_THAT(s, IsOk());
    store = std::move(*s);
    models::GptConfig g;
    g.n_layer = 3, g.n_embd = 32, g.n_head = 4, g.vocab_size = 128, g.seq_len = 16;
    auto spec = models::Gpt2Spec(g);
    ASSERT_THAT(spec, IsOk());
    Plan plan;
    plan.optimizer = plan.grads = TierKind::kHost;
    plan.checkpoints = TierKind::kGpu;
    ModelState::Layout lay{DType::kF32, DType::kF32, 2, 16, 1, true};
    auto st = ModelState::Create(store.get(), *spec, plan, lay, speculative);
    ASSERT_THAT(st, IsOk());
    state = std::move(*st);
    auto c = GradientCounts::Create(store->host_tier(), state->size(), /*stand_in=*/true);
    ASSERT_THAT(c, IsOk());
    counts = std::move(*c);
    copies = std::make_unique<OptimizerCopies>(store.get());
    device_counts.assign(state->size(), 0);
  }

  std::unique_ptr<OptimizerPool> Pool(bool two_workers, bool assist_takes_all = false) {
    OptimizerPool::Options po;
    po.update_mode = "during backward (test)";
    po.assist_takes_all = assist_takes_all;
    auto p = std::make_unique<OptimizerPool>(state.get(), counts.get(), copies.get(), &cpu,
                                             two_workers ? &gpu : nullptr, po);
    p->Start();
    return p;
  }

  // Shard s's gradient is final, with `nonfinite` bad values.
  void Final(OptimizerPool& pool, size_t s, int32_t nonfinite = 0) {
    device_counts[s] = nonfinite;
    auto t = counts->CopyDown(s, &device_counts[s], nullptr);
    ASSERT_THAT(t, IsOk());
    pool.MarkGradFinal(s, *t);
  }

  static OptJob Job(int64_t step, bool streaming = false, bool speculative = false, double multiplier = 1) {
    OptJob j;
    j.step = step;
    j.streaming = streaming;
    j.speculative = speculative;
    j.grad_multiplier = multiplier;
    return j;
  }
};

std::vector<size_t> Iota(size_t n) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST_F(PoolFixture, APostBackwardJobUpdatesEveryShardInForwardOrder) {
  auto pool = Pool(false);
  ASSERT_EQ(state->size(), 5u);
  EXPECT_FALSE(pool->Updated(0, 1));
  ASSERT_THAT(pool->Post(Job(1)), IsOk());
  ASSERT_THAT(pool->WaitAll(1), IsOk());
  EXPECT_EQ(cpu.shards(), Iota(5));
  for (const Call& c : cpu.calls()) {
    EXPECT_FALSE(c.speculative);
    EXPECT_EQ(c.multiplier, 1);
  }
  for (size_t s = 0; s < 5; ++s) EXPECT_TRUE(pool->Updated(s, 1));
  EXPECT_FALSE(pool->Updated(0, 2));
  // The next job starts from the first shard again.
  ASSERT_THAT(pool->Post(Job(2)), IsOk());
  ASSERT_THAT(pool->WaitAll(2), IsOk());
  EXPECT_EQ(cpu.calls().size(), 10u);
  EXPECT_GT(pool->Stats(2).seconds, 0);
}

TEST_F(PoolFixture, TheForwardWaitsOnlyForTheShardItNeeds) {
  auto pool = Pool(false);
  cpu.Hold(3);
  ASSERT_THAT(pool->Post(Job(1)), IsOk());
  double wait = 0;
  CopyTicket up;
  // Shards 0..2 come before the held one.
  for (size_t s = 0; s < 3; ++s) ASSERT_THAT(pool->WaitForShard(s, 1, &wait, &up), IsOk());
  EXPECT_FALSE(pool->Updated(3, 1));
  EXPECT_FALSE(pool->Updated(4, 1));
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cpu.Release(3);
  });
  ASSERT_THAT(pool->WaitForShard(4, 1, &wait, &up), IsOk());
  release.join();
  EXPECT_GT(wait, 0.02);  // it waited for shard 3's (held) update, then 4's
  ASSERT_THAT(pool->WaitAll(1), IsOk());
}

TEST_F(PoolFixture, AStreamingJobClaimsEachShardOnlyOnceItsGradientIsFinal) {
  auto pool = Pool(false);
  ASSERT_THAT(pool->Post(Job(1, /*streaming=*/true)), IsOk());
  // The backward's order: the final unit first. Marking the embedding first
  // does not let it jump the queue.
  Final(*pool, 0);
  Final(*pool, 4);
  Final(*pool, 3);
  cpu.AwaitCalls(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(cpu.shards(), (std::vector<size_t>{4, 3}));
  EXPECT_FALSE(pool->Updated(2, 1));
  Final(*pool, 2);
  Final(*pool, 1);
  ASSERT_THAT(pool->WaitAll(1), IsOk());
  EXPECT_EQ(cpu.shards(), (std::vector<size_t>{4, 3, 2, 1, 0}));
}

TEST_F(PoolFixture, AStreamingShardWithANonFiniteGradientIsNotUpdatedAndTheErrorSticks) {
  auto pool = Pool(false);
  ASSERT_THAT(pool->Post(Job(7, /*streaming=*/true)), IsOk());
  Final(*pool, 4);
  Final(*pool, 3, /*nonfinite=*/2);
  Final(*pool, 2);
  Final(*pool, 1);
  Final(*pool, 0);
  Status st = pool->WaitAll(7);
  EXPECT_THAT(st, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(st.ToString(), HasSubstr("2 in " + state->shard(3).name + ", which was not updated"));
  EXPECT_THAT(st.ToString(), HasSubstr("at step 7"));
  EXPECT_THAT(st.ToString(), HasSubstr("during backward (test)"));
  for (const Call& c : cpu.calls()) EXPECT_NE(c.shard, 3u);
  // Sticky: every later call reports it.
  pool->WaitIdle();
  EXPECT_THAT(pool->error(), StatusIs(StatusCode::kFailedPrecondition));
  double wait = 0;
  CopyTicket up;
  EXPECT_THAT(pool->WaitForShard(0, 7, &wait, &up), StatusIs(StatusCode::kFailedPrecondition));
}

TEST_F(PoolFixture, AnUpdatersErrorSticksWithTheShardsName) {
  auto pool = Pool(false);
  cpu.FailShard(2);
  ASSERT_THAT(pool->Post(Job(1)), IsOk());
  Status st = pool->WaitAll(1);
  EXPECT_THAT(st, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(st.ToString(), HasSubstr("optimizer step of " + state->shard(2).name));
  EXPECT_THAT(st.ToString(), HasSubstr("injected failure of shard 2"));
  pool->WaitIdle();
  // The shards after it are not updated with a sticky error (each is
  // settled without an update), and the error stays.
  EXPECT_EQ(cpu.shards(), (std::vector<size_t>{0, 1, 2}));
  EXPECT_THAT(pool->error(), StatusIs(StatusCode::kUnavailable));
}

TEST_F(PoolFixture, TwoWorkersShareTheShardsAndEachShardIsUpdatedOnce) {
  auto pool = Pool(true);
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_THAT(pool->Post(Job(step)), IsOk());
    ASSERT_THAT(pool->WaitAll(step), IsOk());
    pool->WaitIdle();
  }
  // Per job, each shard by exactly one worker; the share is the GPU
  // worker's parameters over all.
  std::vector<size_t> all = cpu.shards();
  const std::vector<size_t> g = gpu.shards();
  all.insert(all.end(), g.begin(), g.end());
  std::sort(all.begin(), all.end());
  std::vector<size_t> want;
  for (size_t s = 0; s < 5; ++s) want.insert(want.end(), 3, s);
  EXPECT_EQ(all, want);
  EXPECT_GE(pool->Stats(3).assist_share, 0.0);
  EXPECT_LE(pool->Stats(3).assist_share, 1.0);
}

TEST_F(PoolFixture, TheGpuWorkersShareIsItsParametersOverAll) {
  auto pool = Pool(true);
  ASSERT_THAT(pool->Post(Job(1)), IsOk());
  ASSERT_THAT(pool->WaitAll(1), IsOk());
  pool->WaitIdle();
  double total = 0, gpu_params = 0;
  for (size_t s = 0; s < 5; ++s) total += static_cast<double>(state->shard(s).numel);
  for (size_t s : gpu.shards()) gpu_params += static_cast<double>(state->shard(s).numel);
  EXPECT_EQ(cpu.shards().size() + gpu.shards().size(), 5u);
  EXPECT_NEAR(pool->Stats(1).assist_share, gpu_params / total, 1e-12);
}

TEST_F(PoolFixture, AssistTakesAllLeavesEveryShardToTheGpuWorker) {
  auto pool = Pool(true, /*assist_takes_all=*/true);
  ASSERT_THAT(pool->Post(Job(1)), IsOk());
  ASSERT_THAT(pool->WaitAll(1), IsOk());
  pool->WaitIdle();
  EXPECT_TRUE(cpu.calls().empty());
  EXPECT_EQ(gpu.shards(), Iota(5));
  EXPECT_EQ(pool->Stats(1).assist_share, 1.0);
}

TEST_F(PoolFixture, ASkippedJobMarksEveryShardWithoutAnUpdate) {
  auto pool = Pool(false);
  OptJob j = Job(1);
  j.skip = true;  // fp16 overflow
  ASSERT_THAT(pool->Post(j), IsOk());
  ASSERT_THAT(pool->WaitAll(1), IsOk());
  EXPECT_TRUE(cpu.calls().empty());
  for (size_t s = 0; s < 5; ++s) EXPECT_TRUE(pool->Updated(s, 1));
}

TEST_F(PoolFixture, AHitCommitsTheSpeculatedShardsBySwappingTheirSets) {
  Make(/*speculative=*/true);
  auto pool = Pool(false);
  std::vector<Shard> before(state->shards());
  ASSERT_THAT(pool->Post(Job(1, true, /*speculative=*/true, 0.5)), IsOk());
  for (size_t s = 5; s-- > 0;) Final(*pool, s);
  cpu.AwaitCalls(5);
  pool->Verdict(1, /*hit=*/true, 0.5);
  ASSERT_THAT(pool->WaitAll(1), IsOk());
  pool->WaitIdle();
  ASSERT_EQ(cpu.calls().size(), 5u);
  for (const Call& c : cpu.calls()) {
    EXPECT_TRUE(c.speculative);
    EXPECT_EQ(c.multiplier, 0.5);
  }
  for (size_t s = 0; s < 5; ++s) {
    const Shard& now = state->shard(s);
    EXPECT_EQ(now.w.value, before[s].w2.value) << s;
    EXPECT_EQ(now.w2.value, before[s].w.value) << s;
    EXPECT_EQ(now.m.value, before[s].m2.value) << s;
    EXPECT_EQ(now.v.value, before[s].v2.value) << s;
  }
}

TEST_F(PoolFixture, AMissRedoesEveryShardInPlaceWithTheTrueMultiplier) {
  Make(/*speculative=*/true);
  auto pool = Pool(false);
  std::vector<Shard> before(state->shards());
  // Hold the worker on its second shard: when the verdict comes, shard 4 is
  // speculated, 3 is running, 2..0 are not claimed yet.
  cpu.Hold(3);
  ASSERT_THAT(pool->Post(Job(1, true, true, 1.0)), IsOk());
  for (size_t s = 5; s-- > 0;) Final(*pool, s);
  cpu.AwaitCalls(2);
  pool->Verdict(1, /*hit=*/false, 0.25);
  cpu.Release(3);
  ASSERT_THAT(pool->WaitAll(1), IsOk());
  pool->WaitIdle();
  const std::vector<Call> calls = cpu.calls();
  // 4 and 3 speculated; 3 redone by its worker at once; the rest (4 redone,
  // then the unclaimed ones) in forward order, in place.
  ASSERT_EQ(calls.size(), 7u);
  EXPECT_TRUE(calls[0].speculative);
  EXPECT_EQ(calls[0].shard, 4u);
  EXPECT_TRUE(calls[1].speculative);
  EXPECT_EQ(calls[1].shard, 3u);
  EXPECT_EQ(calls[2].shard, 3u);
  std::vector<size_t> rest;
  for (size_t i = 2; i < calls.size(); ++i) {
    EXPECT_FALSE(calls[i].speculative) << i;
    EXPECT_EQ(calls[i].multiplier, 0.25) << i;
    if (i > 2) rest.push_back(calls[i].shard);
  }
  EXPECT_EQ(rest, (std::vector<size_t>{0, 1, 2, 4}));
  // Nothing was committed: the sets are where they were.
  for (size_t s = 0; s < 5; ++s) EXPECT_EQ(state->shard(s).w.value, before[s].w.value) << s;
}

TEST_F(PoolFixture, AbortAfterAnInPlaceUpdateLeavesASavingError) {
  auto pool = Pool(false);
  ASSERT_THAT(pool->Post(Job(3, /*streaming=*/true)), IsOk());
  Final(*pool, 4);
  cpu.AwaitCalls(1);
  double wait = 0;
  CopyTicket up;
  ASSERT_THAT(pool->WaitForShard(4, 3, &wait, &up), IsOk());
  pool->Abort(Unavailable("the backward failed"), 2);
  Status st = pool->error();
  EXPECT_THAT(st, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(st.ToString(), HasSubstr("1 shards hold its update"));
  EXPECT_THAT(st.ToString(), HasSubstr("the backward failed"));
  EXPECT_EQ(cpu.shards(), (std::vector<size_t>{4}));
}

TEST_F(PoolFixture, AbortBeforeAnyUpdateLeavesTheLastStepsState) {
  auto pool = Pool(false);
  ASSERT_THAT(pool->Post(Job(3, /*streaming=*/true)), IsOk());
  pool->Abort(Unavailable("the backward failed"), 2);
  EXPECT_THAT(pool->error(), IsOk());
  EXPECT_TRUE(cpu.calls().empty());
  // The pool takes the next job.
  ASSERT_THAT(pool->Post(Job(3)), IsOk());
  ASSERT_THAT(pool->WaitAll(3), IsOk());
}

}  // namespace
}  // namespace strata
