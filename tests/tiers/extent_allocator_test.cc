// SPDX-License-Identifier: Apache-2.0
// ExtentAllocator: alignment, best fit, coalescing, tail give-back,
// exhaustion, double frees, and a randomized run against a byte map.
#include "tiers/nvme/extent_allocator.h"

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "base/bytes.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
constexpr uint64_t kA = 4096;

TEST(ExtentAllocator, AlignsAndGrowsFromTheEnd) {
  ExtentAllocator a;
  EXPECT_EQ(a.Allocate(1), 0u);
  EXPECT_EQ(a.Allocate(kA), kA);
  EXPECT_EQ(a.Allocate(kA + 1), 2 * kA);
  EXPECT_EQ(a.end(), 4 * kA);
  EXPECT_EQ(a.used(), 4 * kA);
  EXPECT_FALSE(a.Allocate(0).has_value());
}

TEST(ExtentAllocator, FreeCoalescesAndGivesTheTailBack) {
  ExtentAllocator a;
  std::vector<uint64_t> off;
  for (int i = 0; i < 5; ++i) off.push_back(*a.Allocate(kA));
  ASSERT_OK(a.Free(off[1], kA));
  ASSERT_OK(a.Free(off[3], kA));
  EXPECT_EQ(a.hole_count(), 2u);
  ASSERT_OK(a.Free(off[2], kA));  // joins [1] and [3]
  EXPECT_EQ(a.hole_count(), 1u);
  EXPECT_EQ(a.largest_hole(), 3 * kA);
  ASSERT_OK(a.Free(off[4], kA));  // hole now reaches the end: tail shrinks to 1 page
  EXPECT_EQ(a.hole_count(), 0u);
  EXPECT_EQ(a.end(), kA);
  ASSERT_OK(a.Free(off[0], kA));
  EXPECT_EQ(a.end(), 0u);
  EXPECT_EQ(a.used(), 0u);
}

TEST(ExtentAllocator, BestFitPrefersTheSmallestHoleThatFits) {
  ExtentAllocator a;
  uint64_t big = *a.Allocate(8 * kA);
  uint64_t sep1 = *a.Allocate(kA);
  uint64_t small = *a.Allocate(2 * kA);
  uint64_t sep2 = *a.Allocate(kA);
  ASSERT_OK(a.Free(big, 8 * kA));
  ASSERT_OK(a.Free(small, 2 * kA));
  // A 2-page request goes to the 2-page hole, keeping the 8-page hole whole.
  EXPECT_EQ(a.Allocate(2 * kA), small);
  EXPECT_EQ(a.largest_hole(), 8 * kA);
  // A 3-page request carves the 8-page hole from its start.
  EXPECT_EQ(a.Allocate(3 * kA), big);
  EXPECT_EQ(a.largest_hole(), 5 * kA);
  // Nothing fits 6 pages: it goes to the end.
  uint64_t end_before = a.end();
  EXPECT_EQ(a.Allocate(6 * kA), end_before);
  (void)sep1;
  (void)sep2;
}

TEST(ExtentAllocator, ExhaustionAtTheLimit) {
  ExtentAllocator a(kA, 10 * kA);
  EXPECT_EQ(a.Allocate(6 * kA), 0u);
  EXPECT_FALSE(a.Allocate(5 * kA).has_value());
  EXPECT_EQ(a.Allocate(4 * kA), 6 * kA);
  EXPECT_FALSE(a.Allocate(1).has_value());
  ASSERT_OK(a.Free(0, 6 * kA));
  EXPECT_FALSE(a.Allocate(7 * kA).has_value());  // hole of 6 and no room after 10
  EXPECT_EQ(a.Allocate(6 * kA), 0u);
  EXPECT_FALSE(a.Allocate(11 * kA).has_value());
}

