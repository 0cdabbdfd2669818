// SPDX-License-Identifier: Apache-2.0
// The prefetcher against a real TierStore (GPU stand-in, small budgets):
// it keeps exactly the next uses that fit resident, the store's next-use
// eviction drops the copy used farthest ahead, readiness holds a refresh back,
// the driver must follow the schedule, what moves is what SimulateTraffic
// says, and a failed write-back sticks.
#include "swap/prefetcher.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "tests/fault_io_env.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::RandomBytes;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

constexpr TierKind kGpu = TierKind::kGpu, kHost = TierKind::kHost, kNvme = TierKind::kNvme;
constexpr uint64_t kSlot = 4 * kKiB;  // one test tensor; a multiple of the gpu tier's alignment

class PrefetcherTest : public ::testing::Test {
 protected:
  std::unique_ptr<TierStore> store;

  void Open(uint64_t gpu_budget, EvictionPolicy policy = EvictionPolicy::kNextUse) {
    TierStoreOptions o;
    o.gpu_tier.stand_in = true;
    o.gpu_tier.budget_bytes = gpu_budget;
    o.gpu_tier.slab_bytes = 0;
    o.host_tier.budget_bytes = 8 * kMiB;
    o.host_tier.slab_bytes = 0;
    o.host_tier.pin = false;
    o.copy.stand_in = true;
    o.eviction = policy;
    auto s = TierStore::Open(o);
    ASSERT_OK(s.status());
    store = std::move(s).value();
  }

  TensorId Make(const std::string& name, uint64_t bytes = kSlot, TierKind home = kHost, uint64_t seed = 0) {
    auto id = store->Create(name, DType::kU8, Shape{static_cast<int64_t>(bytes)}, home);
    EXPECT_OK(id.status());
    if (!id.ok()) return TensorId{};
    std::vector<uint8_t> data = RandomBytes(bytes, seed ? seed : id->value);
    EXPECT_OK(store->Write(*id, data.data(), bytes));
    return *id;
  }

