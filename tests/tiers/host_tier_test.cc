// SPDX-License-Identifier: Apache-2.0
// Tests for HostTier: pinning (mlock here; cudaHostRegister on a GPU
// machine), the RLIMIT_MEMLOCK error, slab hooks (NVMe registration), NUMA
// options and the exact budget.
#include "tiers/host_tier.h"

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "tests/test_util.h"
#include "tiers/numa.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

// Locked memory of this process (VmLck in /proc/self/status), in bytes.
uint64_t LockedBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmLck:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  return 0;
}

// Drops CAP_IPC_LOCK from this process (used in forked children only), so
// that RLIMIT_MEMLOCK applies even to root.
bool DropIpcLock() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  data[0].effective &= ~(1u << CAP_IPC_LOCK);
  data[0].permitted &= ~(1u << CAP_IPC_LOCK);
  data[0].inheritable &= ~(1u << CAP_IPC_LOCK);
  return syscall(SYS_capset, &hdr, data) == 0 && !HasIpcLockCapability();
}

// ASan and TSan replace mlock with a no-op: tests that watch locking skip there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_SANITIZER() GTEST_SKIP() << "the sanitizer turns mlock into a no-op"
#else
#define SKIP_UNDER_SANITIZER() \
  do {                         \
  } while (0)
#endif

bool SetMemlock(uint64_t bytes) {
  struct rlimit rl {bytes, bytes};
  return setrlimit(RLIMIT_MEMLOCK, &rl) == 0;
}

TEST(HostTier, PageAlignedBlocksWithinBudget) {
  HostTierOptions o;
  o.budget_bytes = 2 * kMiB;
  o.slab_bytes = 0;  // one slab: the whole budget
  o.pin = false;
  ASSERT_OK_AND_ASSIGN(auto tier, HostTier::Open(o));
  EXPECT_FALSE(tier->pinned());
  EXPECT_EQ(tier->pin_method(), "none");
  EXPECT_EQ(tier->alignment(), 4096u);
  ASSERT_OK_AND_ASSIGN(TierBlock a, tier->Allocate(1));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 4096, 0u);
  EXPECT_EQ(a.bytes(), 4096u);
  ASSERT_OK_AND_ASSIGN(TierBlock b, tier->Allocate(kMiB + 1));
  EXPECT_EQ(b.bytes(), kMiB + 4096);
  std::memset(b.data(), 7, b.bytes());
  auto c = tier->Allocate(kMiB - 4096, "optimizer state");
  ASSERT_THAT(c, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_EQ(c.status().tier(), TierKind::kHost);
  EXPECT_EQ(c.status().bytes_available(), 2 * kMiB - 4096 - (kMiB + 4096));
  EXPECT_THAT(c.status().ToString(), HasSubstr("optimizer state"));
}

