// SPDX-License-Identifier: Apache-2.0
// Fault injection into the NVMe tier through the IoEnv seam (FaultIoEnv,
// tests/fault_io_env.h), and real faults made behind the tier's back (a
// truncated, deleted or corrupted swap file, a non-writable directory). Each
// test checks the specific code, errno, file and offset, and that the other
// extents' data is intact afterwards.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <tuple>

#include "base/bytes.h"
#include "tests/fault_io_env.h"
#include "tests/test_util.h"
#include "tiers/nvme/nvme_tier.h"

namespace strata {
namespace {

using ::strata::testing::FaultIo;
using ::strata::testing::FaultIoEnv;
using ::strata::testing::FaultSite;
using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

class Buf {
 public:
  explicit Buf(size_t n)
      : n_(n), p_(static_cast<uint8_t*>(std::aligned_alloc(4096, AlignUp(n, 4096)))) {}
  Buf(size_t n, uint64_t seed) : Buf(n) {
    auto r = testing::RandomBytes(n, seed);
    std::memcpy(p_, r.data(), n);
  }
  ~Buf() { std::free(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  bool operator==(const Buf& o) const { return n_ == o.n_ && std::memcmp(p_, o.p_, n_) == 0; }

 private:
  size_t n_;
  uint8_t* p_;
};

#define OPEN_OR_SKIP(var, opts)                                             \
  auto var##_r = NvmeTier::Open(opts);                                      \
  if (!var##_r.ok() && var##_r.status().code() == StatusCode::kUnavailable) \
    GTEST_SKIP() << var##_r.status().ToString();                            \
  ASSERT_OK(var##_r.status());                                              \
  std::unique_ptr<NvmeTier> var = std::move(var##_r).value()

// A tier with three 3-MiB extents A, B, C of known data, written before any
// fault is armed.
class NvmeFault : public ::testing::Test {
 protected:
  static constexpr uint64_t kExtent = 3 * kMiB;

  void OpenTier(NvmeOptions o = {}) {
    o.dirs = {dir_.path()};
    o.env = &env_;
    if (o.block_size == NvmeOptions().block_size) o.block_size = kMiB;
    auto r = NvmeTier::Open(o);
    if (!r.ok() && r.status().code() == StatusCode::kUnavailable) {
      skip_ = r.status().ToString();
      return;
    }
    ASSERT_OK(r.status());
    tier_ = std::move(r).value();
    for (int i = 0; i < 3; ++i) {
      ASSERT_OK_AND_ASSIGN(Extent e, tier_->Allocate(kExtent));
      ext_.push_back(e);
      data_.push_back(std::make_unique<Buf>(kExtent, 500 + i));
      ASSERT_OK(tier_->WriteSync(e, 0, data_.back()->data(), kExtent));
    }
  }

  // Every extent except `skip` reads back as written.
  void ExpectIntact(int skip = -1) {
    for (int i = 0; i < static_cast<int>(ext_.size()); ++i) {
      if (i == skip) continue;
      Buf back(kExtent);
      ASSERT_OK(tier_->ReadSync(ext_[i], 0, back.data(), kExtent)) << "extent " << i;
      EXPECT_TRUE(back == *data_[i]) << "extent " << i;
    }
  }
  const std::string& file() const { return tier_->files()[0]; }

  TempDir dir_;
  FaultIoEnv env_;
  std::string skip_;
  std::unique_ptr<NvmeTier> tier_;
  std::vector<Extent> ext_;
  std::vector<std::unique_ptr<Buf>> data_;
};

#define SKIP_IF_NO_TIER() \
  if (!skip_.empty()) GTEST_SKIP() << skip_

// The second piece of B's read fails with EIO: the read reports it with B's
// file and the absolute offset of that piece; nothing else is affected.
TEST_F(NvmeFault, ReadEioNamesFileOffsetAndErrno) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  const uint64_t bad = ext_[1].offset + kMiB;
  env_.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kRead, .offset = bad, .times = 1,
            .error = EIO});
  Buf back(kExtent);
  std::atomic<int> calls{0};
  Status got;
  std::mutex mu;
  std::condition_variable cv;
  tier_->Read(ext_[1], 0, back.data(), kExtent, [&](Status s) {
    std::lock_guard<std::mutex> l(mu);
    got = s;
    ++calls;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return calls.load() > 0; });
  }
  EXPECT_THAT(got, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(got.sys_errno(), EIO);
  EXPECT_EQ(got.path(), file());
  EXPECT_EQ(got.offset(), bad);
  EXPECT_FALSE(got.retryable());
  ExpectIntact();              // B too: the injected failure was one read
  EXPECT_EQ(calls.load(), 1);  // exactly once, even with later pieces drained
  EXPECT_EQ(tier_->stats().errors, 1u);
}

TEST_F(NvmeFault, WriteEioNamesFileOffsetAndErrno) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  const uint64_t bad = ext_[2].offset + 2 * kMiB;
  env_.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kWrite, .offset = bad, .error = EIO});
  Buf fresh(kExtent, 99);
  Status s = tier_->WriteSync(ext_[2], 0, fresh.data(), kExtent);
  EXPECT_THAT(s, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_EQ(s.path(), file());
  EXPECT_EQ(s.offset(), bad);
  env_.Clear();
  ExpectIntact(2);
  ASSERT_OK(tier_->WriteSync(ext_[2], 0, fresh.data(), kExtent));  // the tier stays usable
  Buf back(kExtent);
  ASSERT_OK(tier_->ReadSync(ext_[2], 0, back.data(), kExtent));
  EXPECT_TRUE(back == fresh);
}

TEST_F(NvmeFault, WriteEnospcFromTheDevice) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  env_.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kWrite, .error = ENOSPC});
  Buf fresh(kExtent, 98);
  Status s = tier_->WriteSync(ext_[0], kMiB, fresh.data(), kMiB);
  EXPECT_THAT(s, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(s.sys_errno(), ENOSPC);
  EXPECT_EQ(s.path(), file());
  EXPECT_EQ(s.offset(), ext_[0].offset + kMiB);
  ExpectIntact(0);
}

