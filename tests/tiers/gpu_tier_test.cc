// SPDX-License-Identifier: Apache-2.0
// Tests for GpuTier on its host-memory stand-in (what CI has): exact budget,
// slab growth and trimming, errors naming the tier and the bytes. The real
// device tier is tested in gpu_tier_gpu_test.cc (label gpu).
#include "tiers/gpu_tier.h"

#include <cstring>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<GpuTier> OpenStandIn(uint64_t budget, uint64_t slab) {
  GpuTierOptions o;
  o.stand_in = true;
  o.budget_bytes = budget;
  o.slab_bytes = slab;
  auto r = GpuTier::Open(o);
  EXPECT_OK(r.status());
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(GpuTier, StandInWithoutGpu) {
  std::string why;
  bool gpu = testing::HaveGpu(&why);
  GpuTierOptions o;
  o.budget_bytes = 4 * kMiB;
  ASSERT_OK_AND_ASSIGN(auto tier, GpuTier::Open(o));
  EXPECT_EQ(tier->stand_in(), !gpu);
  EXPECT_EQ(tier->device_memory(), gpu);
  EXPECT_EQ(tier->kind(), TierKind::kGpu);
  if (!gpu) {
    EXPECT_THAT(tier->description(), HasSubstr("stand-in"));
    EXPECT_THAT(tier->description(), HasSubstr(why));
  }
  GpuTierOptions forced;
  forced.stand_in = true;
  ASSERT_OK_AND_ASSIGN(auto standin, GpuTier::Open(forced));
  EXPECT_TRUE(standin->stand_in());
  EXPECT_EQ(standin->budget(), kGiB);  // the stand-in's default budget
}

TEST(GpuTier, BudgetIsExact) {
  auto tier = OpenStandIn(kMiB, 0);
  ASSERT_NE(tier, nullptr);
  ASSERT_OK_AND_ASSIGN(TierBlock a, tier->Allocate(512 * kKiB, "a"));
  ASSERT_OK_AND_ASSIGN(TierBlock b, tier->Allocate(512 * kKiB - 256, "b"));
  EXPECT_EQ(b.bytes(), 512 * kKiB - 256);
  EXPECT_EQ(tier->usage().used, kMiB - 256);
  ASSERT_OK_AND_ASSIGN(TierBlock c, tier->Allocate(1, "c"));  // the last 256 bytes
  EXPECT_EQ(c.bytes(), 256u);
  EXPECT_EQ(tier->usage().used, kMiB);
  auto d = tier->Allocate(1, "tensor d");
  ASSERT_THAT(d, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_EQ(d.status().tier(), TierKind::kGpu);
  EXPECT_EQ(d.status().bytes_requested(), 256u);
  EXPECT_EQ(d.status().bytes_available(), 0u);
  EXPECT_THAT(d.status().ToString(), HasSubstr("tensor d"));
  EXPECT_EQ(tier->usage().failures, 1u);
  // The memory is usable (host memory in the stand-in).
  std::memset(a.data(), 0xab, a.bytes());
  std::memset(b.data(), 0xcd, b.bytes());
  EXPECT_EQ(static_cast<uint8_t*>(a.data())[a.bytes() - 1], 0xab);
  EXPECT_EQ(static_cast<uint8_t*>(b.data())[0], 0xcd);
  c.Reset();
  EXPECT_EQ(tier->usage().used, kMiB - 256);
}

TEST(GpuTier, RequestLargerThanBudget) {
  auto tier = OpenStandIn(kMiB, 256 * kKiB);
  ASSERT_NE(tier, nullptr);
  auto r = tier->Allocate(kMiB + 1, "big");
  ASSERT_THAT(r, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_EQ(r.status().bytes_requested(), kMiB + 256);
  EXPECT_EQ(r.status().bytes_available(), kMiB);
  EXPECT_EQ(tier->usage().reserved, 0u);  // nothing was mapped for it
}

TEST(GpuTier, GrowsInSlabsAndTrims) {
  auto tier = OpenStandIn(kMiB, 256 * kKiB);
  ASSERT_NE(tier, nullptr);
  std::vector<TierBlock> blocks;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(TierBlock b, tier->Allocate(256 * kKiB));
    blocks.push_back(std::move(b));
    EXPECT_EQ(tier->usage().slabs, i + 1);
    EXPECT_EQ(tier->usage().reserved, (i + 1) * 256 * kKiB);
  }
  EXPECT_THAT(tier->Allocate(256), StatusIs(StatusCode::kOutOfMemory));
  blocks.clear();
  EXPECT_EQ(tier->usage().used, 0u);
  EXPECT_EQ(tier->usage().reserved, kMiB);  // kept for reuse
  // A request bigger than any slab: the empty slabs are given back and one
  // big slab is mapped within the same budget.
  ASSERT_OK_AND_ASSIGN(TierBlock big, tier->Allocate(kMiB));
  EXPECT_EQ(tier->usage().slabs, 1);
  EXPECT_EQ(tier->usage().reserved, kMiB);
  big.Reset();
  EXPECT_EQ(tier->Trim(), kMiB);
  EXPECT_EQ(tier->usage().reserved, 0u);
  EXPECT_EQ(tier->usage().slabs, 0);
}

TEST(GpuTier, ReserveAllMapsTheBudgetAtOpen) {
  GpuTierOptions o;
  o.stand_in = true;
  o.budget_bytes = 3 * kMiB;
  o.slab_bytes = kMiB;
  o.reserve_all = true;
  ASSERT_OK_AND_ASSIGN(auto tier, GpuTier::Open(o));
  EXPECT_EQ(tier->usage().reserved, 3 * kMiB);
  EXPECT_EQ(tier->usage().slabs, 3);
  EXPECT_EQ(tier->usage().used, 0u);
}

TEST(GpuTier, ConcurrentAllocateAndFreeKeepExactAccounting) {
  auto tier = OpenStandIn(8 * kMiB, kMiB);
  ASSERT_NE(tier, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> ooms{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<TierBlock> mine;
      for (int i = 0; i < 2000; ++i) {
        if (mine.size() < 8 && rng() % 2) {
          auto r = tier->Allocate(1 + rng() % (256 * kKiB));
          if (r.ok()) {
            std::memset(r->data(), t, 64);
            mine.push_back(std::move(r).value());
          } else {
            ooms++;
          }
        } else if (!mine.empty()) {
          EXPECT_EQ(static_cast<uint8_t*>(mine.back().data())[63], t);
          mine.pop_back();
        }
        EXPECT_LE(tier->usage().used, 8 * kMiB);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(tier->usage().used, 0u);
  EXPECT_EQ(tier->usage().live_blocks, 0u);
  EXPECT_LE(tier->usage().reserved, 8 * kMiB);
}

}  // namespace
}  // namespace strata
