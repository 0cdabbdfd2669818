// SPDX-License-Identifier: Apache-2.0
// Fault injection under the TierStore through the NVMe tier's IoEnv seam
// (FaultIoEnv, tests/fault_io_env.h), and real faults behind its back
// (truncated, corrupted, deleted swap file): each is a specific error at the
// next call on the tensor concerned, never a crash and never wrong data, and
// the other tensors keep their data.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "tests/fault_io_env.h"
#include "tests/test_util.h"
#include "tiers/tier_store.h"

namespace strata {
namespace {

using ::strata::testing::FaultIo;
using ::strata::testing::FaultIoEnv;
using ::strata::testing::FaultSite;
using ::strata::testing::RandomBytes;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

constexpr TierKind kGpu = TierKind::kGpu, kHost = TierKind::kHost, kNvme = TierKind::kNvme;

class StoreFault : public ::testing::Test {
 protected:
  testing::TempDir dir;
  FaultIoEnv env;  // faults armed by the test, applied by the NVMe tier's I/O threads
  std::unique_ptr<TierStore> store;

  TierStoreOptions Options(ChecksumKind checksum = ChecksumKind::kNone) {
    TierStoreOptions o;
    o.gpu_tier.stand_in = true;
    o.gpu_tier.budget_bytes = 512 * kKiB;
    o.gpu_tier.slab_bytes = 0;
    o.host_tier.budget_bytes = 4 * kMiB;
    o.host_tier.slab_bytes = 0;
    o.host_tier.pin = false;
    o.staging_chunk_bytes = 64 * kKiB;
    o.staging_buffers = 2;
    o.staging_per_move = 2;
    NvmeOptions n;
    n.dirs = {dir.path()};
    n.capacity_bytes = 32 * kMiB;
    n.block_size = 64 * kKiB;
    n.queue_depth = 8;
    n.buffered_fallback = true;  // where /var/tmp refuses O_DIRECT: same store paths
    n.checksum = checksum;
    n.checksum_block = 64 * kKiB;
    n.env = &env;
    o.nvme = n;
    return o;
  }
  void Open(ChecksumKind checksum = ChecksumKind::kNone) {
    auto r = TierStore::Open(Options(checksum));
    if (!r.ok() && r.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << r.status().ToString();
    ASSERT_OK(r.status());
    store = std::move(r).value();
  }
  // An nvme-home tensor of known data whose only valid copy is on disk.
  TensorId OnDisk(const std::string& name, uint64_t bytes, uint64_t seed) {
    auto id = store->Create(name, DType::kU8, Shape{static_cast<int64_t>(bytes)}, kNvme);
    EXPECT_OK(id.status());
    auto data = RandomBytes(bytes, seed);
    EXPECT_OK(store->Write(*id, data.data(), bytes));
    EXPECT_OK(Wait(store->Flush(*id)));
    EXPECT_OK(Wait(store->Evict(*id, kHost)));
    return *id;
  }
  static Status Wait(const Result<Ticket>& t) { return t.ok() ? t->Wait() : t.status(); }
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
  void WaitForFailures(uint64_t n) {
    for (int i = 0; i < 5000 && store->stats().failures < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_GE(store->stats().failures, n);
  }
};

TEST_F(StoreFault, ReadEioDuringPrefetchIsReportedAtTheNextCall) {
  Open();
  TensorId a = OnDisk("a", 200 * kKiB, 1), b = OnDisk("b", 200 * kKiB, 2);
  env.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kRead, .error = EIO});
  ASSERT_OK_AND_ASSIGN(Ticket t, store->Prefetch(a, kHost));  // not waited on
  WaitForFailures(1);
  env.Clear();
  auto r = store->Acquire(a, kHost, Access::kRead);
  ASSERT_THAT(r, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(r.status().sys_errno(), EIO);
  EXPECT_EQ(r.status().path(), store->nvme_tier()->files()[0]);
  EXPECT_TRUE(r.status().offset().has_value());
  EXPECT_THAT(r.status().ToString(), HasSubstr("earlier prefetch of 'a' to host failed"));
  EXPECT_FALSE(CopyOf(a, kHost).valid);  // never wrong data
  // Reported once; the next call loads it correctly. b was never touched.
  EXPECT_EQ(ReadOn(a, kHost), RandomBytes(200 * kKiB, 1));
  EXPECT_EQ(ReadOn(b, kGpu), RandomBytes(200 * kKiB, 2));
  (void)t.Poll();
}

TEST_F(StoreFault, ReadEioThroughStagingFailsTheTicket) {
  Open();
  TensorId a = OnDisk("a", 300 * kKiB, 3);
  env.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kRead, .error = EIO});
  ASSERT_OK_AND_ASSIGN(Ticket t, store->Prefetch(a, kGpu));
  Status s = t.Wait();
  ASSERT_THAT(s, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_THAT(s.ToString(), HasSubstr("from nvme to gpu"));
  env.Clear();
  EXPECT_FALSE(CopyOf(a, kGpu).valid);
  EXPECT_FALSE(CopyOf(a, kGpu).allocated);  // a half-loaded copy is not kept
  EXPECT_EQ(ReadOn(a, kGpu), RandomBytes(300 * kKiB, 3));  // reported by the ticket: not repeated
}

TEST_F(StoreFault, EnospcOnWriteBackKeepsTheDirtyCopy) {
  Open();
  TensorId a = OnDisk("a", 256 * kKiB, 4), b = OnDisk("b", 64 * kKiB, 5);
  ASSERT_OK_AND_ASSIGN(TensorView v, store->Acquire(a, kGpu, Access::kReadWrite));
  std::memset(v.data, 0xee, 4096);
  ASSERT_OK(store->Release(a, kGpu, true));
  auto want = RandomBytes(256 * kKiB, 4);
  std::memset(want.data(), 0xee, 4096);
  for (bool through_host : {false, true}) {
    if (!through_host) {
      ASSERT_OK(Wait(store->Evict(a, kHost)));  // the write-back goes through staging
    } else {
      // A stale host copy: the write-back goes gpu -> host copy -> nvme.
      EXPECT_EQ(ReadOn(a, kHost), want);
      ASSERT_OK_AND_ASSIGN(TensorView w, store->Acquire(a, kGpu, Access::kReadWrite));
      std::memset(w.data, 0xef, 4096);
      ASSERT_OK(store->Release(a, kGpu, true));
      std::memset(want.data(), 0xef, 4096);
      EXPECT_TRUE(CopyOf(a, kHost).allocated);
      EXPECT_FALSE(CopyOf(a, kHost).valid);
    }
    env.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kWrite, .error = ENOSPC});
    Status s = Wait(store->Evict(a, kGpu));
    env.Clear();
    ASSERT_THAT(s, StatusIs(StatusCode::kIoError));
    EXPECT_EQ(s.sys_errno(), ENOSPC);
    EXPECT_THAT(s.ToString(), HasSubstr("write-back"));
    auto gpu = CopyOf(a, kGpu);
    EXPECT_TRUE(gpu.allocated);  // no data lost
    EXPECT_TRUE(gpu.valid);
    EXPECT_TRUE(gpu.dirty);
    EXPECT_FALSE(CopyOf(a, kNvme).valid);
    EXPECT_EQ(CopyOf(a, kHost).valid, through_host);  // the first hop landed
    EXPECT_EQ(ReadOn(a, kGpu), want);
  }
  ASSERT_OK(Wait(store->Evict(a, kGpu)));  // the fault is gone: it goes home now
  ASSERT_OK(Wait(store->Evict(a, kHost)));
  EXPECT_FALSE(CopyOf(a, kGpu).allocated);
  EXPECT_EQ(ReadOn(a, kHost), want);
  EXPECT_EQ(ReadOn(b, kHost), RandomBytes(64 * kKiB, 5));
}