// fallocate runs out of space: Allocate names the file, the offset the file
// was to grow from, and ENOSPC; nothing is reserved, and the tier carries on.
TEST_F(NvmeFault, FallocateEnospc) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  const uint64_t used = tier_->stats().used;
  env_.Add({.site = FaultSite::kFallocate, .error = ENOSPC});
  auto r = tier_->Allocate(kMiB);
  ASSERT_THAT(r, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(r.status().sys_errno(), ENOSPC);
  EXPECT_EQ(r.status().path(), file());
  EXPECT_EQ(r.status().offset(), 3 * kExtent);  // the end of the file
  EXPECT_EQ(tier_->stats().used, used);
  env_.Clear();
  ASSERT_OK_AND_ASSIGN(Extent e, tier_->Allocate(kMiB));
  EXPECT_EQ(e.offset, 3 * kExtent);  // the failed attempt left no hole or growth behind
  ExpectIntact();
}

// With two directories, a full one is skipped.
TEST(NvmeFaultDirs, FallocateEnospcInOneDirectoryUsesTheOther) {
  TempDir a, b;
  FaultIoEnv env;
  NvmeOptions o;
  o.dirs = {a.path(), b.path()};
  o.env = &env;
  OPEN_OR_SKIP(tier, o);
  // Both files are empty, so file 0 is tried first: fail only that attempt.
  env.Add({.site = FaultSite::kFallocate, .times = 1, .error = ENOSPC});
  ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(kMiB));
  EXPECT_EQ(e.file, 1u);
  EXPECT_EQ(env.calls(FaultSite::kFallocate), 2u);
  Buf src(kMiB, 3), back(kMiB);
  ASSERT_OK(tier->WriteSync(e, 0, src.data(), kMiB));
  ASSERT_OK(tier->ReadSync(e, 0, back.data(), kMiB));
  EXPECT_TRUE(src == back);
}

