// SPDX-License-Identifier: Apache-2.0
// Tests for the Arena: best fit, coalescing within (never across) regions,
// alignment, exact accounting, and a randomized run against a reference.
#include "tiers/arena.h"

#include <map>
#include <random>

#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;

constexpr uintptr_t kBase = 0x10000000;

TEST(Arena, RoundsAndAligns) {
  Arena a(256);
  ASSERT_OK(a.AddRegion(kBase, 4096));
  uintptr_t p = a.Allocate(1);
  uintptr_t q = a.Allocate(300);
  ASSERT_NE(p, 0u);
  ASSERT_NE(q, 0u);
  EXPECT_EQ(p % 256, 0u);
  EXPECT_EQ(q % 256, 0u);
  EXPECT_EQ(a.BlockSize(p), 256u);
  EXPECT_EQ(a.BlockSize(q), 512u);
  EXPECT_EQ(a.stats().used, 768u);
  EXPECT_EQ(a.stats().free, 4096u - 768u);
  EXPECT_EQ(a.RoundUp(0), 256u);
  // Alignment below 256 is raised to 256.
  EXPECT_EQ(Arena(64).alignment(), 256u);
  EXPECT_EQ(Arena(4096).alignment(), 4096u);
}

TEST(Arena, RejectsBadRegions) {
  Arena a(4096);
  EXPECT_THAT(a.AddRegion(kBase + 256, 4096), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(a.AddRegion(kBase, 100), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(a.AddRegion(kBase, 0), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK(a.AddRegion(kBase, 8192));
  EXPECT_THAT(a.AddRegion(kBase + 4096, 8192), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(a.AddRegion(kBase - 4096, 8192), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_OK(a.AddRegion(kBase + 8192, 4096));  // adjacent is fine
  EXPECT_EQ(a.stats().capacity, 12288u);
}

TEST(Arena, BestFitPicksSmallestHole) {
  Arena a(256);
  ASSERT_OK(a.AddRegion(kBase, 256 * 100));
  // Layout: [A 4][B 1][C 8][D 1][E 2][F 1][rest], then free A, C, E to make holes of 4, 8, 2.
  uintptr_t A = a.Allocate(4 * 256), B = a.Allocate(256), C = a.Allocate(8 * 256),
            D = a.Allocate(256), E = a.Allocate(2 * 256), F = a.Allocate(256);
  ASSERT_TRUE(A && B && C && D && E && F);
  ASSERT_OK(a.Free(A));
  ASSERT_OK(a.Free(C));
  ASSERT_OK(a.Free(E));
  EXPECT_EQ(a.Allocate(2 * 256), E);  // exact fit
  EXPECT_EQ(a.Allocate(3 * 256), A);  // the 4-hole, not the 8-hole or the tail
  EXPECT_EQ(a.Allocate(5 * 256), C);  // the 8-hole
  EXPECT_EQ(a.stats().failures, 0u);
}

TEST(Arena, CoalescesBothSides) {
  Arena a(256);
  ASSERT_OK(a.AddRegion(kBase, 256 * 3));
  uintptr_t x = a.Allocate(256), y = a.Allocate(256), z = a.Allocate(256);
  EXPECT_EQ(a.Allocate(1), 0u);
  EXPECT_EQ(a.stats().failures, 1u);
  ASSERT_OK(a.Free(x));
  ASSERT_OK(a.Free(z));
  EXPECT_EQ(a.stats().free_blocks, 2u);
  EXPECT_EQ(a.stats().largest_free, 256u);
  EXPECT_DOUBLE_EQ(a.stats().fragmentation(), 0.5);
  ASSERT_OK(a.Free(y));  // merges with both neighbours
  EXPECT_EQ(a.stats().free_blocks, 1u);
  EXPECT_EQ(a.stats().largest_free, 768u);
  EXPECT_DOUBLE_EQ(a.stats().fragmentation(), 0.0);
  EXPECT_EQ(a.Allocate(768), kBase);
}

TEST(Arena, FromTopCarvesTheHighEndAndKeepsLongLivedBlocksApart) {
  Arena a(256);
  ASSERT_OK(a.AddRegion(kBase, 256 * 16));
  uintptr_t home1 = a.Allocate(256 * 2);           // long-lived: bottom
  uintptr_t cache1 = a.Allocate(256 * 3, true);    // short-lived: top
  uintptr_t home2 = a.Allocate(256 * 2);
  uintptr_t cache2 = a.Allocate(256, true);
  EXPECT_EQ(home1, kBase);
  EXPECT_EQ(home2, kBase + 256 * 2);
  EXPECT_EQ(cache1, kBase + 256 * 13);
  EXPECT_EQ(cache2, kBase + 256 * 12);
  EXPECT_EQ(a.BlockSize(cache1), 256u * 3);
  // The caches go: the free space is one range again, next to the homes.
  ASSERT_OK(a.Free(cache1));
  ASSERT_OK(a.Free(cache2));
  EXPECT_EQ(a.stats().free_blocks, 1u);
  EXPECT_EQ(a.stats().largest_free, 256u * 12);
  EXPECT_EQ(a.stats().used, 256u * 4);
}

TEST(Arena, NeverMergesAcrossRegions) {
  Arena a(256);
  ASSERT_OK(a.AddRegion(kBase, 512));
  ASSERT_OK(a.AddRegion(kBase + 512, 512));  // adjacent addresses, distinct regions
  EXPECT_EQ(a.stats().free_blocks, 2u);
  EXPECT_EQ(a.Allocate(1024), 0u);  // would span both regions
  uintptr_t p = a.Allocate(512);
  ASSERT_NE(p, 0u);
  ASSERT_OK(a.Free(p));
  EXPECT_EQ(a.stats().free_blocks, 2u);
  EXPECT_EQ(a.stats().largest_free, 512u);
}

TEST(Arena, FreeOfUnknownBlockIsAnErrorAndChangesNothing) {
  Arena a(256);
  ASSERT_OK(a.AddRegion(kBase, 1024));
  uintptr_t p = a.Allocate(256);
  EXPECT_THAT(a.Free(p + 256), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK(a.Free(p));
  EXPECT_THAT(a.Free(p), StatusIs(StatusCode::kInvalidArgument));  // double free
  EXPECT_EQ(a.stats().used, 0u);
  EXPECT_EQ(a.stats().free, 1024u);
}

TEST(Arena, RemoveRegionOnlyWhenEmpty) {
  Arena a(256);
  ASSERT_OK(a.AddRegion(kBase, 1024));
  ASSERT_OK(a.AddRegion(kBase + 4096, 1024));
  uintptr_t p = a.Allocate(512);
  ASSERT_EQ(p, kBase);
  EXPECT_THAT(a.RemoveRegion(kBase), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(a.RemoveRegion(kBase + 256), StatusIs(StatusCode::kNotFound));
  auto empty = a.EmptyRegions();
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(empty[0].first, kBase + 4096);
  ASSERT_OK(a.RemoveRegion(kBase + 4096));
  EXPECT_EQ(a.stats().capacity, 1024u);
  EXPECT_EQ(a.stats().regions, 1);
  ASSERT_OK(a.Free(p));
  ASSERT_OK(a.RemoveRegion(kBase));
  EXPECT_EQ(a.stats().capacity, 0u);
  EXPECT_EQ(a.Allocate(1), 0u);
}

// Random allocate/free against a reference of live blocks: blocks never
// overlap, stay inside their region, accounting is exact, and freeing
// everything leaves one free block per region.
TEST(Arena, RandomizedAgainstReference) {
  Arena a(256);
  const uint64_t kRegion = 1 << 20;
  const uintptr_t bases[] = {kBase, kBase + kRegion, kBase + 8 * kRegion};
  for (uintptr_t b : bases) ASSERT_OK(a.AddRegion(b, kRegion));
  std::mt19937_64 rng(42);
  std::map<uintptr_t, uint64_t> live;  // addr -> rounded size
  uint64_t used = 0;
  for (int step = 0; step < 20000; ++step) {
    bool alloc = live.empty() || (rng() % 100) < 55;
    if (alloc) {
      uint64_t want = 1 + rng() % (64 * 1024);
      uintptr_t p = a.Allocate(want);
      if (p == 0) {
        EXPECT_LT(a.stats().largest_free, a.RoundUp(want));
        continue;
      }
      uint64_t sz = a.RoundUp(want);
      EXPECT_EQ(p % 256, 0u);
      EXPECT_EQ(a.BlockSize(p), sz);
      // inside one region
      bool inside = false;
      for (uintptr_t b : bases) inside |= (p >= b && p + sz <= b + kRegion);
      ASSERT_TRUE(inside) << p;
      // no overlap with neighbours
      auto it = live.lower_bound(p);
      if (it != live.end()) {
        ASSERT_LE(p + sz, it->first);
      }
      if (it != live.begin()) {
        auto pr = std::prev(it);
        ASSERT_LE(pr->first + pr->second, p);
      }
      live[p] = sz;
      used += sz;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_OK(a.Free(it->first));
      used -= it->second;
      live.erase(it);
    }
    ASSERT_EQ(a.stats().used, used);
    ASSERT_EQ(a.stats().free, 3 * kRegion - used);
    ASSERT_EQ(a.stats().live_blocks, live.size());
  }
  for (auto& [p, sz] : live) ASSERT_OK(a.Free(p));
  EXPECT_EQ(a.stats().used, 0u);
  EXPECT_EQ(a.stats().free_blocks, 3u);
  EXPECT_EQ(a.stats().largest_free, kRegion);
  EXPECT_GE(a.stats().peak_used, kRegion / 2);
}

}  // namespace
}  // namespace strata
