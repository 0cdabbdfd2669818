// SPDX-License-Identifier: Apache-2.0
// Transparent huge pages for host memory (tiers/host_tier.h): MapHostMemory,
// the THP probes, and HostTierOptions::huge_pages. Whether the kernel grants
// huge pages depends on the machine: tests that need them skip when
// /sys/kernel/mm/transparent_hugepage/enabled is "never" or THP is disabled
// for the process.
#include <sys/mman.h>

#include <cstring>

#include "tests/test_util.h"
#include "tiers/host_tier.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;

constexpr uint64_t k2M = uint64_t{2} << 20;

// One 16 MiB slab, no NUMA binding, the given page policy and pinning.
HostTierOptions EightHugePages(HostHugePages pages, bool pin) {
  HostTierOptions o;
  o.budget_bytes = 8 * k2M;
  o.slab_bytes = 8 * k2M;
  o.pin = pin;
  o.huge_pages = pages;
  o.numa = NumaPlacement::kNone;
  return o;
}

#define SKIP_WITHOUT_THP()                                                         \
  if (!TransparentHugePagesUsable())                                               \
  GTEST_SKIP() << "transparent huge pages are not usable here (setting: '"        \
               << TransparentHugePagesSetting() << "')"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_SANITIZER() GTEST_SKIP() << "the sanitizer turns mlock into a no-op"
#else
#define SKIP_UNDER_SANITIZER() \
  do {                         \
  } while (0)
#endif

TEST(HostHugePages, SettingIsOneOfTheKernelsWords) {
  std::string s = TransparentHugePagesSetting();
  if (s.empty()) GTEST_SKIP() << "no /sys/kernel/mm/transparent_hugepage/enabled";
  EXPECT_TRUE(s == "always" || s == "madvise" || s == "never") << s;
  ASSERT_OK_AND_ASSIGN(uint64_t process, ProcessAnonHugePages());
  EXPECT_EQ(process % 4096, 0u);
}

TEST(HostHugePages, MapHostMemoryIsAlignedAndZeroAndRejectsZeroBytes) {
  EXPECT_THAT(MapHostMemory(0, HostHugePages::kAligned), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(HostMapping m, MapHostMemory(5 * k2M + 100, HostHugePages::kAligned, /*prefault=*/true));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data()) % k2M, 0u);
  EXPECT_EQ(m.bytes(), 5 * k2M + 4096);  // rounded up to whole pages
  const unsigned char* c = static_cast<const unsigned char*>(m.data());
  for (uint64_t o = 0; o < m.bytes(); o += 4096) ASSERT_EQ(c[o], 0) << o;
  HostMapping moved = std::move(m);
  EXPECT_EQ(m.data(), nullptr);
  EXPECT_EQ(moved.bytes(), 5 * k2M + 4096);
}

TEST(HostHugePages, AlignedMappingGetsHugePagesAndOffGetsNone) {
  SKIP_WITHOUT_THP();
  ASSERT_OK_AND_ASSIGN(HostMapping on, MapHostMemory(8 * k2M, HostHugePages::kAligned, /*prefault=*/true));
  ASSERT_OK_AND_ASSIGN(uint64_t huge, AnonHugePagesOfMapping(on.data()));
  // Direct compaction may still come up short on a fragmented machine, but
  // not for all of 8 aligned 2 MiB extents.
  EXPECT_GE(huge, k2M) << "THP setting " << TransparentHugePagesSetting();
  EXPECT_EQ(huge % k2M, 0u);

  ASSERT_OK_AND_ASSIGN(HostMapping off, MapHostMemory(8 * k2M, HostHugePages::kOff, /*prefault=*/true));
  ASSERT_OK_AND_ASSIGN(uint64_t none, AnonHugePagesOfMapping(off.data()));
  EXPECT_EQ(none, 0u);
}

TEST(HostHugePages, AnonHugePagesOfAnUnmappedAddressIsNotFound) {
  ASSERT_OK_AND_ASSIGN(HostMapping m, MapHostMemory(k2M, HostHugePages::kOff));
  void* p = m.data();
  m = HostMapping();  // unmapped now
  EXPECT_THAT(AnonHugePagesOfMapping(p), StatusIs(StatusCode::kNotFound));
}

TEST(HostTierHugePages, AlignedSlabsArePinnedAsHugePages) {
  SKIP_WITHOUT_THP();
  SKIP_UNDER_SANITIZER();
  ASSERT_OK_AND_ASSIGN(auto tier, HostTier::Open(EightHugePages(HostHugePages::kAligned, true)));
  ASSERT_TRUE(tier->pinned());
  ASSERT_OK_AND_ASSIGN(TierBlock b, tier->Allocate(8 * k2M));
  // The slab's first block starts at the slab: 2 MiB-aligned.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % k2M, 0u);
  // Pinning faulted the pages in after the advice: huge before any touch.
  ASSERT_OK_AND_ASSIGN(uint64_t huge, AnonHugePagesOfMapping(b.data()));
  EXPECT_GE(huge, k2M) << "pinned with " << tier->pin_method();
}

TEST(HostTierHugePages, OffKeepsSmallPagesAndTheDefaultIsAdvise) {
  EXPECT_EQ(HostTierOptions{}.huge_pages, HostHugePages::kAdvise);
  EXPECT_EQ(HostHugePagesName(HostHugePages::kAdvise), "advise");
  EXPECT_EQ(HostHugePagesName(HostHugePages::kAligned), "aligned");
  EXPECT_EQ(HostHugePagesName(HostHugePages::kOff), "off");
  ASSERT_OK_AND_ASSIGN(auto tier, HostTier::Open(EightHugePages(HostHugePages::kOff, false)));
  ASSERT_OK_AND_ASSIGN(TierBlock b, tier->Allocate(8 * k2M));
  std::memset(b.data(), 1, b.bytes());  // fault every page in
  ASSERT_OK_AND_ASSIGN(uint64_t huge, AnonHugePagesOfMapping(b.data()));
  EXPECT_EQ(huge, 0u);
}

TEST(HostTierHugePages, UnpinnedAlignedSlabGetsHugePagesOnFirstTouch) {
  SKIP_WITHOUT_THP();
  ASSERT_OK_AND_ASSIGN(auto tier, HostTier::Open(EightHugePages(HostHugePages::kAligned, false)));
  ASSERT_OK_AND_ASSIGN(TierBlock b, tier->Allocate(8 * k2M));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % k2M, 0u);
  std::memset(b.data(), 1, b.bytes());
  ASSERT_OK_AND_ASSIGN(uint64_t huge, AnonHugePagesOfMapping(b.data()));
  EXPECT_GE(huge, k2M);
}

}  // namespace
}  // namespace strata