// Every read is cut to half its length (whole pages) before submission, so
// the kernel really transfers less; the tier re-queues the rest each time.
TEST_F(NvmeFault, ShortReadsAreCompletedByRequeueing) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  env_.Add({.site = FaultSite::kPrepareIo, .io = FaultIo::kRead, .len_divisor = 2});
  ExpectIntact();
  NvmeStats s = tier_->stats();
  // Each 1 MiB piece is submitted as 512K, 256K, ... 4K, 4K: 8 short completions.
  EXPECT_EQ(s.short_requeued, 3u * 3 * 8);
  EXPECT_EQ(s.errors, 0u);
}

TEST_F(NvmeFault, ShortWritesAreCompletedByRequeueing) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  env_.Add({.site = FaultSite::kPrepareIo, .io = FaultIo::kWrite, .len_divisor = 3});
  Buf fresh(kExtent, 77);
  const uint64_t before = tier_->stats().short_requeued;
  ASSERT_OK(tier_->WriteSync(ext_[1], 0, fresh.data(), kExtent));
  EXPECT_GT(tier_->stats().short_requeued, before);
  env_.Clear();
  data_[1] = std::make_unique<Buf>(kExtent, 77);
  ExpectIntact();
}

// A short completion the device reports (the data beyond it not transferred
// as far as the tier knows): the rest is requested again.
TEST_F(NvmeFault, ShortCompletionResultIsRequeued) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  env_.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kRead, .first_attempt = true,
            .times = 5, .result_cap = 8192});
  ExpectIntact();
  EXPECT_EQ(tier_->stats().short_requeued, 5u);
}

TEST_F(NvmeFault, EagainIsRetried) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  env_.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kRead, .times = 3, .error = EAGAIN});
  ExpectIntact();
  EXPECT_EQ(tier_->stats().retried, 3u);
  EXPECT_EQ(tier_->stats().errors, 0u);
}

TEST_F(NvmeFault, EintrAndEagainAtSubmissionAreRetried) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  for (int i = 0; i < 4; ++i)  // EAGAIN, EINTR, EAGAIN, EINTR
    env_.Add({.site = FaultSite::kPrepareIo, .skip = i, .times = 1,
              .error = i % 2 ? EINTR : EAGAIN});
  ExpectIntact();
  EXPECT_EQ(tier_->stats().retried, 4u);
}

TEST_F(NvmeFault, EagainForeverBecomesARetryableError) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  env_.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kRead, .offset = ext_[0].offset,
            .error = EAGAIN});
  Buf back(kExtent);
  Status s = tier_->ReadSync(ext_[0], 0, back.data(), kExtent);
  EXPECT_THAT(s, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(s.sys_errno(), EAGAIN);
  EXPECT_TRUE(s.retryable());
  EXPECT_EQ(s.offset(), ext_[0].offset);
  EXPECT_THAT(s.ToString(), HasSubstr("retries"));
  env_.Clear();
  ExpectIntact();
}

// PrepareIo fails a submission outright (as if io_uring_get_sqe's I/O could
// not be set up): the same path as a failed completion.
TEST_F(NvmeFault, FailedSubmissionOfOnePiece) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  const uint64_t bad = ext_[2].offset + 2 * kMiB;
  env_.Add({.site = FaultSite::kPrepareIo, .offset = bad, .error = EBADF});
  Buf back(kExtent);
  Status s = tier_->ReadSync(ext_[2], 0, back.data(), kExtent);
  EXPECT_THAT(s, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(s.sys_errno(), EBADF);
  EXPECT_EQ(s.offset(), bad);
  ExpectIntact(2);
}