  // Waits until the store has no move queued or running.
  void Quiesce() {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (store->stats().queue_depth > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(store->stats().queue_depth, 0u);
  }
  // Lets the prefetcher finish what it can: evictions, then the prefetches
  // they made room for.
  void Settle(Prefetcher& p) {
    ASSERT_OK(p.WaitEvictions());
    ASSERT_OK(p.Poll());
    Quiesce();
  }

  bool OnGpu(TensorId id) {
    auto info = store->Info(id);
    return info.ok() && info->copies[0].allocated;
  }
  bool ValidOnGpu(TensorId id) {
    auto info = store->Info(id);
    return info.ok() && info->copies[0].allocated && info->copies[0].valid;
  }
  uint64_t H2d() { return store->stats().copy.h2d.bytes; }
  uint64_t D2h() { return store->stats().copy.d2h.bytes; }

  // Reads each tensor once per cycle, in order.
  static AccessSchedule InOrder(const std::vector<TensorId>& ids) {
    AccessSchedule s(kGpu);
    for (TensorId id : ids) {
      s.Acquire(id, Access::kRead);
      s.Release(id);
    }
    return s;
  }
};

TEST_F(PrefetcherTest, KeepsExactlyTheNextUsesWithinTheBudget) {
  Open(3 * kSlot);  // the tier holds the window and nothing more
  std::vector<TensorId> t;
  for (int i = 0; i < 6; ++i) t.push_back(Make(std::string("t").append(std::to_string(i))));
  AccessSchedule s = InOrder(t);
  ASSERT_OK(s.DescribeFrom(*store));
  ASSERT_OK(s.Finish());
  PrefetcherOptions po;
  po.budget_bytes = 3 * kSlot;
  ASSERT_OK_AND_ASSIGN(auto p, Prefetcher::Create(store.get(), std::move(s), po));
  Settle(*p);
  auto resident = [&] {
    std::set<int> r;
    for (int i = 0; i < 6; ++i)
      if (OnGpu(t[static_cast<size_t>(i)])) r.insert(i);
    return r;
  };
  EXPECT_EQ(resident(), (std::set<int>{0, 1, 2}));
  EXPECT_EQ(H2d(), 3 * kSlot);
  for (int k = 0; k < 12; ++k) {  // two cycles
    const TensorId id = t[static_cast<size_t>(k % 6)];
    ASSERT_OK_AND_ASSIGN(TensorView v, p->Acquire(id, Access::kRead));
    std::vector<uint8_t> want = RandomBytes(kSlot, id.value);
    EXPECT_EQ(std::memcmp(v.data, want.data(), kSlot), 0) << "t" << k % 6;
    Settle(*p);
    // While t_k is held, it and the next two uses fill the budget.
    EXPECT_EQ(resident(), (std::set<int>{k % 6, (k + 1) % 6, (k + 2) % 6})) << "acquired t" << k % 6;
    ASSERT_OK(p->Release(id, false));
    Settle(*p);
    EXPECT_EQ(resident(), (std::set<int>{(k + 1) % 6, (k + 2) % 6, (k + 3) % 6})) << "released t" << k % 6;
  }
  // Each tensor loaded once per cycle, and the next cycle's first three: no
  // reloads, and clean copies are dropped without writing back.
  EXPECT_EQ(H2d(), (12 + 3) * kSlot);
  EXPECT_EQ(D2h(), 0u);
  EXPECT_EQ(p->stats().forced, 0u);
  EXPECT_EQ(store->stats().tiers[0].evictions, p->stats().evictions);  // none on the store's own
}

TEST_F(PrefetcherTest, SetsNextUseHintsAndTheStoreEvictsTheFarthest) {
  Open(3 * kSlot);
  TensorId a = Make("a"), b = Make("b"), c = Make("c"), z = Make("z");
  AccessSchedule s = InOrder({a, b, c});  // ticks: a 0, b 2, c 4 (cycle of 6)
  ASSERT_OK(s.DescribeFrom(*store));
  ASSERT_OK(s.Finish());
  PrefetcherOptions po;
  po.budget_bytes = 3 * kSlot;
  ASSERT_OK_AND_ASSIGN(auto p, Prefetcher::Create(store.get(), std::move(s), po));
  for (TensorId id : {a, b, c}) {
    ASSERT_OK(p->Acquire(id, Access::kRead).status());
    ASSERT_OK(p->Release(id, false));
  }
  Settle(*p);
  // All three stay for the next cycle; each hint is its next use.
  for (auto [id, tick] : {std::pair{a, 6}, {b, 8}, {c, 10}}) {
    ASSERT_OK_AND_ASSIGN(TensorInfo info, store->Info(id));
    EXPECT_TRUE(info.copies[0].valid) << info.name;
    EXPECT_EQ(info.next_use, std::optional<uint64_t>(tick)) << info.name;
  }
  // Someone else needs a slot: the store drops c (used farthest ahead), where
  // LRU would have dropped a (used longest ago).
  ASSERT_OK(store->Acquire(z, kGpu, Access::kRead).status());
  EXPECT_FALSE(OnGpu(c));
  EXPECT_TRUE(ValidOnGpu(a));
  EXPECT_TRUE(ValidOnGpu(b));
  ASSERT_OK(store->Release(z, kGpu, false));
}

TEST_F(PrefetcherTest, ReadinessHoldsARefreshBackUntilReady) {
  Open(2 * kSlot);
  TensorId b = Make("b"), a = Make("a");
  AccessSchedule s(kGpu);
  s.Acquire(b, Access::kRead);
  s.Release(b);
  s.Acquire(a, Access::kRead, /*refresh=*/true);  // as a shard's parameters after the optimizer
  s.Release(a);
  ASSERT_OK(s.DescribeFrom(*store));
  ASSERT_OK(s.Finish());
  std::atomic<int64_t> ready_through{-1};  // a is ready for the cycles up to this one
  std::vector<uint64_t> asked;
  PrefetcherOptions po;
  po.budget_bytes = 2 * kSlot;
  po.ready = [&](TensorId id, uint64_t cycle) {
    EXPECT_EQ(id, a);
    asked.push_back(cycle);
    return static_cast<int64_t>(cycle) <= ready_through.load();
  };
  ASSERT_OK_AND_ASSIGN(auto p, Prefetcher::Create(store.get(), std::move(s), po));
  Settle(*p);
  EXPECT_TRUE(ValidOnGpu(b));
  EXPECT_FALSE(OnGpu(a));  // held back, though it fits
  EXPECT_EQ(H2d(), kSlot);
  ready_through = 0;
  Settle(*p);
  EXPECT_TRUE(ValidOnGpu(a));
  EXPECT_EQ(H2d(), 2 * kSlot);
  ASSERT_FALSE(asked.empty());
  EXPECT_EQ(asked.back(), 0u);

  ASSERT_OK(p->Acquire(b, Access::kRead).status());
  ASSERT_OK(p->Release(b, false));
  ASSERT_OK_AND_ASSIGN(TensorView v, p->Acquire(a, Access::kRead));
  std::vector<uint8_t> old = RandomBytes(kSlot, a.value);
  EXPECT_EQ(std::memcmp(v.data, old.data(), kSlot), 0);
  ASSERT_OK(p->Release(a, false));
  Settle(*p);
  // Cycle 1: b stays resident; a's copy is dropped (its next use gets new
  // contents), and its refresh waits for them.
  EXPECT_TRUE(ValidOnGpu(b));
  EXPECT_FALSE(OnGpu(a));
  std::vector<uint8_t> fresh = RandomBytes(kSlot, 777);
  ASSERT_OK(store->Write(a, fresh.data(), kSlot));  // the "optimizer" (host copy)
  Settle(*p);
  EXPECT_EQ(asked.back(), 1u);
  EXPECT_FALSE(OnGpu(a));  // not loaded before it is ready
  EXPECT_EQ(H2d(), 2 * kSlot);
  ready_through = 1;
  Settle(*p);
  EXPECT_TRUE(ValidOnGpu(a));
  EXPECT_EQ(H2d(), 3 * kSlot);
  ASSERT_OK(p->Acquire(b, Access::kRead).status());
  ASSERT_OK(p->Release(b, false));
  ASSERT_OK_AND_ASSIGN(TensorView w, p->Acquire(a, Access::kRead));
  EXPECT_EQ(std::memcmp(w.data, fresh.data(), kSlot), 0);
  ASSERT_OK(p->Release(a, false));
  EXPECT_EQ(H2d(), 3 * kSlot);  // the acquire found it loaded
}

TEST_F(PrefetcherTest, RefusesCallsThatDoNotFollowTheSchedule) {
  Open(4 * kSlot);
  TensorId a = Make("a"), b = Make("b"), z = Make("z");
  AccessSchedule s = InOrder({a, b});
  ASSERT_OK(s.DescribeFrom(*store));
  ASSERT_OK(s.Finish());
  PrefetcherOptions po;
  po.budget_bytes = 4 * kSlot;
  ASSERT_OK_AND_ASSIGN(auto p, Prefetcher::Create(store.get(), std::move(s), po));
  auto r = p->Acquire(b, Access::kRead);
  EXPECT_THAT(r, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(r.status().ToString(), HasSubstr("acquire of 'b' (read) at tick 0"));
  EXPECT_THAT(r.status().ToString(), HasSubstr("which has acquire 'a' (read) there"));
  EXPECT_THAT(p->Acquire(a, Access::kReadWrite), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(p->Acquire(z, Access::kRead).status().ToString(), HasSubstr("not in the schedule"));
  EXPECT_THAT(p->Release(a, false), StatusIs(StatusCode::kFailedPrecondition));
  // Nothing was taken: the right call still works.
  ASSERT_OK(p->Acquire(a, Access::kRead).status());
  ASSERT_OK(p->Release(a, false));
  EXPECT_EQ(p->tick(), 2u);
}

TEST(SimulateTraffic, TurnaroundBlocksAreLoadedOnce) {
  // Three blocks, forward then backward, one unit each; the forward's uses
  // get new parameters (refresh). Budget of k units: the last k blocks of the
  // forward (at least the last one) stay for the backward.
  AccessSchedule s(kGpu);
  for (uint64_t l : {1, 2, 3}) {
    s.Acquire(TensorId{l}, Access::kRead, /*refresh=*/true);
    s.Release(TensorId{l});
  }
  for (uint64_t l : {3, 2, 1}) {
    s.Acquire(TensorId{l}, Access::kRead);
    s.Release(TensorId{l});
  }
  for (uint64_t l : {1, 2, 3}) s.Describe(TensorId{l}, 1000, kHost);
  ASSERT_OK(s.Finish());
  for (auto [units, loads] : {std::pair{1, 5}, {2, 4}, {3, 3}}) {
    ASSERT_OK_AND_ASSIGN(auto t, SimulateTraffic(s, static_cast<uint64_t>(units) * 1024, 256));
    ASSERT_EQ(t.size(), 3u);
    for (const auto& c : t) {
      EXPECT_EQ(c.loads, static_cast<uint64_t>(loads)) << units << " units";
      EXPECT_EQ(c.load_bytes, static_cast<uint64_t>(loads) * 1000);
      EXPECT_EQ(c.writebacks, 0u);
    }
  }
}

TEST(SimulateTraffic, WrittenCopiesGoHomeOncePerCycle) {
  AccessSchedule s(kGpu);
  for (uint64_t g : {1, 2, 3}) {
    s.Acquire(TensorId{g}, Access::kWriteDiscard);
    s.Release(TensorId{g});
  }
  for (uint64_t g : {1, 2, 3}) s.Describe(TensorId{g}, 1000, kHost);
  ASSERT_OK(s.Finish());
  // Whatever the room, each written copy goes home once per cycle (its next
  // use overwrites it: it is not kept), and nothing is loaded.
  for (uint64_t budget : {1024, 3 * 1024}) {
    ASSERT_OK_AND_ASSIGN(auto t, SimulateTraffic(s, budget, 256));
    for (const auto& c : t) {
      EXPECT_EQ(c.writebacks, 3u) << budget;
      EXPECT_EQ(c.writeback_bytes, 3000u) << budget;
      EXPECT_EQ(c.loads, 0u) << budget;
    }
  }
}

TEST(SimulateTraffic, DiscardedWritesDoNotGoHome) {
  // An accumulator: written by the first hold, read and written by the
  // second; the next cycle overwrites it. Its copy ends its life at the
  // second release: written home, unless that release discards the writes.
  for (bool discard : {false, true}) {
    AccessSchedule s(kGpu);
    s.Acquire(TensorId{1}, Access::kWriteDiscard);
    s.Release(TensorId{1});
    s.Acquire(TensorId{1}, Access::kReadWrite);
    s.Release(TensorId{1}, discard);
    s.Describe(TensorId{1}, 1000, kHost);
    ASSERT_OK(s.Finish());
    ASSERT_OK_AND_ASSIGN(auto t, SimulateTraffic(s, 4096, 256));
    for (const auto& c : t) {
      EXPECT_EQ(c.writebacks, discard ? 0u : 1u) << discard;
      EXPECT_EQ(c.loads, 0u) << discard;  // kept between the holds
    }
  }
}

// A training step in miniature: forward over L blocks with A micro-batches
// (checkpoints written, then read by the next block), a head, backward in
// reverse (checkpoints read again, gradients written); the "optimizer" writes
// new parameters between cycles. Whatever the budget, the store moves exactly
// what the simulation says, cycle by cycle.
struct MiniStep {
  int L = 4, A = 2;
  int gpu_checkpoints = 1;  // the last sets live on the gpu
  uint64_t param = 8 * kKiB, act = 2 * kKiB, grad = 8 * kKiB;
};

class PrefetcherTraffic : public PrefetcherTest, public ::testing::WithParamInterface<uint64_t> {};

TEST_P(PrefetcherTraffic, MovesExactlyWhatTheSimulationSays) {
  const MiniStep m;
  const uint64_t window = GetParam();
  const uint64_t homes = static_cast<uint64_t>(m.gpu_checkpoints * m.A) * m.act;
  // Slack of one parameter block: the tier's allocator is not compacting, and
  // a window that fills the tier to the byte can find its free room in pieces
  // (then the store drops a copy the window keeps, and it is loaded again).
  Open(window + homes + m.param);
  std::vector<TensorId> p, g;
  std::vector<std::vector<TensorId>> x(static_cast<size_t>(m.L + 1));
  for (int l = 0; l < m.L; ++l) {
    p.push_back(Make(std::string("p").append(std::to_string(l)), m.param));
    g.push_back(Make(std::string("g").append(std::to_string(l)), m.grad));
  }
  for (int l = 0; l <= m.L; ++l)
    for (int a = 0; a < m.A; ++a) {
      TierKind home = l > m.L - m.gpu_checkpoints ? kGpu : kHost;
      auto id = store->Create(std::string("x").append(std::to_string(l)).append(".").append(std::to_string(a)), DType::kU8,
                              Shape{static_cast<int64_t>(m.act)}, home);
      ASSERT_OK(id.status());
      x[static_cast<size_t>(l)].push_back(*id);
    }
  AccessSchedule s(kGpu);
  for (int a = 0; a < m.A; ++a) {
    s.Acquire(x[0][a], Access::kWriteDiscard);
    s.Release(x[0][a]);
  }
  for (int l = 0; l < m.L; ++l) {
    s.Acquire(p[l], Access::kRead, true);
    for (int a = 0; a < m.A; ++a) {
      s.Acquire(x[l][a], Access::kRead);
      s.Acquire(x[l + 1][a], Access::kWriteDiscard);
      s.Release(x[l][a]);
      s.Release(x[l + 1][a]);
    }
    s.Release(p[l]);
  }
  for (int a = 0; a < m.A; ++a) {
    s.Acquire(x[m.L][a], Access::kRead);
    s.Release(x[m.L][a]);
  }
  for (int l = m.L - 1; l >= 0; --l) {
    s.Acquire(p[l], Access::kRead);
    s.Acquire(g[l], Access::kWriteDiscard);
    for (int a = 0; a < m.A; ++a) {
      s.Acquire(x[l][a], Access::kRead);
      s.Release(x[l][a]);
    }
    s.Release(g[l]);
    s.Release(p[l]);
  }
  ASSERT_OK(s.DescribeFrom(*store));
  ASSERT_OK(s.Finish());
  const std::vector<ScheduleEvent> events = s.events();
  const std::vector<ScheduledTensor> tensors = s.tensors();
  ASSERT_OK_AND_ASSIGN(auto expect, SimulateTraffic(s, window, store->gpu_tier()->alignment(), 3));

  std::atomic<uint64_t> ready_cycles{1};
  PrefetcherOptions po;
  po.budget_bytes = window;
  po.ready = [&](TensorId, uint64_t cycle) { return cycle < ready_cycles.load(); };
  // Each cycle's loads start once its parameters are ready (the first
  // cycle's at Create), after the figures of the cycle before are taken.
  uint64_t h0 = H2d(), d0 = D2h();
  ASSERT_OK_AND_ASSIGN(auto pf, Prefetcher::Create(store.get(), std::move(s), po));
  for (int cycle = 0; cycle < 3; ++cycle) {
    std::map<uint32_t, Access> held;
    for (const ScheduleEvent& e : events) {
      const TensorId id = tensors[e.tensor].id;
      if (e.type == ScheduleEvent::kAcquire) {
        ASSERT_OK(pf->Acquire(id, e.access).status()) << "cycle " << cycle;
        held[e.tensor] = e.access;
      } else {
        ASSERT_OK(pf->Release(id, held[e.tensor] != Access::kRead));
      }
    }
    ASSERT_OK(pf->WaitEvictions());
    Quiesce();
    EXPECT_EQ(H2d() - h0, expect[cycle].load_bytes) << "cycle " << cycle << ", window " << window;
    EXPECT_EQ(D2h() - d0, expect[cycle].writeback_bytes) << "cycle " << cycle << ", window " << window;
    h0 = H2d();
    d0 = D2h();
    // The optimizer: new parameters, then they are ready for the next cycle.
    for (int l = 0; l < m.L; ++l) {
      std::vector<uint8_t> np = RandomBytes(m.param, 1000 * cycle + l + 1);
      ASSERT_OK(store->Write(p[l], np.data(), m.param));
    }
    ready_cycles = static_cast<uint64_t>(cycle) + 2;
  }
  EXPECT_EQ(pf->stats().forced, 0u);
  // Steady state: each block's parameters at most twice, each host checkpoint
  // set out and back at most once, every gradient written back once.
  const uint64_t L = static_cast<uint64_t>(m.L), A = static_cast<uint64_t>(m.A);
  const uint64_t host_sets = L + 1 - static_cast<uint64_t>(m.gpu_checkpoints);
  EXPECT_LE(expect[2].load_bytes, 2 * L * m.param + host_sets * A * m.act);
  EXPECT_GE(expect[2].load_bytes, L * m.param);
  EXPECT_GE(expect[2].writeback_bytes, L * m.grad);
}

// From the working set of one backward block (its parameters, gradients and a
// checkpoint) to everything.
INSTANTIATE_TEST_SUITE_P(Budgets, PrefetcherTraffic,
                         ::testing::Values(8 * kKiB + 8 * kKiB + 2 * 2 * kKiB, 24 * kKiB, 40 * kKiB, 64 * kKiB,
                                           4 * 8 * kKiB * 2 + 5 * 2 * 2 * kKiB),
                         [](const auto& info) { return std::to_string(info.param / kKiB) + "KiB"; });

// A write-back that fails (the disk is full) is reported by the next call,
// and by every call after it; the data stays in the faster copy.
TEST(PrefetcherFault, AFailedWriteBackSticks) {
  testing::TempDir dir;
  testing::FaultIoEnv env;
  TierStoreOptions o;
  o.gpu = false;
  o.host_tier.budget_bytes = 4 * kMiB;
  o.host_tier.slab_bytes = 0;
  o.host_tier.pin = false;
  o.staging_chunk_bytes = 64 * kKiB;
  o.staging_buffers = 2;
  o.staging_per_move = 2;
  o.eviction = EvictionPolicy::kNextUse;
  NvmeOptions n;
  n.dirs = {dir.path()};
  n.capacity_bytes = 8 * kMiB;
  n.block_size = 64 * kKiB;
  n.queue_depth = 8;
  n.buffered_fallback = true;
  n.env = &env;
  o.nvme = n;
  ASSERT_OK_AND_ASSIGN(auto store, TierStore::Open(o));
  const uint64_t bytes = 64 * kKiB;
  std::vector<TensorId> ids;
  for (const char* name : {"m0", "m1"}) {
    ASSERT_OK_AND_ASSIGN(TensorId id, store->Create(name, DType::kU8, Shape{static_cast<int64_t>(bytes)}, kNvme));
    std::vector<uint8_t> zero(bytes, 0);
    ASSERT_OK(store->Write(id, zero.data(), bytes));
    ASSERT_OK(store->Evict(id, kHost)->Wait());
    ids.push_back(id);
  }
  // Optimizer state streamed through the host one shard at a time.
  AccessSchedule s(kHost);
  for (TensorId id : ids) {
    s.Acquire(id, Access::kReadWrite);
    s.Release(id);
  }
  ASSERT_OK(s.DescribeFrom(*store));
  ASSERT_OK(s.Finish());
  PrefetcherOptions po;
  po.budget_bytes = bytes;  // one at a time
  ASSERT_OK_AND_ASSIGN(auto p, Prefetcher::Create(store.get(), std::move(s), po));
  ASSERT_OK_AND_ASSIGN(TensorView v, p->Acquire(ids[0], Access::kReadWrite));
  std::vector<uint8_t> data = RandomBytes(bytes, 5);
  std::memcpy(v.data, data.data(), bytes);
  env.Add({.site = testing::FaultSite::kCompleteIo, .io = testing::FaultIo::kWrite,
           .error = ENOSPC});  // the disk is full
  // m0 leaves: its write-back starts. The failure comes back from this call
  // (when the write-back is already over) or the next one, which needs m0's
  // room and waits for it.
  Status r = p->Release(ids[0], true);
  if (r.ok()) r = p->Acquire(ids[1], Access::kReadWrite).status();
  EXPECT_THAT(r, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(r.sys_errno(), ENOSPC);
  EXPECT_THAT(r.ToString(), HasSubstr("evicting 'm0' (host)"));
  EXPECT_THAT(p->Poll(), StatusIs(StatusCode::kIoError));  // sticky
  env.Clear();
  std::vector<uint8_t> back(bytes);
  ASSERT_OK(store->Read(ids[0], back.data(), bytes));
  EXPECT_EQ(back, data);  // nothing lost
}

}  // namespace
}  // namespace strata
