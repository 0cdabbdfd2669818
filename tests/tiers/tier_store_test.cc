// SPDX-License-Identifier: Apache-2.0
// Tests for the TierStore on the gpu stand-in: residency, access modes and
// their conflicts, dirty write-back, multi-hop moves (through staging and
// through a host copy), eviction policies, budgets, tickets, sticky errors,
// and call order per tensor. Fault injection on the NVMe path is in
// tier_store_fault_test.cc; the randomized stress test in store_stress_test.cc.
#include "tiers/tier_store.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "base/trace.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::RandomBytes;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

constexpr TierKind kGpu = TierKind::kGpu, kHost = TierKind::kHost, kNvme = TierKind::kNvme;

struct StoreFixture : ::testing::Test {
  testing::TempDir dir;
  std::unique_ptr<TierStore> store;

  TierStoreOptions Options(uint64_t gpu_budget, uint64_t host_budget, bool with_nvme = true) {
    TierStoreOptions o;
    o.gpu_tier.stand_in = true;
    o.gpu_tier.budget_bytes = gpu_budget;
    o.gpu_tier.slab_bytes = 0;
    o.host_tier.budget_bytes = host_budget;
    o.host_tier.slab_bytes = 0;
    o.host_tier.pin = false;
    o.copy.chunk_bytes = 64 * kKiB;
    o.staging_chunk_bytes = 64 * kKiB;
    o.staging_buffers = 2;
    o.staging_per_move = 2;
    if (with_nvme) {
      NvmeOptions n;
      n.dirs = {dir.path()};
      n.capacity_bytes = 64 * kMiB;
      n.block_size = 64 * kKiB;
      n.queue_depth = 8;
      n.buffered_fallback = true;  // where /var/tmp refuses O_DIRECT: same store paths
      o.nvme = n;
    }
    return o;
  }
  void Open(TierStoreOptions o) {
    auto r = TierStore::Open(std::move(o));
    ASSERT_OK(r.status());
    store = std::move(r).value();
  }
  void Open(uint64_t gpu_budget, uint64_t host_budget, bool with_nvme = true) {
    Open(Options(gpu_budget, host_budget, with_nvme));
  }
  TensorId Make(const std::string& name, uint64_t bytes, TierKind home, uint64_t seed = 0) {
    auto r = store->Create(name, DType::kU8, Shape{static_cast<int64_t>(bytes)}, home);
    EXPECT_OK(r.status());
    if (!r.ok()) return {};
    if (seed != 0) {
      auto data = RandomBytes(bytes, seed);
      EXPECT_OK(store->Write(*r, data.data(), bytes));
    }
    return *r;
  }
  std::vector<uint8_t> ReadAll(TensorId id) {
    auto info = store->Info(id);
    EXPECT_OK(info.status());
    std::vector<uint8_t> out(info->bytes);
    EXPECT_OK(store->Read(id, out.data(), out.size()));
    return out;
  }
  std::vector<uint8_t> ReadOn(TensorId id, TierKind tier) {
    auto v = store->Acquire(id, tier, Access::kRead);
    EXPECT_OK(v.status());
    if (!v.ok()) return {};
    std::vector<uint8_t> out(static_cast<uint8_t*>(v->data), static_cast<uint8_t*>(v->data) + v->bytes);
    EXPECT_OK(store->Release(id, tier, false));
    return out;
  }
  TensorInfo::CopyInfo CopyOf(TensorId id, TierKind tier) {
    auto info = store->Info(id);
    EXPECT_OK(info.status());
    return info.ok() ? info->copies[static_cast<int>(tier)] : TensorInfo::CopyInfo{};
  }
};