// One transfer split over four rings fails in one part: one callback, with
// that error; the other transfers in flight at the same time are unaffected.
TEST(NvmeFaultRings, ErrorInOnePartOfASplitTransfer) {
  TempDir d;
  FaultIoEnv env;
  NvmeOptions o;
  o.dirs = {d.path()};
  o.env = &env;
  o.rings = 4;
  o.block_size = 256 * kKiB;
  o.queue_depth = 4;
  OPEN_OR_SKIP(tier, o);
  constexpr uint64_t kN = 8 * kMiB;
  std::vector<Extent> ext;
  std::vector<std::unique_ptr<Buf>> src;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(kN));
    ext.push_back(e);
    src.push_back(std::make_unique<Buf>(kN, 40 + i));
    ASSERT_OK(tier->WriteSync(e, 0, src.back()->data(), kN));
  }
  const uint64_t bad = ext[2].offset + 5 * kMiB + 256 * kKiB;
  env.Add({.site = FaultSite::kCompleteIo, .offset = bad, .error = EIO});
  std::vector<std::unique_ptr<Buf>> back;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> calls(4, 0);
  std::vector<Status> got(4);
  for (int i = 0; i < 4; ++i) {
    back.push_back(std::make_unique<Buf>(kN));
    tier->Read(ext[i], 0, back[i]->data(), kN, [&, i](Status s) {
      std::lock_guard<std::mutex> l(mu);
      got[i] = s;
      ++calls[i];
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return calls[0] && calls[1] && calls[2] && calls[3]; });
  }
  tier.reset();  // drains everything: any second callback would show below
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(calls[i], 1) << i;
    if (i == 2) {
      EXPECT_THAT(got[i], StatusIs(StatusCode::kIoError));
      EXPECT_EQ(got[i].offset(), bad);
    } else {
      EXPECT_OK(got[i]);
      EXPECT_TRUE(*back[i] == *src[i]) << i;
    }
  }
}

TEST(NvmeFaultOpen, ODirectRefused) {
  TempDir d;
  FaultIoEnv env;
  env.Add({.site = FaultSite::kOpen, .open_flags = O_DIRECT, .error = EINVAL});
  NvmeOptions o;
  o.dirs = {d.path()};
  o.env = &env;
  auto r = NvmeTier::Open(o);
  ASSERT_THAT(r, StatusIs(StatusCode::kUnavailable));
  EXPECT_EQ(r.status().sys_errno(), EINVAL);
  EXPECT_EQ(r.status().path(), d.path());
  EXPECT_THAT(r.status().ToString(), HasSubstr("O_DIRECT was refused"));
  EXPECT_THAT(r.status().ToString(), HasSubstr("buffered_fallback"));
  EXPECT_TRUE(std::filesystem::is_empty(d.path()));  // nothing left behind

  o.buffered_fallback = true;
  OPEN_OR_SKIP(tier, o);
  EXPECT_FALSE(tier->direct_io());
  ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(kMiB + 4096));
  Buf src(kMiB + 4096, 8), back(kMiB + 4096);
  ASSERT_OK(tier->WriteSync(e, 0, src.data(), src.size()));
  ASSERT_OK(tier->ReadSync(e, 0, back.data(), back.size()));
  EXPECT_TRUE(src == back);
}