TEST_F(StoreFault, FailedWriteBackOfAnEvictionVictimSticksToTheVictim) {
  Open();  // gpu budget 512 KiB: two of these tensors
  TensorId a = OnDisk("a", 256 * kKiB, 6), b = OnDisk("b", 256 * kKiB, 7), c = OnDisk("c", 256 * kKiB, 8);
  ASSERT_OK_AND_ASSIGN(TensorView va, store->Acquire(a, kGpu, Access::kReadWrite));
  std::memset(va.data, 0x42, va.bytes);
  ASSERT_OK(store->Release(a, kGpu, true));  // a: dirty, only on gpu, least recently used
  ASSERT_OK(Wait(store->Evict(a, kHost)));
  EXPECT_EQ(ReadOn(b, kGpu), RandomBytes(256 * kKiB, 7));
  env.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kWrite, .error = ENOSPC});
  // c needs room: a (LRU) cannot be written home, so b is dropped instead.
  EXPECT_EQ(ReadOn(c, kGpu), RandomBytes(256 * kKiB, 8));
  env.Clear();
  EXPECT_TRUE(CopyOf(a, kGpu).dirty);
  EXPECT_FALSE(CopyOf(b, kGpu).allocated);
  auto r = store->Acquire(a, kGpu, Access::kRead);
  ASSERT_THAT(r, StatusIs(StatusCode::kIoError));  // a's owner hears of it
  EXPECT_EQ(r.status().sys_errno(), ENOSPC);
  EXPECT_THAT(r.status().ToString(), HasSubstr("write-back of 'a'"));
  EXPECT_EQ(ReadOn(a, kGpu), std::vector<uint8_t>(256 * kKiB, 0x42));
  ASSERT_OK(Wait(store->Flush(a)));
  EXPECT_FALSE(CopyOf(a, kGpu).dirty);
}