TEST_F(StoreFixture, CreateFindInfoAndErrors) {
  Open(kMiB, 4 * kMiB);
  ASSERT_OK_AND_ASSIGN(TensorId a, store->Create("layer0.w", DType::kBF16, Shape{64, 32}, kNvme));
  ASSERT_OK_AND_ASSIGN(TensorId found, store->Find("layer0.w"));
  EXPECT_EQ(found, a);
  ASSERT_OK_AND_ASSIGN(TensorInfo info, store->Info(a));
  EXPECT_EQ(info.bytes, 64u * 32u * 2u);
  EXPECT_EQ(info.home, kNvme);
  EXPECT_EQ(info.shape, (Shape{64, 32}));
  EXPECT_FALSE(info.written);
  EXPECT_TRUE(info.copies[2].allocated);
  EXPECT_TRUE(info.copies[2].valid);
  EXPECT_FALSE(info.copies[0].allocated);
  EXPECT_THAT(store->Create("layer0.w", DType::kF32, Shape{4}, kHost), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(store->Create("", DType::kF32, Shape{4}, kHost), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(store->Find("nope"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(store->Info(TensorId{999}), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(store->Acquire(TensorId{999}, kHost, Access::kRead), StatusIs(StatusCode::kNotFound));
  // Tier rules.
  EXPECT_THAT(store->Acquire(a, kNvme, Access::kRead), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(TensorId g, store->Create("gpu-home", DType::kF32, Shape{16}, kGpu));
  auto slower = store->Acquire(g, kHost, Access::kRead);
  EXPECT_THAT(slower, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(slower.status().ToString(), HasSubstr("lives on gpu"));
  EXPECT_THAT(store->Evict(a, kNvme), StatusIs(StatusCode::kInvalidArgument));  // the home copy
  // A store without NVMe refuses nvme homes.
  store.reset();
  Open(kMiB, 4 * kMiB, /*with_nvme=*/false);
  EXPECT_THAT(store->Create("x", DType::kF32, Shape{4}, kNvme), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(StoreFixture, WriteAndReadBackOnEveryHomeAndTier) {
  Open(4 * kMiB, 8 * kMiB);
  const uint64_t n = 300 * kKiB + 7;  // not a multiple of anything
  for (TierKind home : {kGpu, kHost, kNvme}) {
    std::string name = "t-" + std::string(TierName(home));
    TensorId id = Make(name, n, home, 11 + static_cast<int>(home));
    auto want = RandomBytes(n, 11 + static_cast<int>(home));
    EXPECT_EQ(ReadAll(id), want) << name;
    for (TierKind tier : {kGpu, kHost}) {
      if (static_cast<int>(tier) > static_cast<int>(home)) continue;
      EXPECT_EQ(ReadOn(id, tier), want) << name << " on " << TierName(tier);
    }
  }
}

TEST_F(StoreFixture, ReadersShareWritersAreExclusive) {
  Open(kMiB, 4 * kMiB);
  TensorId id = Make("w", 4096, kNvme, 1);
  ASSERT_OK_AND_ASSIGN(TensorView r1, store->Acquire(id, kHost, Access::kRead));
  ASSERT_OK_AND_ASSIGN(TensorView r2, store->Acquire(id, kGpu, Access::kRead));
  EXPECT_EQ(std::memcmp(r1.data, r2.data, 4096), 0);
  auto w = store->Acquire(id, kGpu, Access::kReadWrite);
  ASSERT_THAT(w, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(w.status().ToString(), HasSubstr("acquired for reading"));
  EXPECT_THAT(store->Acquire(id, kHost, Access::kWriteDiscard), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(store->Release(id, kHost, /*dirty=*/true), StatusIs(StatusCode::kFailedPrecondition));  // read pin
  ASSERT_OK(store->Release(id, kGpu, false));
  ASSERT_OK_AND_ASSIGN(TensorView wv, store->Acquire(id, kGpu, Access::kReadWrite));
  EXPECT_THAT(store->Acquire(id, kHost, Access::kRead), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(store->Prefetch(id, kHost), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(store->Evict(id, kGpu), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(store->Remove(id), StatusIs(StatusCode::kFailedPrecondition));
  std::memset(wv.data, 0x5a, 4096);
  ASSERT_OK(store->Release(id, kGpu, true));
  EXPECT_THAT(store->Release(id, kGpu, false), StatusIs(StatusCode::kFailedPrecondition));  // not acquired
  EXPECT_EQ(ReadOn(id, kHost), std::vector<uint8_t>(4096, 0x5a));
}

TEST_F(StoreFixture, DirtyCopyIsWrittenBackBeforeItIsDropped) {
  Open(kMiB, 4 * kMiB);
  TensorId id = Make("w", 100 * kKiB, kNvme, 2);
  ASSERT_OK_AND_ASSIGN(TensorView v, store->Acquire(id, kGpu, Access::kReadWrite));
  static_cast<uint8_t*>(v.data)[0] ^= 0xff;
  static_cast<uint8_t*>(v.data)[v.bytes - 1] ^= 0xff;
  ASSERT_OK(store->Release(id, kGpu, true));
  auto gpu = CopyOf(id, kGpu), home = CopyOf(id, kNvme), host = CopyOf(id, kHost);
  EXPECT_TRUE(gpu.valid);
  EXPECT_TRUE(gpu.dirty);
  EXPECT_FALSE(home.valid);
  EXPECT_FALSE(host.valid);  // the host copy made on the way up is stale now
  EXPECT_TRUE(host.allocated);
  ASSERT_OK_AND_ASSIGN(Ticket t, store->Evict(id, kGpu));
  ASSERT_OK(t.Wait());
  EXPECT_FALSE(CopyOf(id, kGpu).allocated);
  EXPECT_TRUE(CopyOf(id, kNvme).valid);
  EXPECT_TRUE(CopyOf(id, kHost).valid);  // went home through the host copy
  TierStoreStats s = store->stats();
  EXPECT_EQ(s.tiers[0].writebacks, 1u);
  EXPECT_EQ(s.tiers[0].evictions, 1u);
  // Drop the host copy too and read from the file.
  ASSERT_OK_AND_ASSIGN(Ticket t2, store->Evict(id, kHost));
  ASSERT_OK(t2.Wait());
  auto want = RandomBytes(100 * kKiB, 2);
  want[0] ^= 0xff;
  want.back() ^= 0xff;
  EXPECT_EQ(ReadAll(id), want);
}

TEST_F(StoreFixture, NvmeToGpuGoesThroughStagingWhenThereIsNoHostCopy) {
  Open(4 * kMiB, 4 * kMiB);
  const uint64_t n = kMiB + 5;  // 17 staging chunks of 64 KiB
  TensorId id = Make("w", n, kNvme, 3);
  ASSERT_OK_AND_ASSIGN(Ticket e, store->Evict(id, kHost));  // Write left a host copy
  ASSERT_OK(e.Wait());
  ASSERT_OK(store->FlushAll());
  TierStoreStats before = store->stats();
  ASSERT_OK_AND_ASSIGN(Ticket p, store->Prefetch(id, kGpu));
  ASSERT_OK(p.Wait());
  EXPECT_FALSE(CopyOf(id, kHost).allocated);  // staging, not a host copy
  EXPECT_TRUE(CopyOf(id, kGpu).valid);
  TierStoreStats after = store->stats();
  EXPECT_EQ(after.nvme_to_host.bytes - before.nvme_to_host.bytes, AlignUp(n, 4096));
  EXPECT_EQ(after.host_to_gpu.bytes - before.host_to_gpu.bytes, n);
  EXPECT_EQ(ReadOn(id, kGpu), RandomBytes(n, 3));
  // And back down after a change: gpu -> staging -> nvme.
  ASSERT_OK_AND_ASSIGN(TensorView v, store->Acquire(id, kGpu, Access::kReadWrite));
  std::memset(v.data, 0x11, 1000);
  ASSERT_OK(store->Release(id, kGpu, true));
  ASSERT_OK_AND_ASSIGN(Ticket f, store->Flush(id));
  ASSERT_OK(f.Wait());
  EXPECT_TRUE(CopyOf(id, kNvme).valid);
  EXPECT_FALSE(CopyOf(id, kHost).allocated);
  ASSERT_OK_AND_ASSIGN(Ticket g, store->Evict(id, kGpu));
  ASSERT_OK(g.Wait());
  auto want = RandomBytes(n, 3);
  std::memset(want.data(), 0x11, 1000);
  EXPECT_EQ(ReadAll(id), want);
}

TEST_F(StoreFixture, LruEvictsTheLeastRecentlyUsedCopy) {
  Open(3 * 256 * kKiB, 8 * kMiB);
  TensorId a = Make("a", 256 * kKiB, kHost, 1), b = Make("b", 256 * kKiB, kHost, 2),
           c = Make("c", 256 * kKiB, kHost, 3), d = Make("d", 256 * kKiB, kHost, 4);
  for (TensorId id : {a, b, c}) EXPECT_EQ(ReadOn(id, kGpu).size(), 256 * kKiB);
  EXPECT_EQ(ReadOn(a, kGpu), RandomBytes(256 * kKiB, 1));  // a is now the most recent
  EXPECT_EQ(ReadOn(d, kGpu), RandomBytes(256 * kKiB, 4));  // evicts b
  EXPECT_TRUE(CopyOf(a, kGpu).allocated);
  EXPECT_FALSE(CopyOf(b, kGpu).allocated);
  EXPECT_TRUE(CopyOf(c, kGpu).allocated);
  EXPECT_EQ(store->stats().tiers[0].evictions, 1u);
  EXPECT_EQ(store->stats().tiers[0].writebacks, 0u);  // b was clean
}

// --trace (base/trace.h): a copy that had to wait for room says so, and
// every move is named by its tensor and tiers.
TEST_F(StoreFixture, TheTraceShowsMovesAndTheWaitForRoom) {
  Open(3 * 256 * kKiB, 8 * kMiB);
  TensorId a = Make("a", 256 * kKiB, kHost, 1), b = Make("b", 256 * kKiB, kHost, 2),
           c = Make("c", 256 * kKiB, kHost, 3), d = Make("d", 256 * kKiB, kHost, 4);
  for (TensorId id : {a, b, c}) EXPECT_EQ(ReadOn(id, kGpu).size(), 256 * kKiB);
  testing::TempDir dir;
  {
    ASSERT_OK_AND_ASSIGN(trace::Recording rec, trace::Recording::Begin(dir.File("t.json")));
    EXPECT_EQ(ReadOn(d, kGpu), RandomBytes(256 * kKiB, 4));  // evicts a
    ASSERT_OK(rec.Finish());
  }
  std::ifstream f(dir.File("t.json"));
  const std::string json((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(json.find("\"name\":\"d host to gpu\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\":\"room for d on gpu\""), std::string::npos) << json;
  EXPECT_EQ(json.find("room for a"), std::string::npos) << json;  // (before the recording)
}

TEST_F(StoreFixture, NextUsePolicyEvictsTheFarthestUse) {
  TierStoreOptions o = Options(3 * 256 * kKiB, 8 * kMiB);
  o.eviction = EvictionPolicy::kNextUse;
  Open(o);
  TensorId a = Make("a", 256 * kKiB, kHost, 1), b = Make("b", 256 * kKiB, kHost, 2),
           c = Make("c", 256 * kKiB, kHost, 3), d = Make("d", 256 * kKiB, kHost, 4);
  for (TensorId id : {a, b, c}) ReadOn(id, kGpu);
  ASSERT_OK(store->SetNextUse(a, 50));
  ASSERT_OK(store->SetNextUse(b, 10));
  ASSERT_OK(store->SetNextUse(c, 90));  // farthest: goes first
  ReadOn(d, kGpu);
  EXPECT_FALSE(CopyOf(c, kGpu).allocated);
  EXPECT_TRUE(CopyOf(a, kGpu).allocated);
  EXPECT_TRUE(CopyOf(b, kGpu).allocated);
  ASSERT_OK(store->SetNextUse(d, 5));
  ASSERT_OK(store->ClearNextUse(b));  // no hint: treated as never used again
  ReadOn(c, kGpu);
  EXPECT_FALSE(CopyOf(b, kGpu).allocated);
  ASSERT_OK_AND_ASSIGN(TensorInfo info, store->Info(a));
  EXPECT_EQ(info.next_use, 50u);
}

TEST_F(StoreFixture, OutOfMemoryWhenEverythingIsPinned) {
  Open(512 * kKiB, 8 * kMiB);
  TensorId a = Make("a", 256 * kKiB, kHost, 1), b = Make("b", 256 * kKiB, kHost, 2),
           c = Make("c", 256 * kKiB, kHost, 3);
  ASSERT_OK_AND_ASSIGN(TensorView va, store->Acquire(a, kGpu, Access::kRead));
  ASSERT_OK_AND_ASSIGN(TensorView vb, store->Acquire(b, kGpu, Access::kRead));
  EXPECT_NE(va.data, vb.data);
  auto r = store->Acquire(c, kGpu, Access::kRead);
  ASSERT_THAT(r, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_EQ(r.status().tier(), kGpu);
  EXPECT_EQ(r.status().bytes_requested(), 256 * kKiB);
  EXPECT_EQ(r.status().bytes_available(), 0u);
  EXPECT_THAT(r.status().ToString(), HasSubstr("2 pinned copies"));
  ASSERT_OK(store->Release(a, kGpu, false));
  ASSERT_OK_AND_ASSIGN(TensorView vc, store->Acquire(c, kGpu, Access::kRead));  // evicts a
  EXPECT_EQ(std::memcmp(vc.data, RandomBytes(256 * kKiB, 3).data(), 256 * kKiB), 0);
  ASSERT_OK(store->Release(b, kGpu, false));
  ASSERT_OK(store->Release(c, kGpu, false));
  // A tensor larger than the whole budget.
  TensorId big = Make("big", kMiB, kHost);
  EXPECT_THAT(store->Acquire(big, kGpu, Access::kRead), StatusIs(StatusCode::kOutOfMemory));
}

TEST_F(StoreFixture, WriteDiscardAllocatesWithoutLoading) {
  Open(kMiB, 4 * kMiB);
  TensorId id = Make("grad", 200 * kKiB, kNvme, 5);
  ASSERT_OK(store->FlushAll());
  ASSERT_OK_AND_ASSIGN(Ticket e, store->Evict(id, kHost));
  ASSERT_OK(e.Wait());
  TierStoreStats before = store->stats();
  ASSERT_OK_AND_ASSIGN(TensorView v, store->Acquire(id, kGpu, Access::kWriteDiscard));
  TierStoreStats mid = store->stats();
  EXPECT_EQ(mid.nvme_to_host.bytes, before.nvme_to_host.bytes);  // nothing was read
  EXPECT_EQ(mid.host_to_gpu.bytes, before.host_to_gpu.bytes);
  std::memset(v.data, 0x77, v.bytes);
  ASSERT_OK(store->Release(id, kGpu, /*dirty=*/false));  // discard: the copy is the contents anyway
  EXPECT_TRUE(CopyOf(id, kGpu).dirty);
  EXPECT_EQ(ReadAll(id), std::vector<uint8_t>(200 * kKiB, 0x77));
}

TEST_F(StoreFixture, UnwrittenTensorsMoveNoBytes) {
  Open(kMiB, 4 * kMiB);
  ASSERT_OK_AND_ASSIGN(TensorId id, store->Create("act", DType::kF16, Shape{256, 256}, kNvme));
  ASSERT_OK_AND_ASSIGN(Ticket p, store->Prefetch(id, kGpu));
  ASSERT_OK(p.Wait());
  ASSERT_OK_AND_ASSIGN(Ticket e, store->Evict(id, kGpu));
  ASSERT_OK(e.Wait());
  TierStoreStats s = store->stats();
  EXPECT_EQ(s.nvme_to_host.bytes + s.host_to_gpu.bytes + s.gpu_to_host.bytes + s.host_to_nvme.bytes, 0u);
  EXPECT_EQ(s.tiers[0].misses, 1u);
}

TEST_F(StoreFixture, PrefetchTicketsHitsAndMisses) {
  Open(kMiB, 4 * kMiB);
  TensorId id = Make("w", 64 * kKiB, kNvme, 6);
  ASSERT_OK_AND_ASSIGN(Ticket t, store->Prefetch(id, kGpu));
  ASSERT_OK(t.Wait());
  ASSERT_OK_AND_ASSIGN(bool done, t.Poll());
  EXPECT_TRUE(done);
  ASSERT_OK_AND_ASSIGN(Ticket again, store->Prefetch(id, kGpu));  // a hit: complete at once
  ASSERT_OK_AND_ASSIGN(done, again.Poll());
  EXPECT_TRUE(done);
  ASSERT_OK_AND_ASSIGN(TensorView v, store->Acquire(id, kGpu, Access::kRead));
  EXPECT_EQ(std::memcmp(v.data, RandomBytes(64 * kKiB, 6).data(), v.bytes), 0);
  ASSERT_OK(store->Release(id, kGpu, false));
  TierStoreStats s = store->stats();
  EXPECT_EQ(s.tiers[0].misses, 1u);
  EXPECT_EQ(s.tiers[0].hits, 2u);
  EXPECT_EQ(s.prefetches, 2u);
  EXPECT_EQ(s.queue_depth, 0u);
  EXPECT_GE(s.max_queue_depth, 1u);
  EXPECT_GT(s.host_to_gpu.seconds, 0.0);
  EXPECT_EQ(s.tiers[0].resident, 1u);
}

TEST_F(StoreFixture, MovesOnOneTensorHappenInCallOrder) {
  Open(kMiB, 4 * kMiB);
  TensorId id = Make("w", 128 * kKiB, kNvme, 7);
  for (int round = 0; round < 20; ++round) {
    ASSERT_OK_AND_ASSIGN(Ticket p, store->Prefetch(id, kGpu));
    ASSERT_OK_AND_ASSIGN(Ticket e, store->Evict(id, kGpu));
    ASSERT_OK_AND_ASSIGN(Ticket p2, store->Prefetch(id, kGpu));
    ASSERT_OK_AND_ASSIGN(Ticket e2, store->Evict(id, kGpu));
    ASSERT_OK(e2.Wait());
    EXPECT_FALSE(CopyOf(id, kGpu).allocated) << round;  // the last call wins
    ASSERT_OK(p.Wait());
    ASSERT_OK(e.Wait());
    ASSERT_OK(p2.Wait());
  }
  // An Acquire right after a Prefetch runs or joins it rather than racing it.
  ASSERT_OK_AND_ASSIGN(Ticket p, store->Prefetch(id, kGpu));
  EXPECT_EQ(ReadOn(id, kGpu), RandomBytes(128 * kKiB, 7));
  ASSERT_OK(p.Wait());
  EXPECT_EQ(store->stats().queue_depth, 0u);
}

TEST_F(StoreFixture, FailedBackgroundMoveIsReportedOnceAtTheNextCall) {
  Open(256 * kKiB, 4 * kMiB);
  TensorId a = Make("a", 256 * kKiB, kHost, 1), b = Make("b", 256 * kKiB, kHost, 2);
  ASSERT_OK_AND_ASSIGN(TensorView va, store->Acquire(a, kGpu, Access::kRead));  // fills the gpu
  EXPECT_EQ(va.bytes, 256 * kKiB);
  ASSERT_OK_AND_ASSIGN(Ticket p, store->Prefetch(b, kGpu));
  // Wait for the move to fail without reporting it through the ticket.
  for (int i = 0; i < 1000 && store->stats().failures == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(store->stats().failures, 1u);
  auto r = store->Acquire(b, kHost, Access::kRead);  // an unrelated call on b
  ASSERT_THAT(r, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_THAT(r.status().ToString(), HasSubstr("earlier prefetch of 'b' to gpu failed"));
  ASSERT_OK_AND_ASSIGN(TensorView vb, store->Acquire(b, kHost, Access::kRead));  // reported: gone
  EXPECT_EQ(std::memcmp(vb.data, RandomBytes(256 * kKiB, 2).data(), vb.bytes), 0);  // source intact
  ASSERT_OK(store->Release(b, kHost, false));
  EXPECT_FALSE(CopyOf(b, kGpu).valid);
  // A failure seen through the ticket is not repeated by the next call.
  ASSERT_OK_AND_ASSIGN(Ticket p2, store->Prefetch(b, kGpu));
  EXPECT_THAT(p2.Wait(), StatusIs(StatusCode::kOutOfMemory));
  EXPECT_OK(store->Prefetch(b, kHost).status());
  ASSERT_OK(store->Release(a, kGpu, false));
  (void)p.Poll();
}

TEST_F(StoreFixture, ReleaseWithAStreamNeedsAGpu) {
  Open(kMiB, 4 * kMiB);
  TensorId id = Make("w", 4096, kHost, 1);
  ASSERT_OK_AND_ASSIGN(TensorView v, store->Acquire(id, kGpu, Access::kRead));
  EXPECT_EQ(v.tier, kGpu);
  int fake = 0;
  EXPECT_THAT(store->Release(id, kGpu, false, &fake), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(CopyOf(id, kGpu).readers, 0);  // released anyway
}

TEST_F(StoreFixture, RemoveFreesEveryCopy) {
  Open(kMiB, 4 * kMiB);
  TensorId id = Make("w", 256 * kKiB, kNvme, 1);
  ReadOn(id, kGpu);
  uint64_t host_used = store->host_tier()->usage().used;
  ASSERT_OK_AND_ASSIGN(TensorView v, store->Acquire(id, kGpu, Access::kRead));
  EXPECT_EQ(v.id, id);
  EXPECT_THAT(store->Remove(id), StatusIs(StatusCode::kFailedPrecondition));
  ASSERT_OK(store->Release(id, kGpu, false));
  ASSERT_OK(store->Remove(id));
  EXPECT_THAT(store->Find("w"), StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(store->gpu_tier()->usage().used, 0u);
  EXPECT_EQ(store->host_tier()->usage().used, host_used - 256 * kKiB);
  EXPECT_EQ(store->stats().tensors, 0u);
  ASSERT_OK_AND_ASSIGN(TensorId again, store->Create("w", DType::kU8, Shape{16}, kNvme));
  EXPECT_NE(again, id);  // ids are not reused
}

TEST_F(StoreFixture, RemoveRunsTheMovesQueuedBeforeIt) {
  Open(kMiB, 4 * kMiB);
  TensorId id = Make("w", 256 * kKiB, kNvme, 1);
  ASSERT_OK_AND_ASSIGN(Ticket p, store->Prefetch(id, kGpu));
  ASSERT_OK_AND_ASSIGN(Ticket e, store->Evict(id, kHost));
  ASSERT_OK(store->Remove(id));
  EXPECT_OK(p.Wait());
  EXPECT_OK(e.Wait());
  EXPECT_EQ(store->gpu_tier()->usage().used, 0u);
  EXPECT_EQ(store->stats().queue_depth, 0u);
}

TEST_F(StoreFixture, HomeCopiesAreNeverEvictedAndStagingCountsInTheHostBudget) {
  Open(kMiB, kMiB);
  // Two staging buffers of 64 KiB come out of the host budget.
  EXPECT_EQ(store->host_tier()->usage().used, 128 * kKiB);
  TensorId h = Make("h", 512 * kKiB, kHost, 1);
  TensorId n = Make("n", 256 * kKiB, kNvme, 2);  // Write goes through a host copy
  auto r = store->Create("h2", DType::kU8, Shape{512 * 1024}, kHost);
  EXPECT_THAT(r, StatusIs(StatusCode::kOutOfMemory));  // only n's cache could go: not enough
  EXPECT_TRUE(CopyOf(h, kHost).valid);
  EXPECT_EQ(ReadAll(n), RandomBytes(256 * kKiB, 2));
}

TEST_F(StoreFixture, RejectsBadOptions) {
  TierStoreOptions o = Options(kMiB, 4 * kMiB);
  o.staging_per_move = 3;  // more than staging_buffers
  EXPECT_THAT(TierStore::Open(o), StatusIs(StatusCode::kInvalidArgument));
  o = Options(kMiB, 4 * kMiB);
  o.staging_chunk_bytes = 1000;
  EXPECT_THAT(TierStore::Open(o), StatusIs(StatusCode::kInvalidArgument));
  o = Options(kMiB, 4 * kMiB);
  o.worker_threads = 0;
  EXPECT_THAT(TierStore::Open(o), StatusIs(StatusCode::kInvalidArgument));
  o = Options(kMiB, 64 * kKiB);  // the staging does not fit in the host budget
  auto r = TierStore::Open(o);
  ASSERT_THAT(r, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_THAT(r.status().ToString(), HasSubstr("staging buffers"));
}

TEST_F(StoreFixture, ZeroSizedTensors) {
  Open(kMiB, 4 * kMiB);
  ASSERT_OK_AND_ASSIGN(TensorId id, store->Create("empty", DType::kF32, Shape{0, 4}, kNvme));
  ASSERT_OK(store->Write(id, nullptr, 0));
  ASSERT_OK_AND_ASSIGN(TensorView v, store->Acquire(id, kGpu, Access::kRead));
  EXPECT_EQ(v.bytes, 0u);
  ASSERT_OK(store->Release(id, kGpu, false));
  ASSERT_OK_AND_ASSIGN(Ticket e, store->Evict(id, kGpu));
  ASSERT_OK(e.Wait());
}

}  // namespace
}  // namespace strata