// A real tmpfs: older kernels refuse O_DIRECT there (then the error must be
// the specific one), Linux 6.6+ accepts it (then it must work).
TEST(NvmeFaultOpen, RealTmpfs) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  char tmpl[] = "/dev/shm/strata-nvme-test.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) GTEST_SKIP() << "cannot create a directory in /dev/shm";
  std::string dir = tmpl;
  NvmeOptions o;
  o.dirs = {dir};
  {
    auto r = NvmeTier::Open(o);
    if (r.ok()) {
      EXPECT_TRUE((*r)->direct_io());
      ASSERT_OK_AND_ASSIGN(Extent e, (*r)->Allocate(64 * kKiB));
      Buf src(64 * kKiB, 1), back(64 * kKiB);
      EXPECT_OK((*r)->WriteSync(e, 0, src.data(), src.size()));
      EXPECT_OK((*r)->ReadSync(e, 0, back.data(), back.size()));
      EXPECT_TRUE(src == back);
    } else if (r.status().sys_errno() == EINVAL) {
      EXPECT_THAT(r, StatusIs(StatusCode::kUnavailable));
      EXPECT_THAT(r.status().ToString(), HasSubstr("O_DIRECT"));
    } else {
      EXPECT_THAT(r, StatusIs(StatusCode::kUnavailable))
          << "io_uring missing is the only other excuse";
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(NvmeFaultOpen, NonWritableDirectory) {
  TempDir d;
  std::string ro = d.File("ro");
  ASSERT_EQ(::mkdir(ro.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);
  if (::access(ro.c_str(), W_OK) == 0)
    GTEST_SKIP() << "running with CAP_DAC_OVERRIDE (root): permissions do not deny writes; "
                    "see NonWritableDirectoryInjected";
  NvmeOptions o;
  o.dirs = {ro};
  auto r = NvmeTier::Open(o);
  ASSERT_THAT(r, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(r.status().sys_errno(), EACCES);
  EXPECT_EQ(r.status().path(), ro);
  EXPECT_THAT(r.status().ToString(), HasSubstr("not writable"));
}

TEST(NvmeFaultOpen, NonWritableDirectoryInjected) {
  for (int err : {EACCES, EROFS}) {
    TempDir d;
    FaultIoEnv env;
    env.Add({.site = FaultSite::kOpen, .error = err});
    NvmeOptions o;
    o.dirs = {d.path()};
    o.env = &env;
    auto r = NvmeTier::Open(o);
    ASSERT_THAT(r, StatusIs(StatusCode::kIoError));
    EXPECT_EQ(r.status().sys_errno(), err);
    EXPECT_EQ(r.status().path(), d.path());
    EXPECT_THAT(r.status().ToString(), HasSubstr("not writable"));
  }
}

TEST(NvmeFaultOpen, IoUringUnavailable) {
  TempDir d;
  FaultIoEnv env;
  env.Add({.site = FaultSite::kRingInit, .error = ENOSYS});
  NvmeOptions o;
  o.dirs = {d.path()};
  o.env = &env;
  auto r = NvmeTier::Open(o);
  ASSERT_THAT(r, StatusIs(StatusCode::kUnavailable));
  EXPECT_EQ(r.status().sys_errno(), ENOSYS);
  EXPECT_THAT(r.status().ToString(), HasSubstr("io_uring"));
  EXPECT_TRUE(std::filesystem::is_empty(d.path()));  // the swap file was removed again
}

// The kernel refuses to pin a registered buffer (as with a low RLIMIT_MEMLOCK):
// RegisterBuffer still succeeds and transfers use unregistered I/O.
TEST(NvmeFaultOpen, BufferRegistrationRefusedFallsBack) {
  TempDir d;
  FaultIoEnv env;
  NvmeOptions o;
  o.dirs = {d.path()};
  o.env = &env;
  OPEN_OR_SKIP(tier, o);
  env.Add({.site = FaultSite::kUpdateBuffers, .error = ENOMEM});
  Buf pool(kMiB, 2), back(kMiB);
  ASSERT_OK(tier->RegisterBuffer(pool.data(), pool.size()));
  EXPECT_EQ(tier->stats().registered_bytes, 0u);
  env.Clear();
  ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(kMiB));
  ASSERT_OK(tier->WriteSync(e, 0, pool.data(), kMiB));
  ASSERT_OK(tier->ReadSync(e, 0, back.data(), kMiB));
  EXPECT_TRUE(pool == back);
  EXPECT_EQ(tier->stats().fixed_ios, 0u);
  tier->UnregisterBuffer(pool.data());  // known, though never registered with the kernel
}

// io_uring_enter fails for good: the transfer fails with that errno, the
// ring stays failed (sticky) for later transfers, and the tier shuts down.
TEST(NvmeFaultOpen, FatalSubmitErrorIsSticky) {
  TempDir d;
  FaultIoEnv env;
  NvmeOptions o;
  o.dirs = {d.path()};
  o.env = &env;
  OPEN_OR_SKIP(tier, o);
  ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(kMiB));
  Buf src(kMiB, 4);
  ASSERT_OK(tier->WriteSync(e, 0, src.data(), kMiB));
  // Armed while the ring thread runs (it calls SubmitAndWait all the time).
  env.Add({.site = FaultSite::kSubmitAndWait, .error = EBADF});
  Status s = tier->WriteSync(e, 0, src.data(), kMiB);
  EXPECT_THAT(s, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(s.sys_errno(), EBADF);
  env.Clear();
  Status again = tier->ReadSync(e, 0, src.data(), kMiB);
  EXPECT_THAT(again, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(again.sys_errno(), EBADF);
}

// ---- Faults made behind the tier's back -----------------------------------------

// Someone truncates the swap file: reads past the new end are DataLoss naming
// the file and where it ends, never zero-filled data; extents before the cut
// are intact.
TEST_F(NvmeFault, TruncatedFileIsDataLoss) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  const uint64_t cut = ext_[1].offset + kMiB + 100;
  ASSERT_EQ(::truncate(file().c_str(), static_cast<off_t>(cut)), 0);
  Buf back(kExtent);
  Status s = tier_->ReadSync(ext_[1], 0, back.data(), kExtent);
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ(s.path(), file());
  ASSERT_TRUE(s.offset().has_value());
  EXPECT_GE(*s.offset(), cut - 100);  // where the file now ends (page-rounded or exact)
  EXPECT_LE(*s.offset(), cut);
  EXPECT_TRUE(s.data_lost());
  Status c = tier_->ReadSync(ext_[2], 0, back.data(), kExtent);
  EXPECT_THAT(c, StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ(c.offset(), ext_[2].offset);
  Buf a(kExtent);
  ASSERT_OK(tier_->ReadSync(ext_[0], 0, a.data(), kExtent));
  EXPECT_TRUE(a == *data_[0]);
}

// Unlinking the file behind the tier's back changes nothing for I/O while it
// is open (Linux keeps the inode), but CheckFiles says so, naming the file;
// closing at destruction copes with the missing name.
TEST_F(NvmeFault, DeletedFileKeepsWorkingUntilClosed) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  ASSERT_OK(tier_->CheckFiles());
  ASSERT_EQ(::unlink(file().c_str()), 0);
  Status c = tier_->CheckFiles();
  EXPECT_THAT(c, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(c.sys_errno(), ENOENT);
  EXPECT_EQ(c.path(), file());
  EXPECT_THAT(c.ToString(), ::testing::HasSubstr("deleted while in use"));
  ExpectIntact();
  ASSERT_OK_AND_ASSIGN(Extent e, tier_->Allocate(kMiB));
  Buf src(kMiB, 12), back(kMiB);
  ASSERT_OK(tier_->WriteSync(e, 0, src.data(), kMiB));
  ASSERT_OK(tier_->ReadSync(e, 0, back.data(), kMiB));
  EXPECT_TRUE(src == back);
  tier_.reset();
}

// Another file put at the swap file's path (ours deleted, or moved away) is
// reported, and is not removed when the tier closes: only our file is.
TEST_F(NvmeFault, PathTakenByAnotherFileIsReportedAndLeftAlone) {
  ASSERT_NO_FATAL_FAILURE(OpenTier());
  SKIP_IF_NO_TIER();
  const std::string path = file();
  const std::string moved = path + ".moved";
  ASSERT_EQ(::rename(path.c_str(), moved.c_str()), 0);
  Status gone = tier_->CheckFiles();
  EXPECT_THAT(gone, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(gone.sys_errno(), ENOENT);
  EXPECT_EQ(gone.path(), path);
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  Status other = tier_->CheckFiles();
  EXPECT_THAT(other, StatusIs(StatusCode::kIoError));
  EXPECT_EQ(other.sys_errno(), EEXIST);
  EXPECT_THAT(other.ToString(), ::testing::HasSubstr("another file"));
  ExpectIntact();  // I/O still goes to our (moved) file
  tier_.reset();
  EXPECT_EQ(::access(path.c_str(), F_OK), 0) << "the other file at the path was removed";
  EXPECT_EQ(::access(moved.c_str(), F_OK), 0);  // ours, moved: not ours to find any more
  ::unlink(path.c_str());
  ::unlink(moved.c_str());
}

// (checksum, block size): 1 MiB pieces hold whole 256 KiB checksum blocks
// (checked as each piece lands); 64 KiB pieces do not (checked at the end).
using CorruptionParam = std::tuple<ChecksumKind, uint32_t>;
class NvmeCorruption : public NvmeFault, public ::testing::WithParamInterface<CorruptionParam> {};

// Garbage written into the file with an ordinary descriptor: with checksums
// on, reading the block is DataLoss naming the file and the block's offset;
// reads that do not cover the block, and the other extents, are fine.
TEST_P(NvmeCorruption, CorruptedBlockIsDataLoss) {
  const ChecksumKind kind = std::get<0>(GetParam());
  NvmeOptions o;
  o.checksum = kind;
  o.block_size = std::get<1>(GetParam());
  o.checksum_block = 256 * kKiB;
  ASSERT_NO_FATAL_FAILURE(OpenTier(o));
  SKIP_IF_NO_TIER();
  const uint64_t block = ext_[1].offset + 2 * 256 * kKiB;  // B's third checksum block
  {
    int fd = ::open(file().c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const char garbage[] = "not what the tier wrote";
    ASSERT_EQ(::pwrite(fd, garbage, sizeof garbage, static_cast<off_t>(block + 1000)),
              static_cast<ssize_t>(sizeof garbage));
    ASSERT_EQ(::fsync(fd), 0);
    ::close(fd);
  }
  Buf back(kExtent);
  Status s = tier_->ReadSync(ext_[1], 0, back.data(), kExtent);
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ(s.path(), file());
  EXPECT_EQ(s.offset(), block);
  EXPECT_THAT(s.ToString(), HasSubstr("checksum mismatch"));
  EXPECT_THAT(s.ToString(), HasSubstr(std::string(ChecksumName(kind))));
  EXPECT_EQ(tier_->stats().checksum_failures, 1u);
  // The first two blocks of B are still good.
  Buf head(512 * kKiB);
  ASSERT_OK(tier_->ReadSync(ext_[1], 0, head.data(), head.size()));
  EXPECT_EQ(std::memcmp(head.data(), data_[1]->data(), head.size()), 0);
  ExpectIntact(1);
}

std::string CorruptionName(const ::testing::TestParamInfo<CorruptionParam>& info) {
  return std::string(ChecksumName(std::get<0>(info.param))) + "_bs" +
         std::to_string(std::get<1>(info.param) / 1024) + "k";
}

INSTANTIATE_TEST_SUITE_P(Kinds, NvmeCorruption,
                         ::testing::Combine(::testing::Values(ChecksumKind::kCrc32c,
                                                              ChecksumKind::kXxh64),
                                            ::testing::Values(1024u * 1024, 64u * 1024)),
                         CorruptionName);

// A failed write leaves the blocks it touched unknown on disk: with checksums
// on, reading them is DataLoss until they are written again.
TEST_F(NvmeFault, FailedWritePoisonsItsBlocksUntilRewritten) {
  NvmeOptions o;
  o.checksum = ChecksumKind::kCrc32c;
  o.checksum_block = kMiB;
  ASSERT_NO_FATAL_FAILURE(OpenTier(o));
  SKIP_IF_NO_TIER();
  const uint64_t bad = ext_[0].offset + kMiB;
  env_.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kWrite, .offset = bad, .error = EIO});
  Buf fresh(kExtent, 31);
  EXPECT_THAT(tier_->WriteSync(ext_[0], 0, fresh.data(), kExtent), StatusIs(StatusCode::kIoError));
  env_.Clear();
  Buf back(kExtent);
  Status s = tier_->ReadSync(ext_[0], 0, back.data(), kExtent);
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ(s.offset(), ext_[0].offset);  // the first block the failed write touched
  EXPECT_THAT(s.ToString(), HasSubstr("earlier write"));
  ASSERT_OK(tier_->WriteSync(ext_[0], 0, fresh.data(), kExtent));
  ASSERT_OK(tier_->ReadSync(ext_[0], 0, back.data(), kExtent));
  EXPECT_TRUE(back == fresh);
  ExpectIntact(0);
}

}  // namespace
}  // namespace strata