TEST(HostTier, BlocksNeverSpanSlabsAndTheErrorSaysSo) {
  HostTierOptions o;
  o.budget_bytes = 2 * kMiB;
  o.slab_bytes = kMiB;
  o.pin = false;
  ASSERT_OK_AND_ASSIGN(auto tier, HostTier::Open(o));
  ASSERT_OK_AND_ASSIGN(TierBlock a, tier->Allocate(512 * kKiB));
  ASSERT_OK_AND_ASSIGN(TierBlock b, tier->Allocate(768 * kKiB));  // second slab
  EXPECT_EQ(tier->usage().slabs, 2);
  auto c = tier->Allocate(640 * kKiB);  // fits the budget, but no slab has room
  ASSERT_THAT(c, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_EQ(c.status().bytes_available(), 768 * kKiB);
  EXPECT_THAT(c.status().ToString(), HasSubstr("split across 2 slabs"));
}

TEST(HostTier, PinsSlabsOnceAndReusesThem) {
  SKIP_UNDER_SANITIZER();
  std::string why;
  bool gpu = testing::HaveGpu(&why);
  HostTierOptions o;
  o.budget_bytes = 4 * kMiB;
  o.slab_bytes = 2 * kMiB;
  ASSERT_OK_AND_ASSIGN(auto tier, HostTier::Open(o));
  EXPECT_TRUE(tier->pinned());
  EXPECT_EQ(tier->pin_method(), gpu ? "cudaHostRegister" : "mlock");
  uint64_t locked0 = LockedBytes();
  {
    ASSERT_OK_AND_ASSIGN(TierBlock a, tier->Allocate(kMiB));
    if (!gpu) {
      EXPECT_EQ(LockedBytes() - locked0, 2 * kMiB);  // one slab, locked as a whole
    }
  }
  for (int i = 0; i < 10; ++i) {  // reuse: no new slab, nothing unlocked
    ASSERT_OK_AND_ASSIGN(TierBlock a, tier->Allocate(kMiB));
    EXPECT_EQ(tier->usage().slabs, 1);
  }
  if (!gpu) {
    EXPECT_EQ(LockedBytes() - locked0, 2 * kMiB);
  }
  tier.reset();
  if (!gpu) {
    EXPECT_EQ(LockedBytes(), locked0);
  }
}

TEST(HostTier, MlockOverTheLimitAtOpenNamesRlimitMemlock) {
  SKIP_UNDER_SANITIZER();
  EXPECT_EXIT(
      {
        if (!DropIpcLock() || !SetMemlock(64 * kKiB)) _exit(3);
        HostTierOptions o;
        o.budget_bytes = 8 * kMiB;
        o.pin_method = PinMethod::kMlock;
        auto r = HostTier::Open(o);
        bool good = r.status().code() == StatusCode::kOutOfMemory &&
                    r.status().tier() == TierKind::kHost &&
                    r.status().message().find("RLIMIT_MEMLOCK is 64.0 KiB") != std::string_view::npos &&
                    r.status().message().find("pin_memory: false") != std::string_view::npos;
        if (!good) std::fprintf(stderr, "got %s\n", r.status().ToString().c_str());
        _exit(good ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(HostTier, MlockRefusedLaterNamesRlimitMemlock) {
  SKIP_UNDER_SANITIZER();
  EXPECT_EXIT(
      {
        if (!DropIpcLock() || !SetMemlock(8 * kMiB)) _exit(3);
        HostTierOptions o;
        o.budget_bytes = 4 * kMiB;
        o.slab_bytes = kMiB;
        o.pin_method = PinMethod::kMlock;
        auto tier = HostTier::Open(o);
        if (!tier.ok()) _exit(4);
        if (!SetMemlock(4096)) _exit(5);  // the limit shrinks after Open
        auto r = (*tier)->Allocate(kMiB);
        bool good = r.status().code() == StatusCode::kOutOfMemory &&
                    r.status().message().find("RLIMIT_MEMLOCK is 4.00 KiB") != std::string_view::npos;
        if (!good) std::fprintf(stderr, "got %s\n", r.status().ToString().c_str());
        _exit(good ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(HostTier, UnpinnedNeedsNoMemlock) {
  EXPECT_EXIT(
      {
        if (!DropIpcLock() || !SetMemlock(4096)) _exit(3);
        HostTierOptions o;
        o.budget_bytes = 4 * kMiB;
        o.pin = false;
        auto tier = HostTier::Open(o);
        if (!tier.ok()) _exit(4);
        auto r = (*tier)->Allocate(2 * kMiB);
        _exit(r.ok() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(HostTier, SlabHooksSeeEverySlab) {
  std::vector<std::pair<void*, uint64_t>> mapped;
  std::vector<void*> unmapped;
  HostTierOptions o;
  o.budget_bytes = 3 * kMiB;
  o.slab_bytes = kMiB;
  o.pin = false;
  o.on_map = [&](void* base, uint64_t bytes) {
    mapped.emplace_back(base, bytes);
    return mapped.size() == 2 ? IoError("register buffer", ENOMEM) : Status::OK();
  };
  o.on_unmap = [&](void* base) { unmapped.push_back(base); };
  {
    ASSERT_OK_AND_ASSIGN(auto tier, HostTier::Open(o));
    EXPECT_OK(tier->registration_status());
    ASSERT_OK_AND_ASSIGN(TierBlock a, tier->Allocate(kMiB));
    ASSERT_OK_AND_ASSIGN(TierBlock b, tier->Allocate(kMiB));  // second slab: hook fails
    EXPECT_THAT(tier->registration_status(), StatusIs(StatusCode::kIoError));
    ASSERT_EQ(mapped.size(), 2u);
    EXPECT_EQ(mapped[0].first, a.data());
    EXPECT_EQ(mapped[0].second, kMiB);
    EXPECT_EQ(mapped[1].first, b.data());
  }
  ASSERT_EQ(unmapped.size(), 2u);
}

TEST(HostTier, NumaOptions) {
  EXPECT_GE(NumaNodeCount(), 1);
  HostTierOptions o;
  o.budget_bytes = kMiB;
  o.pin = false;
  o.numa = NumaPlacement::kNode;
  o.numa_node = NumaNodeCount();  // one past the last
  EXPECT_THAT(HostTier::Open(o), StatusIs(StatusCode::kInvalidArgument));
  o.numa_node = 0;
  ASSERT_OK_AND_ASSIGN(auto tier, HostTier::Open(o));
  EXPECT_EQ(tier->numa_node(), 0);
  ASSERT_OK_AND_ASSIGN(TierBlock a, tier->Allocate(64 * kKiB));
  std::memset(a.data(), 1, a.bytes());  // touch: placed by the binding
  int where = NumaNodeOfAddress(a.data());
  if (where >= 0) {
    EXPECT_EQ(where, 0);
  }
  EXPECT_OK(tier->registration_status());
  // kNearGpu without a GPU falls back to the calling thread's node; with one
  // node there is nothing to bind.
  HostTierOptions near;
  near.budget_bytes = kMiB;
  near.pin = false;
  ASSERT_OK_AND_ASSIGN(auto t2, HostTier::Open(near));
  if (NumaNodeCount() == 1) {
    EXPECT_EQ(t2->numa_node(), -1);
  }
}

TEST(HostTier, RejectsBadOptions) {
  HostTierOptions o;
  o.budget_bytes = 100;
  EXPECT_THAT(HostTier::Open(o), StatusIs(StatusCode::kInvalidArgument));
  o.budget_bytes = 4 * kMiB;
  o.slab_bytes = 2 * kGiB;
  EXPECT_THAT(HostTier::Open(o), StatusIs(StatusCode::kInvalidArgument));
  if (!testing::HaveGpu()) {
    HostTierOptions c;
    c.budget_bytes = kMiB;
    c.pin_method = PinMethod::kCuda;
    EXPECT_THAT(HostTier::Open(c), StatusIs(StatusCode::kUnavailable));
  }
  HostTierOptions d;  // budget 0: half the machine (nothing is mapped until used)
  d.pin = false;
  ASSERT_OK_AND_ASSIGN(auto tier, HostTier::Open(d));
  EXPECT_GT(tier->budget(), 256 * kMiB);
  EXPECT_EQ(tier->usage().reserved, 0u);
}

}  // namespace
}  // namespace strata