TEST_F(StoreFault, ShortTransfersAreInvisible) {
  Open();
  env.Add({.site = FaultSite::kPrepareIo, .len_cap = 4096});
  TensorId a = OnDisk("a", 500 * kKiB + 3, 9);
  EXPECT_EQ(ReadOn(a, kGpu), RandomBytes(500 * kKiB + 3, 9));  // nvme -> staging -> gpu
  ASSERT_OK(Wait(store->Evict(a, kGpu)));
  EXPECT_EQ(ReadOn(a, kHost), RandomBytes(500 * kKiB + 3, 9));  // nvme -> host
  EXPECT_GT(store->stats().nvme.short_requeued, 0u);
}

TEST_F(StoreFault, TruncatedFileIsDataLossAndCachedTensorsSurvive) {
  Open();
  TensorId a = OnDisk("a", 128 * kKiB, 10), b = OnDisk("b", 128 * kKiB, 11);
  EXPECT_EQ(ReadOn(b, kHost), RandomBytes(128 * kKiB, 11));  // b has a host copy now
  ASSERT_EQ(truncate(store->nvme_tier()->files()[0].c_str(), 0), 0);
  auto r = store->Acquire(a, kGpu, Access::kRead);
  ASSERT_THAT(r, StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ(r.status().path(), store->nvme_tier()->files()[0]);
  EXPECT_FALSE(CopyOf(a, kGpu).valid);
  EXPECT_EQ(ReadOn(b, kGpu), RandomBytes(128 * kKiB, 11));  // from its host copy
  // Writing a again makes it whole (the file grows back).
  auto fresh = RandomBytes(128 * kKiB, 12);
  ASSERT_OK(store->Write(a, fresh.data(), fresh.size()));
  ASSERT_OK(Wait(store->Flush(a)));
  ASSERT_OK(Wait(store->Evict(a, kHost)));
  EXPECT_EQ(ReadOn(a, kHost), fresh);
}

TEST_F(StoreFault, CorruptedFileIsDataLossWithChecksums) {
  Open(ChecksumKind::kCrc32c);
  TensorId a = OnDisk("a", 192 * kKiB, 13);
  {
    const std::string& path = store->nvme_tier()->files()[0];
    int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    off_t size = lseek(fd, 0, SEEK_END);
    auto junk = RandomBytes(static_cast<size_t>(size), 99);
    ASSERT_EQ(pwrite(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
    ASSERT_EQ(fsync(fd), 0);
    ::close(fd);
  }
  for (TierKind tier : {kHost, kGpu}) {
    auto r = store->Acquire(a, tier, Access::kRead);
    ASSERT_THAT(r, StatusIs(StatusCode::kDataLoss)) << TierName(tier);
    EXPECT_TRUE(r.status().data_lost());
    EXPECT_FALSE(CopyOf(a, tier).valid);
  }
}

TEST_F(StoreFault, DeletedFileKeepsWorkingWhileOpen) {
  Open();
  TensorId a = OnDisk("a", 128 * kKiB, 14);
  ASSERT_EQ(unlink(store->nvme_tier()->files()[0].c_str()), 0);
  EXPECT_EQ(ReadOn(a, kGpu), RandomBytes(128 * kKiB, 14));  // the open file still holds the data
  TensorId b = OnDisk("b", 64 * kKiB, 15);
  EXPECT_EQ(ReadOn(b, kHost), RandomBytes(64 * kKiB, 15));
}

TEST_F(StoreFault, OpenFailsClearlyWhenTheDirectoryIsUnusable) {
  env.Add({.site = FaultSite::kOpen, .open_flags = O_DIRECT, .error = EINVAL});
  TierStoreOptions o = Options();
  o.nvme->buffered_fallback = false;
  auto r = TierStore::Open(o);
  ASSERT_THAT(r, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(r.status().ToString(), HasSubstr("O_DIRECT"));
  env.Clear();
  env.Add({.site = FaultSite::kOpen, .error = EACCES});
  auto r2 = TierStore::Open(o);
  ASSERT_THAT(r2, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(r2.status().sys_errno(), EACCES);
  EXPECT_THAT(r2.status().ToString(), HasSubstr(dir.path()));
}

}  // namespace
}  // namespace strata