TEST(ExtentAllocator, RejectsBadAndDoubleFrees) {
  ExtentAllocator a;
  uint64_t x = *a.Allocate(4 * kA);
  (void)*a.Allocate(kA);
  EXPECT_THAT(a.Free(x + 1, kA), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(a.Free(x, 0), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(a.Free(x, 100 * kA), StatusIs(StatusCode::kInvalidArgument));  // beyond end
  ASSERT_OK(a.Free(x + kA, kA));
  EXPECT_THAT(a.Free(x + kA, kA), StatusIs(StatusCode::kInvalidArgument));  // same again
  EXPECT_THAT(a.Free(x, 2 * kA), StatusIs(StatusCode::kInvalidArgument));   // overlaps it
  EXPECT_THAT(a.Free(x, 4 * kA), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(a.used(), 4 * kA);  // the rejected frees changed nothing
  ASSERT_OK(a.Free(x, kA));
  ASSERT_OK(a.Free(x + 2 * kA, 2 * kA));
  EXPECT_EQ(a.hole_count(), 1u);
  EXPECT_EQ(a.largest_hole(), 4 * kA);
}

// Fragmentation: free every other extent, then ask for sizes that fit only
// the holes or only the tail; afterwards, freeing everything leaves nothing.
TEST(ExtentAllocator, FragmentationIsReusedBeforeGrowing) {
  ExtentAllocator a;
  std::vector<uint64_t> off;
  for (int i = 0; i < 64; ++i) off.push_back(*a.Allocate(2 * kA));
  const uint64_t end = a.end();
  for (int i = 0; i < 64; i += 2) ASSERT_OK(a.Free(off[i], 2 * kA));
  EXPECT_EQ(a.hole_count(), 32u);
  EXPECT_EQ(a.hole_bytes(), 64 * kA);
  // 64 one-page requests fill the 32 two-page holes exactly, without growing.
  std::vector<uint64_t> small;
  for (int i = 0; i < 64; ++i) small.push_back(*a.Allocate(kA));
  EXPECT_EQ(a.end(), end);
  EXPECT_EQ(a.hole_count(), 0u);
  // A three-page request cannot use holes: it grows the end.
  EXPECT_EQ(a.Allocate(3 * kA), end);
  for (int i = 1; i < 64; i += 2) ASSERT_OK(a.Free(off[i], 2 * kA));
  for (uint64_t s : small) ASSERT_OK(a.Free(s, kA));
  ASSERT_OK(a.Free(end, 3 * kA));
  EXPECT_EQ(a.end(), 0u);
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.hole_count(), 0u);
}

// Random allocate/free against a page-ownership map: no two live extents
// overlap, every extent is aligned and below end(), and the counters agree.
TEST(ExtentAllocator, RandomizedAgainstPageMap) {
  ExtentAllocator a(kA, 512 * kA);
  std::mt19937_64 rng(42);
  std::map<uint64_t, uint64_t> live;  // offset -> bytes
  std::vector<int> owner(512, -1);
  int refused = 0;
  int next_id = 0;
  for (int step = 0; step < 20000; ++step) {
    bool alloc = live.empty() || rng() % 100 < 55;
    if (alloc) {
      uint64_t bytes = (1 + rng() % 16) * kA - (rng() % 2 ? rng() % kA : 0);
      auto off = a.Allocate(bytes);
      if (!off) {  // only when neither a hole nor the room below the limit fits
        EXPECT_LT(a.largest_hole(), AlignUp(bytes, kA));
        EXPECT_GT(a.end() + AlignUp(bytes, kA), a.limit());
        ++refused;
        continue;
      }
      ASSERT_EQ(*off % kA, 0u);
      uint64_t len = AlignUp(bytes, kA);
      ASSERT_LE(*off + len, a.end());
      int id = next_id++;
      for (uint64_t p = *off / kA; p < (*off + len) / kA; ++p) {
        ASSERT_EQ(owner[p], -1) << "page " << p << " handed out twice";
        owner[p] = id;
      }
      live[*off] = len;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_OK(a.Free(it->first, it->second));
      for (uint64_t p = it->first / kA; p < (it->first + it->second) / kA; ++p) owner[p] = -1;
      live.erase(it);
    }
    uint64_t used = 0, high = 0;
    for (auto& [o, l] : live) {
      used += l;
      high = std::max(high, o + l);
    }
    ASSERT_EQ(a.used(), used);
    ASSERT_EQ(a.end(), high);  // the tail give-back keeps end() tight
  }
  EXPECT_GT(refused, 0) << "the run never reached the limit";
}

}  // namespace
}  // namespace strata
